"""What `hexiscale run` adds for a Hugging Face model (docs/models-and-data.md §12): the run
settings of --data PATH / --eval-data (tokenized once, from the cache after that),
--init-from, --save-hf and --save-dtype, each checked before any process starts; and
`hexiscale export-hf`, a plan-independent checkpoint in the Hugging Face layout; and the note
`solve` and `validate` print where a folder model could not run the plan."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer

from hexiscale.cli.app import app, console, err_console, fail, friendly_errors, writable_folder
from hexiscale.cli.paths import refuse_nested_folder
from hexiscale.cli.precision import DTYPE_NAMES
from hexiscale.interrupt import EXIT_INTERRUPTED
from runtime.checkpoints.manifest import CheckpointError
from runtime.checkpoints.staged_save import cut_short
from runtime.config import SaveDtype
from runtime.errors import RunError
from runtime.launch.launcher import MODELS, make_job

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
WEIGHT_DECAY = typer.Option(0.01, help="AdamW weight decay (≥ 0)")  # checked by RunConfig: nan named as nan
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


def weight_settings(problem, model: str, init_from: Path | None, save_hf: Path | None, save_dtype: str | None) -> dict:
    """--init-from (its config here; its tensors when the job is made), --save-hf, --save-dtype:
    checked before the data is tokenized, so that a typo fails in a second."""
    dtype = save_dtype_of(save_dtype)
    if save_dtype is not None and save_hf is None:
        fail("--save-dtype: sets the dtype --save-hf writes, and no --save-hf is given")
    if init_from is not None:
        check_init_folder(problem, model, init_from)
    if save_hf is not None:
        refuse_save_into(save_hf, own=problem.model.hf_folder, init_from=init_from)
    writable_folder(save_hf, "--save-hf")  # made by rank 0 after the last step: nothing written before
    return {"init_from": str(init_from.resolve()) if init_from else "",
            "save_hf": str(save_hf.resolve()) if save_hf else "", "save_dtype": dtype}


def check_init_folder(problem, model: str, init_from: Path) -> None:
    """--init-from is a folder, and where it has a config.json, one of the trained model: its
    tensors' shapes alone do not tell a rope_theta or rms_norm_eps apart, and the run would
    train the problem's model from weights made for another."""
    from planner.hf_config import HFConfigError, config_differences, read_hf_model

    if not init_from.is_dir():
        fail(f"--init-from: {init_from} is not a folder (a Hugging Face model folder)")
    if model != "problem" or not (init_from / "config.json").is_file():
        return
    try:
        theirs = read_hf_model(init_from)
    except HFConfigError as exc:
        fail(f"--init-from: {exc}")
    for key, there, ours in config_differences(theirs, problem.model)[:1]:
        fail(f"--init-from: {init_from / 'config.json'}: {key}: {there} there, but the problem's model has {ours}: "
             "its weights are another model's")


def refuse_save_into(save: str | Path, *, own: str | Path | None, init_from: str | Path | None = None) -> None:
    """--save-hf is neither the trained model's own folder (its config.json and tokenizer are
    read from there when the run ends, and writing over them failed only then, half-way) nor the
    --init-from one (the save would replace the weights it starts from: an interrupted or bad
    run would lose the only copy)."""
    for folder, what in ((own, "the model's own folder (its config.json, tokenizer and weights are read from it)"),
                         (init_from, "the --init-from folder (the save would replace the weights it starts from)")):
        if folder and Path(save).resolve() == Path(folder).resolve():
            fail(f"--save-hf: {save} is {what}: write to another folder")


def check_save_target(job) -> None:
    """--save-hf against the model the job trains: the problem's, or a resumed checkpoint's,
    whose folder only the job knows (`refuse_save_into` checked the problem's before any work)."""
    if job.config.save_hf:
        refuse_save_into(job.config.save_hf, own=job.config.model.hf_folder)


def model_notes(config, global_batch: int) -> list[str]:
    """What a run of a folder's model does that its user may not have meant: random weights
    (no --init-from), random tokens (no --data), a sequence past the positions the model was
    made for, an eval loss on the training text, a corpus shorter than one step's B·s tokens."""
    from planner.hf_config import HFConfigError, max_positions
    from runtime.model.text import TokenStream

    folder, notes = config.model.hf_folder, []
    if not folder:
        return notes
    if not config.init_from and not config.resume_from:
        notes.append(f"note: the weights start random (no --init-from): {folder}'s safetensors are not read")
    if config.data == "synthetic":
        notes.append("note: the data is random tokens (no --data): the model learns nothing of text")
    try:
        most = max_positions(folder)
    except HFConfigError:
        most = None  # a folder gone since the problem was read is said where it is read
    if most is not None and config.seq_len > most:
        notes.append(f"note: seq_len {config.seq_len} is longer than the model's max_position_embeddings {most} "
                     "(config.json): it was made for positions below that")
    if config.eval_token_file and config.eval_token_file == config.token_file:
        notes.append("note: --eval-data is the --data text: the eval loss is measured on training text")
    if config.token_file and Path(config.token_file).is_file():
        tokens = TokenStream.of_file(Path(config.token_file)).tokens
        step = global_batch * config.seq_len
        if step > tokens - config.seq_len - 1:  # the offsets wrap within one step (docs/models-and-data.md §12)
            notes.append(f"note: the corpus has {tokens:,} tokens, fewer than one step reads (B·s = {step:,}): "
                         "every step repeats its sequences")
    return notes


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
    weights = weight_settings(problem, model, init_from, save_hf, save_dtype)  # before the text is tokenized
    return {**data_settings(problem, model, data, eval_data, eval_every, steps, seq_len), **weights}


@app.command("export-hf")
@friendly_errors
def export_hf(checkpoint: Path = typer.Argument(..., help="a checkpoint folder, or a folder of them (newest)"),
              output: Path = typer.Option(..., "-o", "--output", help="folder to write (Hugging Face layout)"),
              save_dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16 (or fp32 | bf16 | fp16)")
              ) -> None:
    """Write a plan-independent checkpoint (any plan, either kind) as a Hugging Face model folder."""
    dtype: SaveDtype = save_dtype_of(save_dtype)  # type: ignore[assignment]
    if not checkpoint.is_dir():
        fail(f"{checkpoint}: not a folder")
    # not config.json and the weights among a checkpoint's files (the tree then holds what no run
    # wrote), nor a model folder holding the checkpoints (copied or uploaded, they go with it)
    refuse_nested_folder(output, "--output", checkpoint, "the checkpoint folder read")
    writable_folder(output, "--output")
    from runtime.checkpoints.hf_weights import export_checkpoint  # torch: only here, after the checks
    try:
        folder, step = export_checkpoint(checkpoint, output, dtype,
                                         log=lambda line: console.print(line, highlight=False, soft_wrap=True))
    except CheckpointError as exc:
        fail(str(exc))
    except KeyboardInterrupt:  # its staged files are gone already (write_hf_folder); say what OUT holds
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        save = cut_short(output)
        fail("interrupted" + (f": {save}" if save else ""), EXIT_INTERRUPTED)
    console.print(f"[green]wrote[/] {output}: the model of {folder} (step {step}), {dtype}", highlight=False)


def note_if_own_model_cannot_run(prob, plan) -> None:
    """A problem whose model is a Hugging Face folder is one the user means to train: where
    `run --model problem` would refuse the plan (a vocabulary its TP sizes cannot split, say),
    `solve` and `validate` say so now, with the runtime's own reason, not after the user has set up
    a run (the planner's rules do not hold f, V or sequence parallelism's s to the TP sizes)."""
    if prob.model.hf_folder is None:
        return
    try:
        make_job(prob, plan, "problem")
    except (RunError, ValueError) as exc:
        err_console.print(f"note: `hexiscale run --model problem` would refuse this plan: {exc}",
                          highlight=False, markup=False, soft_wrap=True)
