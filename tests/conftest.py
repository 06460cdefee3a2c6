"""Fixtures shared by several test modules."""

import signal
import tempfile

import pytest


@pytest.fixture(autouse=True)
def signals_kept():
    """SIGINT's and SIGTERM's handlers and the signal mask as the test found them: a command run
    in-process that is interrupted ends by ignoring SIGINT (so that a second Ctrl-C cannot cut its
    last line), and every process this worker started after it inherited the ignored SIGINT (exec
    keeps SIG_IGN): a later test's run then went on through its Ctrl-C (make test, 2026-12-07).
    The tests that Ctrl-C a command also start it as a terminal would (`terminal.py`)."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    for signum, handler in before.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(scope="session", autouse=True)
def suite_temp_folder(tmp_path_factory):
    """The suite's temporary files, and those of every process it starts, under pytest's own
    folder (pytest keeps the last three runs' and removes older ones). A run without `--out`
    keeps its logs in a temporary folder on purpose, as do agents that a fault test SIGKILLs
    before they can clean up: in /tmp these piled up by the hundred over a day of suites."""
    folder = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:  # both restored at the session's end
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread in this process (restored afterwards): the tiny ops of the
    runtime tests are slower with two threads contending on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_solving(monkeypatch):
    """Any solve fails the test: a refusal (bad input, an output path) must come before it."""
    import hexiscale.cli.compare as compare_mod
    import hexiscale.cli.frontier as frontier_mod
    import hexiscale.cli.replan as replan_mod
    import hexiscale.cli.solve as solve_mod

    def forbidden(*args, **kwargs):
        raise AssertionError("solved before checking the input")

    for module, name in ((solve_mod, "solve_any_kind"), (compare_mod, "compare_problem"),
                         (replan_mod, "replan_plan"), (frontier_mod.frontiers, "frontier")):
        monkeypatch.setattr(module, name, forbidden)


@pytest.fixture
def no_move_work(monkeypatch):
    """The layered structure moves' default work at nothing (not 160 structures per second of the
    time limit, at least 400), for tests of something else than the layered plan's quality: the
    same search at any machine speed. On the long-context testbed (tests/test_kind_auto.py) the
    plans are the same as with 400 and the layered solves take 3.5 s, not 6-10."""
    import solvers.layered.heuristic.options as heuristic_options
    monkeypatch.setattr(heuristic_options, "MOVE_EVALUATIONS_PER_S", 0)
    monkeypatch.setattr(heuristic_options, "MIN_MOVE_EVALUATIONS", 0)


def pytest_collection_modifyitems(config, items):
    """The modules that hold a slow test first, whole and in their collected order: `make test`
    runs the suite on one pytest-xdist worker per core with work stealing, and a minute-long test
    collected last would run alone at the end while the other core idles; run first, the short
    tests that follow fill in around it. Whole modules, so that a module's shared results
    (module fixtures, caches) are computed once: moving only the slow tests had
    tests/test_sequence_exact.py's and test_sequence_milp.py's fixtures (18–19 s each)
    computed twice."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)
