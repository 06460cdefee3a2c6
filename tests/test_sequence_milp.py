"""The exact MILP solver of sequence plans (solvers/sequence/exact/milp.py, docs/formulation.md
§7.1.1) against the brute-force oracle and the CP-SAT model: equal feasibility and equal T
(to 1e-6) on seeded tiny problems (memory-tight and infeasible ones included), every plan valid
and priced by the planner, the bound below T; the one-hot look-ups, model sizes (time limit,
size refusal and registry: tests/test_sequence_exact.py, for both exact solvers)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from planner.solver_info import SolveStatus
from solvers.sequence.exact import milp
from solvers.sequence.exact.model import tables_of
from solvers.sequence.exact.structure import canonical_devices, structures
from test_sequence_exact import EXACT_SUITE, _memory_tight, judged
from test_sequence_solvers import GENERATORS, check_result, hetero_seq


@pytest.fixture(scope="module")
def milp_results():
    out = []
    for family, seed in EXACT_SUITE:
        problem, oracle, by_cpsat, _ = judged(family, seed)  # brute force and CP-SAT solved once per session
        start = time.perf_counter()
        res = milp.solve(problem)
        out.append((problem, oracle, by_cpsat, res, time.perf_counter() - start))
    return out


@pytest.mark.slow
def test_milp_equals_brute_force_and_cpsat_on_seeded_tiny_problems(milp_results):
    agreed, infeasible, tight, worst_gap, worst_diff = 0, 0, 0, 0.0, 0.0
    for problem, oracle, cp, res, _ in milp_results:
        check_result(problem, res)
        assert cp.status == oracle.status, problem.name
        if oracle.status == SolveStatus.infeasible:
            assert res.status == SolveStatus.infeasible and res.plan is None, problem.name
            infeasible += 1
            continue
        assert oracle.status == res.status == SolveStatus.optimal, problem.name
        assert res.objective_s == pytest.approx(oracle.objective_s, rel=1e-6), problem.name
        assert res.objective_s == pytest.approx(cp.objective_s, rel=1e-6), problem.name
        assert res.bound_s <= res.objective_s and res.bound_s <= oracle.objective_s * (1 + 1e-12), problem.name
        worst_gap = max(worst_gap, res.gap)
        worst_diff = max(worst_diff, abs(res.objective_s - oracle.objective_s) / oracle.objective_s)
        tight += _memory_tight(problem, res.plan)
        agreed += 1
    times = [t for *_, t in milp_results]
    print(f"\nmilp = brute = cpsat on {agreed} feasible + {infeasible} infeasible problems ({tight} memory-tight); "
          f"worst |T − T_brute|/T {worst_diff:.1e}, worst bound gap {worst_gap:.1e}; "
          f"milp {np.mean(times):.3f} s mean, {max(times):.3f} s worst")
    assert agreed + infeasible >= 40 and infeasible >= 3 and tight >= 3
    assert worst_gap <= 1e-8  # GAP of the MIP and the bound's deflation


def test_model_sizes_and_messages(milp_results):
    for problem, _, _, res, _ in milp_results:
        if res.status == SolveStatus.optimal:
            assert res.model_size.variables > 0 and res.model_size.constraints > 0
            assert "MILP models (HiGHS)" in res.message


@pytest.mark.parametrize("family,seed", [("tiny", 1), ("hetero", 4), ("hetero", 50), ("tiny", 24)])
def test_one_hot_look_ups_give_the_same_optimum(family, seed):
    """[M-S3] the one-hot form of every look-up (forced) equals the affine form."""
    problem = GENERATORS[family](seed)
    affine, onehot = milp.solve(problem), milp.solve(problem, onehot=True)
    check_result(problem, onehot)
    assert onehot.status == affine.status
    if affine.objective_s is not None:
        assert onehot.objective_s == pytest.approx(affine.objective_s, rel=1e-6)
        assert onehot.model_size.variables > affine.model_size.variables


def test_every_table_is_affine_so_the_default_model_has_no_look_up_binaries():
    problem = hetero_seq(4)
    key = tuple(int(c) for c in np.bincount(problem.cluster.machine_of_device, minlength=len(problem.cluster.machines)))
    unit = milp.time_unit(problem, canonical_devices(problem, key))
    for spec in structures(problem, key):
        tb = tables_of(problem, spec)
        lp, v = milp.build_milp(problem, spec, tb, unit)
        k, n = problem.model.num_kv_heads, len(spec.devices)
        binaries = [x for x in lp.variables() if x.cat == "Integer" and x.upBound == 1 and x.lowBound == 0]
        assert len(binaries) == k * n  # only the one-hot of every member's kv heads [M-S1]
        assert len(v.blocks) == n and len(v.shard) == len(spec.groups)
        assert len(milp.build_milp(problem, spec, tb, unit, onehot=True)[0].variables()) > len(lp.variables())
