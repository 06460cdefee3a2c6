"""Machine classes and class-level stage types of the configuration bound (docs/bounds.md §1).

Machines with the same GPU figures (π, π_att, memory), device count and intra bandwidth and
latency form one *class*; a class-level stage type is (class, t). Every coefficient a type
carries is a value the cost model gives a stage of that type on *some* member machine, taken
at its most favourable member (times and traffic: the least; memory caps: the largest), so a
pipeline priced with class-level types is never slower, nor needs more devices of a class,
than the real one (docs/bounds.md [K1]). The numbers themselves are `Tables`' (the exact
models' tables, docs/formulation.md §1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.prices import spendable
from solvers.layered.exact.bounds import PipelineFloors
from solvers.layered.tables import Tables


@dataclass(frozen=True)
class ClassTypes:
    """Class-level stage types for one number of pipelines D (arrays over types i)."""

    pipelines: int  # D
    class_of_machine: np.ndarray  # [machine] → class index
    devices: np.ndarray  # [class] → devices in the class (the LP's right-hand side)
    cls: np.ndarray  # [i] class of type i
    tp: np.ndarray  # [i] t
    per_layer: np.ndarray  # [i] τ_layer: one layer's τ on the type
    head: np.ndarray  # [i] τ_head: the LM head's τ on the type
    receive: np.ndarray  # [i] least T_pp into the type (any sender, [B1])
    sync_layer: np.ndarray  # [i] floor of τ_dp(layer) when the type is a last stage ([B3]; 0 when D = 1)
    sync_head: np.ndarray  # [i] floor of τ_dp(head) (or the tied sync) on a last stage
    crossing_layer: np.ndarray  # [i] floor of τ_dp(layer) of a holder whose ring leaves its machine ([U9]; 0 when D = 1)
    crossing_head: np.ndarray  # [i] the same of the head (or the tied matrix)
    caps: np.ndarray  # [i, first, last] most layers that fit at q = 1 with D's memory
    layers: int  # L
    micro_batches: int  # B/b
    machine_size: np.ndarray  # [class] devices of its largest machine (a pipeline's usage spans ≥ ⌈u/size⌉ machines)
    hop: float  # least extra T_pp of a receiver whose sender is on another machine ([U3])
    machines: np.ndarray  # [class] machines in the class
    least_rent: np.ndarray  # [class] least rent per hour of one of its machines (NaN: unpriced) ([U6])
    device_price: np.ndarray  # [class] least price per device-hour of its machines (NaN: unpriced) ([P5])
    room: np.ndarray  # [class, z] Σ (count − D) over its z largest machines of ≥ D devices; −1 past them ([U10])
    # [U16]: every stage's sync floor times this in its pipeline's bubble (1/s where some pipeline has
    # s stages and none fewer; 0: the last stage's floor alone), and the fewest stages a pipeline has
    stage_sync_share: float = 0.0
    fewest_stages: int = 1

    @property
    def num_types(self) -> int:
        return len(self.tp)


def machine_classes(tables: Tables, by_gpu: bool = False) -> np.ndarray:
    """[machine] → class index: machines alike in every figure a stage on them reads (§3.1, §3.5);
    with `by_gpu`, machines alike in their GPU only (coarser classes, [K1] holds for any partition)."""
    cl = tables.cluster
    keys = list(zip(cl.machine_flops.tolist(), cl.machine_attention_flops.tolist(), cl.machine_memory_bytes.tolist()))
    if not by_gpu:
        keys = list(zip(keys, [m.count for m in cl.machines], cl.machine_intra_bw.tolist(),
                        cl.machine_intra_lat.tolist()))
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=int)


def class_types(tables: Tables, pipelines: int, by_gpu: bool = False) -> ClassTypes:
    """The class-level types of D = `pipelines`: each the most favourable of its machine-level
    types ([K1]); the floors of a last stage's sync are PipelineFloors' [B3] at D."""
    floors = PipelineFloors(tables, pipelines)
    crossing_layer, crossing_head = crossing_sync(tables, pipelines)
    sync_layer, sync_head = _cross_machine_sync(tables, pipelines, *floors._last_stage_sync(),
                                                crossing_layer, crossing_head)
    receive = floors._receive_floor()
    n_max = tables.n_max_for(pipelines)
    of_machine = machine_classes(tables, by_gpu)
    counts = np.array([m.count for m in tables.cluster.machines])
    keys = sorted({(int(of_machine[c.machine]), c.tp) for c in tables.types})
    rows = {k: [i for i, c in enumerate(tables.types) if (int(of_machine[c.machine]), c.tp) == k] for k in keys}
    pick = lambda arr, f: np.array([f(arr[rows[k]]) for k in keys])  # noqa: E731
    classes = range(int(of_machine.max()) + 1)
    size = np.array([counts[of_machine == k].max() for k in classes])
    machines = np.bincount(of_machine, minlength=len(classes))
    least_rent = np.array([tables.cluster.machine_rent[of_machine == k].min() for k in classes])
    device_price = np.array([tables.cluster.machine_prices[of_machine == k].min() for k in classes])
    devices = _affordable(np.bincount(of_machine, weights=counts).astype(int), size, machines, least_rent,
                          tables.budget)
    return ClassTypes(
        pipelines=pipelines, class_of_machine=of_machine, devices=devices,
        cls=np.array([k[0] for k in keys], dtype=int), tp=np.array([k[1] for k in keys], dtype=int),
        per_layer=pick(tables.tau_layer, np.min), head=pick(tables.tau_head, np.min),
        receive=pick(receive, np.min), sync_layer=pick(sync_layer, np.min), sync_head=pick(sync_head, np.min),
        crossing_layer=pick(np.maximum(sync_layer, crossing_layer), np.min),
        crossing_head=pick(np.maximum(sync_head, crossing_head), np.min),
        caps=np.array([n_max[rows[k], :, :, 1].max(axis=0) for k in keys], dtype=int),
        layers=tables.layers, micro_batches=tables.total_micro,
        machine_size=size, hop=_hop(tables, receive), machines=machines, least_rent=least_rent,
        device_price=device_price, room=_room(counts, of_machine, pipelines))


def _room(counts: np.ndarray, of_machine: np.ndarray, pipelines: int) -> np.ndarray:
    """[class, z]: the most devices beyond one per pipeline on z machines of the class that every
    one of D pipelines has a device of — Σ (count − D) over its z largest machines of ≥ D devices
    (z = 0 … the machines in the largest class; −1 past the class's machines of ≥ D devices) [U10]."""
    classes = int(of_machine.max()) + 1
    room = np.full((classes, np.bincount(of_machine).max() + 1), -1, dtype=int)
    for k in range(classes):
        spare = np.sort(counts[(of_machine == k) & (counts >= pipelines)] - pipelines)[::-1]
        room[k, :len(spare) + 1] = np.concatenate([[0], np.cumsum(spare)])
    return room


PER_TYPE = ("tp", "per_layer", "head", "receive", "sync_layer", "sync_head", "crossing_layer", "crossing_head",
            "caps")
PER_CLASS = ("devices", "machine_size", "machines", "least_rent", "device_price", "room")


def types_where(types: ClassTypes, keep: np.ndarray) -> ClassTypes:
    """`types` with only the types `keep` (a mask over types i); the classes stay as they are."""
    return replace(types, **{name: getattr(types, name)[keep] for name in PER_TYPE + ("cls",)})


def one_class(types: ClassTypes, k: int) -> ClassTypes:
    """`types` restricted to class k, renumbered as class 0 (its machines map to 0, the others
    to −1): the types a DP over that class's devices alone reads ([U12])."""
    keep = types.cls == k
    per_class = {name: getattr(types, name)[k:k + 1] for name in PER_CLASS}
    return replace(types_where(types, keep), **per_class, cls=np.zeros(int(keep.sum()), dtype=int),
                   class_of_machine=np.where(types.class_of_machine == k, 0, -1))


def range_types(tables: Tables, fewest: int, most: int, by_gpu: bool = False) -> ClassTypes:
    """Types that hold for every D in [fewest, most] at once ([P6]): each coefficient at its
    most favourable over the range (times and sync floors: the least; memory caps: the
    largest), `pipelines` = `most` (the LP's Σ x ≤ D row at its loosest)."""
    each = [class_types(tables, d, by_gpu) for d in range(fewest, most + 1)]
    low = lambda name: np.min([getattr(t, name) for t in each], axis=0)  # noqa: E731
    return replace(each[-1], pipelines=most, per_layer=low("per_layer"), head=low("head"),
                   receive=low("receive"), sync_layer=low("sync_layer"), sync_head=low("sync_head"),
                   crossing_layer=low("crossing_layer"), crossing_head=low("crossing_head"),
                   caps=np.max([t.caps for t in each], axis=0), hop=min(t.hop for t in each))


def _affordable(total: np.ndarray, size: np.ndarray, machines: np.ndarray, least_rent: np.ndarray,
                budget: float | None) -> np.ndarray:
    """[class] the most devices of each class a plan within the budget can use ([U6]): it rents
    at most budget / (the class's least rent) of its machines, each of at most its largest
    size (every device of the class without a budget). The usage tables' axes stop there."""
    if budget is None:
        return total
    affordable = np.minimum(np.floor(spendable(budget) / np.maximum(least_rent, 1e-300)), machines)
    return np.minimum(total, (size * affordable).astype(int))


def _cross_machine_sync(tables: Tables, pipelines: int, layer: np.ndarray, head: np.ndarray,
                        cross_layer: np.ndarray, cross_head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[c]: the sync floors of [B3] raised to the best *other* machine's link where the D
    holders cannot all sit on c's machine: they are D stages of D pipelines, c's takes t_c of
    its devices and every other ≥ 1, so D − 1 > count − t_c puts one on another machine M',
    and the ring's bw_min ≤ bw[M_c, M'], α_max ≥ lat[M_c, M'] [U4]; `cross_*` are `crossing_sync`'s."""
    cl = tables.cluster
    if pipelines < 2 or len(cl.machines) < 2:
        return layer, head
    outgrown = np.array([pipelines - 1 > cl.machines[c.machine].count - c.tp for c in tables.types])
    return (np.where(outgrown, np.maximum(layer, cross_layer), layer),
            np.where(outgrown, np.maximum(head, cross_head), head))


def crossing_sync(tables: Tables, pipelines: int) -> tuple[np.ndarray, np.ndarray]:
    """[c]: the all-reduce of one layer (and of the head, or the tied matrix) among D holders
    at the best link from c's machine to *another* and the least latency to another: the floor
    of a holder whose ring is known to leave its machine (0 with one machine or D = 1)."""
    cl = tables.cluster
    layer, head = np.zeros(len(tables.types)), np.zeros(len(tables.types))
    if pipelines < 2 or len(cl.machines) < 2:
        return layer, head
    bw, lat = cl.bw_matrix, cl.lat_matrix
    for i, c in enumerate(tables.types):
        others = np.delete(np.arange(len(cl.machines)), c.machine)
        fast = int(others[np.argmax(bw[c.machine, others])])
        close = int(others[np.argmin(lat[c.machine, others])])
        layer[i] = (tables.dp_bw_part(pipelines, tables.pseudo_params["layer"], c.tp, c.machine, fast)
                    + tables.dp_lat_part(pipelines, c.machine, close))
        if tables.tied:
            head[i] = tables.tied_bw_part(pipelines, c.tp, c.machine, fast) + tables.tied_lat_part(pipelines, c.machine, close)
        else:
            head[i] = (tables.dp_bw_part(pipelines, tables.pseudo_params["head"], c.tp, c.machine, fast)
                       + tables.dp_lat_part(pipelines, c.machine, close))
    return layer, head


def _hop(tables: Tables, receive: np.ndarray) -> float:
    """min over machine-level types c of (least T_pp into c from another machine − least T_pp
    into c from any machine): what a stage whose sender sits on another machine pays at least
    beyond its receive floor (0 on a one-machine cluster) [U3]."""
    link = tables.pp_link
    if link.shape[0] < 2:
        return 0.0
    cross = np.array([np.delete(link[:, c.machine], c.machine).min() + tables.pp_bcast[i]
                      for i, c in enumerate(tables.types)])
    return max(0.0, float((cross - receive).min()))
