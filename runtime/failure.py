"""Test-only failure injection: make one rank die, or stop answering, in the middle of a step.

Not a run setting (`RunConfig` holds only what users set): the tests pass a
`FailureInjection` to `launch_local`, which hands it to that one child process in the
environment variable `HEXISCALE_INJECT_FAILURE`; the worker reads it with `from_env`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import Field

from planner.base import Frozen

ENV_VAR = "HEXISCALE_INJECT_FAILURE"


class FailureInjection(Frozen):
    rank: int = Field(ge=0, description="the rank that fails")
    step: int = Field(default=0, ge=0, description="the step (0-based) it fails in")
    mode: Literal["kill", "hang", "kill_saving"] = Field(
        default="kill", description="die (SIGKILL), stop answering, or die halfway through writing "
        "the checkpoint saved after `step`")

    def env(self) -> dict[str, str]:
        """The environment entry that carries this injection to its rank's process."""
        return {ENV_VAR: self.model_dump_json()}

    @classmethod
    def from_env(cls) -> FailureInjection | None:
        text = os.environ.get(ENV_VAR)
        return cls.model_validate_json(text) if text else None

    def strikes(self, rank: int, step: int) -> bool:
        """Mid-step failures (kill, hang) of `rank` in `step`."""
        return rank == self.rank and step == self.step and self.mode != "kill_saving"

    def strikes_saving(self, rank: int, step: int) -> bool:
        return self.mode == "kill_saving" and rank == self.rank and step == self.step

    def cut_write(self, path: Path, size: int = 4096) -> None:
        """Leave `path` half written (zeros), then die: a checkpoint cut mid-write."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(size))
        os.kill(os.getpid(), signal.SIGKILL)

    def strike(self, first: Callable[[], None]) -> None:
        """Run `first` (e.g. one forward, so peers are mid-step), then die without a goodbye
        or stop answering for good."""
        first()
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(60)
