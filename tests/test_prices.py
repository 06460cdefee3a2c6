"""Prices, budgets and the cost per token (docs/prices.md §13): the schema refuses what
cannot be priced (one line naming the field, exit 2), and rent, cost per token and the budget
test agree with hand-computed figures for plans of both kinds."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hexiscale.cli import app
from instances.price_table import builtin_prices, priced
from planner.hardware import Cluster, GpuType, Machine, builtin_catalog
from planner.io import load_cluster, load_plan, load_problem
from planner.kinds import evaluate
from planner.prices import (cost_per_mtok, objective_value, rent_per_hour, rented_machines,
                            within_budget)
from planner.problem import Objective, Problem
from solvers.choose import solve
from solvers.common import SolverOptions

# demo-4: r4090-0 (2 × RTX4090, devices 0–1), r3090-0 (2 × RTX3090, devices 2–3)
DEMO_CLUSTER = {
    "name": "demo-4-priced", "inter_bw_gbps": 1.25,
    "gpu_types": [{"name": "RTX4090", "vendor": "nvidia", "peak_tflops": 165.2, "memory_gib": 24,
                   "price_per_hour": 0.40}],
    "machines": [{"name": "r4090-0", "gpu": "RTX4090", "count": 2, "intra_bw_gbps": 16},
                 {"name": "r3090-0", "gpu": "RTX3090", "count": 2, "intra_bw_gbps": 16, "price_per_hour": 0.25}],
}
TRAINING = {"seq_len": 64, "global_batch": 8, "micro_batch": 1, "recompute": True}


def write_problem(tmp_path, cluster=DEMO_CLUSTER, **top) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "demo-tiny", "cluster": cluster, "model": "tiny",
                                    "training": TRAINING, **top}))
    return str(path)


def one_line_error(args) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "Traceback" not in result.output + result.stderr
    return lines[0]


def flat(text: str) -> str:
    """Terminal output with its wrapping undone (every run of spaces and newlines as one space)."""
    return " ".join(text.split())


def unpriced_cluster() -> dict:
    """DEMO_CLUSTER with the 3090 machine's price removed (its type has none either)."""
    machines = [dict(DEMO_CLUSTER["machines"][0]), {k: v for k, v in DEMO_CLUSTER["machines"][1].items()
                                                   if k != "price_per_hour"}]
    return {**DEMO_CLUSTER, "machines": machines}


def test_cluster_prices_machine_overrides_type():
    cluster = Cluster.model_validate(DEMO_CLUSTER)
    assert cluster.device_price(0) == 0.40 and cluster.device_price(1) == 0.25
    assert cluster.priced
    assert not Cluster.model_validate(unpriced_cluster()).priced
    assert Cluster.model_validate(unpriced_cluster()).device_price(1) is None


def test_budget_without_prices_names_the_field(tmp_path):
    line = one_line_error(["validate", write_problem(tmp_path, unpriced_cluster(), budget_per_hour=5)])
    assert "budget_per_hour" in line and "cluster.machines[1].price_per_hour" in line and "RTX3090" in line


def test_cost_objective_without_prices_names_the_field(tmp_path):
    line = one_line_error(["validate", write_problem(tmp_path, unpriced_cluster(), objective="cost")])
    assert "objective: cost" in line and "cluster.machines[1].price_per_hour" in line


@pytest.mark.parametrize("where", ["machine", "type"])
def test_negative_price_is_refused(tmp_path, where):
    cluster = json.loads(json.dumps(DEMO_CLUSTER))
    target = cluster["machines"][1] if where == "machine" else cluster["gpu_types"][0]
    target["price_per_hour"] = -1
    line = one_line_error(["validate", write_problem(tmp_path, cluster)])
    assert "price_per_hour" in line and "greater than or equal to 0" in line


@pytest.mark.parametrize("top, words", [({"budget_per_hour": 0}, ["budget_per_hour", "greater than 0"]),
                                        ({"objective": "money"}, ["objective", "'time' or 'cost'"])])
def test_bad_objective_or_budget(tmp_path, top, words):
    line = one_line_error(["validate", write_problem(tmp_path, **top)])
    assert all(w in line for w in words), line


def test_time_objective_needs_no_prices(tmp_path):
    problem = load_problem(write_problem(tmp_path, unpriced_cluster()))
    assert problem.objective == Objective.time and problem.budget_per_hour is None
    plan = load_plan("demo-tiny")
    estimate = evaluate(problem, plan)
    assert estimate.rent_per_hour is None and estimate.cost_per_mtok is None
    assert rent_per_hour(problem, plan) is None and within_budget(problem, plan)


def test_rent_and_cost_of_a_layered_plan(tmp_path):
    problem = load_problem(write_problem(tmp_path, objective="cost", budget_per_hour=1.2))
    plan = load_plan("demo-tiny")  # uses devices 0–3: both machines
    assert rented_machines(problem, plan.devices) == (0, 1)
    rent = 2 * 0.40 + 2 * 0.25
    assert rent_per_hour(problem, plan) == pytest.approx(rent)
    estimate = evaluate(problem, plan)
    tokens = 8 * 64  # B·s
    expected = rent * estimate.iteration_s / (3600 * tokens) * 1e6
    assert estimate.rent_per_hour == pytest.approx(rent)
    assert estimate.cost_per_mtok == pytest.approx(expected)
    assert cost_per_mtok(problem, plan, estimate.iteration_s) == pytest.approx(expected)
    assert objective_value(problem, plan, estimate.iteration_s) == pytest.approx(expected)
    assert not within_budget(problem, plan)  # 1.30 > 1.2
    assert within_budget(problem.model_copy(update={"budget_per_hour": 1.3}), plan)  # exactly the budget


def test_a_plan_on_one_machine_rents_only_it(tmp_path):
    problem = load_problem(write_problem(tmp_path, budget_per_hour=1.0))
    plan = load_plan("demo-tiny").model_validate(
        {"format": "hexiscale.plan/1", "pipelines": [{"batch": 8, "stages": [{"devices": [3], "layers": 4}]}]})
    assert rented_machines(problem, plan.devices) == (1,)
    assert rent_per_hour(problem, plan) == pytest.approx(0.50)  # the whole machine: 2 devices × 0.25
    assert within_budget(problem, plan)
    iteration = evaluate(problem, plan).iteration_s
    assert objective_value(problem, plan, iteration) == iteration  # objective time


def test_rent_and_cost_of_a_sequence_plan():
    base = load_problem("longctx-tiny")  # h100-0 (2, devices 0–1), a100-0 (device 2), mi250x-0 (device 3)
    priced = base.cluster.model_copy(update={"machines": tuple(
        m.model_copy(update={"price_per_hour": p}) for m, p in zip(base.cluster.machines, (3.0, 1.5, 2.0)))})
    problem = Problem(name=base.name, cluster=Cluster.model_validate(priced.model_dump()), model=base.model,
                      training=base.training, objective="cost")
    plan = load_plan("longctx-tiny")  # devices 0, 1, 2 and 3
    rent = 2 * 3.0 + 1.5 + 2.0
    estimate = evaluate(problem, plan)
    assert estimate.rent_per_hour == pytest.approx(rent)
    tokens = problem.training.global_batch * problem.training.seq_len
    assert estimate.cost_per_mtok == pytest.approx(rent * estimate.iteration_s / (3600 * tokens) * 1e6)
    assert math.isclose(objective_value(problem, plan, estimate.iteration_s), estimate.cost_per_mtok)


def test_problem_refuses_cost_without_prices_in_the_api():
    base = load_problem("demo-tiny")
    with pytest.raises(ValueError, match=r"cluster.machines\[0\].price_per_hour"):
        Problem(name="x", cluster=base.cluster, model=base.model, training=base.training, objective="cost")
    typed = Cluster(machines=(Machine(name="m", gpu="X", count=1, intra_bw_gbps=1),), inter_bw_gbps=1,
                    gpu_types=(GpuType(name="X", peak_tflops=1, memory_gib=1, price_per_hour=2.5),))
    assert typed.priced and typed.device_price(0) == 2.5


def test_solve_json_and_api_carry_rent_and_cost(tmp_path):
    path = write_problem(tmp_path)
    result = CliRunner().invoke(app, ["solve", path, "--kind", "layered", "-t", "20", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    problem = load_problem(path)
    plan = load_plan("demo-tiny").model_validate(out["plan"])
    rent = rent_per_hour(problem, plan)
    assert out["rent_per_hour"] == pytest.approx(rent) and out["estimate"]["rent_per_hour"] == pytest.approx(rent)
    assert out["cost_per_mtok"] == pytest.approx(cost_per_mtok(problem, plan, out["estimate"]["iteration_s"]))
    api = solve(problem, "heuristic", SolverOptions(time_limit_s=5), kind="layered")
    assert api.rent_per_hour == pytest.approx(rent_per_hour(problem, api.plan))
    assert api.cost_per_mtok == pytest.approx(evaluate(problem, api.plan).cost_per_mtok)


def test_solve_json_without_prices_has_no_rent(tmp_path):
    result = CliRunner().invoke(app, ["solve", write_problem(tmp_path, unpriced_cluster()), "--kind", "layered",
                                      "-t", "20", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert "rent_per_hour" not in out and "cost_per_mtok" not in out["estimate"]


def test_prices_on_some_machines_only_are_said_where_the_rent_would_be(tmp_path):
    """One machine priced, the other not (nor its type): validate, solve and evaluate had shown no
    rent and said nothing; each now names the first unpriced machine's field."""
    path = write_problem(tmp_path, unpriced_cluster())
    said = ("no rent: cluster.machines[1].price_per_hour (r3090-0) is missing, and so is price_per_hour of its "
            "GPU type RTX3090; rent and cost are shown when every machine has a price")
    checked = CliRunner().invoke(app, ["validate", path])
    assert checked.exit_code == 0 and f"note: {said}" in flat(checked.output), checked.output
    solved = CliRunner().invoke(app, ["solve", path, "--kind", "layered", "-t", "10", "-o", str(tmp_path / "s.json")])
    assert solved.exit_code == 0 and said in flat(solved.output), solved.output
    judged = CliRunner().invoke(app, ["evaluate", path, str(tmp_path / "s.json")])
    assert judged.exit_code == 0 and said in flat(judged.output), judged.output
    bare = write_problem(tmp_path, {**unpriced_cluster(), "gpu_types": [], "machines": [
        {k: v for k, v in m.items() if k != "price_per_hour"} for m in DEMO_CLUSTER["machines"]]})
    assert "no rent" not in flat(CliRunner().invoke(app, ["validate", bare]).output)  # no prices at all: as before


def test_the_price_table_prices_every_catalog_type_and_cites_each():
    table = builtin_prices()
    assert set(table) == set(builtin_catalog())
    assert all(0 < p < 10 for p in table.values())
    text = (Path(__file__).parents[1] / "instances" / "prices.yaml").read_text()
    for line in text.splitlines():
        if line.lstrip().startswith("- {gpu:"):
            comment = line.partition("#")[2]
            assert re.search(r"\[S\d\]", comment) or "ESTIMATE" in comment, line
    cited = set(re.findall(r"\[S\d\]", text.partition("prices:")[2]))
    for source in cited:  # every cited source is listed with its address and date
        entry = text.partition(f"#   {source}")[2].partition("#   [S")[0]
        assert "https://" in entry and re.search(r"20\d\d", entry), source


def test_generate_cluster_with_prices(tmp_path):
    out = tmp_path / "c.yaml"
    result = CliRunner().invoke(app, ["generate", "cluster", "--gpus", "16", "--mix", "H100:1,RTX4090:1",
                                      "--prices", "-o", str(out)])
    assert result.exit_code == 0, result.output
    cluster = load_cluster(out)
    # rich wraps at 80 columns off a terminal: where it breaks depends on the temp path's length
    assert cluster.priced and "/h for all of it" in " ".join(result.stdout.split())
    table = builtin_prices()
    assert cluster.machine_rent.sum() == pytest.approx(sum(m.count * table[m.gpu] for m in cluster.machines))
    problem = tmp_path / "p.yaml"
    result = CliRunner().invoke(app, ["generate", "problem", "--gpus", "8", "--mix", "A100-80G:1", "--model",
                                      "llama2-7b", "--prices", "-o", str(problem)])
    assert result.exit_code == 0, result.output
    assert load_problem(problem).cluster.device_price(0) == table["A100-80G"]


def test_priced_keeps_the_figures_a_cluster_already_has():
    cluster = priced(Cluster.model_validate(DEMO_CLUSTER))  # RTX4090 typed at 0.40, r3090-0 at 0.25
    assert cluster.device_price(0) == 0.40 and cluster.device_price(1) == 0.25
    bare = priced(load_problem("demo-tiny").cluster)
    assert bare.device_price(1) == builtin_prices()["RTX3090"]


def test_the_offers_problems():
    plain, budget, cost = (load_problem(n) for n in
                           ("offers-llama2-13b", "offers-llama2-13b-budget", "offers-llama2-13b-cost"))
    cluster = plain.cluster
    types = {m.gpu for m in cluster.machines}
    assert 4 <= len(types) <= 6 and cluster.priced and plain.model.name == "llama2-13b"
    assert float(cluster.machine_rent.sum()) == pytest.approx(92.32)
    assert budget.budget_per_hour < float(cluster.machine_rent.sum()) / 3  # a menu, not a shopping list
    assert cost.objective == Objective.cost and plain.objective == Objective.time
    for t in types:  # the menu's prices are the table's
        assert cluster.catalog[t].price_per_hour == builtin_prices()[t]


def test_evaluate_and_solve_print_rent_and_cost(tmp_path):
    path = write_problem(tmp_path, budget_per_hour=2.0)
    result = CliRunner().invoke(app, ["evaluate", path, "demo-tiny"])
    assert result.exit_code == 0, result.output
    assert "$1.30/h: 2 of 2 machines (4 of 4 GPUs), within the budget of $2.00/h" in flat(result.stdout)
    problem, plan = load_problem(path), load_plan("demo-tiny")
    assert f"${evaluate(problem, plan).cost_per_mtok:.4g} per million tokens" in flat(result.stdout)
    solved = CliRunner().invoke(app, ["solve", path, "--kind", "layered", "-t", "20"])
    assert solved.exit_code == 0, solved.output
    assert "rent $" in flat(solved.stdout) and "per million tokens" in flat(solved.stdout)
    bare = CliRunner().invoke(app, ["evaluate", write_problem(tmp_path, unpriced_cluster()), "demo-tiny"])
    assert "per million tokens" not in bare.stdout and "rent $" not in flat(bare.stdout)
    assert "no rent: cluster.machines[1].price_per_hour" in flat(bare.stdout)  # some machines priced: said why


def test_show_marks_rented_machines(tmp_path):
    path = write_problem(tmp_path)
    one_machine = tmp_path / "plan.json"
    one_machine.write_text(json.dumps({"format": "hexiscale.plan/1", "problem": "demo-tiny", "pipelines": [
        {"batch": 8, "stages": [{"devices": [2, 3], "layers": 4}]}]}))
    result = CliRunner().invoke(app, ["show", path, str(one_machine), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("r3090-0" in line and "$0.50" in line and "rented" in line and "not" not in line for line in lines)
    assert any("r4090-0" in line and "$0.80" in line and "not rented" in line for line in lines)
    assert (tmp_path / "cluster.png").stat().st_size > 0


def test_idle_view_names_the_machines_the_budget_cannot_rent(tmp_path):
    path = write_problem(tmp_path, budget_per_hour=1.0)  # the 3090 box ($0.50) fits, the 4090 box ($0.80) not both
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "hexiscale.plan/1", "problem": "demo-tiny", "pipelines": [
        {"batch": 8, "stages": [{"devices": [2, 3], "layers": 4}]}]}))
    result = CliRunner().invoke(app, ["evaluate", path, str(plan)])
    assert result.exit_code == 0, result.output
    assert "r4090-0: not rented, renting any of them would exceed the budget of $1.00/h" in flat(result.stdout)


def test_compare_prints_rent_and_cost_columns(tmp_path):
    result = CliRunner().invoke(app, ["compare", write_problem(tmp_path), "--solvers", "symmetric", "-t", "20"])
    assert result.exit_code == 0, result.output
    assert "$/h" in result.stdout and "$/Mtok" in result.stdout
    bare = CliRunner().invoke(app, ["compare", write_problem(tmp_path, unpriced_cluster()), "--solvers", "symmetric",
                                    "-t", "20"])
    assert "$/h" not in bare.stdout and "tok/s" in bare.stdout
