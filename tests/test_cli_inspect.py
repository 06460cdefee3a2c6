"""CLI: validate, evaluate (table and --json), instances, schema, generate."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from hexiscale.cli import app
from instances.generate import generate_cluster
from planner import Estimate, Plan, evaluate, load_plan, load_problem
from planner.io import bundled_names, load_cluster

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output, result.stderr)
    return result


def test_validate_ok():
    assert "valid for demo-tiny" in invoke("validate", "demo-tiny", "demo-tiny").stdout
    assert "ok" in invoke("validate", "instances/clusters/tiny-4.yaml").stdout
    assert "ok" in invoke("validate", "instances/models/llama2-70b.yaml").stdout


def test_evaluate_json_round_trips_to_the_evaluator():
    out = invoke("evaluate", "demo-tiny", "demo-tiny", "--json").stdout
    assert Estimate.model_validate_json(out) == evaluate(load_problem("demo-tiny"), load_plan("demo-tiny"))


def test_evaluate_table_shows_every_stage_and_the_breakdown():
    est = evaluate(load_problem("demo-tiny"), load_plan("demo-tiny"))
    out = invoke("evaluate", "demo-tiny", "demo-tiny").stdout
    for row in ("0.0", "0.1", "1.0"):  # pipeline.stage of each of the three stages
        assert f"\n {row} " in out or f"\n{row} " in out, out
    for word in ("T (iteration)", "max T_pipe", "T_dp", "tokens/s", "MFU", "bottleneck", est.bottleneck.kind):
        assert word in out
    assert f"{est.tokens_per_s:,.0f}" in out
    assert "r4090-0" in out and "0-1" in out  # machine and devices of the TP-2 stage


def test_evaluate_flags_out_of_memory_stages(tmp_path):
    problem = tmp_path / "tight.yaml"
    problem.write_text(yaml.safe_dump({"name": "demo-tiny", "cluster": "demo-4", "model": "tiny",
                                       "training": {"seq_len": 64, "global_batch": 8, "reserved_gib": 23.9999}}))
    result = invoke("evaluate", str(problem), "demo-tiny")
    assert "out of memory" in result.stdout and "[memory]" in result.stdout


def test_instances_lists_every_bundled_instance():
    out = invoke("instances").stdout
    for kind in ("clusters", "models", "problems", "plans"):
        for name in bundled_names(kind):
            assert name in out, name
    plans = invoke("instances", "--kind", "plans").stdout
    assert "2 pipelines" in plans and "tp2×3→tp1×1" in plans


def test_schema_matches_the_types():
    every = json.loads(invoke("schema").stdout)
    assert set(every) == {"problem", "cluster", "model", "training", "plan", "seqplan"}
    plan = json.loads(invoke("schema", "--type", "plan").stdout)
    assert plan == every["plan"] == {**Plan.model_json_schema(), "required": ["format", "pipelines"]}
    assert set(plan["properties"]) == {"format", "problem", "pipelines", "solver"}
    # the reader refuses a plan without its format tag, so the schema requires it (QA: it did not)
    assert json.loads(invoke("schema", "--type", "seqplan").stdout)["required"] == ["format", "replicas"]
    stage = plan["$defs"]["Stage"]
    assert stage["additionalProperties"] is False and stage["properties"]["layers"]["minimum"] == 1
    assert runner.invoke(app, ["schema", "--type", "nope"]).exit_code == 2


def test_generate_cluster_writes_the_seeded_cluster(tmp_path):
    mix = "A100-80G:0.25,RTX4090:0.5,H20:0.25"
    a, b, c = (tmp_path / n for n in ("a.yaml", "b.yaml", "c.yaml"))
    invoke("generate", "cluster", "--gpus", "64", "--mix", mix, "--seed", "7", "-o", str(a))
    invoke("generate", "cluster", "--gpus", "64", "--mix", mix, "--seed", "7", "-o", str(b))
    invoke("generate", "cluster", "--gpus", "64", "--mix", mix, "--seed", "8", "-o", str(c))
    assert a.read_text() == b.read_text() != c.read_text()
    assert load_cluster(a) == generate_cluster(64, mix, 7)


def test_generate_problem_and_bad_arguments(tmp_path):
    out = tmp_path / "p.yaml"
    invoke("generate", "problem", "--gpus", "128", "--seed", "1", "--global-batch", "64", "-o", str(out))
    problem = load_problem(out)
    assert problem.cluster.num_devices == 128 and problem.model.name == "llama2-70b"
    assert problem.training.global_batch == 64 and problem.training.seq_len == 4096
    for args in (["--gpus", "30"], ["--gpus", "32", "--mix", "B200:1"], ["--gpus", "32", "--mix", "H20"]):
        result = runner.invoke(app, ["generate", "cluster", *args, "-o", str(out)])
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_runs_of_ids_are_collapsed_for_devices_and_d_values():
    """One formatter for device ids in the tables and D values in the exact solvers' messages
    (a note said "not proven for D in [1, 2, 3, …, 24]")."""
    from planner.base import format_runs

    assert format_runs([0, 1, 2, 3, 8]) == "0-3,8"
    assert format_runs(list(range(1, 25))) == "1-24"
    assert format_runs([2, 4, 5, 7]) == "2,4-5,7"
    assert format_runs([5]) == "5" and format_runs([]) == ""


def test_a_long_sequence_no_ring_can_split_is_said_where_the_problem_is_made_and_solved(tmp_path):
    """s = 100,000 is not a multiple of 2q = 128: no sequence plan exists. generate and validate
    said nothing, and solve's kind choice said only 'sequence: no plan (infeasible)'; each now
    gives the reason. Short sequences (no ring needed) say nothing."""
    path = tmp_path / "odd.yaml"
    made = CliRunner().invoke(app, ["generate", "problem", "--gpus", "8", "--seq-len", "100000", "--model",
                                    "llama3-8b", "--global-batch", "4", "-o", str(path)])
    why = "seq_len 100000 is not a multiple of 2·token_block = 128"
    assert made.exit_code == 0 and f"note: {why}" in made.output and "layered plans only" in made.output
    checked = CliRunner().invoke(app, ["validate", str(path)])
    assert checked.exit_code == 0 and f"note: {why}" in checked.output
    assert "note" not in CliRunner().invoke(app, ["validate", "demo-tiny"]).output
    solved = CliRunner().invoke(app, ["solve", str(path), "-t", "5", "--json"])
    assert solved.exit_code == 0 and f"sequence: no plan (infeasible: {why}" in json.loads(solved.stdout)["kind_reason"]
