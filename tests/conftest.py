"""Fixtures shared by several test files."""

import pytest
import torch

from tests import compose_prebuild


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and the 2-core CI machine is shared: with two
    OpenMP threads each of the GRU's many small ops waits for a busy core (30x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The compose tests run last, and their image build starts now in the background, so the
    build's minutes overlap the rest of the suite (tests/compose_prebuild.py)."""
    compose = [item for item in items if item.path.name == compose_prebuild.MODULE]
    if not compose or config.option.collectonly:
        return
    items[:] = [item for item in items if item.path.name != compose_prebuild.MODULE] + compose
    compose_prebuild.prebuild()


def pytest_sessionfinish(session: pytest.Session) -> None:
    compose_prebuild.finish()
