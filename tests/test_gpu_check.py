"""scripts/gpu-check.sh runs everywhere: without CUDA it skips every GPU part with a line saying
so and still writes the summary; with GPU_CHECK_TINY=1 it runs every part on the CPU at toy sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PARTS = ["tests", "training_speed", "cross_attention", "mining", "serving", "torchrun", "two_rounds"]


def _run(tmp_path: Path, tiny: bool) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "GPU_CHECK_OUT": str(tmp_path / "out"), "GPU_CHECK_TINY": "1" if tiny else "0",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (tmp_path / "out" / "check.log").stat().st_size > 0
    return done, summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA behaviour")
def test_without_cuda_every_part_is_skipped_with_a_line(tmp_path: Path) -> None:
    done, summary = _run(tmp_path, tiny=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert summary["cuda"] is False and set(summary["parts"]) == set(PARTS)
    for part in PARTS:
        assert summary["parts"][part]["skipped"] == "no CUDA device"
        assert f"SKIP {part}: no CUDA device" in done.stderr


@pytest.mark.slow
def test_tiny_mode_runs_every_part_on_the_cpu(tmp_path: Path) -> None:
    done, summary = _run(tmp_path, tiny=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    parts = summary["parts"]
    assert set(parts) == set(PARTS) and not any("error" in p for p in parts.values())
    assert parts["tests"]["returncode"] in (0, 5) and parts["tests"]["failures"] == 0  # 5: all skipped
    for key in ("vse_fp32", "vse_bf16", "vsrn_fp32", "vsrn_bf16"):
        speed = parts["training_speed"][key]
        assert speed["round1_ms"] > 0 and speed["round2_ms"] > 0
    for kind in ("scan", "bfan"):
        cross = parts["cross_attention"][kind]
        assert cross["fp32"]["round1_ms"] > 0 and cross["bf16"]["round2_ms"] > 0
        assert cross["scoring"]["images"] == 12 and cross["scoring"]["projected_coco5k_s"] > 0
    assert parts["mining"]["fp32"]["shapes"] == [[400, 50], [2000, 10]]
    assert parts["mining"]["fp32"]["fp32_agreement"]["cap_top_imgs"]["rows_identical"] == 1.0
    assert set(parts["two_rounds"]["stages"]) == {"synth", "round1", "mine", "round2"}
    assert len(parts["two_rounds"]["round2_dev_rsum"]) == 1
    assert parts["serving"]["cpu_ms_p50"] > 0 and parts["serving"]["torch_ms_p50"] > 0 and "gpu" in parts["serving"]
    assert parts["torchrun"]["agree"] is True and len(parts["torchrun"]["torchrun_train_loss"]) == 2
