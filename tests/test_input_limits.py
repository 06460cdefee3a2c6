"""What problem, cluster and model files may hold (docs/plan-space.md §1, "What input files may
hold"): finite numbers written as numbers, names of 1–200 printable characters, figures under
upper limits far beyond real hardware. Every refusal is one line naming the field, exit 2."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from hexiscale.cli import app
from planner.base import FROM_FILE, MAX_NAME, Input
from planner.hardware import Cluster, GpuType, Link, Machine, Rack, builtin_catalog
from planner.io import InputError, load_cluster, load_model, load_plan, load_problem, save_yaml
from planner.kinds import evaluate
from planner.layered.plan import Plan
from planner.problem import Problem
from planner.workload import ModelSpec, TrainingSpec
from solvers.replan import survivors

INSTANCES = Path(__file__).parent.parent / "instances"
MACHINES = [{"name": "m0", "gpu": "RTX4090", "count": 2, "intra_bw_gbps": 16},
            {"name": "m1", "gpu": "RTX3090", "count": 2, "intra_bw_gbps": 16}]
CLUSTER = {"inter_bw_gbps": 1.25, "machines": MACHINES}
MODEL = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 172, "vocab": 256}
TRAINING = {"seq_len": 64, "global_batch": 8}


def problem_file(tmp_path: Path, section: str | None = None, **changes) -> Path:
    """An inline problem written as YAML, with `changes` made to one section (None: the top)."""
    data = {"name": "p", "cluster": {**CLUSTER, "machines": [dict(m) for m in MACHINES]}, "model": dict(MODEL),
            "training": dict(TRAINING)}
    target = data if section is None else data["cluster"]["machines"][0] if section == "machine" else data[section]
    target.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one_line_error(*args: str) -> str:
    """The CLI's one `error:` line for bad input (exit 2, no traceback)."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, (args, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output and "internal error" not in lines[0]
    return lines[0]


# -- finite numbers -----------------------------------------------------------------------------

@pytest.mark.parametrize("section, field", [
    ("training", "act_bytes"), ("training", "grad_bytes"), ("training", "param_state_bytes"),
    ("training", "reserved_gib"), ("training", "weight_bytes"), ("model", "rope_theta"), ("model", "norm_eps"),
    ("cluster", "inter_latency_us"), ("machine", "price_per_hour")])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_inf_and_nan_are_refused_naming_the_field(tmp_path, section, field, value):
    line = one_line_error("validate", str(problem_file(tmp_path, section, **{field: value})))
    where = "cluster.machines.0" if section == "machine" else section
    assert f"{where}.{field}: Input should be a finite number" in line, line


# A valid mapping of every input type: each of its float fields is set to inf in turn below
VALID = {GpuType: {"name": "G", "peak_tflops": 100, "memory_gib": 40, "price_per_hour": 1.0,
                   "attention_efficiency": 0.5},
         Machine: {**MACHINES[0], "intra_latency_us": 5, "price_per_hour": 1.0},
         Link: {"a": "m0", "b": "m1", "bw_gbps": 10, "latency_us": 5},
         Rack: {"machines": ["m0", "m1"], "bw_gbps": 10, "latency_us": 5},
         Cluster: CLUSTER, ModelSpec: MODEL, TrainingSpec: TRAINING,
         Problem: {"cluster": {**CLUSTER, "machines": [{**m, "price_per_hour": 1.0} for m in MACHINES]},
                   "model": MODEL, "training": TRAINING, "budget_per_hour": 10}}


def _float_fields(cls: type[Input]) -> list[str]:
    return [name for name, f in cls.model_fields.items() if "float" in str(f.annotation)]


def test_every_input_type_is_covered_and_refuses_inf_in_every_float_field():
    assert set(VALID) == {cls for cls in _input_types()}
    checked = 0
    for cls, data in VALID.items():
        cls.model_validate(data)
        for field in _float_fields(cls):
            for bad in (math.inf, -math.inf, math.nan):
                with pytest.raises(ValidationError, match="finite number"):
                    cls.model_validate({**data, field: bad})
            checked += 1
    assert checked >= 25


def test_every_input_type_reads_its_own_dump_again():
    """Defaults pass the rules too: a dump (calibration rescales a cluster's dump) reads back."""
    for cls, data in VALID.items():
        dump = cls.model_validate(data).model_dump()
        assert cls.model_validate(dump).model_dump() == dump
        assert cls.model_validate(json.loads(json.dumps(dump, default=str))).model_dump() == dump
    assert Rack.model_validate(Rack(machines=("m0", "m1"), bw_gbps=10).model_dump()).name == ""


def _input_types() -> list[type]:
    """Every subclass of Input the planner defines (a new input type must join VALID)."""
    found, todo = [], list(Input.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__.startswith("planner.")]


# -- upper limits --------------------------------------------------------------------------------

@pytest.mark.parametrize("section, changes, words", [
    ("cluster", {"inter_latency_us": 1e308}, ["cluster.inter_latency_us", "less than or equal to 1000000000"]),
    ("cluster", {"inter_bw_gbps": 1e308}, ["cluster.inter_bw_gbps", "less than or equal to 1000000"]),
    ("cluster", {"gpu_types": [{"name": "X", "peak_tflops": 1e308, "memory_gib": 80}]},
     ["cluster.gpu_types.0.peak_tflops", "less than or equal to 1000000"]),
    ("cluster", {"gpu_types": [{"name": "X", "peak_tflops": 1e-300, "memory_gib": 80}]},
     ["cluster.gpu_types.0.peak_tflops", "greater than or equal to 0.000001"]),
    ("cluster", {"gpu_types": [{"name": "X", "peak_tflops": 100, "memory_gib": 1e308}]},
     ["cluster.gpu_types.0.memory_gib", "less than or equal to 1000000"]),
    ("machine", {"count": 10**15}, ["cluster.machines.0.count", "less than or equal to 4096"]),
    ("machine", {"count": 10**30}, ["cluster.machines.0.count", "less than or equal to 4096"]),
    ("machine", {"intra_bw_gbps": 1e308}, ["cluster.machines.0.intra_bw_gbps", "less than or equal to"]),
    ("model", {"hidden": 2**70}, ["model.hidden", "less than or equal to 1048576"]),
    ("model", {"layers": 10**6}, ["model.layers", "less than or equal to 10000"]),
    ("model", {"vocab": 2**40}, ["model.vocab", "less than or equal to 16777216"]),
    ("training", {"seq_len": 2**70}, ["training.seq_len", "less than or equal to 16777216"]),
    ("training", {"global_batch": 2**70, "micro_batch": 2**69}, ["training.global_batch", "training.micro_batch"]),
    ("training", {"param_state_bytes": 1e6}, ["training.param_state_bytes", "less than or equal to 1024"]),
])
def test_figures_beyond_any_hardware_or_model_are_refused(tmp_path, section, changes, words):
    line = one_line_error("validate", str(problem_file(tmp_path, section, **changes)))
    assert all(w in line for w in words), line


def test_a_cluster_beyond_four_million_devices_is_refused_before_its_arrays_are_built():
    machines = [{"name": f"m{i}", "gpu": "H100", "count": 4096, "intra_bw_gbps": 450} for i in range(1025)]
    with pytest.raises(ValidationError, match=r"4,198,400 devices in all, more than the 4,194,304"):
        Cluster.model_validate({"inter_bw_gbps": 25, "machines": machines})
    Cluster.model_validate({"inter_bw_gbps": 25, "machines": machines[:1024]})  # 2^22 exactly: fine


def test_at_every_upper_limit_the_cost_model_still_prices_to_finite_numbers(tmp_path):
    """The limits are low enough that nothing overflows: a problem at all of them is priced (the
    reserve 1 GiB below the memory: at or above it is refused)."""
    cluster = {"inter_bw_gbps": 1e6, "inter_latency_us": 1e9, "intra_latency_us": 1e9,
               "gpu_types": [{"name": "BIG", "peak_tflops": 1e6, "memory_gib": 1e6, "price_per_hour": 1e9}],
               "machines": [{"name": f"m{i}", "gpu": "BIG", "count": 4096, "intra_bw_gbps": 1e6} for i in range(2)]}
    # heads 2^19: a head dimension of 2, the least rotary embeddings allow
    model = {"layers": 10**4, "hidden": 2**20, "heads": 2**19, "ffn_hidden": 2**20, "vocab": 2**24}
    training = {"seq_len": 2**24, "global_batch": 2**40, "micro_batch": 2**40, "param_state_bytes": 1024,
                "grad_bytes": 1024, "act_bytes": 1024, "reserved_gib": 1e6 - 1, "token_block": 2**24}
    path = tmp_path / "max.yaml"
    save_yaml({"cluster": cluster, "model": model, "training": training}, path)
    problem = load_problem(path)
    plan = Plan.model_validate({"pipelines": [{"batch": 2**40, "stages": [{"devices": list(range(8)),
                                                                           "layers": 10**4}]}]})
    numbers = list(_floats(evaluate(problem, plan).model_dump()))
    assert len(numbers) > 10 and all(math.isfinite(x) for x in numbers)


def _floats(value):
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats(v)
    elif isinstance(value, float):
        yield value


def test_every_bundled_file_is_within_the_limits():
    loaders = {"clusters": load_cluster, "models": load_model, "problems": load_problem, "plans": load_plan}
    count = 0
    for kind, load in loaders.items():
        for path in sorted((INSTANCES / kind).glob("*.*")):
            load(path)
            count += 1
    assert len(builtin_catalog.__wrapped__()) >= 20  # the catalog, read again (the cached one was read once)
    assert count >= 40


# -- numbers written as numbers ----------------------------------------------------------------

@pytest.mark.parametrize("section, field, value", [
    ("machine", "count", True), ("machine", "intra_bw_gbps", True), ("training", "zero_stage", True),
    ("model", "layers", True), ("training", "seq_len", True), (None, "budget_per_hour", True),
    ("machine", "count", "2"), ("training", "zero_stage", "1"), ("cluster", "inter_bw_gbps", "25"),
    ("model", "kv_heads", False)])
def test_booleans_and_quoted_numbers_are_not_taken_as_numbers(tmp_path, section, field, value):
    if field == "budget_per_hour":  # a budget needs prices
        path = problem_file(tmp_path, None, budget_per_hour=value)
        data = yaml.safe_load(path.read_text())
        data["cluster"]["machines"] = [{**m, "price_per_hour": 1.0} for m in data["cluster"]["machines"]]
        path.write_text(yaml.safe_dump(data))
    else:
        path = problem_file(tmp_path, section, **{field: value})
    line = one_line_error("validate", str(path))
    assert f"{field}: expected a number" in line and f"(got {value!r})" in line, line


def test_true_false_fields_and_named_choices_still_read():
    model = ModelSpec.model_validate({**MODEL, "gated": False, "qkv_bias": True, "tied_embeddings": True})
    assert (model.gated, model.qkv_bias, model.tied_embeddings) == (False, True, True)
    training = TrainingSpec.model_validate({**TRAINING, "recompute": False, "sequence_parallel": True,
                                            "schedule": "gpipe", "zero_stage": 1})
    assert (training.recompute, training.sequence_parallel, training.schedule, training.zero_stage) == \
        (False, True, "gpipe", 1)
    assert Machine.model_validate({**MACHINES[0], "count": 2.0}).count == 2  # a whole float is a number
    with pytest.raises(ValidationError, match="valid integer"):  # text that is no number: pydantic's message
        ModelSpec.model_validate({**MODEL, "layers": "many"})


@pytest.mark.parametrize("text, value", [("010", 10), ("1e3", 1000), ("0064", 64), ("1_000", 1000), ("0x40", 64)])
def test_yaml_numbers_read_as_written(tmp_path, text, value):
    """YAML 1.1 reads 010 as octal 8 and 1e3 as text; the files read them as YAML 1.2 and JSON do."""
    path = problem_file(tmp_path)
    path.write_text(path.read_text().replace("global_batch: 8", f"global_batch: {text}"))
    assert load_problem(path).training.global_batch == value


@pytest.mark.parametrize("name", ["09", "1e3", "010", "1.5e-4"])
def test_names_that_look_like_numbers_are_written_quoted_and_read_back_as_names(tmp_path, name):
    cluster = Cluster.model_validate({**CLUSTER, "name": name})
    save_yaml(cluster.model_dump(mode="json", exclude_defaults=True), tmp_path / "c.yaml")
    assert load_cluster(tmp_path / "c.yaml").name == name


# -- names -------------------------------------------------------------------------------------

@pytest.mark.parametrize("section, name, words", [
    (None, None, ["name: Input should be a valid string", "(got None)"]),
    (None, "", ["name: String should have at least 1 character"]),
    (None, [1, 2], ["name: Input should be a valid string"]),
    (None, {"a": 1}, ["name: Input should be a valid string"]),
    (None, 5, ["name: Input should be a valid string"]),
    (None, "a\nb", ["name: names hold printable characters only", r"'\n'"]),
    (None, "red\x1b[31m", ["name: names hold printable characters only", r"'\x1b'"]),
    ("model", "", ["model.name: String should have at least 1 character"]),
    ("cluster", "c\tx", ["cluster.name: names hold printable characters only"]),
    ("machine", 7, ["cluster.machines.0.name: Input should be a valid string"]),
])
def test_names_are_strings_of_printable_characters(tmp_path, section, name, words):
    line = one_line_error("validate", str(problem_file(tmp_path, section, name=name)))
    assert all(w in line for w in words), line


def test_a_huge_name_is_refused_at_once_in_a_short_line(tmp_path):
    start = time.perf_counter()
    line = one_line_error("validate", str(problem_file(tmp_path, "machine", name="m" * 100_000)))
    assert time.perf_counter() - start < 10
    assert "cluster.machines.0.name: names have at most 200 characters" in line
    assert len(line) < 300 and "(100,000 characters)" in line, line  # the name's length, not its repr's


def test_gpu_type_names_are_checked_too():
    with pytest.raises(ValidationError, match="at most 200 characters"):
        GpuType.model_validate({"name": "G" * 201, "peak_tflops": 1, "memory_gib": 1}, context=FROM_FILE)
    with pytest.raises(ValidationError, match="printable"):
        Machine.model_validate({**MACHINES[0], "gpu": "RTX4090\n"})


def test_names_the_planner_derives_stay_within_the_file_limit(tmp_path):
    """Replanning a problem named at the limit builds the smaller problem under a name that a
    file holds again (cut, with a hash of the whole name and the lost ids: tests/test_cli_replan.py)."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p" * 200, "cluster": "small-16", "model": "tiny", "training": TRAINING}))
    problem = load_problem(path)
    smaller, _ = survivors(problem, set(range(0, 16, 2)))
    assert smaller.cluster.num_devices == 8 and len(smaller.name) == MAX_NAME
    assert smaller.name.startswith("p" * 150) and "…-without-8-devices-" in smaller.name


def test_a_long_problem_name_still_names_its_inline_cluster_and_model(tmp_path):
    problem = load_problem(problem_file(tmp_path, None, name="p" * 200))
    assert problem.cluster.name.endswith("-cluster") and len(problem.cluster.name) == 200
    assert problem.model.name.endswith("-model") and len(problem.model.name) == 200


# -- gpu types -----------------------------------------------------------------------------------

def test_a_gpu_type_defined_twice_in_a_cluster_is_refused(tmp_path):
    types = [{"name": "X", "peak_tflops": 100, "memory_gib": 80}, {"name": "X", "peak_tflops": 200, "memory_gib": 80}]
    machines = [{**MACHINES[0], "gpu": "X"}]
    line = one_line_error("validate", str(problem_file(tmp_path, "cluster", gpu_types=types, machines=machines)))
    assert "gpu_types names must be unique; repeated: ['X']" in line, line
    with pytest.raises(InputError):
        load_problem(problem_file(tmp_path, "cluster", gpu_types=types, machines=machines))
