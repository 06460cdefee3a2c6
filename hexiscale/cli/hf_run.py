"""What `hexiscale run` adds for a Hugging Face model (docs/models-and-data.md §12): the run
settings of --data PATH / --eval-data (tokenized once, from the cache after that),
--init-from, --save-hf and --save-dtype, each checked before any process starts; and
`hexiscale export-hf`, a plan-independent checkpoint in the Hugging Face layout."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from hexiscale.cli.app import app, console, fail, friendly_errors, writable_folder
from hexiscale.cli.precision import DTYPE_NAMES
from runtime.checkpoints.manifest import CheckpointError
from runtime.config import SaveDtype
from runtime.errors import RunError
from runtime.launch.launcher import MODELS

SAVE_DTYPES = ("float32", "bfloat16", "float16")  # or fp32, bf16, fp16, as --precision is spelled
# `run`'s options of this module (typer reads them from run's signature)
MODEL = typer.Option(None, help="tiny: small model, same plan structure; problem: the problem's model "
                                "(default: problem when it comes from a Hugging Face folder, else tiny)")
DATA = typer.Option("synthetic", help="synthetic | corpus (the bundled text: bytes for the tiny model, tokenized "
                                      "for a folder's) | PATH: .jsonl (text field), .txt or a folder, tokenized with "
                                      "the model folder's tokenizer (an existing path wins over a source's name)")
EVAL_DATA = typer.Option(None, help="held-out text (as --data PATH): an eval loss every --eval-every steps")
EVAL_EVERY = typer.Option(0, min=0, help="steps between eval losses (default: at the last step)")
INIT_FROM = typer.Option(None, help="start from this Hugging Face folder's safetensors (each rank reads its slice)")
SAVE_HF = typer.Option(None, help="after the last step, write the model here (Hugging Face layout)")
SAVE_DTYPE = typer.Option(None, help="--save-hf tensors: float32 | bfloat16 | float16 (or fp32 | bf16 | fp16); "
                                     "default float32")
WEIGHT_DECAY = typer.Option(0.01, min=0, help="AdamW weight decay")
CLIP_GRAD = typer.Option(None, help="clip the gradients' global norm to this before each step (torch's "
                                    "clip_grad_norm_ over the whole model, every plan alike; default: no clipping)")
LOG_EVERY = typer.Option(1, min=1, help="print every N-th step's line (always the first, the last and eval steps)")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def data_settings(problem, model: str, data: str, eval_data: str | None, eval_every: int, steps: int,
                  seq_len: int | None) -> dict:
    """The run settings of --data and --eval-data (`runtime.model.corpora`): a path is
    tokenized with the problem's model folder's tokenizer.json, and only the model of that
    folder trains on it (a model of no folder, or the tiny one: one line, exit 2)."""
    from runtime.model.corpora import NAMED_SOURCES, corpus_settings  # tokenizers: only when text is read

    if eval_every and eval_data is None:
        fail("--eval-every: needs --eval-data (the held-out text whose loss it reports)")
    texts = [(option, value) for option, value in (("--data", data), ("--eval-data", eval_data))
             if value is not None and value not in NAMED_SOURCES]
    if model == "tiny" and texts and problem.model.hf_folder:  # as run_plan(model="tiny", data=PATH) refuses
        fail(f"{texts[0][0]}: a text corpus is tokenized with the problem's model folder's tokenizer and trains "
             f"that model, not the tiny one: use --model problem (the default for this problem), got --model tiny")
    trained = problem.model if model == "problem" else problem.model.model_copy(update={"hf_folder": ""})
    try:
        return corpus_settings(trained, data, eval_data, eval_every, steps, seq_len or problem.training.seq_len,
                               _log, names=("--data", "--eval-data"))
    except RunError as exc:
        fail(str(exc))


def check_window(problem, model: str, seq_len: int | None) -> None:
    """--seq-len against the folder model's sliding window, as the problem's seq_len was
    checked when it was read: the runtime attends to the whole causal prefix, so a window
    shorter than the run's sequence would make it train another model than transformers'."""
    if model != "problem" or not problem.model.hf_folder or seq_len is None:
        return
    from planner.hf_config import HFConfigError, read_hf_model

    try:
        read_hf_model(problem.model.hf_folder, seq_len)
    except HFConfigError as exc:
        fail(f"--seq-len {seq_len}: {exc}")


def save_dtype_of(save_dtype: str | None) -> str:
    """--save-dtype: float32 | bfloat16 | float16, or as --precision spells them (fp32, bf16, fp16)."""
    dtype = DTYPE_NAMES.get(save_dtype, save_dtype) if save_dtype is not None else "float32"
    if dtype not in SAVE_DTYPES:
        fail(f"--save-dtype: expected one of {', '.join(SAVE_DTYPES)} (or {', '.join(DTYPE_NAMES)}), got {save_dtype!r}")
    return dtype


def weight_settings(problem, init_from: Path | None, save_hf: Path | None, save_dtype: str | None) -> dict:
    """--init-from (checked against the model when the job is made), --save-hf, --save-dtype."""
    dtype = save_dtype_of(save_dtype)
    if save_dtype is not None and save_hf is None:
        fail("--save-dtype: sets the dtype --save-hf writes, and no --save-hf is given")
    if init_from is not None and not init_from.is_dir():
        fail(f"--init-from: {init_from} is not a folder (a Hugging Face model folder)")
    writable_folder(save_hf, "--save-hf")  # made by rank 0 after the last step: nothing written before
    return {"init_from": str(init_from.resolve()) if init_from else "",
            "save_hf": str(save_hf.resolve()) if save_hf else "", "save_dtype": dtype}


def check_save_target(job) -> None:
    """--save-hf must not be the trained model's own folder (the problem's, or a resumed
    checkpoint's): its config.json and tokenizer are read from there when the run ends, and
    writing over them failed only then, half-way, after all the training."""
    save, folder = job.config.save_hf, job.config.model.hf_folder
    if save and folder and Path(save).resolve() == Path(folder).resolve():
        fail(f"--save-hf: {save} is the model's own folder (its config.json, tokenizer and weights are read "
             "from it): write to another folder")


def checked_model(problem, model: str | None) -> str:
    """--model: tiny or problem; by default a problem whose model comes from a folder trains
    that model, others the tiny one."""
    model = model or ("problem" if problem.model.hf_folder else "tiny")
    if model not in MODELS:  # the names run_plan takes (runtime.launch.launcher.checked_model)
        fail(f"--model must be {' or '.join(MODELS)}, got {model!r}")
    return model


def model_file_settings(problem, model: str, steps: int, seq_len: int | None, data: str, eval_data: str | None,
                        eval_every: int, init_from: Path | None, save_hf: Path | None, save_dtype: str | None) -> dict:
    """The run settings of this module's options for the model actually run (`model`: tiny or
    problem), each checked (one line, exit 2)."""
    check_window(problem, model, seq_len)
    return {**data_settings(problem, model, data, eval_data, eval_every, steps, seq_len),
            **weight_settings(problem, init_from, save_hf, save_dtype)}


@app.command("export-hf")
@friendly_errors
def export_hf(checkpoint: Path = typer.Argument(..., help="a checkpoint folder, or a folder of them (newest)"),
              output: Path = typer.Option(..., "-o", "--output", help="folder to write (Hugging Face layout)"),
              save_dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16 (or fp32 | bf16 | fp16)")
              ) -> None:
    """Write a plan-independent checkpoint (any plan, either kind) as a Hugging Face model folder."""
    from runtime.checkpoints.hf_weights import export_checkpoint  # torch: only here

    dtype: SaveDtype = save_dtype_of(save_dtype)  # type: ignore[assignment]
    if not checkpoint.is_dir():
        fail(f"{checkpoint}: not a folder")
    writable_folder(output, "--output")
    try:
        folder, step = export_checkpoint(checkpoint, output, dtype,
                                         log=lambda line: console.print(line, highlight=False, soft_wrap=True))
    except CheckpointError as exc:
        fail(str(exc))
    console.print(f"[green]wrote[/] {output}: the model of {folder} (step {step}), {dtype}", highlight=False)
