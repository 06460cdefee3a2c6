"""What rank 0's line per step adds for a person watching a real run (docs/models-and-data.md
§12): tokens/s, the gradients' global norm when --clip-grad measured it, the held-out loss
when one was measured, and an estimate of the time left; and which steps print a line at all
(`--log-every N`: every N-th step, and always the first, the last and every eval step)."""

from __future__ import annotations

from runtime.metrics.runlog import after_warmup


def eta_text(seconds: float) -> str:
    """A duration as 42 s, 7.5 min or 3.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class StepLines:
    """Rank 0's step lines of one run (or of one resumed part of it, from step `first`)."""

    def __init__(self, config, first: int = 0):
        self.steps, self.log_every, self.first = config.steps, config.log_every, first
        self.walls: list[float] = []  # every step's wall time so far, shown or not

    def shows(self, step: int, record: dict) -> bool:
        """Whether step `step` (0-based) prints its line."""
        return (step == self.first or step + 1 == self.steps or (step + 1) % self.log_every == 0
                or "eval_loss" in record)

    def eta_s(self, step: int) -> float:
        """Steps left times the mean wall time of the steps so far after the warm-up (a fresh
        process's first steps are slower: runtime.metrics.runlog.WARMUP_STEPS)."""
        walls = after_warmup(self.walls)
        return (self.steps - step - 1) * sum(walls) / len(walls)

    def note(self, record: dict, step: int) -> str | None:
        """'  tokens/s N[  grad norm G][  eval loss X][  ETA T]' of a step record, or None for a
        step that --log-every leaves out; every step's wall time counts towards the ETA."""
        self.walls.append(record["wall_s"])
        if not self.shows(step, record):
            return None
        note = f"  tokens/s {record['tokens_per_s']:,.0f}"
        if "grad_norm" in record:
            note += f"  grad norm {record['grad_norm']:.4f}"
        if "eval_loss" in record:
            note += f"  eval loss {record['eval_loss']:.5f}"
        return note + (f"  ETA {eta_text(self.eta_s(step))}" if step + 1 < self.steps else "")
