"""The cross-attention model wrapper (``model.image_encoder`` scan / bfan): encoders, scores,
a round-1 training step, configuration checks."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from aoq.config import ModelConfig, TrainConfig
from aoq.models.bfan import bfan_scores
from aoq.models.joint import build_model, text_vocabulary
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


def test_minilm_words_are_the_frozen_token_states_through_a_trained_projection():
    """``model.text_encoder=minilm``: each WordPiece token's last hidden state, projected and
    normalised; junk after a caption's length is never read; only the projection trains and
    the checkpointed state holds no backbone weight."""
    import torch.nn.functional as F

    from aoq.models.pretrained import MiniLMWordEncoder, WordPieceVocab

    model = _model("bfan", text_encoder="minilm")
    encoder = model.text_encoder
    assert isinstance(encoder, MiniLMWordEncoder) and encoder.is_frozen
    assert isinstance(text_vocabulary(ModelConfig(image_encoder="bfan", text_encoder="minilm"), [], 1), WordPieceVocab)
    vocab = WordPieceVocab()
    ids = [vocab.encode(t) for t in ("a grinning face with big eyes", "cat")]
    width = max(map(len, ids)) + 3
    tokens = torch.randint(1000, 20000, (2, width), generator=torch.Generator().manual_seed(0))  # junk
    for row, seq in enumerate(ids):
        tokens[row, :len(seq)] = torch.tensor(seq)
    lengths = torch.tensor([len(s) for s in ids])
    with torch.no_grad():
        words = model.encode_texts(tokens, lengths)
        for row, seq in enumerate(ids):
            hidden = encoder.backbone(input_ids=torch.tensor([seq])).last_hidden_state[0]
            torch.testing.assert_close(words[row, :len(seq)], F.normalize(encoder.head(hidden), dim=-1),
                                       atol=1e-5, rtol=0)
            assert (words[row, len(seq):] == 0).all()
    assert {k for k in model.state_dict() if k.startswith("text_encoder.")} == {"text_encoder.head.weight",
                                                                                "text_encoder.head.bias"}
    images = torch.randn(2, R, IMG_DIM, generator=torch.Generator().manual_seed(1))
    loss, _ = round1_step(TrainConfig(loss="max_violation", margin=0.2))(
        model, {"images": images, "tokens": tokens, "lengths": lengths})
    loss.backward()
    assert encoder.head.weight.grad is not None
    assert all(p.grad is None for p in encoder.backbone.parameters())


def test_cached_minilm_token_states_give_the_words_of_the_live_backbone(tmp_path):
    """With frozen MiniLM words, the backbone's token states are cached once per split (identical
    captions share their rows): a batch from the cache gives the words of the live backbone, its
    padding is never read, a subset keeps each caption's rows, and a second look is a cache hit."""
    import numpy as np

    from aoq.backbone_cache import input_modes, token_spans, with_backbone_features
    from aoq.data.dataset import SplitData
    from aoq.data.loaders import CaptionDataset, collate_captions
    from aoq.models.pretrained import WordPieceVocab

    model = _model("scan", text_encoder="minilm").eval()
    vocab = WordPieceVocab()
    captions = ["a grinning face with big eyes", "cat", "a red apple", "cat", "smiling face with heart eyes",
                "a grinning face with big eyes"]
    split = SplitData("train", captions, 3, ["a", "b"], features=np.zeros((2, R, IMG_DIM), np.float32))
    spans, _, _ = token_spans(vocab, captions)
    assert (spans[1] == spans[3]).all() and (spans[0] == spans[5]).all() and not (spans[0] == spans[1]).all()
    assert [int(b - a) for a, b in spans] == [len(vocab.encode(c)) for c in captions]
    ready = with_backbone_features(model, split, vocab, root=tmp_path)
    assert input_modes(model)[1] == "features" and ready.caption_spans is not None
    assert ready.caption_features.shape == (int(spans.max()), 384)  # distinct captions only
    batch = collate_captions([CaptionDataset(ready, vocab, "features")[c] for c in range(len(captions))])
    live = collate_captions([CaptionDataset(split, vocab, "tokens")[c] for c in range(len(captions))])
    assert torch.equal(batch["lengths"], live["lengths"]) and batch["tokens"].shape[-1] == 384
    assert int(batch["lengths"][1]) < batch["tokens"].shape[1]
    batch["tokens"][1, int(batch["lengths"][1]):] = float("nan")  # junk where no token is: never read
    with torch.no_grad():
        cached_words = model.encode_texts(batch["tokens"], batch["lengths"])
        live_words = model.encode_texts(live["tokens"], live["lengths"])
    torch.testing.assert_close(cached_words, live_words, atol=1e-5, rtol=0)
    first = ready.subset(1)
    assert (first.caption_spans == ready.caption_spans[:3]).all()
    assert torch.equal(CaptionDataset(first, vocab, "features")[2][0], CaptionDataset(ready, vocab, "features")[2][0])
    again = with_backbone_features(model, split, vocab, root=tmp_path)
    assert np.array_equal(again.caption_features, ready.caption_features)
