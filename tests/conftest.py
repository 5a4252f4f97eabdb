"""Fixtures shared by several test files."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and the 2-core CI machine is shared: with two
    OpenMP threads each of the GRU's many small ops waits for a busy core (30x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
