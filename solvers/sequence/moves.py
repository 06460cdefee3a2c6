"""The polish moves of the sequence heuristic: small changes to one replica's ring, each
returned as a new ring (the input is never changed). Positions are (group, member).

- `shift`: token blocks (q each) from some members to others (inside a group, or 2q
  between groups, keeping every T_g a multiple of 2q);
- `move_head`: one kv head's worth of query heads (a/k) between two members of a group;
- `swap`: two neighbouring groups of the ring change places;
- `drop`: a member leaves (its heads and tokens go to a neighbour; a lone member's whole
  shard goes to the previous group);
- `merge` / `split`: two neighbouring groups become one, or a group becomes two, their
  heads and tokens split again by `fine_split`.
"""

from __future__ import annotations

from planner.problem import Problem
from solvers.sequence.coarse import fine_split
from solvers.sequence.space import Ring, mixes_vendors, vendor_of_devices

Pos = tuple[int, int]


def copy_ring(ring: Ring) -> list[list[list[int]]]:
    return [[list(m) for m in g] for g in ring]


def frozen(ring) -> Ring:
    return [[tuple(m) for m in g] for g in ring]


def shift(ring: Ring, q: int, losers: list[Pos], gainers: list[Pos]) -> Ring | None:
    """Each position in `losers` gives q tokens, each in `gainers` takes q (repeats allowed);
    None when a member would drop below q. Only the touched groups are copied."""
    touched = {g: [list(m) for m in ring[g]] for g, _ in losers + gainers}
    for g, i in losers:
        touched[g][i][2] -= q
    for g, i in gainers:
        touched[g][i][2] += q
    if any(m[2] < q for group in touched.values() for m in group):
        return None
    out = list(ring)
    for g, group in touched.items():
        out[g] = [tuple(m) for m in group]
    return out


def move_head(ring: Ring, per_kv: int, g: int, src: int, dst: int) -> Ring | None:
    if ring[g][src][1] <= per_kv or src == dst:
        return None
    group = [list(m) for m in ring[g]]
    group[src][1] -= per_kv
    group[dst][1] += per_kv
    out = list(ring)
    out[g] = [tuple(m) for m in group]
    return out


def swap(ring: Ring, g: int) -> Ring | None:
    """Groups g and g+1 (cyclic) change places; None for rings under three groups."""
    if len(ring) < 3:
        return None
    out = list(ring)
    h = (g + 1) % len(ring)
    out[g], out[h] = out[h], out[g]
    return out


def drop(ring: Ring, g: int, i: int) -> Ring | None:
    """Member i of group g leaves the plan: its heads and tokens go to the next member of its
    group, or (a lone member) its shard to the first member of the previous group."""
    if sum(len(x) for x in ring) < 2:
        return None
    out = copy_ring(ring)
    gone = out[g].pop(i)
    if out[g]:
        heir = out[g][i % len(out[g])]
        heir[1] += gone[1]
        heir[2] += gone[2]
        return frozen(out)
    del out[g]
    out[(g - 1) % len(out)][0][2] += gone[2]
    return frozen(out)


def merge(problem: Problem, ring: Ring, g: int) -> Ring | None:
    """Groups g and g+1 become one group (at most k members); heads and tokens split again."""
    if len(ring) < 2 or len(ring[g]) + len(ring[(g + 1) % len(ring)]) > problem.model.num_kv_heads:
        return None
    h = (g + 1) % len(ring)
    devices = [m[0] for m in ring[g]] + [m[0] for m in ring[h]]
    vendors = vendor_of_devices(problem)
    if mixes_vendors([vendors[d] for d in devices]):
        return None
    tokens = sum(m[2] for m in ring[g]) + sum(m[2] for m in ring[h])
    group = fine_split(problem, devices, tokens // (2 * problem.training.token_block))
    if group is None:
        return None
    out = [x for j, x in enumerate(ring) if j not in (g, h)]
    out.insert(min(g, len(out)), group)
    return out


def split(problem: Problem, ring: Ring, g: int) -> Ring | None:
    """Group g becomes two neighbouring groups (first and second half of its members), its
    shard split between them by their token counts (in whole units of 2q)."""
    members = ring[g]
    if len(members) < 2:
        return None
    unit = 2 * problem.training.token_block
    half = len(members) // 2
    total = sum(m[2] for m in members) // unit
    first = min(max(round(sum(m[2] for m in members[:half]) / unit), (half + 1) // 2),
                total - (len(members) - half + 1) // 2)
    if first < 1 or total - first < 1:
        return None
    a = fine_split(problem, [m[0] for m in members[:half]], first)
    b = fine_split(problem, [m[0] for m in members[half:]], total - first)
    if a is None or b is None:
        return None
    return list(ring[:g]) + [a, b] + list(ring[g + 1:])
