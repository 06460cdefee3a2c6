"""[C16] of the CP-SAT model (docs/formulation.md §2.1): a tied model's shared embedding sync.

With `tied_embeddings` the embedding and the head are one matrix whose copies, on the first
and the last stage of every pipeline, are summed by one all-reduce over all of them
(docs/cost-model.md §3.4): n = D + Σ_p [S_p ≥ 2] holders (a one-stage pipeline holds it
once), t_min, bw_min and α_max over every pair of holder stages, a pipeline's own first and
last included, priced even when D = 1. τ_tied = F + G as in [C11], with the n of the plan
as one more index of the look-up tables (`cpsat_units`). Every holder stage counts it once.

The functions take the `CpSatBuilder` of one model (its `model`, `scale`, `tb`, `d`, `P`,
`nk` and `int_var`), so that the builder's module stays a readable size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model


@dataclass(frozen=True)
class TiedVars:
    """[C16]: a tied model's shared sync over the first and last stage of every pipeline."""

    several: dict  # p → S_p ≥ 2 (the last stage is a second holder)
    holders: cp_model.IntVar  # n − D = Σ_p several[p]
    t_min: cp_model.IntVar  # index of the smallest TP size among the holders
    bandwidth: cp_model.IntVar  # F: the largest bandwidth part over pairs of holders
    latency: cp_model.IntVar  # G: the largest latency part over pairs of holders


def tied_sync(b, layout) -> TiedVars:
    """[C16] τ_tied = F + G: n = D + Σ_p [S_p ≥ 2] holders, t_min over the first and last
    stages, and for every pair of holder slots (first/last of each pipeline; a pipeline's own
    pair only when S_p ≥ 2) Element look-ups at (n − D, machine pair, t_min)."""
    model, sc, big_l = b.model, b.scale, b.tb.layers
    several = {}
    for p in b.P:  # S_p ≥ 2 ⇔ some stage starts after layer 0
        several[p] = model.new_bool_var(f"multi_{p}")
        model.add_max_equality(several[p], [layout.beta[p, l] for l in range(1, big_l)] or [0])
    extra = b.int_var(sum(several.values()), b.d, "tied_n")
    slots = [(p, l) for p in b.P for l in sorted({0, big_l - 1})]
    t_min = model.new_int_var(0, len(b.tb.tp_values) - 1, "tied_tmin")
    model.add_min_equality(t_min, [layout.tp_index[slot] for slot in slots])
    bw_parts, lat_parts = [], []
    for i, first in enumerate(slots):
        for second in slots[i + 1:]:
            bw, lat = _pair(b, first, second, layout.machine_index, (extra, t_min))
            if first[0] == second[0]:  # one pipeline's first and last stage: two holders iff S_p ≥ 2
                bw = _only_if(b, several[first[0]], bw, max(sc.tied_bw))
                lat = _only_if(b, several[first[0]], lat, max(sc.tied_lat))
            bw_parts.append(bw)
            lat_parts.append(lat)
    f = model.new_int_var(0, max(sc.tied_bw), "tied_F")
    model.add_max_equality(f, bw_parts or [0])
    g = model.new_int_var(0, max(sc.tied_lat), "tied_G")
    model.add_max_equality(g, lat_parts or [0])
    return TiedVars(several=several, holders=extra, t_min=t_min, bandwidth=f, latency=g)


def tied_at_last(b, p: int, tied: TiedVars) -> cp_model.IntVar:
    """[C16] the tied sync counted by pipeline p's last stage: once per holder stage, so 0
    when the last stage is the first (S_p = 1), which counted it at ℓ = 0."""
    v = b.model.new_int_var(0, max(b.scale.tied_bw) + max(b.scale.tied_lat), f"tiedl_{p}")
    b.model.add(v == tied.bandwidth + tied.latency).only_enforce_if(tied.several[p])
    b.model.add(v == 0).only_enforce_if(~tied.several[p])
    return v


def _pair(b, first: tuple, second: tuple, mi: dict, index: tuple) -> tuple:
    """The tied sync's bandwidth and latency parts for two holder slots (p, ℓ) [C16]; `index`
    is (n − D, t_min)."""
    model, sc, nk, nt = b.model, b.scale, b.nk, len(b.tb.tp_values)
    extra, t_min = index
    name = f"{first[0]}_{first[1]}_{second[0]}_{second[1]}"
    pair = b.int_var(extra * nk ** 2 + mi[first] * nk + mi[second], len(sc.tied_lat) - 1, f"tpair_{name}")
    lat = model.new_int_var(0, max(sc.tied_lat), f"tlat_{name}")
    model.add_element(pair, sc.tied_lat, lat)
    idx = b.int_var(pair * nt + t_min, len(sc.tied_bw) - 1, f"tidx_{name}")
    bw = model.new_int_var(0, max(sc.tied_bw), f"tbw_{name}")
    model.add_element(idx, sc.tied_bw, bw)
    return bw, lat


def _only_if(b, literal, value, top: int) -> cp_model.IntVar:
    """`value` (in [0, top]) where `literal` holds, else 0."""
    v = b.model.new_int_var(0, top, f"{value.name}_if")
    b.model.add(v == value).only_enforce_if(literal)
    b.model.add(v == 0).only_enforce_if(~literal)
    return v
