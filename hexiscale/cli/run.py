"""`hexiscale run`: train a plan for a few steps on local processes, or print torchrun commands."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import typer
from pydantic import ValidationError

from hexiscale.cli.calibrate import print_prediction
from hexiscale.cli.run_accuracy import mean_error_line
from hexiscale.cli.hf_run import (CLIP_GRAD, DATA, EVAL_DATA, EVAL_EVERY, INIT_FROM, LOG_EVERY, MODEL, SAVE_DTYPE,
                                  SAVE_HF, WEIGHT_DECAY, check_save_target, checked_model, model_file_settings,
                                  model_notes)
from hexiscale.cli.precision import PRECISION, precision_settings, print_run_notes
from hexiscale.cli.app import app, check_plan_is_for, check_plan_rules, console, fail, friendly_errors, seed_option, writable_folder
from runtime.host import too_many_ranks
from hexiscale.cli.show import write_loss_picture
from hexiscale.cli.torchrun_views import print_torchrun
from hexiscale.cli.views import views_for
from planner.io import load_plan, load_problem
from planner.kinds import kind_of
from planner.workload import MAX_TOKENS
from runtime.checkpoints.manifest import CheckpointError, incomplete_steps, newest_manifest, saved_steps, step_dir
from runtime.checkpoints.staged_save import cut_short
from runtime.launch.elastic import ELASTIC_LOG, attempts_folder, run_elastic
from runtime.launch.launcher import RunError, RunResult, launch_local, make_job
from runtime.launch.resume import check_fresh_dir, resume_job
from runtime.metrics.runlog import after_warmup, run_problem
from runtime.precision import held_training
from solvers.replan import ReplanError, replan
from planner.base import plural

EXIT_RUN_FAILED = 1
from hexiscale.interrupt import EXIT_INTERRUPTED
# what a run writes into its --out folder (and each elastic attempt-N folder), besides rank<R>.log:
# an earlier run's are removed before this one writes, so that none is taken for this run's
RUN_FILES = ("job.json", "steps.jsonl", "metrics.json", "runlog.json", "loss.png", ELASTIC_LOG)
# the run setting each option sets (RunConfig's field names), to name the option in errors
OPTION_OF_SETTING = {"steps": "--steps", "schedule": "--schedule", "recompute": "--recompute",
                     "data": "--data", "seq_len": "--seq-len", "lr": "--lr", "seed": "--seed",
                     "timeout_s": "--timeout", "wait": "--wait", "backend": "--backend", "out_dir": "--out",
                     "micro_batch": "the problem's training.micro_batch", "save_every": "--save-every",
                     "checkpoint_dir": "--checkpoint-dir", "clip_grad": "--clip-grad", "log_every": "--log-every",
                     "weight_decay": "--weight-decay"}


def settings_error(exc: ValidationError) -> str:
    """One line per bad setting, naming the option: `--timeout: Input should be greater than 0 (got -1.0)`."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        lines.append(f"{OPTION_OF_SETTING.get(field, field)}: {error['msg']} (got {error.get('input')!r})")
    return "; ".join(lines)


def make_out_folder(out: Path | None) -> None:
    """--out is checked, and made, before any work: a place that cannot be written fails now."""
    if writable_folder(out, "--out") is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(f"--out: cannot create {out}: {exc.strerror or exc}")


def check_model_before_data(prob, the_plan, model: str, seq_len: int | None, resume: Path | None) -> None:
    """The plan against the model it will train (TP sizes that split it, sequence parallelism's
    s), before --data is tokenized: a refusal there took as long as the corpus's tokenizing. (A
    resumed run trains its checkpoint's model, which `start_from_checkpoint` checks.)"""
    if resume is None:
        built_job(prob, the_plan, model, {"seq_len": seq_len} if seq_len is not None else {})


def built_job(prob, the_plan, model, settings: dict):
    """The run's job, or one line naming the option whose value it refuses (exit 2)."""
    try:
        return make_job(prob, the_plan, model, **settings)
    except ValidationError as exc:
        fail(settings_error(exc))
    except (RunError, ValueError) as exc:
        fail(str(exc))


def check_backend(backend: str, torchrun: bool, processes: int) -> None:
    """A local NCCL run needs a GPU per process here: NCCL refuses two ranks on one GPU; a
    local gloo run starts at most MAX_RANKS_PER_CORE processes per core (torchrun commands
    run elsewhere: not checked)."""
    if backend == "gloo" and not torchrun and (why := too_many_ranks(processes)) is not None:
        fail(f"the plan uses {processes} devices, one process each: {why}; run it across machines (--torchrun)")
    if backend == "nccl" and not torchrun:
        import torch  # only for this check: the CLI starts without torch

        if not torch.cuda.is_available():
            fail("nccl needs CUDA; this machine has none: use --backend gloo")
        if processes > torch.cuda.device_count():
            runs = f"{processes} process{'es' if processes != 1 else ''}"  # plural() would say "processs"
            fail(f"--backend nccl: the plan runs {runs} here, one per GPU, and this machine has "
                 f"{plural(torch.cuda.device_count(), 'GPU')} (NCCL cannot put two ranks on one GPU): "
                 f"run it on machines with as many GPUs (--torchrun), or with --backend gloo")


def print_summary(result: RunResult, plan) -> None:
    console.print(views_for(plan).run_table(result, plan))
    steps = after_warmup(result.steps)
    tokens_s = sum(s["tokens_per_s"] for s in steps) / len(steps)
    console.print(f"loss {result.steps[0]['loss']:.4f} → {result.steps[-1]['loss']:.4f} over "
                  f"{plural(len(result.steps), 'step')}; {tokens_s:,.0f} tokens/s; wall {result.wall_s:.1f} s; "
                  f"replicas identical: {result.replicas_identical}; logs in {result.out_dir}",
                  highlight=False, soft_wrap=True)


@app.command()
@friendly_errors
def run(problem: str = typer.Argument(..., help="problem file or bundled name"),
        plan: str = typer.Argument(..., help="plan file or bundled name"),
        model: str = MODEL,
        steps: int = typer.Option(3, min=1, help="optimizer steps"),
        schedule: str = typer.Option(None, help="pipeline schedule: 1f1b | gpipe (default: the problem's, "
                                     "whose memory was priced)"),
        recompute: bool = typer.Option(None, "--recompute/--no-recompute", help="default: the problem's setting"),
        data: str = DATA, eval_data: str = EVAL_DATA, eval_every: int = EVAL_EVERY,
        init_from: Path = INIT_FROM, save_hf: Path = SAVE_HF, save_dtype: str = SAVE_DTYPE,
        seq_len: int = typer.Option(None, min=1, max=MAX_TOKENS, help="default: min(problem's, 32) for tiny"),
        lr: float = typer.Option(1e-3, help="AdamW learning rate"), weight_decay: float = WEIGHT_DECAY,
        clip_grad: float = CLIP_GRAD, log_every: int = LOG_EVERY, precision: str = PRECISION,
        seed: int = seed_option("seeds weights and data"),
        timeout: float = typer.Option(60.0, help="seconds any rank waits on a peer before giving up (at most a day)"),
        wait: str = typer.Option("auto", help="CPU: auto (wait awake while the ranks fit the cores) | asleep"),
        backend: str = typer.Option("gloo", help="gloo (CPU) | nccl (CUDA)"),
        torchrun: bool = typer.Option(False, help="print torchrun commands for several machines instead"),
        master_addr: str = typer.Option(None, help="torchrun: the rendezvous address every machine reaches "
                                        "(default: the first used machine's name)"),
        ifname: str = typer.Option(None, help="torchrun: the interface every machine binds (default: each the one "
                                   "that routes to --master-addr)"),
        out: Path = typer.Option(None, help="folder for the job file, logs and metrics"),
        checkpoint_dir: Path = typer.Option(None, help="folder for plan-independent checkpoints"),
        save_every: int = typer.Option(0, min=0, help="save a checkpoint every N steps (needs --checkpoint-dir)"),
        resume: Path = typer.Option(None, help="resume from the newest complete checkpoint in this folder "
                                    "(any plan wrote it); --steps counts from the start of training"),
        elastic: bool = typer.Option(False, help="when a rank dies: re-plan on the survivors, resume from the "
                                     "last checkpoint, go on (needs --checkpoint-dir and --save-every)"),
        force: bool = typer.Option(False, help="use a plan made for another problem; --resume: a checkpoint of "
                                   "another model (its model is trained)")) -> None:
    """Train PLAN for a few steps: one process per used device (gloo on this machine)."""
    check_torchrun_options(master_addr, ifname, torchrun)
    make_out_folder(out)
    checkpoint_dir = checkpoint_options(checkpoint_dir, save_every, resume, elastic, torchrun)
    prob, the_plan = load_problem(problem), load_plan(plan)
    check_plan_is_for(prob, the_plan, plan, force)
    check_plan_rules(prob, the_plan, plan, memory=False)  # memory: the run's model may be another (tiny)
    model = checked_model(prob, model)
    check_backend(backend, torchrun, len(the_plan.devices))
    peeked = newest_manifest(resume) if resume is not None else None  # unverified: resume_job verifies
    check_resume_early(prob, model, peeked, resume, force)
    seq_len = resumed_seq_len(peeked, seq_len)
    check_model_before_data(prob, the_plan, model, seq_len, resume)
    settings = {"steps": steps, "lr": lr, "seed": seed, "weight_decay": weight_decay, **model_file_settings(
                    prob, model, steps, seq_len, data, eval_data, eval_every, init_from, save_hf, save_dtype),
                "timeout_s": timeout, "wait": wait, "backend": backend, "out_dir": str(out) if out else "",
                "checkpoint_dir": str(checkpoint_dir or ""), "save_every": save_every,
                "clip_grad": clip_grad, "log_every": log_every,
                **precision_settings(prob, the_plan, precision, backend)}
    settings.update({k: v for k, v in (("recompute", recompute), ("seq_len", seq_len), ("schedule", schedule))
                     if v is not None})
    job = start_from_checkpoint(built_job(prob, the_plan, model, settings), resume, force)
    check_save_target(job)
    print_run_notes(prob, job, model_notes(job.config, prob.training.global_batch))
    job = clear_earlier_run(job, out, elastic, torchrun)
    if torchrun:
        return print_torchrun(job, prob, the_plan, master_addr, ifname, out, describe_job)
    result, the_plan = launch(prob, job, the_plan, elastic)
    report_run(prob, job, result, the_plan, elastic)


def launch(prob, job, the_plan, elastic: bool) -> tuple[RunResult, object]:
    """Run the job's processes here (elastically: re-planned when a rank is lost); a run that
    fails, cannot start or is interrupted (Ctrl-C) is one error naming where its logs are."""
    count = len(the_plan.devices)
    logs = attempts_folder(job) if elastic else job.config.out_dir
    try:  # (the line inside: a Ctrl-C right after it is this run's, whatever has started)
        console.print(f"running {count} process{'es' if count > 1 else ''}: {describe_job(job)}", highlight=False)
        result, the_plan = run_elastically(prob, job, the_plan) if elastic else (launch_local(job), the_plan)
    except RunError as exc:  # the processes could not start (e.g. TMPDIR too long for their socket)
        fail(f"{exc} (logs in {logs})", EXIT_RUN_FAILED)
    except KeyboardInterrupt:  # the workers end with this process (daemons; and each watches its launcher)
        # a second Ctrl-C must not cut multiprocessing's exit (it printed a traceback and left its
        # forkserver's /tmp/pymp-* folder): ignored from here, as `interrupted` does
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        save = cut_short(job.config.save_hf) if job.config.save_hf else ""
        fail(f"interrupted: stopped the run's {count} process{'es' if count > 1 else ''}; logs in {logs}"
             + (f"; {save}" if save else ""), EXIT_INTERRUPTED)
    if not result.ok:
        fail(f"the run failed (logs in {result.out_dir}):\n" + result.failure_summary(), EXIT_RUN_FAILED)  # fail escapes it
    return result, the_plan


def clear_earlier_run(job, out: Path | None, elastic: bool, torchrun: bool):
    """Before this run writes: remove an earlier run's files from the folder it writes into
    (RUN_FILES and rank logs, also in attempt-N folders), said in one line, so that none of them
    is read as this run's (4 old rank logs beside 2 new ones; two runs' elastic events). A local
    run without --out gets a fresh temporary folder, made here so that it can be named whatever
    happens (the job's out_dir)."""
    folder = attempts_folder(job) if elastic else out
    if folder is None and not torchrun:
        folder = Path(tempfile.mkdtemp(prefix="hexiscale-run-"))
        job = job.model_copy(update={"config": job.config.model_copy(update={"out_dir": str(folder)})})
    if folder is not None and (removed := remove_run_files(folder)):
        console.print(f"note: removed an earlier run's files from {folder}: {', '.join(removed)}",
                      highlight=False, soft_wrap=True, markup=False)
    return job


def remove_run_files(folder: Path) -> list[str]:
    """Remove the files a run writes (RUN_FILES, rank<R>.log) from `folder` and its attempt-N
    folders (an attempt folder left empty goes too); returns them, relative to `folder`.
    Anything else there is left as it is."""
    removed = []
    for place in (folder, *sorted(folder.glob("attempt-*"))) if folder.is_dir() else ():
        for path in [*(place / name for name in RUN_FILES), *sorted(place.glob("rank*.log"))]:
            if path.is_file():
                path.unlink()
                removed.append(str(path.relative_to(folder)))
        if place != folder and place.is_dir() and not any(place.iterdir()):
            place.rmdir()
    return removed


def report_run(prob, job, result: RunResult, the_plan, elastic: bool) -> None:
    """The run's summary, then (for one plan) predicted against measured times and its run log;
    an elastic run's plans changed on the way: no one prediction to compare."""
    print_summary(result, the_plan)
    write_loss_picture(result.out_dir, result.steps)
    if not elastic:
        print_memory(prob, job, result, the_plan)
        print_prediction(prob, job, result)
        if line := mean_error_line(result.out_dir):
            console.print(line, highlight=False)


def print_memory(prob, job, result: RunResult, plan) -> None:
    """On a GPU, the plan kind's memory per device measured against its cost model, for the
    problem as run (its model, settings and the precision's bytes); nothing on CPU."""
    draw = getattr(views_for(plan), "memory_table", None)
    if draw is None:
        return
    as_run = run_problem(prob, job.config.model, job.config)
    as_run = as_run.model_copy(update={"training": held_training(as_run.training, job.config.precision)})
    if (table := draw(as_run, plan, result.steps)) is not None:
        console.print(table)


def checkpoint_options(checkpoint_dir: Path | None, save_every: int, resume: Path | None, elastic: bool,
                       torchrun: bool) -> Path | None:
    """Check the checkpoint options together; --resume alone keeps saving into its folder."""
    if resume is not None and not resume.is_dir():
        fail(f"--resume: {resume} is not a folder")
    if checkpoint_dir is None and resume is not None and save_every:
        checkpoint_dir = resume.parent if (resume / "manifest.json").is_file() else resume
    if save_every and checkpoint_dir is None:
        fail("--save-every needs --checkpoint-dir")
    if checkpoint_dir is not None and not save_every and not elastic:  # (--elastic says what it needs)
        fail("--checkpoint-dir saves nothing without --save-every N (a checkpoint after every N-th step)")
    if elastic and (checkpoint_dir is None or not save_every):
        fail("--elastic needs --checkpoint-dir and --save-every (it restarts from the last checkpoint)")
    if elastic and torchrun:
        fail("--elastic runs local processes; it does not combine with --torchrun")
    if writable_folder(checkpoint_dir, "--checkpoint-dir") is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    return checkpoint_dir


def start_from_checkpoint(job, resume: Path | None, force: bool = False):
    """The job resumed from `resume` (shards verified first), or fresh; either way it must not
    write over newer checkpoints. A bad checkpoint is one line naming the file (exit 2), and
    so is one of another model than the run's, unless --force."""
    try:
        step = None
        if resume is not None:
            run_model = job.config.model
            job, manifest = resume_job(job, resume)
            step = manifest.step
            check_resumed_model(run_model, manifest, job.config.resume_from, force)
            if job.config.init_from:
                console.print(f"note: --init-from {job.config.init_from} is not read: a resumed run starts from the "
                              "checkpoint's weights", highlight=False, soft_wrap=True)
        check_step_folders(job, resume, step or 0)
        check_fresh_dir(job, step)
    except CheckpointError as exc:
        fail(str(exc))
    print_save_note(job.config, step or 0)
    return job


def check_step_folders(job, resume: Path | None, first: int) -> None:
    """Folders named like checkpoints but without a manifest (deleted, made by hand) newer than
    the start are passed over, by --resume as by a fresh run: said in one line (one where this
    run would save is refused by check_fresh_dir, before any process starts)."""
    config = job.config
    roots = {Path(r) for r in (config.checkpoint_dir, resume) if r and not (Path(r) / "manifest.json").is_file()}
    for root in sorted(roots):
        if newer := [str(step_dir(root, s)) for s in incomplete_steps(root) if s > first]:
            what = "it (not a complete checkpoint)" if len(newer) == 1 else "them (not complete checkpoints)"
            console.print(f"note: passing over {', '.join(newer)}: no manifest.json in {what}",
                          highlight=False, soft_wrap=True, markup=False)


def print_save_note(config, first: int) -> None:
    """Checkpoints are saved after every save_every-th step (the workers' rule, docs/checkpoints.md):
    when that leaves the last step unsaved, one line says which steps are saved, before the run."""
    saves = saved_steps(first, config.steps, config.save_every)
    if not config.save_every or (saves and saves[-1] == config.steps):
        return
    shown = ", ".join(map(str, saves)) if len(saves) <= 4 else f"{saves[0]}, {saves[1]}, …, {saves[-1]}"
    which = f"a checkpoint after step{'s' if len(saves) > 1 else ''} {shown} only" if saves else \
        f"no checkpoint in steps {first + 1}–{config.steps}"
    console.print(f"note: --save-every {config.save_every} saves {which}: "
                  f"the last step ({config.steps}) is not saved", highlight=False, soft_wrap=True)


def check_torchrun_options(master_addr: str | None, ifname: str | None, torchrun: bool) -> None:
    """An address or interface name is never empty nor holds spaces: `--master-addr ""` was
    printed into every command as `--master-addr=`; and either without --torchrun would be
    ignored (local processes meet on this host), which the user surely did not mean."""
    for option, value, what in (("--master-addr", master_addr, "a host name or address"),
                                ("--ifname", ifname, "an interface name")):
        if value is not None and not torchrun:
            fail(f"{option} is for --torchrun commands (machines that meet over a network); this run's local "
                 f"processes meet on this host: add --torchrun, or leave {option} out")
        if value is not None and (not value or any(c.isspace() for c in value)):
            fail(f"{option}: expected {what}, without spaces, got {value!r}")


def model_difference(saved, run_model) -> str:
    """The fields in which two models differ: `heads 4 (this run: 8), qkv_bias True (this run: False)`."""
    ours, theirs = run_model.model_dump(), saved.model_dump()
    return ", ".join(f"{field} {theirs[field]} (this run: {ours[field]})" for field in theirs
                     if field not in ("name", "hf_folder") and theirs[field] != ours[field])


def check_resumed_model(run_model, manifest, folder: str, force: bool) -> None:
    """Says what is resumed. A resumed run trains (and --save-hf writes) the checkpoint's
    model: another model than the run's is refused unless --force, then said; the tiny model
    is the plan's shrink of the problem's, so another plan's tiny one of it is only said."""
    saved, difference = manifest.model, model_difference(manifest.model, run_model)
    refuse_other_model(run_model, manifest, folder, force)
    console.print(f"resuming at step {manifest.step} from {folder} (saved by a {manifest.plan_kind} plan on "
                  f"{len(manifest.files)} rank(s); model {saved.name})", highlight=False, soft_wrap=True)
    if difference:
        console.print(f"note: training the checkpoint's model {saved.name!r}, not {run_model.name!r}: {difference}",
                      highlight=False, soft_wrap=True)


def refuse_other_model(run_model, manifest, folder, force: bool) -> None:
    """--resume of a checkpoint of another model than the run's: one line, unless --force (the
    tiny model is the plan's shrink of the problem's: another plan's tiny one of it passes)."""
    saved, difference = manifest.model, model_difference(manifest.model, run_model)
    if difference and not force and not (saved.name == run_model.name and saved.name.startswith("tiny(")):
        fail(f"--resume: {folder} holds another model than this run's {run_model.name!r}: {saved.name!r}, "
             f"{difference}; resume with the problem of that model, or pass --force to train the checkpoint's")


def resumed_seq_len(peeked, seq_len: int | None) -> int | None:
    """--seq-len, or when it is not given and the run resumes (`peeked`: the newest checkpoint's
    folder and manifest), the checkpoint's (said): the default differs by plan kind (a sequence
    plan's tiny run 16, a layered one's 32), and a checkpoint resumes under a plan of either kind."""
    if peeked is None or seq_len is not None:
        return seq_len
    trained = peeked[1].settings.get("seq_len")
    if trained is not None:
        console.print(f"note: --seq-len {trained}, as the checkpoint was trained", highlight=False)
    return trained


def check_resume_early(prob, model: str, peeked, resume: Path | None, force: bool) -> None:
    """A folder model's --resume of another model (`peeked`: the newest checkpoint's folder and
    manifest) is refused before its text is tokenized (it was refused only after); the resume
    itself checks everything again, verified."""
    if peeked is not None and model == "problem":
        refuse_other_model(prob.model, peeked[1], str(resume), force)


def run_elastically(prob, job, the_plan):
    """run_elastic with solvers.replan as the re-planner (new plans must run the job's model
    and sequence); returns the last attempt's result (with every step) and the plan the run
    ended on. `the_plan` is the problem's plan (a sequence job carries it scaled)."""
    def replanner(problem, plan, lost):
        result = replan(problem, plan, lost, trained=job.config.model, trained_seq_len=job.config.seq_len)
        return result.problem, result.plan, result.old_s, result.new_s

    def log(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True)

    try:
        run = run_elastic(prob, job, replanner, plan=the_plan, log=log)
    except CheckpointError as exc:
        fail(str(exc))
    except (RunError, ReplanError) as exc:
        fail(str(exc), EXIT_RUN_FAILED)
    run.result.steps = run.steps
    return run.result, run.plan


def describe_job(job) -> str:
    spec, config = job.config.model, job.config
    schedule = f"{config.schedule}, " if kind_of(job.plan).pipeline_schedule else ""
    return (f"model {spec.name} (L={spec.layers}, h={spec.hidden}, heads={spec.heads}/{spec.num_kv_heads}), "
            f"{schedule}recompute={config.recompute}, seq {config.seq_len}, B={job.plan.global_batch}")
