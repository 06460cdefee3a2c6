"""The two steps both repairs share (DESIGN.md §10): `solvers.replan` (layered) and
`solvers.sequence.replan` drop the units (pipelines, replicas) that lost too much and deal
their sequences — and, in a sequence group, a lost member's heads and tokens — to the
survivors in proportion to speed.
"""

from __future__ import annotations


def deal(loads: list[int], speeds: list[float], total: int, unit: int) -> list[int]:
    """`loads` grown by `total`: one `unit` at a time to the load whose share per unit of
    speed after it is least (ties: the first); a rest under one unit goes where the next unit
    would have gone."""
    out = list(loads)
    for _ in range(total // unit):
        out[_next(out, speeds, unit)] += unit
    if total % unit:
        out[_next(out, speeds, unit)] += total % unit
    return out


def keep_or_move(repaired: list[tuple[object | None, int]], unit: str, why: str,
                 changes: list[str]) -> tuple[list, list[int], int]:
    """Of the units (replicas, pipelines) as repaired — (the repair, or None when the unit lost
    too much, `why`; its batch) in plan order —: the kept repairs, their batches, and the
    sequences of the dropped units (to be dealt to the kept); each drop said in `changes`."""
    kept, batches, moved = [], [], 0
    for index, (repair, batch) in enumerate(repaired):
        if repair is not None:
            kept.append(repair)
            batches.append(batch)
        else:
            moved += batch
            changes.append(f"{unit} {index} dropped ({why}); its {batch} sequences moved")
    return kept, batches, moved


def _next(loads: list[int], speeds: list[float], unit: int) -> int:
    return min(range(len(loads)), key=lambda j: ((loads[j] + unit) / speeds[j], j))
