"""torchrun with 2 CPU processes (gloo) trains exactly what one process trains on the same global
batch: rounds 1 and 2 through the real CLI, compared on the per-epoch loss, dev rsum and final
weights. Also the sharding and the global-batch gather in isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from aoq.checkpoint import load_checkpoint
from tests.fixtures import write_precomp_fixture
from aoq_train.loop.distributed import Shard, shard_batch
from aoq_train.mining import mine_offline_negatives, save_mined

REPO = Path(__file__).resolve().parents[1]
# Same global batch, summed in another order (two halves + all-reduce): float32 round-off
# grows through 15 Adam steps to ~1e-6 here; 1e-4 leaves room without hiding a wrong gradient
# (a loss over each rank's half batch, or a gradient missing the 1/W, is off by >1e-2).
TOL = 1e-4


def test_each_rank_takes_its_contiguous_slice() -> None:
    batch = list(range(10, 22))
    assert shard_batch(batch, Shard(0, 3)) == [10, 11, 12, 13]
    assert shard_batch(batch, Shard(2, 3)) == [18, 19, 20, 21]
    assert shard_batch(batch, Shard(0, 1)) == batch
    with pytest.raises(ValueError, match="multiple of --nproc_per_node"):
        shard_batch(batch, Shard(0, 5))


def _config(tmp: Path, data: Path, **model) -> Path:
    tree = {
        "name": "ddp",
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"image_encoder": "vse", "embed_dim": 16, "word_dim": 8, **model},
        "train": {"epochs": 3, "batch_size": 24, "lr": 0.002, "device": "cpu", "save_every_steps": 1000},
        "mining": {"top_captions": 40, "top_images": 8},
        "round2": {"epochs": 3, "batch_size": 24, "lr": 0.002, "h_t": 20, "h_i": 4, "device": "cpu",
                   "save_every_steps": 1000},
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _run(args: list[str], procs: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    launcher = [sys.executable, "-m", "aoq_cli.main"] if procs == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
        f"--nproc_per_node={procs}", "-m", "aoq_cli.main"]
    done = subprocess.run(launcher + args + ["--no-progress", "--threads", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _compare(one: Path, two: Path) -> None:
    a = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        assert ra["steps"] == rb["steps"] == 5  # 120 captions / global batch 24
        np.testing.assert_allclose(rb["train_loss"], ra["train_loss"], rtol=TOL)
        np.testing.assert_allclose(rb["train_hardest_neg"], ra["train_hardest_neg"], atol=TOL)
        np.testing.assert_allclose(rb["dev_rsum"], ra["dev_rsum"], atol=1e-3)
    wa = load_checkpoint(one / "last").model.state_dict()
    wb = load_checkpoint(two / "last").model.state_dict()
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], atol=TOL, rtol=0, msg=key)
    # The losses moved: a run that trained nothing would match too.
    assert a[-1]["train_loss"] < a[0]["train_loss"]


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process_round1_and_round2(tmp_path: Path) -> None:
    data = write_precomp_fixture(tmp_path / "data", {"train": 24, "dev": 6, "test": 6}, regions=3, dim=12)
    cfg = _config(tmp_path, data)
    for procs in (1, 2):
        _run(["train", "--config", str(cfg), "--out", str(tmp_path / f"p{procs}")], procs)
    _compare(tmp_path / "p1" / "round1", tmp_path / "p2" / "round1")
    # Only rank 0 wrote: one metrics line per epoch, no stray per-rank files.
    assert sorted(p.name for p in (tmp_path / "p2" / "round1").iterdir()) == sorted(
        p.name for p in (tmp_path / "p1" / "round1").iterdir())

    rng = np.random.default_rng(0)
    img = rng.standard_normal((24, 8)).astype(np.float32)
    caps, imgs = mine_offline_negatives(img, rng.standard_normal((120, 8)).astype(np.float32), 5, 40, 8,
                                        progress=False)
    mined = tmp_path / "mined"
    save_mined(mined, caps, imgs, {"checkpoint_hash": "teacher", "teacher_model": "random"})
    for procs in (1, 2):
        _run(["train2", "--config", str(cfg), "--mined", str(mined), "--out", str(tmp_path / f"p{procs}")], procs)
    _compare(tmp_path / "p1" / "round2", tmp_path / "p2" / "round2")

    # Resume unchanged: a finished run started again under torchrun trains nothing more.
    before = (tmp_path / "p2" / "round2" / "metrics.jsonl").read_text()
    _run(["train2", "--config", str(cfg), "--mined", str(mined), "--out", str(tmp_path / "p2")], 2)
    assert (tmp_path / "p2" / "round2" / "metrics.jsonl").read_text() == before
