"""Fixtures shared by several test files."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from aoq.net import free_port
from tests import compose_prebuild
from tests.demo_helpers import run_demo, sources_or_skip


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and the 2-core CI machine is shared: with two
    OpenMP threads each of the GRU's many small ops waits for a busy core (30x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The quick demo run once from nothing to its first answered query (``--exit-when-ready``):
    (its folder, that run). The demo tests check that run; the browser test serves its models."""
    sources_or_skip()
    root = tmp_path_factory.mktemp("quick-demo")
    first = run_demo(root, "--exit-when-ready", "--backend-port", str(free_port()), "--ui-port", str(free_port()))
    return root, first


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker process takes one core: torch's threads (and those of the
    processes a test starts) would otherwise wait on each other across the workers. The
    controller names the file where the compose preparation it may run tells the workers how it
    went (tests/compose_prebuild.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    elif getattr(config.option, "numprocesses", None):
        state_dir = Path(tempfile.mkdtemp(prefix="aoq-compose-prebuild-"))
        config.add_cleanup(lambda: shutil.rmtree(state_dir, ignore_errors=True))
        os.environ[compose_prebuild.STATE_ENV] = str(state_dir / "state.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The compose tests run last, and their image build starts now in the background, so the
    build's minutes overlap the rest of the suite (tests/compose_prebuild.py; under pytest-xdist
    the controller starts it, :func:`pytest_xdist_node_collection_finished`)."""
    compose = [item for item in items if item.path.name == compose_prebuild.MODULE]
    if not compose or config.option.collectonly:
        return
    items[:] = [item for item in items if item.path.name != compose_prebuild.MODULE] + compose
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        compose_prebuild.prebuild()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """The xdist controller: a worker collected the compose tests, so their preparation starts."""
    if not node.config.option.collectonly and any(compose_prebuild.MODULE in i for i in ids):
        compose_prebuild.prebuild()


def pytest_sessionfinish(session: pytest.Session) -> None:
    compose_prebuild.finish()
