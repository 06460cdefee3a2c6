"""`hexiscale generate cluster|problem`: synthetic clusters for tests and scaling runs."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from pydantic import ValidationError

from hexiscale.cli.inspect import no_sequence_plans
from hexiscale.cli.app import LARGE_DEVICES, WorkLog, app, console, fail, friendly_errors, writable_file
from hexiscale.cli.paths import file_read, refuse_same_file
from planner.io import HF_PREFIX, hf_model
from instances.generate import generate_cluster, generated_problem, write_cluster, write_problem
from instances.price_table import priced
from planner.base import plural

generate_app = typer.Typer(no_args_is_help=True, help="Generate synthetic clusters and problems.")
app.add_typer(generate_app, name="generate")

# the planner is measured up to 10^5 devices (README); 10^9 ran silent past a minute, 2·10^6 wrote 29 MB
MAX_GPUS = 10**6
GPUS = typer.Option(..., "--gpus", min=4, max=MAX_GPUS, help=f"number of GPUs (a multiple of 4, at most {MAX_GPUS:,})")
MIX = typer.Option("A100-80G:0.25,RTX4090:0.5,H20:0.25", "--mix",
                   help="GPU types and weights, e.g. A100-80G:0.25,RTX4090:0.5,H20:0.25")
# the training field each option sets, to name the option in errors
OPTION_OF_FIELD = {"seq_len": "--seq-len", "global_batch": "--global-batch", "micro_batch": "--micro-batch"}
SEED = typer.Option(0, "--seed", help="random seed (same seed, same cluster)")
OUTPUT = typer.Option(..., "-o", "--output", help="YAML file to write")
PRICES = typer.Option(False, "--prices", help="price every GPU type from instances/prices.yaml (public on-demand "
                                            "USD per GPU-hour, sources in its comments; docs/prices.md §13)")


def _check_mix(mix: str) -> None:
    """Refuse what parse_mix would take silently or fail on obscurely: a GPU type named twice
    (its last weight would win), a weight of nan or inf (numpy's "cannot convert float NaN")."""
    seen = set()
    for item in filter(None, (x.strip() for x in mix.split(","))):
        name, _, weight = (part.strip() for part in item.partition(":"))
        if name in seen:
            fail(f"--mix: GPU type {name} is named twice (give each type once, with its whole weight)")
        seen.add(name)
        try:
            finite = math.isfinite(float(weight))
        except ValueError:
            continue  # not a number at all, or no weight: parse_mix names the entry
        if not finite:
            fail(f"--mix: entry {item!r}: the weight must be a finite number")


def _cluster_or_fail(gpus: int, mix: str, seed: int, prices: bool = False):
    if seed < 0:  # numpy would say only "expected non-negative integer"
        fail(f"--seed: expected a non-negative integer, got {seed}")
    _check_mix(mix)
    try:
        cluster = generate_cluster(gpus, mix, seed)
        return priced(cluster) if prices else cluster
    except ValidationError as exc:  # a cluster the generator should not build: one line all the same
        fail("cannot generate this cluster: " + exc.errors()[0]["msg"].removeprefix("Value error, "))
    except ValueError as exc:  # bad --gpus / --mix: one line, exit 2
        fail(str(exc))


def _summary(cluster) -> str:
    counts: dict[str, int] = {}
    for m in cluster.machines:
        counts[m.gpu] = counts.get(m.gpu, 0) + m.count
    types = ", ".join(f"{n}×{g}" for g, n in counts.items())
    rent = f", ${float(cluster.machine_rent.sum()):,.2f}/h for all of it" if cluster.priced else ""
    return (f"{cluster.num_devices} GPUs on {plural(len(cluster.machines), 'machine')} ({types}), "
            f"{len(cluster.links)} link overrides{rent}")


def model_file_read(model: str) -> Path | None:
    """The file --model reads: a model file, or hf:PATH's config.json (PATH itself, or in the
    folder PATH); None for a bundled name."""
    if not model.startswith(HF_PREFIX):
        return file_read(model)
    folder = Path(model[len(HF_PREFIX):])
    return file_read(folder if folder.is_file() else folder / "config.json")


@generate_app.command("cluster")
@friendly_errors
def cluster_cmd(gpus: int = GPUS, mix: str = MIX, seed: int = SEED, output: Path = OUTPUT,
                prices: bool = PRICES) -> None:
    """Write a random heterogeneous cluster (machines of 4 or 8 GPUs, racks, uneven links)."""
    writable_file(output, "--output")
    work = WorkLog(gpus >= LARGE_DEVICES)
    work.step(f"generating {gpus:,} GPUs")
    cluster = _cluster_or_fail(gpus, mix, seed, prices)
    work.step(f"writing {output}")
    write_cluster(cluster, output)
    work.finish()
    console.print(f"[green]wrote[/] {output}: {_summary(cluster)}")


@generate_app.command("problem")
@friendly_errors
def problem_cmd(gpus: int = GPUS, mix: str = MIX, seed: int = SEED, output: Path = OUTPUT,
                model: str = typer.Option("llama2-70b", help="bundled model name, model file, or hf:PATH "
                                                             "(a Hugging Face folder or its config.json)"),
                seq_len: int = typer.Option(4096, min=1, help="sequence length s"),
                global_batch: int = typer.Option(None, min=1, help="B (default: one sequence per GPU)"),
                micro_batch: int = typer.Option(1, min=1, help="b"),
                recompute: bool = typer.Option(True, help="full activation recomputation"),
                prices: bool = PRICES) -> None:
    """Write a self-contained problem: a generated cluster paired with a model."""
    refuse_same_file(output, "--output", {"the --model file read": model_file_read(model)})
    writable_file(output, "--output")
    work = WorkLog(gpus >= LARGE_DEVICES)
    work.step(f"generating {gpus:,} GPUs")
    cluster = _cluster_or_fail(gpus, mix, seed, prices)
    try:
        spec = hf_model(model[len(HF_PREFIX):], seq_len) if model.startswith(HF_PREFIX) else model
        problem = generated_problem(cluster, spec, seq_len, global_batch, micro_batch, recompute)
    except ValidationError as exc:  # e.g. a global batch that is not a multiple of the micro-batch
        error = exc.errors()[0]
        where = OPTION_OF_FIELD.get(str(error["loc"][-1]) if error["loc"] else "", "training")
        fail(f"{where}: " + error["msg"].removeprefix("Value error, ") + (f" (got {error['input']})" if error["loc"] else ""))
    work.step(f"writing {output}")
    write_problem(problem, output)
    work.finish()
    console.print(f"[green]wrote[/] {output}: {problem.name}, {_summary(cluster)}")
    if note := no_sequence_plans(problem):
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
