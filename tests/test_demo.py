"""`make demo QUICK=1` on the real emoji dataset: every step from nothing to a first answered
query; a second run skips the work; SIGTERM stops the demo and both servers; a demo started on
busy ports fails at once with a clear error."""

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aoq.net import free_port, port_free
from tests.demo_helpers import ROOT, demo_env, run_demo


@pytest.mark.slow
def test_quick_demo_reaches_a_first_query_then_skips_work(quick_demo):
    demo_root, first = quick_demo
    assert first.returncode == 0, first.stderr[-3000:]
    assert "first query" in first.stdout and "ready in" in first.stdout
    for stage in ("dataset", "features", "pipeline", "indexes", "servers", "first query"):
        assert f"stage {stage}: " in first.stderr, stage
    # What a newcomer would read as trouble: a progress bar per process loading MiniLM, faiss's
    # "Could not load library ... ModuleNotFoundError" about the CPU builds it tries first.
    assert "Loading weights" not in first.stderr
    assert "faiss.loader" not in first.stderr
    run = demo_root / "runs" / "demo-emoji-quick"
    assert (run / "models" / "aoq" / "manifest.json").is_file()
    assert (demo_root / "data" / "demo-emoji-quick" / "dataset_emoji.json").is_file()
    assert any((demo_root / "features" / "efficientnet_lite0").iterdir())

    second = run_demo(demo_root, "--prepare-only")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"dataset {demo_root / 'data' / 'demo-emoji-quick'}: up to date, skipped" in second.stderr
    assert "backbone features: all 3 splits cached, skipped" in second.stderr
    assert f"indexes {run / 'index'}: up to date, skipped" in second.stderr
    assert "stage round1: up to date, skipped" in second.stderr
    assert "stage round2:aoq: up to date, skipped" in second.stderr


@pytest.mark.slow
def test_sigterm_stops_the_demo_and_frees_both_ports(quick_demo):
    """What a process manager or `docker stop` does: the servers must not outlive the demo."""
    demo_root, _ = quick_demo
    backend, ui = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "aoq_cli.demo", "--quick", "--backend-port", str(backend),
                             "--ui-port", str(ui)], cwd=ROOT, env=demo_env(demo_root), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 600
        for line in proc.stdout:  # the demo prints "ready in" once both servers answered a query
            if line.startswith("ready in") or time.monotonic() > deadline:
                break
        assert proc.poll() is None and not port_free("127.0.0.1", backend) and not port_free("127.0.0.1", ui)
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        proc.wait(timeout=15)
        while not (port_free("127.0.0.1", backend) and port_free("127.0.0.1", ui)):
            assert time.monotonic() - start < 5, "a server still holds its port after the demo exited"
            time.sleep(0.1)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_demo_on_busy_ports_fails_fast(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        result = run_demo(tmp_path, "--backend-port", str(port), "--ui-port", str(free_port()), timeout=60)
    assert result.returncode == 1
    assert f"port(s) {port} on 127.0.0.1 already in use" in result.stderr
    assert "is the demo already running?" in result.stderr
    assert time.monotonic() - start < 30
    assert not (tmp_path / "runs").exists()


def test_every_variant_has_a_valid_config_in_its_own_folders(tmp_path):
    from aoq_cli.demo import VARIANTS, demo_config
    from aoq_train.pipeline.arms import resolve_arms

    for (dataset, quick), variant in VARIANTS.items():
        cfg = demo_config(variant, tmp_path / "data", tmp_path / "runs")
        assert variant.dataset == dataset and cfg.name == variant.name
        assert cfg.run_dir == tmp_path / "runs" / variant.name
        assert [a.name for a in resolve_arms(variant.arms)][0] == "aoq"  # the comparison's default right side
        assert Path(cfg.data.path).is_relative_to(tmp_path / "data" / variant.name)
        if dataset == "emoji":
            assert cfg.data.path.endswith("dataset_emoji.json")
            assert (cfg.model.image_encoder, cfg.model.text_encoder) == ("effnet_lite0", "minilm")
            assert (variant.limit is not None) == quick


def test_the_full_emoji_demo_publishes_a_filtered_aoq():
    # The Negatives tab strikes through what a filter removed: only a filtered arm's lists have any.
    from aoq_cli.demo import EMOJI_FULL
    from aoq_train.pipeline.arms import resolve_arms

    filtered = [a.name for a in resolve_arms(EMOJI_FULL.arms) if a.mining.get("filters")]
    assert filtered == ["aoq-fn-identity"]
