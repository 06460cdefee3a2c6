"""The pricing problem of the configuration bound (docs/bounds.md §2–§3): over *relaxed
pipelines* — a multiset of class-level stages with layer counts, one of them first and one
last — the least `π·usage + λ·bubble` among those whose every stage time is ≤ b, for every
breakpoint b at once (arrays over b).

A relaxed pipeline's *bubble* is Σ_k τ_k + Σ_{k not first} receive + the last stage's sync
floor ([B3]); its steady term is (m − 1)·b where b = max_k τ_k. Middle stages are
interchangeable, so the least cost of the middle stages that cover ℓ layers is a plain
dynamic programme over ℓ with, for each layer count n, the cheapest middle stage of n
layers (docs/bounds.md [P1]); the first and the last stage are added around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.layered.bound.classes import ClassTypes

ROLES = ("middle", "first", "last", "single")  # (first, last) = (0,0), (1,0), (0,1), (1,1)
_ROLE_FLAGS = {"middle": (0, 0), "first": (1, 0), "last": (0, 1), "single": (1, 1)}
SLACK = 1e-9  # relative: a stage of exactly b still counts as ≤ b after float division


def breakpoints(types: ClassTypes, top: float) -> np.ndarray:
    """Every value a stage time n·τ_layer (+ τ_head) can take up to `top`: the steady
    term's max_k τ_k is one of them ([P2])."""
    n = np.arange(1, types.layers + 1)
    plain = (n[None, :] * types.per_layer[:, None]).ravel()
    headed = (n[None, :] * types.per_layer[:, None] + types.head[:, None]).ravel()
    values = np.unique(np.concatenate([plain, headed]))
    return values[values <= top]


@dataclass(frozen=True)
class StageCosts:
    """For every breakpoint k, role and layer count n: the cheapest type (cost, index)."""

    cost: dict  # role → [K, L + 1] (inf where no type fits; n = 0 is inf)
    arg: dict | None  # role → [K, L + 1] type index (None where only the costs were asked for)


@dataclass(frozen=True)
class StageFrame:
    """What the stage costs of one set of breakpoints share whatever the prices: per role, each
    type's bubble share per layer count and where a stage cannot be (n = 0, τ > b, memory)."""

    contribution: dict  # role → [i, L + 1]
    blocked: dict  # role → [K, i, L + 1] bool

    @classmethod
    def of(cls, types: ClassTypes, b: np.ndarray) -> StageFrame:
        n = np.arange(types.layers + 1)[None, None, :]
        blocked = {role: (n < 1) | (n > layer_limits(types, b, role)[:, :, None]) for role in ROLES}
        return cls(contribution={role: stage_contribution(types, role) for role in ROLES}, blocked=blocked)

    def rows(self, keep: np.ndarray) -> StageFrame:
        """The frame of some of its breakpoints."""
        return StageFrame(contribution=self.contribution, blocked={r: m[keep] for r, m in self.blocked.items()})


def layer_limits(types: ClassTypes, b: np.ndarray, role: str) -> np.ndarray:
    """[K, i] most layers a stage of type i in `role` may hold with τ ≤ b and within memory."""
    first, last = _ROLE_FLAGS[role]
    room = b[:, None] - (types.head[None, :] if last else 0.0)
    by_time = np.floor(room / types.per_layer[None, :] * (1 + SLACK))
    return np.clip(np.minimum(by_time, types.caps[None, :, first, last]), 0, types.layers).astype(int)


def stage_contribution(types: ClassTypes, role: str) -> np.ndarray:
    """[i, n] a stage's share of the bubble: n·τ_layer (+ receive unless first) (+ head and the
    last stage's sync floors if last) — with a `stage_sync_share` σ > 0, every stage's sync floors
    times σ instead of the last one's ([U16])."""
    first, last = _ROLE_FLAGS[role]
    n = np.arange(types.layers + 1)[None, :]
    share = types.stage_sync_share
    per = types.per_layer + (share * types.sync_layer if share > 0 else (types.sync_layer if last else 0.0))
    head_sync = share * types.sync_head if share > 0 else types.sync_head
    fixed = (0.0 if first else types.receive) + ((types.head + head_sync) if last else 0.0)
    return n * per[:, None] + np.asarray(fixed)[..., None] * np.ones_like(n)


def stage_costs(types: ClassTypes, b: np.ndarray, price: np.ndarray, lam: np.ndarray,
                frame: StageFrame | None = None, with_arg: bool = True) -> StageCosts:
    """π·t + λ·contribution of the cheapest type per (breakpoint, role, n); `frame`: this b's
    StageFrame when the caller prices it at many (π, λ)."""
    frame = frame or StageFrame.of(types, b)
    device = price[types.cls] * types.tp  # [i]
    cost, arg = {}, ({} if with_arg else None)
    for role in ROLES:
        total = np.multiply.outer(lam, frame.contribution[role])  # [K, i, n]
        total += device[None, :, None]
        np.copyto(total, np.inf, where=frame.blocked[role])
        if with_arg:
            arg[role] = total.argmin(axis=1)
            cost[role] = np.take_along_axis(total, arg[role][:, None, :], axis=1)[:, 0, :]
        else:
            cost[role] = total.min(axis=1)
    return StageCosts(cost=cost, arg=arg)


@dataclass(frozen=True)
class Priced:
    """The least cost per breakpoint and what is needed to read one pipeline back."""

    value: np.ndarray  # [K] least π·usage + λ·bubble (inf: no relaxed pipeline fits)
    costs: StageCosts
    middle: np.ndarray  # [K, ℓ] least middle-stage cost covering ℓ layers
    middle_n: np.ndarray  # [K, ℓ] layers of the last middle stage added there (0: none)


def price(types: ClassTypes, b: np.ndarray, price_per_device: np.ndarray, lam: np.ndarray,
          frame: StageFrame | None = None, with_arg: bool = True) -> Priced:
    """[P1]: min over relaxed pipelines with every τ ≤ b of π·usage + λ·bubble, for every b
    (`with_arg=False`: the values only, no pipeline can be read back)."""
    big_l = types.layers
    costs = stage_costs(types, b, price_per_device, lam, frame, with_arg)
    mid = costs.cost["middle"]
    middle = np.full((len(b), big_l + 1), np.inf)
    middle_n = np.zeros((len(b), big_l + 1), dtype=int)
    middle[:, 0] = 0.0
    for ell in range(1, big_l + 1):
        cand = middle[:, ell - 1::-1][:, :ell] + mid[:, 1:ell + 1]  # n = 1..ℓ
        if with_arg:
            middle_n[:, ell] = cand.argmin(axis=1) + 1
        middle[:, ell] = cand.min(axis=1)
    value = np.minimum(costs.cost["single"][:, big_l], _ends(costs, middle, big_l, with_arg)[0])
    return Priced(value=value, costs=costs, middle=middle, middle_n=middle_n)


def _ends(costs: StageCosts, middle: np.ndarray, big_l: int,
          with_arg: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least first + middle + last over the first's and the last's layer counts: (value,
    n_first, n_last) per breakpoint (the counts 0 without `with_arg`)."""
    first, last = costs.cost["first"], costs.cost["last"]
    k = first.shape[0]
    best, n1, n2 = np.full(k, np.inf), np.zeros(k, dtype=int), np.zeros(k, dtype=int)
    for a in range(1, big_l):
        rest = big_l - a  # layers for the middle and the last stage
        cand = first[:, a][:, None] + middle[:, rest - 1::-1][:, :rest] + last[:, 1:rest + 1]  # last gets 1..rest
        if not with_arg:
            np.minimum(best, cand.min(axis=1), out=best)
            continue
        pick = cand.argmin(axis=1)
        val = cand[np.arange(k), pick]
        better = val < best
        best, n1, n2 = np.where(better, val, best), np.where(better, a, n1), np.where(better, pick + 1, n2)
    return best, n1, n2


@dataclass(frozen=True)
class Column:
    """A relaxed pipeline as the master LP sees it."""

    usage: tuple[int, ...]  # devices per class
    bubble: float  # Σ τ + Σ receive + the last stage's sync floor
    steady: float  # max_k τ_k
    stages: tuple[tuple[int, int], ...]  # (type index, layers), first stage first, last stage last

    def capacity(self, threshold: float, most: int) -> int:
        """The most micro-batches it runs within `threshold`: bubble + (m − 1)·steady ≤ threshold."""
        if self.bubble > threshold:
            return 0
        return int(min(most, np.floor((threshold - self.bubble) / self.steady * (1 + SLACK)) + 1))


def read_column(types: ClassTypes, priced: Priced, k: int) -> Column | None:
    """The relaxed pipeline behind breakpoint k's least value (None if none fits)."""
    big_l, costs = types.layers, priced.costs
    if not np.isfinite(priced.value[k]):
        return None
    if costs.cost["single"][k, big_l] <= priced.value[k]:
        stages = [(int(costs.arg["single"][k, big_l]), big_l, "single")]
    else:
        one = {r: (costs.cost[r][k:k + 1], costs.arg[r][k:k + 1]) for r in ROLES}
        _, n1, n2 = _ends(StageCosts(cost={r: v[0] for r, v in one.items()}, arg={r: v[1] for r, v in one.items()}),
                          priced.middle[k:k + 1], big_l)
        a, z = int(n1[0]), int(n2[0])
        stages = [(int(costs.arg["first"][k, a]), a, "first")]
        ell = big_l - a - z
        while ell > 0:
            n = int(priced.middle_n[k, ell])
            stages.append((int(costs.arg["middle"][k, n]), n, "middle"))
            ell -= n
        stages.append((int(costs.arg["last"][k, z]), z, "last"))
    return _column(types, stages)


def _column(types: ClassTypes, stages: list[tuple[int, int, str]]) -> Column:
    usage = np.zeros(len(types.devices), dtype=int)
    bubble, steady = 0.0, 0.0
    for i, n, role in stages:
        usage[types.cls[i]] += types.tp[i]
        bubble += float(stage_contribution(types, role)[i, n])
        steady = max(steady, n * types.per_layer[i] + (types.head[i] if _ROLE_FLAGS[role][1] else 0.0))
    return Column(usage=tuple(int(u) for u in usage), bubble=bubble, steady=steady,
                  stages=tuple((i, n) for i, n, _ in stages))
