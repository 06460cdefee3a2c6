"""CP-SAT's integer time unit (docs/formulation.md §2.1, "time units"): the finest unit that
keeps T's domain small enough for CP-SAT, and every cost coefficient and domain top in it,
computed once per model. Rounding every coefficient down keeps the model's T within
`error_units` units below the true T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers.layered.exact.subproblem import SubProblem

FINEST_ROUNDING = 1e-8  # rounding error of T relative to the trivial lower bound, at best
# CP-SAT misjudged optimality (claimed a worse plan optimal) when T's domain reached 2^33 units
# (fine at 2^30) and searches slowly on huge domains: the unit is coarsened until T's domain,
# [0, incumbent] when there is one, is below 2^26
LARGEST_T_UNITS = 2**26
DP_KINDS = ("layer", "emb", "head")  # the layer and the pseudo-layers of §3.4
# With a cutoff, no coefficient above max(this, the cutoff + 2) units: a larger one belongs only to
# plans slower than the cutoff, which `total ≤ cutoff` excludes clipped or not; unclipped ones (an
# unused link of 1,000 s latency beside a 10 µs plan) made domain tops past int64, which CP-SAT
# refused (a TypeError that also stopped the heuristic's exact refinement)
COEFFICIENT_CAP = 4 * LARGEST_T_UNITS


# -- time units: every coefficient and every domain top, computed once per model ------------
@dataclass(frozen=True)
class TimeScale:
    """The integer time unit (seconds per unit) and the cost tables and domain tops in it."""

    unit: float
    error_units: int  # floored coefficients one plan's T adds up (each loses < 1 unit)
    tau_layer: tuple[int, ...]  # [c]
    tau_head: tuple[int, ...]  # [c]
    link: tuple[int, ...]  # [M·K + M']: T_pp's link part
    bcast: tuple[int, ...]  # [c']: T_pp's broadcast part
    dp_bw: dict[str, tuple[int, ...]]  # kind → [(M1·K + M2)·|T| + index of t_min]
    dp_lat: tuple[int, ...]  # [M1·K + M2]
    tied_bw: tuple[int, ...]  # [((n − D)·K² + M1·K + M2)·|T| + index of t_min]: the tied sync's [C16]
    tied_lat: tuple[int, ...]  # [(n − D)·K² + M1·K + M2], n = D..2D holders (empty if untied)
    r_top: int  # any τ_σ or T_pp
    bubble_top: int
    steady_top: int
    dp_top: int
    t_top: int

    def units(self, seconds: float) -> int:
        return int(math.floor(seconds / self.unit))


def time_scale(sub: SubProblem) -> TimeScale:
    """The finest unit that keeps T's domain (up to the cutoff) below LARGEST_T_UNITS."""
    error = _error_units(sub)
    unit = FINEST_ROUNDING * sub.tables.trivial_bound / error
    top = _scaled(sub, unit, error).t_top
    if sub.cutoff is not None:
        top = min(top, sub.cutoff / unit + 1)
    if top > LARGEST_T_UNITS:
        unit *= top / LARGEST_T_UNITS
    cap = None if sub.cutoff is None else max(COEFFICIENT_CAP, math.ceil(sub.cutoff / unit) + 2)
    return _scaled(sub, unit, error, cap)


def _error_units(sub: SubProblem) -> int:
    tb, big_l = sub.tables, sub.tables.layers
    steady = (tb.total_micro - sub.pipelines) * (big_l + 1)
    return (big_l + 1) + 2 * (sub.max_stages - 1) + steady + 2 * (big_l + 2)


def _scaled(sub: SubProblem, unit: float, error: int, cap: int | None = None) -> TimeScale:
    tb, d, big_l, nk = sub.tables, sub.pipelines, sub.tables.layers, sub.tables.num_machines

    def units(seconds: float) -> int:
        whole = int(math.floor(seconds / unit))
        return whole if cap is None else min(whole, cap)

    pairs = [(a, b) for a in range(nk) for b in range(nk)]
    t1, th = tuple(map(units, tb.tau_layer)), tuple(map(units, tb.tau_head))
    link = tuple(units(tb.pp_link[a, b]) for a, b in pairs)
    bcast = tuple(map(units, tb.pp_bcast))
    dp_bw = {kind: tuple(units(tb.dp_bw_part(d, tb.pseudo_params[kind], t, a, b)) if d > 1 else 0
                         for a, b in pairs for t in tb.tp_values) for kind in DP_KINDS}
    dp_lat = tuple(units(tb.dp_lat_part(d, a, b)) if d > 1 else 0 for a, b in pairs)
    tied_bw, tied_lat = _tied_tables(sub, units)
    tau_top = max(big_l * a + b for a, b in zip(t1, th))
    pp_top = max(link) + max(bcast)
    r_top = max(tau_top, pp_top)
    bubble_top, steady_top = tau_top + (big_l - 1) * pp_top, (tb.total_micro - d) * r_top
    dp_top = (big_l + 2) * (max(max(t) for t in (*dp_bw.values(), tied_bw)) + max(dp_lat + tied_lat))
    return TimeScale(unit=unit, error_units=error, tau_layer=t1, tau_head=th, link=link, bcast=bcast,
                     dp_bw=dp_bw, dp_lat=dp_lat, tied_bw=tied_bw, tied_lat=tied_lat, r_top=r_top, bubble_top=bubble_top,
                     steady_top=steady_top, dp_top=dp_top, t_top=bubble_top + steady_top + dp_top)


def _tied_tables(sub: SubProblem, units) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tied model's sync parts for n = D..2D holders, every machine pair (each the larger of
    its two orders, as the evaluator reads every ordered pair) and every t_min [C16]."""
    tb, d, nk = sub.tables, sub.pipelines, sub.tables.num_machines
    if not tb.tied:
        return (0,), (0,)
    holders = range(d, 2 * d + 1)
    pairs = [(a, b) for a in range(nk) for b in range(nk)]
    bw = tuple(units(max(tb.tied_bw_part(n, t, a, b), tb.tied_bw_part(n, t, b, a)))
               for n in holders for a, b in pairs for t in tb.tp_values)
    lat = tuple(units(max(tb.tied_lat_part(n, a, b), tb.tied_lat_part(n, b, a))) for n in holders for a, b in pairs)
    return bw, lat
