"""`aoq evaluate` and `aoq train` on a tiny trained checkpoint; embedding helpers agree."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from aoq.checkpoint import load_checkpoint
from aoq_cli.main import main
from aoq.data.load import load_split
from aoq.data.vocab import coverage, format_coverage
from aoq.embed import encode_image_inputs, encode_split, encode_texts
from tests.fixtures import write_precomp_fixture, write_tiny_config
from aoq_train.evaluate import evaluate_checkpoint, evaluate_model

METRIC_KEYS = {"r1", "r5", "r10", "medr", "meanr"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """One `aoq train` run (1 epoch, tiny data); returns the paths."""
    root = tmp_path_factory.mktemp("eval")
    data = write_precomp_fixture(root / "data", {"train": 30, "dev": 8, "test": 12}, regions=3, dim=10)
    config = write_tiny_config(root / "tiny.yaml", data)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: one thread is fastest on the shared 2-core machine
    try:
        code = main(["train", "--config", str(config), "--out", str(root / "run"), "--loss", "sum",
                     "--seed", "3", "--no-progress"])
    finally:
        torch.set_num_threads(before)
    assert code == 0
    return {"data": data, "ckpt": root / "run" / "round1" / "best", "root": root}


def test_train_cli_applies_flags(trained):
    ckpt = load_checkpoint(trained["ckpt"])
    assert ckpt.config.train.loss == "sum" and ckpt.config.train.seed == 3
    assert ckpt.config.out_dir == str(trained["root"] / "run")
    assert ckpt.extra["role"] == "round1" and ckpt.extra["loss"] == "sum"


def test_evaluate_json_keys(trained, capsys):
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--split", "test", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"i2t", "t2i", "rsum", "protocol"} <= set(out)
    assert set(out["i2t"]) == METRIC_KEYS and set(out["t2i"]) == METRIC_KEYS
    assert out["protocol"] == "full" and out["n_images"] == 12 and out["split"] == "test"
    assert out["rsum"] == pytest.approx(sum(out[d][k] for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")))
    ckpt = load_checkpoint(trained["ckpt"])
    assert out["vocabulary"] == coverage(ckpt.vocab, load_split(ckpt.config.data, "test").captions)
    assert out["vocabulary"]["captions"] == 60


def test_unknown_words_are_reported(trained, tmp_path, capsys):
    copy = shutil.copytree(trained["data"], tmp_path / "copy")
    captions = (copy / "test_caps.txt").read_text(encoding="utf-8").splitlines()
    captions[:5] = ["zyzzyva quokka"] * 5  # the first image's captions: words no training caption has
    (copy / "test_caps.txt").write_text("\n".join(captions) + "\n", encoding="utf-8")
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--data", str(copy), "--json"]) == 0
    cov = json.loads(capsys.readouterr().out)["vocabulary"]
    assert cov["unknown_captions"] == 5 and cov["unknown_caption_share"] == 5 / 60
    assert cov["unknown_tokens"] >= 10
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--data", str(copy)]) == 0
    assert f"unknown words: {format_coverage(cov)}" in capsys.readouterr().out.splitlines()


def test_reloaded_checkpoint_evaluates_to_the_numbers_it_was_selected_on(trained):
    ckpt = load_checkpoint(trained["ckpt"])
    dev = evaluate_checkpoint(trained["ckpt"], "dev", "full")
    for key in ("i2t", "t2i", "rsum"):
        assert dev[key] == ckpt.metrics[key]
    # The in-memory model and a second reload agree on the test split too.
    test_split = load_split(ckpt.config.data, "test")
    again = evaluate_checkpoint(trained["ckpt"], "test", "full")
    direct = evaluate_model(ckpt.model, ckpt.vocab, test_split, "full")
    assert {k: again[k] for k in direct} == direct


def test_table_names_the_protocol(trained, capsys):
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--split", "dev"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "split dev (8 images), protocol full, positives pair"
    assert "image->text (i2t)" in out and "text->image (t2i)" in out and "rsum" in out
    # the text rule, asked for on the command line, says how many pairs it merged
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--split", "dev", "--positives", "text"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("split dev (8 images), protocol full, positives text, ")


def test_evaluate_other_data_path(trained, tmp_path, capsys):
    copy = shutil.copytree(trained["data"], tmp_path / "copy")
    (copy / "test_caps.txt").write_text("")  # a broken copy: the error must name it
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--data", str(copy), "--json"]) == 2
    assert "test_caps.txt" in capsys.readouterr().err


def test_protocol_needing_more_images_is_one_clear_error(trained, capsys):
    assert main(["evaluate", "--checkpoint", str(trained["ckpt"]), "--protocol", "1k5fold"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aoq evaluate: error: the 1k5fold protocol needs at least 5,000 images")


def test_broken_checkpoint_is_one_clear_error(trained, tmp_path, capsys):
    broken = shutil.copytree(trained["ckpt"], tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert main(["evaluate", "--checkpoint", str(broken), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"aoq evaluate: error: {weights}: content hash mismatch (corrupted or truncated file)"


def test_embedding_helpers_agree_with_encode_split(trained):
    ckpt = load_checkpoint(trained["ckpt"])
    split = load_split(ckpt.config.data, "test")
    img, cap = encode_split(ckpt.model, ckpt.vocab, split, batch_size=5)
    assert img.shape == (12, 16) and cap.shape == (60, 16) and img.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(img, axis=1), 1.0, atol=1e-5)
    texts = encode_texts(ckpt.model, ckpt.vocab, split.captions[:7])
    np.testing.assert_allclose(texts, cap[:7], atol=1e-6)
    images = encode_image_inputs(ckpt.model, torch.from_numpy(np.array(split.features[:4])))
    np.testing.assert_allclose(images, img[:4], atol=1e-6)
    assert encode_texts(ckpt.model, ckpt.vocab, []).shape == (0, 16)


def test_hubness_evaluation_names_its_bank_and_refuses_folds(trained, capsys):
    ckpt = str(trained["ckpt"])
    assert main(["evaluate", "--checkpoint", ckpt, "--hubness", "qbnorm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    bank = out["hubness"]["bank"]
    assert (out["protocol"], out["hubness"]["normalise"], bank["split"], bank["images"], bank["captions"]) == \
        ("full", "qbnorm", "train", 30, 150)
    assert 0 < out["hubness"]["hub_share"]["t2i"] <= 1
    assert main(["evaluate", "--checkpoint", ckpt, "--hubness", "none"]) == 0
    assert "hubness normalisation none: share of queries" in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", ckpt, "--protocol", "1k5fold", "--hubness", "qbnorm"]) == 2
    assert "evaluates the whole split (protocol full or labels), not 1k5fold" in capsys.readouterr().err
