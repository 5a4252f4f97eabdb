"""Round 2: batches, the step (groups apart under batch statistics) and its scores, every loss and
ablation, training through the shared trainer (resume, finetune, teacher mining), and the ``aoq train2``
command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from aoq.checkpoint import save_checkpoint
from aoq_cli.main import main as cli_main
from aoq.config import ConfigError, ModelConfig, Round2Config, config_from_dict
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary
from aoq.io import ArtefactError
from aoq.models.joint import build_model
from tests.fixtures import write_precomp_fixture
from aoq_train.objectives.losses import round2_loss
from aoq_train.mining import mine_offline_negatives, save_mined
from aoq_train.round2.train import (
    Round2Dataset,
    collate_round2,
    epoch_negatives,
    round2_scores,
    round2_step,
    train_round2,
    uses_derived_pairs,
)
from aoq_train.round2.depth import Depths
from aoq_train.round2.sampling import OfflineNegatives

SPLITS = {"train": 20, "dev": 6, "test": 6}  # 100 training captions: 4 batches of 25


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_precomp_fixture(tmp_path_factory.mktemp("data"), SPLITS, regions=3, dim=12)


@pytest.fixture(scope="module")
def mined(data: Path, tmp_path_factory) -> Path:
    """Mined lists of the fixture's train split from random embeddings (any 'teacher' will do)."""
    rng = np.random.default_rng(0)
    img = rng.standard_normal((20, 8)).astype(np.float32)
    cap = rng.standard_normal((100, 8)).astype(np.float32)
    caps, imgs = mine_offline_negatives(img, cap, 5, 40, 8, progress=False)
    out = tmp_path_factory.mktemp("mined") / "mined"
    save_mined(out, caps, imgs, {"checkpoint_hash": "teacher", "teacher_model": "random"})
    return out


def _tree(data: Path, out: Path, **round2) -> dict:
    return {
        "name": "t",
        "out_dir": str(out),
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"image_encoder": "vse", "embed_dim": 16, "word_dim": 8},
        "train": {"epochs": 1, "batch_size": 25},
        "mining": {"top_captions": 40, "top_images": 8},
        "round2": {"epochs": 1, "batch_size": 25, "lr": 0.002, "h_t": 20, "h_i": 4,
                   "save_every_steps": 1000, **round2},
    }


def _split_and_vocab(data: Path):
    cfg = config_from_dict(_tree(data, Path("unused")))
    split = load_split(cfg.data, "train")
    return split, Vocabulary.build(split.captions, 1)


def _hand_negatives(n: int = 100) -> OfflineNegatives:
    c = np.arange(n)
    t_off = (c * 7 + 11) % n
    i_off = (c // 5 + 3) % 20
    return OfflineNegatives(t_off, i_off, i_off * 5 + c % 5, t_off // 5, np.zeros(n, np.int64))


def _batch(data: Path, caption_ids: list[int], derived: bool = True):
    split, vocab = _split_and_vocab(data)
    dataset = Round2Dataset(split, vocab, derived=derived)
    dataset.set_negatives(_hand_negatives())
    return split, vocab, collate_round2([dataset[c] for c in caption_ids])


def test_batch_layout_groups_positives_then_offline_items(data: Path) -> None:
    split, vocab, batch = _batch(data, [3, 50, 99])
    neg = _hand_negatives()
    feats = torch.from_numpy(np.array(split.features))
    expected_images = [3 // 5, 50 // 5, 99 // 5] + [int(neg.i_off[c]) for c in (3, 50, 99)] + \
        [int(neg.i_off_tilde[c]) for c in (3, 50, 99)]
    torch.testing.assert_close(batch["images"], feats[expected_images])
    expected_captions = [3, 50, 99] + [int(neg.t_off[c]) for c in (3, 50, 99)] + \
        [int(neg.t_off_tilde[c]) for c in (3, 50, 99)]
    for row, c in enumerate(expected_captions):
        tokens = vocab.encode(split.captions[c])
        assert batch["tokens"][row, : len(tokens)].tolist() == tokens
        assert int(batch["lengths"][row]) == len(tokens)
    assert batch["caption_ids"].tolist() == [3, 50, 99] and batch["image_ids"].tolist() == [0, 10, 19]
    _, _, short = _batch(data, [3, 50, 99], derived=False)
    assert short["images"].shape[0] == 6 and short["tokens"].shape[0] == 6


def test_round2_scores_equal_separate_encoder_calls(data: Path) -> None:
    split, vocab, batch = _batch(data, list(range(0, 100, 9)))  # 12 pairs
    torch.manual_seed(0)
    model = build_model(ModelConfig(embed_dim=16, word_dim=8), len(vocab), 12).eval()
    b = 12

    def enc_img(rows):
        return model.encode_images(batch["images"][rows])

    def enc_cap(rows):
        return model.encode_texts(batch["tokens"][rows], batch["lengths"][rows])

    pos, off, til = slice(0, b), slice(b, 2 * b), slice(2 * b, 3 * b)
    with torch.no_grad():
        got = round2_scores(model.encode_images(batch["images"]),
                            model.encode_texts(batch["tokens"], batch["lengths"]), b)
        i, t = enc_img(pos), enc_cap(pos)
        expected = {
            "scores": i @ t.T,
            "i2t_off": torch.stack([i[k] @ enc_cap(off)[k] for k in range(b)]),
            "t2i_off": torch.stack([enc_img(off)[k] @ t[k] for k in range(b)]),
            "off_pair": torch.stack([enc_img(off)[k] @ enc_cap(off)[k] for k in range(b)]),
            "off_pair_tilde": torch.stack([enc_img(til)[k] @ enc_cap(til)[k] for k in range(b)]),
        }
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


def _float64_model(vocab, encoder: str, seed: int = 0):
    """A small model in float64 and train mode; BatchNorm scales made non-zero (they start at 0,
    which would hide the batch statistics)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(image_encoder=encoder, embed_dim=16, word_dim=8, gcn_layers=1), len(vocab), 12)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.3, 0.3)
    return model.double().train()


def _recorded(model):
    """Wrap the model's encoders: every call's (rows, whether it records gradients) in order."""
    calls = {"images": [], "texts": []}
    encode_images, encode_texts = model.encode_images, model.encode_texts

    def images(x):
        calls["images"].append((x.shape[0], torch.is_grad_enabled()))
        return encode_images(x)

    def texts(x, lengths):
        calls["texts"].append((x.shape[0], torch.is_grad_enabled()))
        return encode_texts(x, lengths)

    model.encode_images, model.encode_texts = images, texts
    return calls


def _reference_scores(model, batch, b: int, mixed: bool = False) -> dict[str, torch.Tensor]:
    """Every group with gradients, one call per group (or one mixed call)."""
    groups = batch["images"].shape[0] // b
    parts = [slice(0, groups * b)] if mixed else [slice(g * b, (g + 1) * b) for g in range(groups)]
    img = torch.cat([model.encode_images(batch["images"][p]) for p in parts])
    cap = torch.cat([model.encode_texts(batch["tokens"][p], batch["lengths"][p]) for p in parts])
    return round2_scores(img, cap, b)


def _reference(model, batch, r2: Round2Config, b: int, mixed: bool = False):
    """The full computation's loss on :func:`_reference_scores`."""
    s = _reference_scores(model, batch, b, mixed)
    return round2_loss(s["scores"], s["i2t_off"], s["t2i_off"], s["off_pair"], s.get("off_pair_tilde"),
                       loss=r2.loss, variant=r2.variant, margin_online=r2.margin_online,
                       margin_offline=r2.margin_offline, alpha=r2.alpha, beta=r2.beta)


def _loss_and_grads(model, compute):
    model.zero_grad(set_to_none=True)
    loss = compute()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("encoder", "loss", "variant"), [
    ("vse", "adaptive_offline_quintuplet", "none"),
    ("vse", "offline_quintuplet", "none"),
    ("vse", "adaptive_offline_quintuplet", "only_offline"),
    ("vsrn", "adaptive_offline_quintuplet", "none"),
    ("vsrn", "adaptive_offline_quintuplet", "no_offline_adapt"),
])
def test_step_equals_the_full_computation_with_groups_apart(data: Path, encoder: str, loss: str,
                                                            variant: str) -> None:
    """Same loss and parameter gradients (float64) as every group encoded alone with gradients;
    encoders without batch statistics take all the groups in one call."""
    b = 20
    _, vocab, batch = _batch(data, list(range(0, 60, 3)))  # groups hold different images
    batch = {**batch, "images": batch["images"].double()}
    model = _float64_model(vocab, encoder)
    r2 = Round2Config(loss=loss, variant=variant)
    expected, expected_grads = _loss_and_grads(model, lambda: _reference(model, batch, r2, b))
    with torch.no_grad():
        s = _reference_scores(model, batch, b)
        active = int((r2.margin_offline - s["scores"].diagonal() + s["off_pair_tilde"] > 0).sum())
    calls = _recorded(model)
    box = {}

    def step():
        box["loss"], box["stats"] = round2_step(r2)(model, batch)
        return box["loss"]

    got, got_grads = _loss_and_grads(model, step)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)
    assert 0 < active < b and box["stats"]["derived_active"] == active / b
    assert calls["texts"] == [(3 * b, True)]  # a GRU: rows independent
    if encoder == "vse":
        assert calls["images"] == [(3 * b, True)]
    else:  # BatchNorm in train mode: one call per group
        assert calls["images"] == [(b, True), (b, True), (b, True)]


def test_batch_statistics_of_a_group_do_not_mix_with_the_others(data: Path) -> None:
    """vsrn in train mode: the positives' embeddings are those of the positives encoded alone,
    which one call over all 3B images would not give, and the loss tells the two apart."""
    b = 20
    _, vocab, batch = _batch(data, list(range(0, 60, 3)))  # groups hold different images
    batch = {**batch, "images": batch["images"].double()}
    model = _float64_model(vocab, "vsrn")
    outputs = []
    encode_images = model.encode_images
    model.encode_images = lambda x: outputs.append(encode_images(x)) or outputs[-1]
    loss, _ = round2_step(Round2Config())(model, batch)
    with torch.no_grad():
        alone = encode_images(batch["images"][:b])
        mixed = encode_images(batch["images"])[:b]
    torch.testing.assert_close(outputs[0].detach(), alone, rtol=1e-12, atol=1e-12)
    assert (mixed - alone).abs().max() > 1e-2
    model.encode_images = encode_images
    with torch.no_grad():
        mixed_loss = _reference(model, batch, Round2Config(), b, mixed=True)
    assert abs(float(loss.detach()) - float(mixed_loss)) > 1e-3


COMBINATIONS = [
    ("offline_triplet", "none"),
    ("offline_quintuplet", "none"),
    ("adaptive_offline_quintuplet", "none"),
    ("offline_triplet", "only_offline"),
    ("adaptive_offline_quintuplet", "only_offline"),
    ("offline_quintuplet", "online_quin"),
    ("adaptive_offline_quintuplet", "online_quin"),
    ("adaptive_offline_quintuplet", "no_offline_adapt"),
]


@pytest.mark.parametrize(("loss", "variant"), COMBINATIONS)
def test_every_loss_and_variant_trains_both_encoders(data: Path, loss: str, variant: str) -> None:
    r2 = Round2Config(loss=loss, variant=variant)
    _, vocab, batch = _batch(data, list(range(0, 100, 7)), derived=uses_derived_pairs(r2))
    assert batch["images"].shape[0] == (3 if uses_derived_pairs(r2) else 2) * 15
    torch.manual_seed(1)
    model = build_model(ModelConfig(embed_dim=16, word_dim=8), len(vocab), 12)
    value, _ = round2_step(r2)(model, batch)
    assert value.dim() == 0 and torch.isfinite(value) and value.item() > 0
    value.backward()
    for encoder in (model.image_encoder, model.text_encoder):
        grads = [p.grad for p in encoder.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0


def test_epoch_negatives_are_a_function_of_seed_and_epoch(data: Path, mined: Path) -> None:
    from aoq.mined import load_mined

    m = load_mined(mined)
    r2, depths = Round2Config(h_t=20, h_i=4), Depths(20, 4)
    a, b = epoch_negatives(m, r2, depths, 0), epoch_negatives(m, r2, depths, 0)
    assert (a.t_off == b.t_off).all() and (a.i_off == b.i_off).all() and (a.t_off_tilde == b.t_off_tilde).all()
    assert (a.rank != epoch_negatives(m, r2, depths, 1).rank).any()
    assert (a.rank != epoch_negatives(m, Round2Config(h_t=20, h_i=4, seed=1), depths, 0).rank).any()


def _weights(run: Path, which: str = "last") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "round2" / which / "model.safetensors"))


def test_train_round2_end_to_end_and_resume_after_an_interruption(data: Path, mined: Path, tmp_path: Path,
                                                                monkeypatch) -> None:
    ref = train_round2(config_from_dict(_tree(data, tmp_path / "ref", epochs=2)), mined, progress_bar=False)
    records = [json.loads(line) for line in (tmp_path / "ref" / "round2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and [r["steps"] for r in records] == [4, 4]
    assert all(np.isfinite(r["train_loss"]) and "dev_rsum" in r and "train_i2t_off" in r for r in records)
    # throughput counts the 25 pairs of a batch, not its 75 stacked images
    assert all(r["pairs_per_s"] * r["batch_time_s"] * r["steps"] == pytest.approx(100) for r in records)
    assert all(0 <= r["train_derived_active"] <= 1 for r in records)
    extra = json.loads((ref.best_dir / "extra.json").read_text())
    assert extra["role"] == "round2" and extra["loss"] == "adaptive_offline_quintuplet"
    assert extra["init"] == "scratch" and extra["teacher_hash"] == "teacher"

    # Interrupt the same run in epoch 2 after its 2nd step; rerunning resumes and ends identical.
    import aoq_train.round2.train as round2_module

    real_step = round2_module.round2_step

    def failing_step(r2):
        inner, calls = real_step(r2), {"n": 0}

        def step(model, batch):
            calls["n"] += 1
            if calls["n"] == 7:
                raise KeyboardInterrupt
            return inner(model, batch)

        return step

    cfg = config_from_dict(_tree(data, tmp_path / "cut", epochs=2, save_every_steps=1))
    monkeypatch.setattr(round2_module, "round2_step", failing_step)
    with pytest.raises(KeyboardInterrupt):
        train_round2(cfg, mined, progress_bar=False)
    monkeypatch.setattr(round2_module, "round2_step", real_step)
    resumed = train_round2(cfg, mined, progress_bar=False)
    assert resumed.resumed and resumed.epochs_done == 2
    for key, value in _weights(tmp_path / "ref").items():
        assert torch.equal(value, _weights(tmp_path / "cut")[key]), key
    assert train_round2(cfg, mined, progress_bar=False).already_finished


def test_mined_lists_must_fit_the_split_and_the_depths(data: Path, mined: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    save_mined(other, np.zeros((21, 40), np.int32), np.zeros((105, 8), np.int32))
    with pytest.raises(ArtefactError, match="mined for 21 images / 105 captions"):
        train_round2(config_from_dict(_tree(data, tmp_path / "a")), other, progress_bar=False)
    deeper_cfg = _tree(data, tmp_path / "b", h_i=9)
    deeper_cfg["mining"]["top_images"] = 10  # the config asks for more than this artefact holds
    with pytest.raises(ConfigError, match="h_i=9 exceeds the mined top_images=8"):
        train_round2(config_from_dict(deeper_cfg), mined, progress_bar=False)
    # a run does not resume with other mined lists
    train_round2(config_from_dict(_tree(data, tmp_path / "c", max_steps_per_epoch=1)), mined, progress_bar=False)
    deeper = tmp_path / "deeper"
    save_mined(deeper, np.zeros((20, 40), np.int32) + 5, np.ones((100, 8), np.int32))
    with pytest.raises(ConfigError, match="started with mined negatives"):
        train_round2(config_from_dict(_tree(data, tmp_path / "c", max_steps_per_epoch=1)), deeper, progress_bar=False)


def test_finetune_starts_from_the_given_weights(data: Path, mined: Path, tmp_path: Path, monkeypatch) -> None:
    import aoq_train.round2.train as round2_module

    cfg0 = config_from_dict(_tree(data, tmp_path / "r1"))
    split, vocab = _split_and_vocab(data)
    torch.manual_seed(5)
    source = build_model(cfg0.model, len(vocab), 12)
    save_checkpoint(tmp_path / "round1_best", source, cfg0, vocab, {"rsum": 0.0})

    cfg = config_from_dict(_tree(data, tmp_path / "ft", init="finetune", init_from=str(tmp_path / "round1_best"),
                                 max_steps_per_epoch=1))
    model, _, init = round2_module._initial_model(cfg, split)
    assert init["init"] == "finetune" and model.training
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value)
    result = train_round2(cfg, mined, progress_bar=False)
    assert json.loads((result.last_dir / "extra.json").read_text())["init_from"] == str(tmp_path / "round1_best")

    with pytest.raises(ConfigError, match="needs round2.init_from"):
        train_round2(config_from_dict(_tree(data, tmp_path / "x", init="finetune")), mined, progress_bar=False)
    vsrn = _tree(data, tmp_path / "y", init="finetune", init_from=str(tmp_path / "round1_best"))
    vsrn["model"]["image_encoder"] = "vsrn"
    with pytest.raises(ConfigError, match="same model section"):
        train_round2(config_from_dict(vsrn), mined, progress_bar=False)


def test_aoq_mine_with_a_vse_teacher_then_train2_a_vsrn_model(data: Path, tmp_path: Path, capsys) -> None:
    """Teacher mining through the commands: mine with a vse checkpoint, train a vsrn model."""
    tree = _tree(data, tmp_path / "run", max_steps_per_epoch=2)
    cfg = config_from_dict(tree)
    split, vocab = _split_and_vocab(data)
    torch.manual_seed(2)
    save_checkpoint(tmp_path / "vse_teacher", build_model(cfg.model, len(vocab), 12), cfg, vocab, {"rsum": 0.0})
    tree["model"]["image_encoder"] = "vsrn"
    tree["model"]["gcn_layers"] = 1
    config = tmp_path / "vsrn.yaml"
    config.write_text(yaml.safe_dump(tree))

    assert cli_main(["mine", "--checkpoint", str(tmp_path / "vse_teacher"), "--config", str(config),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "mined in" in out and "20 images x top 40 captions" in out and "(vse," in out
    mined_dir = tmp_path / "run" / "mined"
    assert not any(p.name.endswith(".work") for p in (tmp_path / "run").iterdir())
    manifest = json.loads((mined_dir / "manifest.json").read_text())
    assert manifest["teacher_model"] == "vse" and manifest["data"]["n_captions"] == 100

    assert cli_main(["train2", "--config", str(config), "--no-progress", "--loss", "offline_quintuplet"]) == 0
    out = capsys.readouterr().out
    assert "round 2 finished: 1 epochs, loss offline_quintuplet, variant none, init scratch" in out
    ckpt_cfg = json.loads((tmp_path / "run" / "round2" / "best" / "config.json").read_text())
    assert ckpt_cfg["model"]["image_encoder"] == "vsrn"

    assert cli_main(["train2", "--config", str(config), "--no-progress", "--loss", "offline_quintuplet"]) == 0
    assert "round 2 already finished" in capsys.readouterr().out


def test_train2_reports_a_missing_mined_folder_as_one_line(data: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_tree(data, tmp_path / "run")))
    assert cli_main(["train2", "--config", str(config), "--mined", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aoq train2: error:") and "nope: no such artefact directory" in err
