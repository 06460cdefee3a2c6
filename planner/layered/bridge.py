"""What a layered plan sends over the cross-vendor bridge per iteration, and the seconds of
its T in bridge-bound terms (docs/vendors.md §8 on §3; the routing's volumes in `planner.bridge`).

Bytes: a stage boundary whose two leaders are on the two sides of the bridge carries the
activation forward and its gradient backward for each of the pipeline's m_p micro-batches
(2·A·m_p, A = b·s·h·β); a layer (or the embedding, or the head) whose D holders span V
vendors all-reduces its P(ℓ)·γ gradient bytes across them, chunk by chunk — the chunks add up
to the whole layer, so V·(V−1)·P(ℓ)·γ. The TP traffic never leaves a machine.

Seconds: the terms of T (§3.3, §3.4) over a crossing boundary or bridged holders — in the
slowest pipeline, the crossing T_pp,k of the fill and drain and the steady-state term when a
crossing T_pp,k sets it; in T_dp, the bridged layers of the stage that sets it.
"""

from __future__ import annotations

import numpy as np

from planner.bridge import BridgeTraffic, allreduce_bridge_bytes, crosses, vendor_spread
from planner.layered.plan import Plan
from planner.layered.cost import activation_message_bytes
from planner.layered.pricing import breakdown, dp_layer_times, stage_dp_times
from planner.layered.table import StageTable, stage_table
from planner.problem import Problem


def unit_holders(table: StageTable, layers: int) -> np.ndarray:
    """(L + 2, D): the stage holding each layer, then "emb" and "head", in every pipeline."""
    d = table.num_pipelines
    holders = np.repeat(np.arange(len(table.pipe)), table.layers).reshape(d, layers)
    return np.vstack([holders.T, table.pipe_start[:-1], table.pipe_start[1:] - 1])


def crossing_boundaries(problem: Problem, table: StageTable) -> np.ndarray:
    """Per stage: whether its boundary to the next stage crosses the bridge (False for last)."""
    nxt = np.minimum(np.arange(len(table.pipe)) + 1, len(table.pipe) - 1)
    return (table.last == 0) & crosses(problem.cluster, table.machine, table.machine[nxt])


def layered_bridge_bytes(problem: Problem, table: StageTable) -> dict[str, float]:
    """Bytes over the bridge per iteration: {"pp": …, "dp": …}."""
    model, training = problem.model, problem.training
    activation = activation_message_bytes(model, training)
    pp = float((crossing_boundaries(problem, table) * 2 * activation * table.micro_batches).sum())
    if table.num_pipelines == 1:
        return {"pp": pp, "dp": 0.0}
    spread = vendor_spread(problem.cluster, table.machine[unit_holders(table, model.layers)])
    params = np.array([model.params_per_layer] * model.layers + [model.params_embedding, model.params_head])
    return {"pp": pp, "dp": float(allreduce_bridge_bytes(spread, params * training.grad_bytes).sum())}


def _pipe_bridge_seconds(table: StageTable, parts, crossing: np.ndarray) -> float:
    """Bridge-bound seconds of the slowest pipeline's T_pipe (§3.3)."""
    p = int(np.argmax(parts.pipe_time))
    own = slice(int(table.pipe_start[p]), int(table.pipe_start[p + 1]))
    pp, tau, cross = parts.pp[own], parts.tau[own], crossing[own]
    steady = float(np.maximum(tau, pp).max())
    bridged_steady = cross.any() and float(pp[cross].max()) >= steady
    return float(pp[cross].sum()) + (int(table.micro_batches[own][0]) - 1) * steady * bridged_steady


def layered_bridge_traffic(problem: Problem, plan: Plan) -> BridgeTraffic:
    """Bytes per iteration over the bridge and the bridge-bound seconds of T (module doc)."""
    table = stage_table(problem, plan)
    parts = breakdown(problem, table)
    seconds = _pipe_bridge_seconds(table, parts, crossing_boundaries(problem, table))
    if table.num_pipelines > 1:
        spread = vendor_spread(problem.cluster, table.machine[unit_holders(table, problem.model.layers)])
        bridged = stage_dp_times(table, np.where(spread > 0, dp_layer_times(problem, table), 0.0))
        seconds += float(bridged[int(np.argmax(parts.dp))])
    by_kind = layered_bridge_bytes(problem, table)
    return BridgeTraffic(bytes_per_step=sum(by_kind.values()), bytes_by_kind=by_kind, bridge_s=seconds,
                         iteration_s=parts.iteration)
