"""The choice of the structure moves' starts (solvers/layered/heuristic/start_choice.py), golden:
a ranked list written by hand, the starts of each family read off it by hand."""

from solvers.layered.heuristic import start_choice


def _ranked():
    """(key, T, plan) fastest first; the plans are named objects (the functions compare by
    identity and never look inside)."""
    keys = [(2, "tiered×1.5", None), (2, "tiered×1.5", 2), (3, "tiered×1.5", None), (3, "tiered×1.5", 2),
            (2, "pipeline", None), (1, "pipeline", None), (3, "data", None), (4, "uneven×5/8", None),
            (1, "pipeline", 2), (2, "tiered×2", None)]
    return [(key, 10.0 + i, f"plan{i}") for i, key in enumerate(keys)]


def test_the_starts_of_each_family_on_a_ranked_list():
    ranked = _ranked()
    assert start_choice.first_starts(ranked, 3) == ["plan0", "plan1", "plan2"]
    assert start_choice.best_ds(ranked, 3) == [2, 3, 1]
    # the best of D = 2 and 3 are first starts already; D = 1's best is plan5
    assert start_choice.other_d_starts(ranked, 3) == ["plan5"]
    # per (D, family) among D = 2, 3, 1: (2, tiered) plan0, (3, tiered) plan2, (2, pipeline)
    # plan4, (1, pipeline) plan5, (3, data) plan6; the first and other-D starts dropped
    assert start_choice.family_starts(ranked, 3) == ["plan4", "plan6"]
    later = start_choice.other_d_starts(ranked, 3) + start_choice.family_starts(ranked, 3)
    # after the first three, skipping plan4, plan5 and plan6: plan3, plan7, plan8
    assert start_choice.next_starts(ranked, 3, later) == ["plan3", "plan7", "plan8"]
    assert start_choice.next_starts(ranked, 2, later) == ["plan2", "plan3"]


def test_short_lists_give_what_they_hold():
    ranked = _ranked()[:2]
    assert start_choice.first_starts(ranked, 3) == ["plan0", "plan1"]
    assert start_choice.other_d_starts(ranked, 3) == []
    assert start_choice.family_starts(ranked, 3) == []
    assert start_choice.next_starts(ranked, 3, []) == []
