"""What every kind's run summary (`<kind>_views.run_table`) shares: which steps it averages and
how. A run's step records (`RunResult.steps`) list per unit — a stage, a member — its times."""

from __future__ import annotations

from runtime.metrics.runlog import WARMUP_STEPS, after_warmup

AFTER_WARMUP = f"mean over the steps after the first {WARMUP_STEPS} (warm-up)"


def final_steps(steps: list[dict], same_plan) -> list[dict]:
    """The steps after the warm-up of the plan the run ended on: those whose `same_plan(step)`
    equals the last step's (an elastic run's earlier plans had other units)."""
    last = same_plan(steps[-1])
    return list(after_warmup([s for s in steps if same_plan(s) == last]))


def mean_over_steps(steps: list[dict], units: str, index: int, keys: tuple[str, ...]) -> list[float]:
    """Each of `keys` of the `index`-th unit ("stages" or "members") of every step, averaged."""
    return [sum(s[units][index][key] for s in steps) / len(steps) for key in keys]
