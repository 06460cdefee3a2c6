"""[U12] Layers aligned across the pipelines, below a level of T_dp (docs/bounds.md §6).

A layer whose D holders do not all sit on one machine *crosses*: each holder's ring leaves its
machine, so it syncs that layer at least at its type's crossing floor ([U9]), and T_dp, the
largest sum of syncs of any stage, is at least that floor times the crossing layers the stage
holds. So where T_dp < ω every stage σ holds at most c_σ = ⌊ω / crossing_layer(σ)⌋ crossing
layers (n·floor < ω, to 10⁻⁹ lenient), and every pipeline holds the same crossing layers, at
most x = ⌊⌊N/D⌋ · max c/t⌋ of them (the pipeline with the fewest devices has at most ⌊N/D⌋,
each holding at most c/t).

Every other layer is *local*: its D holders share one machine, so in every pipeline it sits on a
stage of that machine's class. The local layers per class, λ_k, are therefore the same for all
pipelines, and pipeline p holds λ_k + x_{p,k} layers on class k with Σ_k x_{p,k} = x. A relaxed
pipeline is then a set of stages per class (each stage is on one machine, so in one class),
whose bubble is the sum of the classes' parts: the DP of [U1] run per class on the layers of
that class alone, with the first and the last stage in one of them. Where T_dp lies in
[ω_lo, ω_hi), the bubble is at least max(its own, the bare one + ω_lo) (T ≥ T_pipe + T_dp), the
stages hold at most c_σ(ω_hi) crossing layers, and for every λ with Σ λ_k = L − x the integer
programme of [U2] over the capacities of such pipelines must fail to reach B/b. (More crossing
layers only loosen the pipelines, so x at its largest covers every smaller count.)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.layered.bound import integer
from solvers.layered.bound.classes import ClassTypes, one_class
from solvers.layered.bound.usage import TABLE_SLACK, hop_floor, stage_sets

# role → (holds the first stage, holds the last stage); "both" also covers a single stage
ROLES = {"middle": (False, False), "first": (True, False), "last": (False, True), "both": (True, True)}
MAX_CROSSING = 6  # more crossing layers than this: not tried (the λ and their spreads grow fast)

Parts = list[dict[str, np.ndarray]]  # per class, per role: [K, L+1, N_k+1] least bubble share


@dataclass
class AlignedTest:
    """[U12] for one D: per class and role, the least bubble share of its stages (with D's
    last-stage sync floors, and bare)."""

    types: ClassTypes
    b: np.ndarray
    micro: int
    own: Parts
    bare: Parts
    hops: np.ndarray  # [*usage] (machines spanned − 1)·hop, as the usage tables add ([U3])
    deadline: float = float("inf")  # perf_counter: past it a test refutes nothing (still a bound)
    hint: dict = field(default_factory=dict)  # interval → the λ that held last

    @classmethod
    def of(cls, types: ClassTypes, b: np.ndarray, micro: int, deadline: float = float("inf")) -> AlignedTest:
        bare = replace(types, sync_layer=np.zeros_like(types.sync_layer), sync_head=np.zeros_like(types.sync_head))
        return cls(types=types, b=b, micro=micro, own=class_parts(types, b), bare=class_parts(bare, b),
                   hops=hop_floor(types).astype(np.float32), deadline=deadline)

    def crossing_allowance(self, ceiling: float) -> int:
        """x: the most crossing layers a plan with T_dp < `ceiling` has (module docstring)."""
        t = self.types
        # no crossing floor (one machine): no layer can cross
        held = [int(np.floor(ceiling / c * (1 + 1e-9))) / tp if c > 0 else 0.0  # [U11]'s caps, as lenient
                for c, tp in zip(t.crossing_layer, t.tp)]
        fewest = int(t.devices.sum()) // t.pipelines
        return int(min(t.layers, np.floor(fewest * max(held) + 1e-9)))

    def refuted(self, threshold: float, floor: float, ceiling: float) -> bool:
        """True when no plan with D pipelines, T ≤ threshold and T_dp in [floor, ceiling) exists."""
        t = self.types
        extra = self.crossing_allowance(ceiling)
        if t.pipelines < 2 or extra > MAX_CROSSING or time.perf_counter() > self.deadline:
            return False
        open_counts = [[n for n in range(t.layers + 1) if self._class_open(k, n, extra, threshold, floor)]
                       for k in range(len(t.devices))]
        layouts = [lam for lam in itertools.product(*open_counts) if sum(lam) == t.layers - extra]
        key = (floor, ceiling)
        layouts.sort(key=lambda lam: lam != self.hint.get(key))  # the layout that held last, first
        for lam in layouts:
            if time.perf_counter() > self.deadline or not self._layout_refuted(lam, extra, threshold, floor):
                self.hint[key] = lam
                return False
        return True

    def _class_open(self, k: int, local: int, extra: int, threshold: float, floor: float) -> bool:
        """Whether class k alone (the others' bubble taken as 0) leaves λ_k = `local` open: a
        necessary condition of every layout with it, and cheap (one class's usage axis)."""
        span = slice(local, local + extra + 1)
        own = np.min([part[:, span, :].min(axis=1) for part in self.own[k].values()], axis=0)
        bare = np.min([part[:, span, :].min(axis=1) for part in self.bare[k].values()], axis=0)
        dims = (int(self.types.devices[k]) + 1,)
        return not self._reach_refuted(own, bare, dims, threshold, floor)

    def _layout_refuted(self, local: tuple[int, ...], extra: int, threshold: float, floor: float) -> bool:
        own, bare = _bubbles(self.own, local, extra), _bubbles(self.bare, local, extra)
        dims = tuple(int(n) + 1 for n in self.types.devices)
        return self._reach_refuted(own + self.hops[None], bare + self.hops[None], dims, threshold, floor)

    def _reach_refuted(self, own: np.ndarray, bare: np.ndarray, dims: tuple[int, ...], threshold: float,
                       floor: float) -> bool:
        """[U2] on the capacities of bubbles [K, *usage]: max(own, bare + floor) + (m − 1)·b ≤ threshold."""
        # float32 sums, deflated like the usage tables
        least = np.maximum(own, bare + np.float32(floor)).reshape(len(self.b), -1) * np.float32(1 - TABLE_SLACK)
        return integer.runs_refuted(self.b, least, dims, threshold, self.types.pipelines, self.micro)


def _bubbles(parts: Parts, local: tuple[int, ...], extra: int) -> np.ndarray:
    """[K, *usage]: the least bubble of a pipeline holding local[k] + x_k layers on class k
    (Σ x_k = extra), with exactly one first and one last stage: a DP over the classes whose
    state is (first placed, last placed, crossing layers placed). The last class only closes
    states (its role and x are then forced): the full-size arrays are built once per state."""
    states = {(False, False, 0): np.zeros(parts[0]["middle"].shape[:1], dtype=np.float32)}
    for k, part in enumerate(parts[:-1]):
        grown: dict[tuple[bool, bool, int], np.ndarray] = {}
        for (first, last, placed), acc in states.items():
            for role, (has_first, has_last) in ROLES.items():
                if (first and has_first) or (last and has_last):
                    continue
                for x in range(min(extra - placed, part[role].shape[1] - 1 - local[k]) + 1):
                    key = (first or has_first, last or has_last, placed + x)
                    total = _outer(acc, part[role][:, local[k] + x, :])
                    grown[key] = total if key not in grown else np.minimum(grown[key], total)
        states = grown
    return _closed_by_last_class(states, parts, local, extra)


def _closed_by_last_class(states: dict[tuple[bool, bool, int], np.ndarray], parts: Parts, local: tuple[int, ...],
            extra: int) -> np.ndarray:
    """The last class's step of `_bubbles`, kept to the states it completes: the roles it still
    lacks and the crossing layers still unplaced are its own."""
    last_part, n = parts[-1], local[-1]
    result = None
    for (first, last, placed), acc in states.items():
        role = next(r for r, has in ROLES.items() if has == (not first, not last))
        x = extra - placed
        if n + x > last_part[role].shape[1] - 1:
            continue
        total = _outer(acc, last_part[role][:, n + x, :])
        result = total if result is None else np.minimum(result, total)
    if result is None:
        dims = tuple(part["middle"].shape[2] for part in parts)
        return np.full(parts[0]["middle"].shape[:1] + dims, np.inf, dtype=np.float32)
    return result


def _outer(acc: np.ndarray, share: np.ndarray) -> np.ndarray:
    """acc [K, *u] + share [K, u_k] as [K, *u, u_k]: one more class's usage axis."""
    return acc[..., None] + share.reshape(share.shape[:1] + (1,) * (acc.ndim - 1) + share.shape[1:])


def class_parts(types: ClassTypes, b: np.ndarray) -> Parts:
    """Per class, per role: [K, L+1, N_k+1] the least bubble share of a set of that class's stages
    covering n layers with exactly u devices, every τ ≤ b (inf: none): `usage.stage_sets` on the
    class alone."""
    return [stage_sets(one_class(types, k), b) for k in range(len(types.devices))]
