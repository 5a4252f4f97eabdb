"""Score matrices of cross-attention models: bounded-memory blocks, shortlist re-ranking, the
evaluation of a scan/bfan model on a split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aoq.pair_scores as pair_scores
from aoq.config import ModelConfig
from aoq.data.dataset import SplitData
from aoq.data.vocab import Vocabulary
from aoq.embed import EncodedFragments, encode_fragments
from aoq.models.bfan import bfan_scores
from aoq.models.joint import build_model
from aoq.pair_scores import (
    ScoringTime,
    fold_scores,
    rescore_shortlist,
    score_matrix,
    shortlist,
    shortlist_sims,
)
from aoq_train.evaluate import evaluate_pairwise, format_table

N_IMAGES, CPI, R, D = 6, 5, 4, 8
CPU = torch.device("cpu")


def _fragments() -> EncodedFragments:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, N_IMAGES * CPI)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return EncodedFragments(rng.standard_normal((N_IMAGES, R, D)), rng.standard_normal((offsets[-1], D)), offsets)


def _score(regions, words, lengths):
    return bfan_scores(regions, None, words, lengths, "prob")


def _full_by_pairs(fragments: EncodedFragments) -> np.ndarray:
    out = np.empty((fragments.n_images, fragments.n_captions))
    for c in range(fragments.n_captions):
        words, lengths = fragments.captions([c])
        out[:, c] = _score(torch.from_numpy(fragments.regions), words, lengths)[:, 0].numpy()
    return out


def test_blocks_equal_one_caption_at_a_time(monkeypatch):
    """Tiny blocks (several image sub-blocks per caption block) give every pair's own score."""
    fragments = _fragments()
    monkeypatch.setattr(pair_scores, "BLOCK_ELEMENTS", 3 * 7 * R * 5)
    monkeypatch.setattr(pair_scores, "CAPTION_BLOCK", 7)
    sims, timing = score_matrix(_score, fragments, CPU)
    assert sims.shape == (N_IMAGES, N_IMAGES * CPI) and timing.pairs == sims.size
    np.testing.assert_allclose(sims, _full_by_pairs(fragments), atol=1e-6, rtol=0)


def test_accelerator_blocks_are_large_and_score_the_same(monkeypatch):
    """An accelerator gets the large bounds; one large block (the whole tiny split) gives every
    pair's own score too."""
    assert pair_scores.block_bounds(torch.device("cuda")) == pair_scores.ACCELERATOR_BLOCK
    assert pair_scores.block_bounds(CPU) == (pair_scores.BLOCK_ELEMENTS, pair_scores.CAPTION_BLOCK)
    monkeypatch.setattr(pair_scores, "BLOCK_ELEMENTS", pair_scores.ACCELERATOR_BLOCK[0])
    monkeypatch.setattr(pair_scores, "CAPTION_BLOCK", pair_scores.ACCELERATOR_BLOCK[1])
    fragments = _fragments()
    np.testing.assert_allclose(score_matrix(_score, fragments, CPU)[0], _full_by_pairs(fragments), atol=1e-6, rtol=0)


def test_first_images_only():
    fragments = _fragments()
    sims, _ = score_matrix(_score, fragments, CPU, range(2))
    assert sims.shape == (2, 2 * CPI)
    np.testing.assert_allclose(sims, _full_by_pairs(fragments)[:2, : 2 * CPI], atol=1e-6, rtol=0)


def test_later_images_and_fold_blocks():
    fragments = _fragments()
    full = _full_by_pairs(fragments)
    sims, _ = score_matrix(_score, fragments, CPU, range(2, 5))
    np.testing.assert_allclose(sims, full[2:5, 2 * CPI : 5 * CPI], atol=1e-6, rtol=0)
    fn, timing = fold_scores(_score, fragments, CPU, fold_images=2, n_folds=3)
    assert timing.pairs == 3 * 2 * 2 * CPI
    np.testing.assert_allclose(fn(slice(2, 4), slice(2 * CPI, 4 * CPI)), full[2:4, 2 * CPI : 4 * CPI], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="one fold"):
        fn(slice(0, 2), slice(0, 4 * CPI))


def test_projection():
    assert ScoringTime(2.0, 100).projected_seconds(200) == 4.0


@pytest.mark.parametrize("queries", ["images", "captions"])
def test_shortlist_reranking_equals_full_scoring_restricted(queries):
    fragments = _fragments()
    full = _full_by_pairs(fragments)
    base = np.random.default_rng(1).standard_normal(full.shape)  # a (poor) embedding model's scores
    if queries == "captions":
        full, base = full.T, base.T
    short = shortlist(base, 4)
    rescored = rescore_shortlist(_score, fragments, short, queries, CPU)
    np.testing.assert_allclose(rescored, np.take_along_axis(full, short, axis=1), atol=1e-6, rtol=0)
    sims = shortlist_sims(base, short, rescored)
    for q in range(base.shape[0]):
        order = np.argsort(-sims[q], kind="stable")
        # the shortlist first, in the full scores' order, then the rest in the embedding order
        assert list(order[:4]) == list(short[q][np.argsort(-full[q, short[q]], kind="stable")])
        rest = [i for i in np.argsort(-base[q], kind="stable") if i not in set(short[q])]
        assert list(order[4:]) == rest


def test_shortlist_of_everything_is_full_scoring():
    fragments = _fragments()
    full = _full_by_pairs(fragments)
    base = np.zeros_like(full)
    short = shortlist(base, full.shape[1])
    sims = shortlist_sims(base, short, rescore_shortlist(_score, fragments, short, "images", CPU))
    np.testing.assert_allclose(sims, full, atol=1e-6, rtol=0)


def test_shortlist_needs_one_item():
    with pytest.raises(ValueError):
        shortlist(np.zeros((2, 3)), 0)


def _split_and_model(kind: str):
    rng = np.random.default_rng(2)
    words = ["a", "red", "cat", "on", "the", "mat", "dog", "sits"]
    captions = [" ".join(rng.choice(words, rng.integers(1, 6))) for _ in range(N_IMAGES * CPI)]
    split = SplitData(name="test", captions=captions, captions_per_image=CPI,
                      image_ids=[str(i) for i in range(N_IMAGES)],
                      features=rng.standard_normal((N_IMAGES, R, 12)).astype(np.float32))
    vocab = Vocabulary.build(captions, 1)
    torch.manual_seed(0)
    model = build_model(ModelConfig(image_encoder=kind, embed_dim=16, word_dim=8, bidirectional=True), len(vocab), 12)
    return split, vocab, model


@pytest.mark.parametrize("kind", ["scan", "bfan"])
def test_evaluate_pairwise(kind):
    split, vocab, model = _split_and_model(kind)
    result = evaluate_pairwise(model, vocab, split, "full")
    fragments = encode_fragments(model, vocab, split)
    sims, _ = score_matrix(model.pair_scores, fragments, CPU)
    from aoq.metrics import evaluate_scores

    assert result["rsum"] == evaluate_scores(sims, CPI)["rsum"]
    assert result["scoring"]["pairs"] == N_IMAGES * N_IMAGES * CPI and result["scoring"]["projected_coco5k_s"] > 0
    assert "COCO 5K" in format_table({**result, "split": "test"})
    # a shortlist as long as the gallery re-ranks everything: the full metrics
    emb = (np.random.default_rng(3).standard_normal((N_IMAGES, 4)), np.random.default_rng(4).standard_normal((N_IMAGES * CPI, 4)))
    whole = evaluate_pairwise(model, vocab, split, "full", shortlist_by=emb, shortlist_n=N_IMAGES * CPI)
    assert whole["shortlist"] == N_IMAGES * CPI
    assert whole["i2t"] == pytest.approx(result["i2t"]) and whole["t2i"]["r1"] == pytest.approx(result["t2i"]["r1"])


def test_shortlist_cost_is_the_difference_to_full_scoring():
    split, vocab, model = _split_and_model("bfan")
    full = evaluate_pairwise(model, vocab, split, "full")
    emb = (np.random.default_rng(3).standard_normal((N_IMAGES, 4)), np.random.default_rng(4).standard_normal((N_IMAGES * CPI, 4)))
    short = evaluate_pairwise(model, vocab, split, "full", shortlist_by=emb, shortlist_n=3, shortlist_cost=True)
    cost = short["shortlist_cost"]
    assert cost["full"]["rsum"] == full["rsum"] and cost["full"]["i2t"] == full["i2t"]
    assert cost["difference"]["rsum"] == pytest.approx(short["rsum"] - full["rsum"])
    assert cost["difference"]["t2i"]["r1"] == pytest.approx(short["t2i"]["r1"] - full["t2i"]["r1"])
    # a random 4-d teacher's top 3 of 30 loses recall against every pair scored
    assert cost["difference"]["rsum"] < 0
    assert "the shortlist's cost" in format_table({**short, "split": "test"})
    everything = evaluate_pairwise(model, vocab, split, "full", shortlist_by=emb, shortlist_n=N_IMAGES * CPI,
                                   shortlist_cost=True)
    assert everything["shortlist_cost"]["difference"]["rsum"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="shortlist"):
        evaluate_pairwise(model, vocab, split, "full", shortlist_cost=True)


def test_ensemble_averages_the_two_models_scores():
    split, vocab, scan = _split_and_model("scan")
    _, _, bfan = _split_and_model("bfan")
    sims = [score_matrix(m.pair_scores, encode_fragments(m, vocab, split), CPU)[0] for m in (scan, bfan)]
    from aoq.metrics import evaluate_scores

    expected = evaluate_scores((sims[0] + sims[1]) / 2, CPI)
    result = evaluate_pairwise(scan, vocab, split, "full", ensemble=(bfan, vocab))
    assert result["rsum"] == expected["rsum"] and result["i2t"] == expected["i2t"] and result["t2i"] == expected["t2i"]
    assert result["rsum"] != evaluate_pairwise(scan, vocab, split, "full")["rsum"]
    assert result["scoring"]["pairs"] == N_IMAGES * N_IMAGES * CPI
    # re-ranking a whole-gallery shortlist with the ensemble is the ensemble's full scoring
    emb = (np.random.default_rng(3).standard_normal((N_IMAGES, 4)), np.random.default_rng(4).standard_normal((N_IMAGES * CPI, 4)))
    whole = evaluate_pairwise(scan, vocab, split, "full", shortlist_by=emb, shortlist_n=N_IMAGES * CPI,
                              ensemble=(bfan, vocab))
    assert whole["rsum"] == pytest.approx(expected["rsum"])


def test_pairwise_labels_equal_the_embedding_path(monkeypatch):
    """A pair model whose score is a dot product gets the label-wise metrics (and recalls) that the
    embedding models' path computes from the same vectors, with and without a whole shortlist."""
    import aoq_train.pairwise_eval as pairwise_eval
    from aoq.data.dataset import DataError, split_targets
    from aoq.label_metrics import label_metrics
    from aoq.metrics import evaluate_embeddings

    split, vocab, _ = _split_and_model("scan")
    split.labels = [["red", "cat"], ["cat"], ["dog"], ["dog", "mat"], ["red"], ["mat", "cat"]]
    rng = np.random.default_rng(5)
    img, cap = rng.standard_normal((N_IMAGES, 3)), rng.standard_normal((N_IMAGES * CPI, 3))
    one_each = EncodedFragments(img[:, None, :], cap, np.arange(N_IMAGES * CPI + 1))
    monkeypatch.setattr(pairwise_eval, "encode_fragments", lambda *a, **k: one_each)
    model = torch.nn.Linear(1, 1)
    model.pair_scores = lambda regions, words, lengths: regions[:, 0] @ words[:, 0].T
    expected = label_metrics(img, cap, split_targets(split), CPI, 4)
    recalls = evaluate_embeddings(img, cap, CPI)
    for short in ({}, {"shortlist_by": (img, cap), "shortlist_n": N_IMAGES * CPI}):
        result = evaluate_pairwise(model, vocab, split, "labels", device="cpu", ndcg_k=4, **short)
        assert result["protocol"] == "labels" and result["labels"]["n_labels"] == 4
        for d in ("i2t", "t2i"):
            assert result["labels"][d] == pytest.approx(expected[d], abs=1e-12)
            assert result[d]["r1"] == pytest.approx(recalls[d]["r1"])
    split.labels = None
    with pytest.raises(DataError, match="no labels"):
        evaluate_pairwise(model, vocab, split, "labels", device="cpu")
    with pytest.raises(ValueError, match="5,000"):
        evaluate_pairwise(model, vocab, split, "5k", device="cpu")


def test_scoring_restores_torch_threads_and_raises_a_blocks_error():
    fragments = _fragments()
    threads = torch.get_num_threads()
    score_matrix(_score, fragments, CPU)
    assert torch.get_num_threads() == threads

    def broken(regions, words, lengths):
        raise RuntimeError("block failed")

    with pytest.raises(RuntimeError, match="block failed"):
        score_matrix(broken, fragments, CPU)
    assert torch.get_num_threads() == threads
