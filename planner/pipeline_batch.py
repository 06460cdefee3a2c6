"""The 1F1B makespans of many pipelines at once (docs/cost-model.md §3.3): the rounds of
`planner.pipeline_rounds`, every pipeline and every stage in one numpy operation per step,
for the evaluator (a 1,024-GPU plan has dozens of pipelines; one at a time, in Python, they
would cost it three times what the rest of the evaluation does).

Pipelines of fewer stages are padded: a padded stage is never free (−∞) and takes no time;
the hop out of a pipeline's last stage carries nothing (its link is never free either).
A pipeline whose micro-batches run out sits out the remaining rounds. A stage's chain of
backwards in one round (each waits for the gradient of the stage after it) is a max-plus
scan: B_k = max(z_k, B_{k+1} + c_k) is max_{j ≥ k} (z_j + Σ_{k ≤ l < j} c_l), a cumulative
maximum; the warm-up's chain of forwards likewise, the other way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.pipeline_times import PipelineTimes


@dataclass(frozen=True)
class PaddedPipelines:
    """P pipelines' times as (P, S_max) arrays; hop k of a pipeline is stage k → k + 1."""

    forward: np.ndarray
    backward: np.ndarray
    send_forward: np.ndarray  # 0 where there is no hop
    send_backward: np.ndarray
    stages: np.ndarray  # S_p
    micro_batches: np.ndarray  # m_p

    @classmethod
    def of(cls, pipelines: list[PipelineTimes], micro_batches) -> PaddedPipelines:
        rows = np.repeat(np.arange(len(pipelines)), [p.stages for p in pipelines])
        sends = [np.append(p.send_forward, 0.0) for p in pipelines], [np.append(p.send_backward, 0.0) for p in pipelines]
        return cls.of_stages(rows, np.concatenate([p.forward for p in pipelines]),
                             np.concatenate([p.backward for p in pipelines]), np.concatenate(sends[0]),
                             np.concatenate(sends[1]), micro_batches)

    @classmethod
    def of_stages(cls, pipeline, forward, backward, send_forward, send_backward, micro_batches) -> PaddedPipelines:
        """From per-stage arrays listed pipeline by pipeline (`pipeline`: each stage's pipeline
        index); a stage's sends are those of the hop after it (ignored for a last stage)."""
        pipeline = np.asarray(pipeline)
        counts = np.bincount(pipeline)
        column = np.arange(len(pipeline)) - np.concatenate([[0], np.cumsum(counts)])[pipeline]
        arrays = [np.zeros((len(counts), int(counts.max()))) for _ in range(4)]
        for array, values in zip(arrays, (forward, backward, send_forward, send_backward)):
            array[pipeline, column] = values
        last = column == counts[pipeline] - 1
        arrays[2][pipeline[last], column[last]] = arrays[3][pipeline[last], column[last]] = 0.0
        return cls(*arrays, counts, np.asarray(micro_batches, dtype=np.int64))

    def subset(self, keep: np.ndarray) -> PaddedPipelines:
        """The pipelines where `keep` is true."""
        return PaddedPipelines(self.forward[keep], self.backward[keep], self.send_forward[keep],
                               self.send_backward[keep], self.stages[keep], self.micro_batches[keep])

    def row(self, p: int) -> PipelineTimes:
        s = int(self.stages[p])
        return PipelineTimes(self.forward[p, :s], self.backward[p, :s], self.send_forward[p, :s - 1],
                             self.send_backward[p, :s - 1])

    @property
    def hop(self) -> np.ndarray:
        return np.arange(self.forward.shape[1])[None, :] < self.stages[:, None] - 1

    @property
    def real(self) -> np.ndarray:
        return np.arange(self.forward.shape[1])[None, :] < self.stages[:, None]


def _scan_up(z: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """y_k = max(z_k, y_{k−1} + c_k) along axis 1 (the first y = z), given prefix = Σ_{l ≤ k} c_l:
    max over j ≤ k of z_j + Σ_{j < l ≤ k} c_l = max_j (z_j − prefix_j) + prefix_k."""
    return np.maximum.accumulate(z - prefix, axis=1) + prefix


def _scan_down(z: np.ndarray, suffix: np.ndarray) -> np.ndarray:
    """y_k = max(z_k, y_{k+1} + c_k) along axis 1 (the last y = z), given suffix = Σ_{l ≥ k} c_l:
    max over j ≥ k of z_j + Σ_{k ≤ l < j} c_l = max_j (z_j − suffix_j) + suffix_k."""
    return np.maximum.accumulate((z - suffix)[:, ::-1], axis=1)[:, ::-1] + suffix


@dataclass
class _Run:
    """The pipelines' state, and what every step reads of the times. `into` is one column
    wider than the stages: into[:, k] is when the link into stage k (from k − 1) is next
    free, which is also when its last transfer arrived (column 0: no link, −∞), and
    into[:, k + 1] is hop k's. `back[:, k]` is the link into stage k from k + 1."""

    pp: PaddedPipelines
    free: np.ndarray
    into: np.ndarray
    back: np.ndarray
    warm: np.ndarray  # w_k = min(S − k − 1, m): a stage runs warm-up forward j while j < w_k
    forward_until: np.ndarray  # it runs a forward in round r while r < m − w_k
    up: np.ndarray  # prefix sums of sf_{k−1} + f_k: the warm-up's chain of forwards
    down: np.ndarray  # suffix sums of sb_k + b_k over the hops: the chain of backwards

    @classmethod
    def start(cls, pp: PaddedPipelines) -> _Run:
        real, hop, rows = pp.real, pp.hop, len(pp.forward)
        stage = np.arange(pp.forward.shape[1])[None, :]
        warm = np.where(real, np.minimum(pp.stages[:, None] - stage - 1, pp.micro_batches[:, None]), 0)
        sent_in = np.concatenate([np.zeros((rows, 1)), pp.send_forward[:, :-1]], axis=1)
        down = np.where(hop, pp.send_backward + pp.backward, 0.0)
        return cls(pp, np.where(real, 0.0, -np.inf),
                   np.concatenate([np.full((rows, 1), -np.inf), np.where(hop, 0.0, -np.inf)], axis=1),
                   np.where(hop, 0.0, -np.inf), warm,
                   np.where(real, pp.micro_batches[:, None] - warm, 0), np.cumsum(sent_in + pp.forward, axis=1),
                   np.cumsum(down[:, ::-1], axis=1)[:, ::-1])

    def warm_up_step(self, j: int) -> None:
        """Warm-up forward j on the stages with w_k > j, each fed by the one before in this
        step: F_k = max(free_k + f_k, link_k + sf_{k−1} + f_k, F_{k−1} + sf_{k−1} + f_k)."""
        pp, active = self.pp, j < self.warm
        sent_in = np.diff(self.up, axis=1, prepend=0.0) - pp.forward
        z = np.where(active, np.maximum(self.free, self.into[:, :-1] + sent_in) + pp.forward, -np.inf)
        ends = _scan_up(z, self.up)
        np.copyto(self.free, ends, where=active)
        np.copyto(self.into[:, 1:], np.maximum(ends, self.into[:, 1:]) + pp.send_forward, where=active)

    def round(self, r: int) -> None:
        """Round r: forward r + w_k on each stage still in its pairs (fed by the round before),
        then backward r on every stage of the pipelines that have a micro-batch r, last to
        first: B_k = max(free_k + b_k, back_k + sb_k + b_k, B_{k+1} + sb_k + b_k)."""
        pp = self.pp
        forwarding = r < self.forward_until
        ends = np.maximum(self.free, self.into[:, :-1]) + pp.forward
        np.copyto(self.free, ends, where=forwarding)
        np.copyto(self.into[:, 1:], np.maximum(ends, self.into[:, 1:]) + pp.send_forward,
                  where=forwarding & pp.hop)
        backing = r < pp.micro_batches[:, None]
        ends = _scan_down(np.maximum(self.free, self.back + pp.send_backward) + pp.backward, self.down)
        np.copyto(self.back[:, :-1], np.maximum(ends[:, 1:], self.back[:, :-1]) + pp.send_backward[:, :-1],
                  where=backing & pp.hop[:, :-1])
        np.copyto(self.free, ends, where=backing & pp.real)


def one_f_one_b_makespans(pp: PaddedPipelines) -> np.ndarray:
    """Each pipeline's 1F1B makespan: its warm-up steps, then max_p m_p rounds (a pipeline
    with fewer micro-batches sits the rest out). Costs O(max m) numpy steps: for pipelines of
    many micro-batches `planner.pipeline_rounds` jumps over the steady state instead."""
    run = _Run.start(pp)
    for j in range(int(run.warm.max())):
        run.warm_up_step(j)
    for r in range(int(pp.micro_batches.max())):
        run.round(r)
    return run.free.max(axis=1)
