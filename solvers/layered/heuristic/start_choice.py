"""Which structures the structure moves start from (search.py's `Search.moved_starts`): pure
functions of the search's ranked structures, each (found key, T, plan) with the key (D, split
mode, TP cap), fastest first. `count` is `HeuristicOptions.polish_candidates`: the first starts
are the `count` best structures; the other D's and the family starts come from the `count` best
D; the next starts are at most `count` more. A start is never listed twice: every later kind
skips the plans of those before it (compared by identity, as the ranked list holds each plan
once). Golden-tested in tests/test_start_choice.py."""

from __future__ import annotations

from planner.layered.plan import Plan

Ranked = list[tuple[tuple, float, Plan]]


def first_starts(ranked: Ranked, count: int) -> list[Plan]:
    """The best `count` structures."""
    return [plan for _, _, plan in ranked[:count]]


def best_of_each(ranked: Ranked, key) -> dict:
    """The best structure of each `key(found key)`, in the order of their best T."""
    best: dict = {}
    for found, _, plan in ranked:
        best.setdefault(key(found), plan)
    return best


def best_ds(ranked: Ranked, count: int) -> list[int]:
    """The best `count` D (by their best structure)."""
    return list(best_of_each(ranked, lambda found: found[0]))[:count]


def _without(plans, taken: list[Plan]) -> list[Plan]:
    return [plan for plan in plans if all(plan is not other for other in taken)]


def other_d_starts(ranked: Ranked, count: int) -> list[Plan]:
    """The best structure of each of the best few D, where the first starts do not hold it."""
    best_of_d = best_of_each(ranked, lambda found: found[0])
    return _without([best_of_d[d] for d in best_ds(ranked, count)], first_starts(ranked, count))


def family_starts(ranked: Ranked, count: int) -> list[Plan]:
    """For each of the best few D, the best structure of each family of splits (its mode
    before "×") that no start before it holds: a structure's T as built says little of where
    the moves take it (gen-40 seed 3: D = 2's best tiered one, built at 6.30 s and sixth, moves
    to a D = 3 plan of 5.81 s; the three best starts end at 5.92 s)."""
    ds = best_ds(ranked, count)
    best = best_of_each(ranked, lambda found: (found[0], found[1].split("×")[0]))
    in_best_ds = [plan for (d, _), plan in best.items() if d in ds]
    return _without(in_best_ds, first_starts(ranked, count) + other_d_starts(ranked, count))


def next_starts(ranked: Ranked, count: int, later: list[Plan]) -> list[Plan]:
    """The next `count` structures in rank order after the first starts that no later start
    (`later`: the other D's and the family starts) holds."""
    return _without([plan for _, _, plan in ranked[count:]], later)[:count]
