"""What rank 0's line per step adds for a person watching a real run (docs/models-and-data.md
§12): tokens/s, the held-out loss when one was measured, and an estimate of the time left."""

from __future__ import annotations


def eta_text(seconds: float) -> str:
    """A duration as 42 s, 7.5 min or 3.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def progress_note(record: dict, config, step: int) -> str:
    """'  tokens/s N[  eval loss X][  ETA T]' of a step record (0-based `step`); the ETA counts
    the steps left at this step's wall time."""
    note = f"  tokens/s {record['tokens_per_s']:,.0f}"
    if "eval_loss" in record:
        note += f"  eval loss {record['eval_loss']:.5f}"
    left = config.steps - step - 1
    return note + (f"  ETA {eta_text(left * record['wall_s'])}" if left else "")
