"""The exact CP-SAT solver of sequence plans (solvers/sequence/exact, docs/formulation.md
§7.1) against the brute-force oracle: equal feasibility and equal T on seeded tiny problems
(memory-tight and infeasible ones included), every plan valid and priced by the planner, the
proven bound below T by no more than the stated rounding; model sizes; for CP-SAT and the
MILP both: time limit, size refusal, registry."""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest

from planner.io import load_problem
from planner.solver_info import SolveStatus
from solvers import registry
from solvers.common import SolverOptions
from solvers.sequence import brute, heuristic
from solvers.sequence.exact import cpsat, milp
from solvers.sequence.exact.model import build_model, scale_of, tables_of
from solvers.sequence.exact.structure import canonical_devices, structures
from test_sequence_solvers import GENERATORS, SUITE, check_result, hetero_seq, tiny_seq

EXACT_SUITE = SUITE + [("hetero", s) for s in range(20, 32)]


def _memory_tight(problem, plan) -> bool:
    """The optimum spreads a replica over several devices although some device cannot hold the
    model states alone (as in tests/test_sequence_solvers.py)."""
    capacity = problem.cluster.machine_memory_bytes[problem.cluster.machine_of_device]
    return any(len(r.devices) > 1 for r in plan.replicas) and bool((capacity < 16 * problem.model.total_params).any())


@functools.lru_cache(maxsize=None)
def judged(family: str, seed: int):
    """(problem, brute force's result, CP-SAT's result, CP-SAT's wall s) of one suite problem,
    computed once per test session (tests/test_sequence_milp.py judges against the same)."""
    problem = GENERATORS[family](seed)
    start = time.perf_counter()
    res = cpsat.solve(problem)
    return problem, brute.solve(problem), res, time.perf_counter() - start


@pytest.fixture(scope="module")
def exact_results():
    return [judged(family, seed) for family, seed in EXACT_SUITE]


@pytest.mark.slow
def test_cpsat_equals_brute_force_on_seeded_tiny_problems(exact_results):
    agreed, infeasible, tight, worst_gap = 0, 0, 0, 0.0
    for problem, oracle, res, _ in exact_results:
        check_result(problem, res)
        if oracle.status == SolveStatus.infeasible:
            assert res.status == SolveStatus.infeasible and res.plan is None, problem.name
            infeasible += 1
            continue
        assert oracle.status == res.status == SolveStatus.optimal, problem.name
        assert res.objective_s == pytest.approx(oracle.objective_s, rel=1e-6), problem.name
        assert res.bound_s <= res.objective_s and res.bound_s <= oracle.objective_s * (1 + 1e-12), problem.name
        worst_gap = max(worst_gap, res.gap)
        tight += _memory_tight(problem, res.plan)
        agreed += 1
    times = [t for *_, t in exact_results]
    print(f"\ncpsat = brute on {agreed} feasible + {infeasible} infeasible problems ({tight} memory-tight); "
          f"worst bound gap {worst_gap:.2e}; cpsat {np.mean(times):.3f} s mean, {max(times):.3f} s worst")
    assert agreed + infeasible >= 40 and infeasible >= 3 and tight >= 3
    assert worst_gap <= 1e-8  # the time-unit rounding of [Q9]


def test_model_sizes_and_bounds_are_sane(exact_results):
    for problem, _, res, _ in exact_results:
        if res.status == SolveStatus.optimal:
            assert res.model_size.variables > 0 and res.model_size.constraints > 0
            assert "CP-SAT models" in res.message and "[Q9]" in res.message
    problem = hetero_seq(4)
    key = tuple(int(c) for c in np.bincount(problem.cluster.machine_of_device, minlength=len(problem.cluster.machines)))
    specs = structures(problem, key)
    tables = [tables_of(problem, s) for s in specs]
    scale = scale_of(problem, canonical_devices(problem, key), max(t.largest for t in tables))
    k, units = problem.model.num_kv_heads, problem.training.seq_len // (2 * problem.training.token_block)
    for spec, tb in zip(specs, tables):
        model, mv = build_model(problem, spec, tb, scale)
        n, g = len(spec.devices), len(spec.groups)
        assert len(mv.members.heads) == len(mv.members.blocks) == n and len(mv.shard) == g
        assert len(model.proto.variables) >= 4 * n + g + 4  # h, u, P, Q per member, U per group, 4 maxima
        assert all(len(t) == 2 * k * units + 1 for t in tb.a2a if t is not None)  # Y = 0..2kU
        assert all(len(t) == k * units + 1 for t in tb.ring if t is not None)  # V = 0..kU
    out = cpsat.best_ring(problem, key, math.inf, 1)
    assert 0 < out.models <= len(specs) and out.ring is not None
    assert out.error_s <= 1e-9 * out.tmb  # [Q9]
    assert out.bound <= out.tmb <= out.bound + out.error_s + 1e-12 * out.tmb


@pytest.mark.parametrize("base", [tiny_seq(13), hetero_seq(3)], ids=["tiny-13", "hetero-3"])
def test_cpsat_beyond_brute_force_is_optimal_and_no_worse_than_the_heuristic(base):
    """12 shard units: past brute force's limit (8), inside the model's."""
    problem = base.model_copy(update={"training": base.training.model_copy(
        update={"seq_len": 2 * base.training.token_block * 12})})
    assert brute.solve(problem).status == SolveStatus.unknown
    res, heur = cpsat.solve(problem), heuristic.solve(problem)
    check_result(problem, res)
    assert res.status == SolveStatus.optimal
    assert res.objective_s <= heur.objective_s * (1 + 1e-9) and res.bound_s <= heur.objective_s


EXACT_SOLVERS = pytest.mark.parametrize("solver", [cpsat, milp], ids=["cpsat", "milp"])


@EXACT_SOLVERS
def test_time_limit_never_claims_optimality(solver):
    res = solver.solve(tiny_seq(0), SolverOptions(time_limit_s=0.02))
    assert res.status in (SolveStatus.feasible, SolveStatus.unknown)
    check_result(tiny_seq(0), res)
    assert res.bound_s is None or res.bound_s <= brute.solve(tiny_seq(0)).objective_s * (1 + 1e-12)


@EXACT_SOLVERS
def test_refuses_large_problems(solver):
    res = solver.solve(load_problem("longctx-sim-32-llama3-8b-128k"))
    assert res.status == SolveStatus.unknown and "exact sequence model handles" in res.message


@pytest.mark.parametrize("name", ["cpsat", "milp"])
def test_registry_reaches_the_sequence_exact_solvers(name):
    problem = load_problem("longctx-tiny")
    res = registry.solve(problem, name, kind="sequence")
    check_result(problem, res)
    oracle = brute.solve(problem)
    assert res.status == oracle.status
    if oracle.objective_s is not None:
        assert math.isclose(res.objective_s, oracle.objective_s, rel_tol=1e-6)


@pytest.mark.parametrize("seed", range(40))
def test_the_exact_solvers_replica_split_is_brute_forces_least_max(seed):
    """The exact solvers split B/b over the replicas greedily (`least_max_split`: any size of
    B/b); brute force enumerates every split. Their least max agrees, ties of equal replicas
    included, and the split found reaches it."""
    from solvers.sequence.exact.driver import least_max

    rng = np.random.default_rng(seed)
    replicas = int(rng.integers(1, 5))
    times = [float(t) for t in rng.choice([0.5, 1.0, 1.5, 2.0, 3.0], replicas)] if seed % 2 else \
        [float(t) for t in rng.random(replicas) + 0.1]
    micro = int(rng.integers(replicas, 24))
    value, split = least_max(micro, times)
    assert value == pytest.approx(brute.best_batches(micro, times)[0], rel=1e-12)
    assert sum(split) == micro and min(split) >= 1
    assert max(m * t for m, t in zip(split, times)) == pytest.approx(value, rel=1e-12)


def test_a_large_batch_count_is_split_at_once_and_refused_by_brute_force():
    """B/b = 10⁸: the exact solvers' split needs no enumeration (it filled 12 GB), and brute
    force, which enumerates, says it is too big instead of running past its time."""
    from solvers.sequence.exact.driver import least_max

    value, split = least_max(10**8, [1.0, 2.0, 4.0])
    assert sum(split) == 10**8 and value == pytest.approx(4 / 7 * 10**8, rel=1e-7)
    problem = tiny_seq(0)
    big = problem.model_copy(update={"training": problem.training.model_copy(
        update={"global_batch": 10**8 * problem.training.micro_batch})})
    result = brute.solve(big)
    assert result.plan is None and "≤ 64 micro-batches B/b" in result.message and "100,000,000 micro-batches" in result.message
