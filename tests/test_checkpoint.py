"""Checkpoints: exact round trip, and a clear error for every kind of broken checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from aoq.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from aoq.config import config_from_dict
from aoq.data.vocab import Vocabulary
from aoq.io import ArtefactError, read_manifest, write_manifest
from aoq.models.joint import build_model

IMG_DIM = 12


def _config(**model):
    return config_from_dict(
        {"name": "ckpt-test", "data": {"path": "nowhere"}, "model": {"embed_dim": 16, "word_dim": 8, **model}}
    )


def _vocab() -> Vocabulary:
    return Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "red", "cube", "on", "a"])


def _save(path, image_encoder="vse"):
    torch.manual_seed(0)
    cfg = _config(image_encoder=image_encoder, gcn_layers=2)
    vocab = _vocab()
    model = build_model(cfg.model, len(vocab), IMG_DIM)
    if image_encoder == "vsrn":
        # Give the batch-norm buffers non-default values so the round trip must carry them.
        model.train()
        model.encode_images(torch.randn(8, 3, IMG_DIM))
    model.eval()
    digest = save_checkpoint(path, model, cfg, vocab, {"rsum": 12.5}, {"role": "baseline", "epoch": 3})
    return model, cfg, vocab, digest


def _inputs():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(5, 3, IMG_DIM, generator=g)
    tokens = torch.randint(4, 8, (5, 6), generator=g)
    lengths = torch.tensor([6, 2, 4, 5, 3])
    return images, tokens, lengths


@pytest.mark.parametrize("kind", ["vse", "vsrn"])
def test_round_trip_gives_identical_embeddings(tmp_path, kind):
    model, cfg, vocab, digest = _save(tmp_path / "ckpt", kind)
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.content_hash == digest == read_manifest(tmp_path / "ckpt")["content_hash"]
    assert ckpt.config == cfg
    assert ckpt.vocab == vocab
    assert ckpt.metrics == {"rsum": 12.5}
    assert ckpt.extra["role"] == "baseline" and ckpt.extra["epoch"] == 3
    assert ckpt.extra["img_dim"] == IMG_DIM and ckpt.extra["image_input"] == "features"
    assert not ckpt.model.training
    images, tokens, lengths = _inputs()
    with torch.no_grad():
        assert torch.equal(ckpt.model.encode_images(images), model.encode_images(images))
        assert torch.equal(ckpt.model.encode_texts(tokens, lengths), model.encode_texts(tokens, lengths))


def test_saving_again_replaces_the_whole_directory(tmp_path):
    _save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stray.txt").write_text("left over")
    _save(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "stray.txt").exists()
    load_checkpoint(tmp_path / "ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary siblings left


def test_corrupted_weights(tmp_path):
    _save(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: content hash mismatch"):
        load_checkpoint(tmp_path / "ckpt")


def test_truncated_weights(tmp_path):
    _save(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: content hash mismatch"):
        load_checkpoint(tmp_path / "ckpt")
    # Even with a manifest that matches the truncated bytes, the weights cannot be read.
    manifest = read_manifest(tmp_path / "ckpt", verify=False)
    write_manifest(tmp_path / "ckpt", "checkpoint", manifest["config"])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read the weights"):
        load_checkpoint(tmp_path / "ckpt")


def test_weights_that_do_not_fit_the_config(tmp_path):
    _save(tmp_path / "ckpt")
    config_path = tmp_path / "ckpt" / "config.json"
    tree = json.loads(config_path.read_text())
    tree["model"]["embed_dim"] = 32
    config_path.write_text(json.dumps(tree))
    write_manifest(tmp_path / "ckpt", "checkpoint", tree)  # a consistent manifest: only the fit is wrong
    with pytest.raises(CheckpointError, match=r"model\.safetensors: weights do not fit .*shape mismatch"):
        load_checkpoint(tmp_path / "ckpt")


def test_wrong_artefact_kind(tmp_path):
    _save(tmp_path / "ckpt")
    write_manifest(tmp_path / "ckpt", "mined-negatives", {})
    with pytest.raises(CheckpointError, match=r"is a 'mined-negatives' artefact, expected 'checkpoint'"):
        load_checkpoint(tmp_path / "ckpt")


def test_missing_file_and_missing_directory(tmp_path):
    _save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "vocab.json").unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.json: listed in the manifest but missing"):
        load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="no such artefact directory"):
        load_checkpoint(tmp_path / "absent")
    (tmp_path / "plain").mkdir()
    with pytest.raises(CheckpointError, match="manifest missing"):
        load_checkpoint(tmp_path / "plain")


def test_invalid_config_json(tmp_path):
    _save(tmp_path / "ckpt")
    config_path = tmp_path / "ckpt" / "config.json"
    config_path.write_text(json.dumps({"model": {"embed_dim": "big"}}))
    write_manifest(tmp_path / "ckpt", "checkpoint", {})
    with pytest.raises(CheckpointError, match=r"config\.json: not a valid run configuration"):
        load_checkpoint(tmp_path / "ckpt")


def test_checkpoint_error_is_an_artefact_error():
    # The CLI turns ArtefactError into one clear line and exit code 2.
    assert issubclass(CheckpointError, ArtefactError)
