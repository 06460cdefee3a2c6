"""[M17] of the MILP (docs/formulation.md §2.2): a tied model's shared embedding sync.

The all-reduce of docs/cost-model.md §3.4 over the first and the last stage of every
pipeline (one stage where S_p = 1), priced even when D = 1: τ_tied = F + G as in [M11], with
the holder indicators taken over those stages and the holder count n = D + Σ_p [S_p ≥ 2]
read through step indicators [n ≥ k]. Like every MILP variable, each is only bounded from
below and can take its exact value, and every one only raises T, so the optimum takes them
at their values.

The functions take the `MilpBuilder` of one model (its `tb`, `d`, `unit`, `P`, `K`, `add`,
`bin`, `cont` and `on_machine`), so that the builder's module stays a readable size.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulp


@dataclass(frozen=True)
class TiedVars:
    """[M17]: a tied model's shared sync over the first and last stage of every pipeline."""

    several: dict  # p → [S_p ≥ 2] (binary, ≥ every β of p)
    at_least: dict  # k → [n ≥ k] (binary), k = D+1..2D
    last_only: dict  # (p, M) → p's last stage is on M and is not its first stage
    on_machine: dict  # M → M holds a holder stage
    on_machine_twice: dict  # M → M holds two holder stages (binary)
    tp_occurs: dict  # t → some holder stage has TP size t
    bandwidth: pulp.LpVariable  # F_tied
    latency: pulp.LpVariable  # G_tied


def tied_sync(b, layout) -> TiedVars:
    """[M17] the holders' indicators, then F_tied and G_tied ≥ each pair's part at each n."""
    d, big_l = b.d, b.tb.layers
    several = {p: b.bin(f"multi_{p}") for p in b.P}
    for p in b.P:
        for l in range(1, big_l):
            b.add(several[p] >= layout.beta[p, l])
    at_least = {k: b.bin(f"tn_{k}") for k in range(d + 1, 2 * d + 1)}
    for k, v in at_least.items():  # n = D + Σ several ≥ k forces [n ≥ k] = 1
        b.add(d * v >= pulp.lpSum(several.values()) - (k - d) + 1)
    tied = TiedVars(several=several, at_least=at_least, last_only={}, on_machine={}, on_machine_twice={},
                    tp_occurs={}, bandwidth=b.cont("tied_F"), latency=b.cont("tied_G"))
    _holders(b, layout.z, tied)
    for k in range(d, 2 * d + 1):
        step = 0 if k == d else at_least[k] - 1  # 0 when n ≥ k, else −1
        _latency_rows(b, k, step, tied)
        _bandwidth_rows(b, k, step, tied)
    return tied


def _holders(b, z: dict, tied: TiedVars) -> None:
    """Machine M holds a holder stage (h1), two of them (h2), TP size t occurs among them."""
    tb, big_l = b.tb, b.tb.layers
    ends = sorted({0, big_l - 1})
    for k in b.K:
        one = tied.on_machine[k] = b.cont(f"th1_{k}", 0, 1)
        for p in b.P:
            for l in ends:
                b.add(one >= b.on_machine(z, p, l, k))
            if big_l > 1:  # the last stage is a second holder only when S_p ≥ 2
                v = tied.last_only[p, k] = b.cont(f"tlo_{p}_{k}", 0, 1)
                b.add(v >= b.on_machine(z, p, big_l - 1, k) + tied.several[p] - 1)
        two = tied.on_machine_twice[k] = b.bin(f"th2_{k}")
        count = pulp.lpSum(b.on_machine(z, p, 0, k) + tied.last_only.get((p, k), 0) for p in b.P)
        b.add((2 * b.d - 1) * two >= count - 1)
    for t in tb.tp_values:
        g = tied.tp_occurs[t] = b.cont(f"tt_{t}", 0, 1)
        for p in b.P:
            for l in ends:
                for c in b.C:
                    if tb.types[c].tp == t:
                        b.add(g >= z[p, l, c])


def _pair_part(part, m1: int, m2: int) -> float:
    """The larger of a pair's two orders (the evaluator reads every ordered pair)."""
    return max(part(m1, m2), part(m2, m1))


def _latency_rows(b, k: int, step, tied: TiedVars) -> None:
    """G_tied ≥ tied_lat_part(k, M1, M2) when both hold a holder stage and n ≥ k."""
    tb, u, one, two = b.tb, b.unit, tied.on_machine, tied.on_machine_twice
    for k1 in b.K:
        part = tb.tied_lat_part(k, k1, k1) / u
        if part > 0:
            b.add(tied.latency >= part * (two[k1] + step))
        for k2 in range(k1 + 1, tb.num_machines):
            part = _pair_part(lambda a, c: tb.tied_lat_part(k, a, c), k1, k2) / u
            if part > 0:
                b.add(tied.latency >= part * (one[k1] + one[k2] - 1 + step))


def _bandwidth_rows(b, k: int, step, tied: TiedVars) -> None:
    """F_tied ≥ tied_bw_part(k, t, M1, M2) when TP t occurs, both machines hold a holder
    stage and n ≥ k."""
    tb, u, one, two = b.tb, b.unit, tied.on_machine, tied.on_machine_twice
    for t in tb.tp_values:
        g = tied.tp_occurs[t]
        for k1 in b.K:
            part = tb.tied_bw_part(k, t, k1, k1) / u
            if part > 0:
                b.add(tied.bandwidth >= part * (g + two[k1] - 1 + step))
            for k2 in range(k1 + 1, tb.num_machines):
                part = _pair_part(lambda a, c: tb.tied_bw_part(k, t, a, c), k1, k2) / u
                if part > 0:
                    b.add(tied.bandwidth >= part * (g + one[k1] + one[k2] - 2 + step))
