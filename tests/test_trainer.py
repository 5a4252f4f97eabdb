"""The resumable trainer and round 1: determinism, kill -9 resumption, logs, schedule, losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aoq.config import ConfigError, ModelConfig, TrainConfig, config_from_dict
from aoq.models.joint import build_model
from tests.fixtures import write_precomp_fixture
from aoq_train.loop.batches import epoch_seed, shuffled_batches
from aoq_train.objectives.losses import round1_loss
from aoq_train.round1 import round1_step, train_round1

REPO = Path(__file__).resolve().parents[1]
# 40 train images x 5 captions = 200 pairs = 8 batches of 25 per epoch.
SPLITS = {"train": 40, "dev": 10, "test": 10}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_precomp_fixture(tmp_path_factory.mktemp("data"), SPLITS, regions=3, dim=12)


def _tree(data: Path, out: Path, **train) -> dict:
    return {
        "name": "t",
        "out_dir": str(out),
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"image_encoder": "vse", "embed_dim": 16, "word_dim": 8},
        "train": {"epochs": 2, "batch_size": 25, "lr": 0.002, "save_every_steps": 1000, **train},
    }


def _weights(run: Path, which: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run / "round1" / which / "model.safetensors"))


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_shuffled_batches_are_a_function_of_the_generator():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = shuffled_batches(53, 10, g1), shuffled_batches(53, 10, g2)
    assert a == b
    assert [len(x) for x in a] == [10] * 5  # the 3 left-over items are dropped
    assert len({i for batch in a for i in batch}) == 50
    assert shuffled_batches(7, 10, torch.Generator().manual_seed(0))[0].__len__() == 7
    assert epoch_seed(0, 1) != epoch_seed(0, 2) and epoch_seed(0, 1) == epoch_seed(0, 1)


def test_training_is_deterministic_and_logs_every_epoch(data, tmp_path):
    cfg = config_from_dict(_tree(data, tmp_path / "a", lr_decay_epochs=1, lr_decay_factor=0.5))
    first = train_round1(cfg, progress_bar=False)
    cfg_b = config_from_dict(_tree(data, tmp_path / "b", lr_decay_epochs=1, lr_decay_factor=0.5))
    train_round1(cfg_b, progress_bar=False)
    _assert_same_weights(_weights(tmp_path / "a"), _weights(tmp_path / "b"))

    records = [json.loads(line) for line in (tmp_path / "a" / "round1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert [r["lr"] for r in records] == pytest.approx([0.002, 0.001])
    assert [r["steps"] for r in records] == [8, 8]
    for r in records:
        for key in ("train_loss", "dev_i2t_r1", "dev_i2t_r5", "dev_i2t_r10", "dev_t2i_r1", "dev_t2i_r5",
                    "dev_t2i_r10", "dev_rsum", "train_time_s", "batch_time_s", "pairs_per_s"):
            assert isinstance(r[key], float), key
    best = max(records, key=lambda r: r["dev_rsum"])
    assert first.best_epoch == best["epoch"] and first.best_rsum == best["dev_rsum"]
    assert json.loads((first.best_dir / "extra.json").read_text())["epoch"] == first.best_epoch
    assert json.loads((first.last_dir / "extra.json").read_text())["epoch"] == 2

    # A different seed gives different weights (the comparison above can fail).
    cfg_c = config_from_dict(_tree(data, tmp_path / "c", lr_decay_epochs=1, lr_decay_factor=0.5, seed=1))
    train_round1(cfg_c, progress_bar=False)
    assert not torch.equal(_weights(tmp_path / "a")["text_encoder.embed.weight"],
                           _weights(tmp_path / "c")["text_encoder.embed.weight"])


def test_finished_run_is_a_no_op_and_can_be_extended(data, tmp_path):
    one = config_from_dict(_tree(data, tmp_path / "x", epochs=1))
    train_round1(one, progress_bar=False)
    state = tmp_path / "x" / "round1" / "state" / "state.pt"
    mtime = state.stat().st_mtime_ns
    again = train_round1(one, progress_bar=False)
    assert again.already_finished and again.epochs_done == 1
    assert state.stat().st_mtime_ns == mtime

    # Extending to 2 epochs continues and equals a run that asked for 2 epochs from the start.
    train_round1(config_from_dict(_tree(data, tmp_path / "x", epochs=2)), progress_bar=False)
    train_round1(config_from_dict(_tree(data, tmp_path / "y", epochs=2)), progress_bar=False)
    _assert_same_weights(_weights(tmp_path / "x"), _weights(tmp_path / "y"))


def test_resuming_with_another_configuration_is_refused(data, tmp_path):
    train_round1(config_from_dict(_tree(data, tmp_path / "r", epochs=1)), progress_bar=False)
    changed = config_from_dict(_tree(data, tmp_path / "r", epochs=1, lr=0.01))
    with pytest.raises(ConfigError, match=r"another configuration \(train\.lr: 0\.002 -> 0\.01\)"):
        train_round1(changed, progress_bar=False)


def test_max_steps_per_epoch(data, tmp_path):
    result = train_round1(config_from_dict(_tree(data, tmp_path / "m", epochs=1, max_steps_per_epoch=3)),
                          progress_bar=False)
    assert result.history[0]["steps"] == 3 and result.history[0]["global_step"] == 3


@pytest.mark.parametrize("loss", ["max_violation", "sum", "smooth_ap", "infonce"])
def test_round1_step_every_loss(loss):
    torch.manual_seed(0)
    model = build_model(ModelConfig(embed_dim=8, word_dim=8), 10, 6)
    batch = {"images": torch.randn(4, 2, 6), "tokens": torch.randint(1, 10, (4, 5)),
             "lengths": torch.tensor([5, 3, 4, 2])}
    cfg = TrainConfig(loss=loss)
    loss_value, stats = round1_step(cfg)(model, batch)
    img = model.encode_images(batch["images"])
    cap = model.encode_texts(batch["tokens"], batch["lengths"])
    torch.testing.assert_close(loss_value, round1_loss(loss, img @ cap.T, margin=0.2))
    assert set(stats) == {"pos", "hardest_neg"}
    loss_value.backward()


def _progress(run: Path) -> dict | None:
    try:
        return json.loads((run / "round1" / "state" / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.slow
def test_resume_after_kill_9_mid_epoch_matches_an_uninterrupted_run(data, tmp_path):
    # Reference: the same configuration trained without interruption.
    train_round1(config_from_dict(_tree(data, tmp_path / "ref", epochs=3)), progress_bar=False)

    run = tmp_path / "killed"
    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(_tree(data, run, epochs=3, save_every_steps=1)))
    cmd = [sys.executable, "-m", "aoq_cli.main", "train", "--config", str(config), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            p = _progress(run)
            if p is not None and p["epoch"] == 1 and p["step_in_epoch"] >= 2:
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"training ended before it could be killed: {proc.stderr.read().decode()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    saved = _progress(run)
    assert saved["epoch"] == 1 and 0 < saved["step_in_epoch"] < 8, saved  # killed mid-epoch
    assert not (run / "round1" / "last" / "extra.json").exists() or \
        json.loads((run / "round1" / "last" / "extra.json").read_text())["epoch"] == 1

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "resumed and finished: 3 epochs" in done.stdout
    assert "resuming at epoch 2, step" in done.stderr
    _assert_same_weights(_weights(run), _weights(tmp_path / "ref"))
    _assert_same_weights(_weights(run, "best"), _weights(tmp_path / "ref", "best"))
    log = [json.loads(line) for line in (run / "round1" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (tmp_path / "ref" / "round1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert [r["train_loss"] for r in log] == [r["train_loss"] for r in ref]
    assert [r["dev_rsum"] for r in log] == [r["dev_rsum"] for r in ref]

    # Running the finished command once more trains nothing.
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "already finished: 3 epochs" in again.stdout


def test_vsrn_on_features_and_cnn_on_pixels_train_and_evaluate(data, tmp_path):
    from tests.fixtures import write_karpathy_fixture
    from aoq_train.evaluate import evaluate_checkpoint

    vsrn = _tree(data, tmp_path / "vsrn", epochs=1)
    vsrn["model"].update(image_encoder="vsrn", gcn_layers=2)
    result = train_round1(config_from_dict(vsrn), progress_bar=False)
    assert result.epochs_done == 1 and result.history[0]["steps"] == 8

    json_path = write_karpathy_fixture(tmp_path / "karpathy", "flickr30k", {"train": 10, "val": 3, "test": 3},
                                       image_size=16)
    cnn = {
        "name": "cnn", "out_dir": str(tmp_path / "cnn"),
        "data": {"format": "karpathy", "path": str(json_path), "vocab_threshold": 1, "image_size": 16},
        "model": {"image_encoder": "cnn", "embed_dim": 8, "word_dim": 8, "cnn_width": 4},
        "train": {"epochs": 1, "batch_size": 10},
    }
    result = train_round1(config_from_dict(cnn), progress_bar=False)
    assert result.history[0]["steps"] == 5
    out = evaluate_checkpoint(result.best_dir, "test", "full", device="cpu")
    assert out["n_images"] == 3 and out["protocol"] == "full"
    assert json.loads((result.best_dir / "extra.json").read_text())["image_input"] == "pixels"
