"""`hexiscale run --precision` (docs/models-and-data.md §12): which scheme the run uses —
fp32 by default on CPU, bf16 under `--backend nccl` where the plan's kind runs it — and a note
for every byte count (μ, μ_w, μ_o, γ, β) the problem priced otherwise."""

from __future__ import annotations

import typer

from hexiscale.cli.app import console, fail
from runtime.kinds import runtime_of
from runtime.precision import SCHEMES, training_byte_notes

PRECISION = typer.Option(None, help="fp32 | bf16 (bf16 weights, gradients and activations; fp32 master weights "
                                    "and Adam moments; float32 and bfloat16 also); default: bf16 with --backend "
                                    "nccl, else fp32")
# one table for --precision and --save-dtype, so that either option takes either spelling
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def precision_settings(problem, plan, precision: str | None, backend: str) -> dict:
    """The run setting of --precision; the scheme's notes against the problem's bytes."""
    offered = runtime_of(plan).precisions
    given, precision = precision, {long: short for short, long in DTYPE_NAMES.items()}.get(precision, precision)
    if precision is not None and precision not in SCHEMES:
        fail(f"--precision: expected one of {', '.join(SCHEMES)} (or {', '.join(DTYPE_NAMES[s] for s in SCHEMES)}), "
             f"got {given!r}")
    chosen = precision or ("bf16" if backend == "nccl" and "bf16" in offered else offered[0])
    return {"precision": chosen}


def print_run_notes(problem, job, model_notes: list[str]) -> None:
    """What the run does otherwise than the problem priced (its training bytes, its schedule),
    then `model_notes` (hf_run.model_notes): said once every input has been checked, so that a
    bad input is still the only line."""
    for note in training_byte_notes(problem.training, job.config.precision):
        console.print(note, highlight=False, soft_wrap=True)
    if job.config.schedule != problem.training.schedule:
        console.print(f"note: memory was priced for the problem's schedule {problem.training.schedule}; "
                      f"running {job.config.schedule}", highlight=False)
    for note in model_notes:
        console.print(note, highlight=False, soft_wrap=True, markup=False)
