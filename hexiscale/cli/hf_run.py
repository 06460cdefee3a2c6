"""What `hexiscale run` adds for a Hugging Face model (docs/models-and-data.md §12): the run
settings of --data PATH / --eval-data (tokenized once, from the cache after that),
--init-from, --save-hf and --save-dtype, each checked before any process starts; and
`hexiscale export-hf`, a plan-independent checkpoint in the Hugging Face layout."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from hexiscale.cli.app import app, console, fail, friendly_errors, writable_folder
from runtime.checkpoints.manifest import CheckpointError
from runtime.config import SaveDtype
from runtime.errors import RunError

SAVE_DTYPES = ("float32", "bfloat16", "float16")
# `run`'s options of this module (typer reads them from run's signature)
MODEL = typer.Option(None, help="tiny: small model, same plan structure; problem: the problem's model "
                                "(default: problem when it comes from a Hugging Face folder, else tiny)")
DATA = typer.Option("synthetic", help="synthetic | corpus (bundled text, byte-level) | PATH: .jsonl (text field), "
                                      ".txt or a folder, tokenized with the model folder's tokenizer")
EVAL_DATA = typer.Option(None, help="held-out text (as --data PATH): an eval loss every --eval-every steps")
EVAL_EVERY = typer.Option(0, min=0, help="steps between eval losses (default: at the last step)")
INIT_FROM = typer.Option(None, help="start from this Hugging Face folder's safetensors (each rank reads its slice)")
SAVE_HF = typer.Option(None, help="after the last step, write the model here (Hugging Face layout)")
SAVE_DTYPE = typer.Option("float32", help="--save-hf tensors: float32 | bfloat16 | float16")
WEIGHT_DECAY = typer.Option(0.01, min=0, help="AdamW weight decay")
CLIP_GRAD = typer.Option(None, help="clip the gradients' global norm to this before each step (torch's "
                                    "clip_grad_norm_ over the whole model, every plan alike; default: no clipping)")
LOG_EVERY = typer.Option(1, min=1, help="print every N-th step's line (always the first, the last and eval steps)")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def data_settings(problem, data: str, eval_data: str | None, eval_every: int, steps: int,
                  seq_len: int | None) -> dict:
    """The run settings of --data and --eval-data (`runtime.model.corpora`): a path is
    tokenized with the problem's model folder's tokenizer.json (a model of no folder has
    none: one line, exit 2)."""
    from runtime.model.corpora import corpus_settings  # tokenizers: only when text is read

    try:
        return corpus_settings(problem.model, data, eval_data, eval_every, steps, seq_len or problem.training.seq_len,
                               _log, names=("--data", "--eval-data"))
    except RunError as exc:
        fail(str(exc))


def weight_settings(problem, init_from: Path | None, save_hf: Path | None, save_dtype: str) -> dict:
    """--init-from (checked against the model when the job is made), --save-hf, --save-dtype."""
    if save_dtype not in SAVE_DTYPES:
        fail(f"--save-dtype: expected one of {', '.join(SAVE_DTYPES)}, got {save_dtype!r}")
    if init_from is not None and not init_from.is_dir():
        fail(f"--init-from: {init_from} is not a folder (a Hugging Face model folder)")
    writable_folder(save_hf, "--save-hf")  # made by rank 0 after the last step: nothing written before
    return {"init_from": str(init_from.resolve()) if init_from else "",
            "save_hf": str(save_hf.resolve()) if save_hf else "", "save_dtype": save_dtype}


def checked_model(problem, model: str | None) -> str:
    """--model: tiny or problem; by default a problem whose model comes from a folder trains
    that model, others the tiny one."""
    model = model or ("problem" if problem.model.hf_folder else "tiny")
    if model not in ("tiny", "problem"):
        fail(f"--model must be tiny or problem, got {model!r}")
    return model


def model_file_settings(problem, steps: int, seq_len: int | None, data: str, eval_data: str | None,
                        eval_every: int, init_from: Path | None, save_hf: Path | None, save_dtype: str) -> dict:
    """The run settings of this module's options, each checked (one line, exit 2)."""
    return {**data_settings(problem, data, eval_data, eval_every, steps, seq_len),
            **weight_settings(problem, init_from, save_hf, save_dtype)}


@app.command("export-hf")
@friendly_errors
def export_hf(checkpoint: Path = typer.Argument(..., help="a checkpoint folder, or a folder of them (newest)"),
              output: Path = typer.Option(..., "-o", "--output", help="folder to write (Hugging Face layout)"),
              save_dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16")) -> None:
    """Write a plan-independent checkpoint (any plan, either kind) as a Hugging Face model folder."""
    from runtime.checkpoints.hf_weights import export_checkpoint  # torch: only here

    if save_dtype not in SAVE_DTYPES:
        fail(f"--save-dtype: expected one of {', '.join(SAVE_DTYPES)}, got {save_dtype!r}")
    if not checkpoint.is_dir():
        fail(f"{checkpoint}: not a folder")
    writable_folder(output, "--output")
    dtype: SaveDtype = save_dtype  # type: ignore[assignment]
    try:
        folder, step = export_checkpoint(checkpoint, output, dtype)
    except CheckpointError as exc:
        fail(str(exc))
    console.print(f"[green]wrote[/] {output}: the model of {folder} (step {step}), {save_dtype}", highlight=False)
