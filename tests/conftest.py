"""Fixtures shared by several test modules."""

import pytest


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread in this process (restored afterwards): the tiny ops of the
    runtime tests are slower with two threads contending on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """The slow tests first, each group in its collected order: `make test` runs the suite on
    one pytest-xdist worker per core with work stealing, and a minute-long test collected last
    would run alone at the end while the other core idles; run first, the short tests that
    follow fill in around it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
