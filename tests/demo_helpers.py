"""The quick emoji demo run as a user runs it (``python -m aoq_cli.demo --quick``), in a folder of
its own: its environment, and a skip when the emoji sources are not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aoq.data.dataset import DataError

ROOT = Path(__file__).resolve().parents[1]


def sources_or_skip() -> None:
    from aoq_train.datasets.emoji.sources import locate_sources

    try:
        locate_sources()
    except DataError as exc:
        pytest.skip(f"emoji sources missing (make data-deps): {exc}")


def demo_env(root: Path) -> dict[str, str]:
    """Data, runs and the feature cache under ``root``; the embedded catalogue."""
    env = {**os.environ, "AOQ_DATA_DIR": str(root / "data"), "AOQ_RUNS_DIR": str(root / "runs"),
           "AOQ_FEATURE_CACHE": str(root / "features"), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("AOQ_CATALOGUE_URL", None)
    return env


def run_demo(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aoq_cli.demo", "--quick", *args], cwd=ROOT, env=demo_env(root),
                          capture_output=True, text=True, timeout=timeout)
