"""Random sequence plans for the layout and attention tests (hypothesis strategies)."""

from __future__ import annotations

from hypothesis import strategies as st

from planner.sequence.plan import SeqPlan


@st.composite
def split(draw, total: int, parts: int, unit: int = 1) -> list[int]:
    """`total` (a multiple of `unit`, at least unit·parts) as `parts` positive multiples of `unit`."""
    if parts == 1:
        return [total]
    cuts = sorted(draw(st.lists(st.integers(1, total // unit - 1), min_size=parts - 1, max_size=parts - 1,
                                unique=True)))
    bounds = [0, *cuts, total // unit]
    return [unit * (b - a) for a, b in zip(bounds, bounds[1:])]


@st.composite
def seq_plans(draw, *, max_ranks: int, max_groups: int = 3, max_members: int = 3,
              max_replicas: int = 2) -> tuple[SeqPlan, int]:
    """(plan, kv_heads): uneven tokens and heads, GQA or not, at most `max_ranks` ranks."""
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 2))
    half = draw(st.integers(max_groups, 8))  # s/2: every group gets ℓ_g ≥ 1
    budget, rings, batches = max_ranks, [], []
    for _ in range(draw(st.integers(1, max_replicas))):
        if budget < 1:
            break
        groups = draw(st.integers(1, min(max_groups, budget)))
        ring = []
        for g, length in enumerate(draw(split(half, groups))):
            still_to_place = groups - g - 1  # each needs one rank
            cap = min(max_members, kv_heads, 2 * length, budget - still_to_place)
            members = draw(st.integers(1, cap))
            tokens = draw(split(2 * length, members))
            shares = draw(split(kv_heads, members))
            ring.append([(share * heads // kv_heads, t) for share, t in zip(shares, tokens)])
            budget -= members
        rings.append(ring)
        batches.append(draw(st.integers(1, 3)))
    device = iter(range(10**6))
    rings = [[[(next(device), h, t) for h, t in group] for group in ring] for ring in rings]
    return SeqPlan.from_rings(problem="random", batches=batches, rings=rings), kv_heads
