"""The cross-attention model wrapper (``model.image_encoder`` scan / bfan): encoders, scores,
a round-1 training step, configuration checks."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from aoq.config import ModelConfig, TrainConfig
from aoq.models.bfan import bfan_scores
from aoq.models.joint import build_model
from aoq.models.scan import SCAN_PRESETS, scan_scores
from aoq_train.round1 import round1_step

VOCAB, IMG_DIM, R, E = 30, 12, 5, 16
LENGTHS = torch.tensor([7, 2, 1, 4])


def _model(kind: str, **extra):
    torch.manual_seed(0)
    cfg = ModelConfig(image_encoder=kind, embed_dim=E, word_dim=8, bidirectional=True, **extra)
    return build_model(cfg, VOCAB, IMG_DIM)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, VOCAB, (4, 7), generator=g)
    for row, n in enumerate(LENGTHS):
        tokens[row, n:] = 0
    return {"images": torch.randn(4, R, IMG_DIM, generator=g), "tokens": tokens, "lengths": LENGTHS}


@pytest.mark.parametrize("kind", ["scan", "bfan"])
def test_fragments_are_unit_and_padding_is_zero(kind):
    model = _model(kind)
    batch = _batch()
    img, cap = model(batch["images"], batch["tokens"], batch["lengths"])
    assert img.shape == (4, R, E) and cap.shape == (4, 7, E)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(4, R), atol=1e-6, rtol=0)
    for row, n in enumerate(LENGTHS):
        torch.testing.assert_close(cap[row, :n].norm(dim=-1), torch.ones(int(n)), atol=1e-6, rtol=0)
        assert (cap[row, n:] == 0).all()


def test_pair_scores_are_the_configured_score():
    batch = _batch()
    scan = _model("scan", scan_preset="i2t_avg")
    img, cap = scan(batch["images"], batch["tokens"], batch["lengths"])
    assert torch.equal(scan.pair_scores(img, cap, LENGTHS), scan_scores(img, None, cap, LENGTHS, SCAN_PRESETS["i2t_avg"]))
    bfan = _model("bfan", bfan_focal="prob")
    img, cap = bfan(batch["images"], batch["tokens"], batch["lengths"])
    assert torch.equal(bfan.pair_scores(img, cap, LENGTHS), bfan_scores(img, None, cap, LENGTHS, "prob"))


@pytest.mark.parametrize("kind", ["scan", "bfan"])
def test_round1_step_trains(kind):
    model = _model(kind)
    step = round1_step(TrainConfig(loss="max_violation", margin=0.2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(4):
        loss, stats = step(model, _batch())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        assert set(stats) >= {"pos", "hardest_neg"}
    assert losses[-1] < losses[0]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_configuration_refused():
    with pytest.raises(ValidationError, match="scan_preset"):
        ModelConfig(image_encoder="scan", scan_preset="t2i_max")
    with pytest.raises(ValidationError, match="text_encoder=gru"):
        ModelConfig(image_encoder="bfan", text_encoder="minilm")
    with pytest.raises(ValueError, match="img_dim"):
        build_model(ModelConfig(image_encoder="scan"), VOCAB, None)
    with pytest.raises(ValueError, match="joint embedding"):
        build_model(ModelConfig(image_encoder="bfan", embed_dim=E), VOCAB, IMG_DIM, n_labels=3)


@pytest.mark.parametrize("kind", ["scan", "bfan"])
def test_round2_scores_of_a_cross_model(kind):
    """Round 2 reads every score of a cross-attention model from its pair scores."""
    from aoq_train.round2.train import round2_scores

    model = _model(kind)
    batch = _batch()  # two groups of two: [positives | offline items]
    img, cap = model(batch["images"], batch["tokens"], batch["lengths"])
    s = round2_scores(img, cap, 2, model=model, lengths=LENGTHS)
    full = model.pair_scores(img, cap, LENGTHS)
    torch.testing.assert_close(s["scores"], full[:2, :2])
    torch.testing.assert_close(s["i2t_off"], full[:2, 2:].diagonal())
    torch.testing.assert_close(s["t2i_off"], full[2:, :2].diagonal())
    torch.testing.assert_close(s["off_pair"], full[2:, 2:].diagonal())
