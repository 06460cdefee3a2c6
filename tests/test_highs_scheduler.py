"""HiGHS sizes one thread scheduler per process; solves asking other sizes must still run. The
configuration bound's 1-thread HiGHS solves, run before the 2-thread MILPs in one test process,
made every MILP after them fail as 'no plan found within the time limit' (a whole CI-order
suite failed 20 exact-agreement tests that pass alone)."""

from __future__ import annotations

import numpy as np

from exact_problems import random_problem
from solvers.common import SolverOptions
from solvers.layered.bound.integer import _most_micro
from solvers.layered.exact import milp

USAGE, CAPACITY, DEVICES = np.array([[1, 0], [0, 1]]), np.array([2.0, 3.0]), np.array([2, 2])


def test_one_and_two_thread_highs_solves_alternate_in_one_process():
    for _ in range(2):
        value, _solution = _most_micro(USAGE, CAPACITY, DEVICES, 2)
        assert value == 6.0  # two pipelines of the 3-micro-batch column: 2 devices of class 1
        result = milp.solve(random_problem(0), SolverOptions(time_limit_s=30, threads=2))
        assert result.status.value == "optimal", result.message
