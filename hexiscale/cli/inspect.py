"""validate / evaluate / instances / schema."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hexiscale.cli.app import WorkLog, app, check_plan_is_for, console, fail, friendly_errors, invalid_plan_line
from hexiscale.cli.hf_run import note_if_own_model_cannot_run
from hexiscale.cli.price_views import partial_prices
from hexiscale.cli.views import plain, views_for
from planner.violations import InvalidPlanError
from planner.kinds import PLAN_KINDS, kind_of
from planner.kinds import evaluate as evaluate_plan
from planner.hardware import Cluster, builtin_catalog
from planner.io import (KINDS, PROBLEM_FIELDS, InputError, bundled_names, load_cluster, load_model, load_plan,
                        load_problem, problem_schema, read_mapping)
from planner.problem import Problem
from planner.kinds import validate as validate_plan
from planner.workload import ModelSpec, TrainingSpec
from planner.base import plural


# The top-level fields of each kind of file (`name` is in all three, so it tells none apart)
_KIND_FIELDS = {"problems": (set(PROBLEM_FIELDS), Problem), "clusters": (set(Cluster.model_fields), Cluster),
                "models": (set(ModelSpec.model_fields) - {"hf_folder"}, ModelSpec)}


def _input_kind(path: str) -> tuple[str, str]:
    """Which kind of file this is, and, when the file lacks a field that kind requires, why it
    was read as that kind (otherwise ""): the guess may be what is wrong, as when `layer:` for
    `layers:` once made a model file a problem file that missed its cluster. The kind is the
    one whose fields the file's keys overlap most; a tie (none at all) is a problem."""
    p = Path(path)
    if not p.is_file():  # a bundled name: a problem's first, else a cluster's or a model's
        return next((k for k in ("problems", "clusters", "models") if path in bundled_names(k)), "problems"), ""
    data = read_mapping(p)
    overlap = {kind: [k for k in data if k in fields and k != "name"] for kind, (fields, _) in _KIND_FIELDS.items()}
    kind = max(overlap, key=lambda k: len(overlap[k]))  # the first of a tie: problems
    required = [f for f, info in _KIND_FIELDS[kind][1].model_fields.items() if info.is_required()]
    if all(f in data for f in required):
        return kind, ""
    keys = overlap[kind]
    has = (f"it has {', '.join(keys[:3])}{', …' if len(keys) > 3 else ''}" if keys
           else "it has none of the fields of a cluster, model or problem file")
    return kind, f"read as a {kind[:-1]} file ({has})"


def _guessed(why: str, path: str, load):
    """load(path), its errors about the file itself prefixed with why it was read as its kind."""
    try:
        return load(path)
    except InputError as exc:
        if not why or exc.file != str(Path(path)) or not exc.field:  # no field: it says what the file is
            raise
        raise InputError(exc.file, f"{why}: {exc.field}" if exc.field else why, exc.reason) from None


def no_sequence_plans(problem) -> str:
    """At long context (where `solve` prefers sequence plans) a sequence no ring can split: why,
    and that only layered plans remain ('' otherwise; short sequences need no ring)."""
    from planner.sequence.rules import no_token_layout
    from solvers.sequence import LONG_CONTEXT_TOKENS

    why = no_token_layout(problem) if problem.training.seq_len >= LONG_CONTEXT_TOKENS else None
    return f"{why}; this long-context problem can have layered plans only" if why else ""


@app.command()
@friendly_errors
def validate(problem: str = typer.Argument(..., help="problem file or bundled name (or a cluster or model file)"),
             plan: str = typer.Argument(None, help="plan file to check against the problem"),
             force: bool = typer.Option(False, "--force", help="check a plan made for another problem")) -> None:
    """Check a problem (or cluster or model) file, and a plan against it (every violation, with numbers)."""
    kind, why = _input_kind(problem) if plan is None else ("problems", "")
    if kind == "clusters":
        c = _guessed(why, problem, load_cluster)
        console.print(f"[green]ok[/] cluster {plain(c.name)}: {plural(c.num_devices, 'device')}, "
                      f"{plural(len(c.machines), 'machine')}")
        return
    if kind == "models":
        m = _guessed(why, problem, load_model)
        console.print(f"[green]ok[/] model {plain(m.name)}: {m.total_params / 1e9:.3g}B parameters")
        return
    prob = _guessed(why, problem, load_problem)
    if plan is None:
        console.print(f"[green]ok[/] problem {plain(prob.name)}: {plural(prob.cluster.num_devices, 'device')}, "
                      f"{plural(len(prob.cluster.machines), 'machine')}, model {plain(prob.model.name)}")
        for note in [partial_prices(prob.cluster), no_sequence_plans(prob)]:
            if note:
                console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
        return
    work = WorkLog.for_cluster(prob.cluster)
    work.step(f"reading plan {plan}")
    the_plan = load_plan(plan)
    check_plan_is_for(prob, the_plan, plan, force)
    work.step(f"checking every rule on {len(the_plan.devices):,} devices")
    violations = validate_plan(prob, the_plan)
    work.finish()
    if violations:
        for v in violations:  # escape: "[device]" would otherwise read as rich markup
            console.print(f"[red]✗[/] {escape(str(v))}", highlight=False)
        fail(invalid_plan_line(plan, prob.name, violations, listed=True))
    console.print(f"[green]ok[/] plan {plain(plan)} is valid for {plain(prob.name)}")
    note_if_own_model_cannot_run(prob, the_plan)


# -- evaluate ----------------------------------------------------------------------------


@app.command()
@friendly_errors
def evaluate(problem: str = typer.Argument(..., help="problem file or bundled name"),
             plan: str = typer.Argument(..., help="plan file or bundled plan name"),
             as_json: bool = typer.Option(False, "--json", help="print the whole Estimate as JSON"),
             full: bool = typer.Option(None, "--full/--summary",
                                       help="every stage, or one row per pipeline (default: full up to 64 stages)"),
             force: bool = typer.Option(False, "--force", help="price a plan made for another problem")) -> None:
    """Price a plan: per-stage times and memory, T, throughput, MFU and the bottleneck."""
    prob, the_plan = load_problem(problem), load_plan(plan)
    check_plan_is_for(prob, the_plan, plan, force)
    try:
        est = evaluate_plan(prob, the_plan)
    except InvalidPlanError as exc:  # name the file, then every broken rule, on one line
        fail(f"{plan}: plan cannot be priced for {prob.name}: "
             + "; ".join(str(v) for v in exc.violations))
    if as_json:
        typer.echo(est.model_dump_json(indent=2))
        return
    views = views_for(the_plan)
    for view in views.estimate_views(prob, est, full):
        console.print(view)
    for extra in (views.idle_view(prob, the_plan, est), views.bridge_view(prob, the_plan, est)):
        if extra is not None:
            console.print(extra)
    over = [v for v in validate_plan(prob, the_plan) if v.rule == "memory"]
    for v in over:
        console.print(f"[red]✗ out of memory[/] {escape(str(v))}", highlight=False)


# -- instances ---------------------------------------------------------------------------


def _gpu_summary(cluster) -> str:
    counts: dict[str, int] = {}
    for m in cluster.machines:
        counts[m.gpu] = counts.get(m.gpu, 0) + m.count
    return " + ".join(f"{n}×{g}" for g, n in counts.items())


LISTED = (*KINDS, "gpus")  # the bundled files' kinds, and the built-in GPU catalog


def _instance_rows(kind: str):
    """(name, one-line summary) of each bundled instance of one kind."""
    if kind == "gpus":
        for g in builtin_catalog().values():
            yield g.name, (f"{g.vendor.value}, {g.peak_tflops:g} TFLOP/s dense bf16, {g.memory_gib:g} GiB, "
                           f"η {g.efficiency:g}")
        return
    for name in bundled_names(kind):
        if kind == "clusters":
            c = load_cluster(name)
            yield name, f"{c.num_devices} GPUs, {plural(len(c.machines), 'machine')}: {_gpu_summary(c)}"
        elif kind == "models":
            m = load_model(name)
            size = f"{m.total_params / 1e9:.3g}B" if m.total_params >= 1e9 else f"{m.total_params / 1e6:.3g}M"
            yield name, (f"{size} params, L={m.layers} h={m.hidden} "
                         f"a={m.heads} k={m.num_kv_heads} f={m.ffn_hidden} V={m.vocab}")
        elif kind == "problems":
            p = load_problem(name)
            t = p.training
            yield name, (f"{p.model.name} on {p.cluster.name} ({p.cluster.num_devices} GPUs), "
                         f"s={t.seq_len} B={t.global_batch} b={t.micro_batch}"
                         + ("" if t.recompute else ", no recompute"))
        else:
            pl = load_plan(name)
            plan_kind = kind_of(pl)
            parts = f"{len(plan_kind.units(pl))} {plan_kind.unit}s"
            yield name, (f"for {pl.problem or '?'}: {parts}, {plural(len(pl.devices), 'device')}: "
                         f"{views_for(pl).plan_shape(pl)}")


@app.command()
@friendly_errors
def instances(kind: str = typer.Option(None, "--kind", help="clusters | models | problems | plans | gpus")) -> None:
    """List the bundled clusters, models, problems and plans, and the GPU catalog, one table row each."""
    kinds = LISTED if kind is None else (kind,)
    if kind is not None and kind not in LISTED:
        fail(f"--kind: expected one of {', '.join(LISTED)}, got {kind!r}")
    for k in kinds:
        table = Table(title=f"bundled {k}", header_style="bold", title_justify="left")
        table.add_column("name", style="cyan", no_wrap=True)
        table.add_column("summary")
        for name, summary in _instance_rows(k):
            table.add_row(name, summary)
        console.print(table)


# -- schema ------------------------------------------------------------------------------

SCHEMA_TYPES = {"problem": Problem, "cluster": Cluster, "model": ModelSpec, "training": TrainingSpec,
                **{kind.schema_name: kind.plan_type for kind in PLAN_KINDS.values()}}


def _schema(name: str) -> dict:
    """A file type's JSON Schema; a problem's as files are read (cluster and model by name too),
    a plan's with its `format` tag required (the reader tells the kinds apart by it)."""
    if name == "problem":
        return problem_schema()
    schema = SCHEMA_TYPES[name].model_json_schema()
    if name in PLAN_SCHEMA_NAMES:
        schema["required"] = ["format", *schema.get("required", [])]
    return schema


PLAN_SCHEMA_NAMES = {kind.schema_name for kind in PLAN_KINDS.values()}


@app.command()
@friendly_errors
def schema(type_: str = typer.Option(None, "--type", help="problem | cluster | model | training | plan | seqplan "
                                                          "(default: all, keyed by type)")) -> None:
    """Print the JSON Schema of the input file formats."""
    if type_ is not None and type_ not in SCHEMA_TYPES:
        fail(f"--type: expected one of {', '.join(SCHEMA_TYPES)}, got {type_!r}")
    if type_ is not None:
        out = _schema(type_)
    else:
        out = {name: _schema(name) for name in SCHEMA_TYPES}
    typer.echo(json.dumps(out, indent=2))
