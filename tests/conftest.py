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
