"""`make demo QUICK=1`: every step from nothing to a first answered query; a second run skips the
work; a demo started on busy ports fails at once with a clear error."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aoq.net import free_port

ROOT = Path(__file__).resolve().parents[1]




def _demo(tmp_path, *args, timeout=600):
    env = {**os.environ, "AOQ_DATA_DIR": str(tmp_path / "data"), "AOQ_RUNS_DIR": str(tmp_path / "runs"),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("AOQ_CATALOGUE_URL", None)
    return subprocess.run([sys.executable, "-m", "aoq.cli.demo", "--quick", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_demo_reaches_a_first_query_then_skips_work(tmp_path):
    ports = ["--backend-port", str(free_port()), "--ui-port", str(free_port())]
    first = _demo(tmp_path, "--exit-when-ready", *ports)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "first query" in first.stdout and "ready in" in first.stdout
    assert (tmp_path / "runs" / "demo-quick" / "models" / "aoq" / "manifest.json").is_file()
    assert (tmp_path / "data" / "demo-quick" / "dataset_synth.json").is_file()

    second = _demo(tmp_path, "--prepare-only")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"dataset {tmp_path / 'data' / 'demo-quick'}: up to date, skipped" in second.stderr
    assert f"indexes {tmp_path / 'runs' / 'demo-quick' / 'index'}: up to date, skipped" in second.stderr
    assert "stage round1: up to date, skipped" in second.stderr
    assert "stage round2:aoq: up to date, skipped" in second.stderr


def test_second_demo_on_busy_ports_fails_fast(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        result = _demo(tmp_path, "--backend-port", str(port), "--ui-port", str(free_port()), timeout=60)
    assert result.returncode == 1
    assert f"port(s) {port} on 127.0.0.1 already in use" in result.stderr
    assert "is the demo already running?" in result.stderr
    assert time.monotonic() - start < 30
    assert not (tmp_path / "runs").exists()
