"""The hubness normalisers on a case worked by hand (aoq.hubness, docs/serving.md, Hubness correction).

With ``beta = ln 2`` every ``exp(beta * s)`` is ``2 ** s``. Gallery g0 = (1, 0), g1 = (0, 1),
g2 = (-1, 0); bank b0 = (2, 0), b1 = (1, 1), b2 = (0, 1). Scores s(b, g):

    b0: 2, 0, -2      b1: 1, 1, -1      b2: 0, 1, 0

so Z(g0) = 4 + 2 + 1 = 7, Z(g1) = 1 + 2 + 2 = 5, Z(g2) = 1/4 + 1/2 + 1 = 1.75. Top-1 of b0: g0, of b1:
g0 (a tie with g1 goes to the lower position), of b2: g1; g2 is nobody's top-1, so the activation
set is {g0, g1}.

Query qa = (0.5, 0): raw 0.5, 0, -0.5 (order g0, g1, g2); its top-1 g0 is active, so both methods
normalise: 2**0.5 / 7 = 0.2020, 1 / 5 = 0.2, 2**-0.5 / 1.75 = 0.4041: order g2, g0, g1.
Query qb = (-1, 0): raw -1, 0, 1; its top-1 g2 is not active: QB-Norm keeps ``beta * s``
(order g2, g1, g0), the inverted softmax gives 0.5 / 7, 1 / 5, 2 / 1.75 (order g2, g1, g0 too).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from aoq import hubness
from aoq.hubness import bank_normaliser, hub_share, normalise_rows, rerank

LN2 = math.log(2.0)
GALLERY = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
BANK = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
QUERIES = np.array([[0.5, 0.0], [-1.0, 0.0]])


@pytest.fixture
def normaliser() -> hubness.Normaliser:
    return bank_normaliser(BANK, GALLERY, beta=LN2)


def test_the_log_denominators_and_the_activation_set_match_the_hand_computed_values(normaliser) -> None:
    assert np.exp(normaliser.log_denominator) == pytest.approx([7.0, 5.0, 1.75], rel=1e-12)
    assert normaliser.active.tolist() == [True, True, False]


def test_blocks_of_one_bank_row_give_the_same_normaliser(monkeypatch, normaliser) -> None:
    monkeypatch.setattr(hubness, "BLOCK_ELEMENTS", 1)  # one bank row per block
    blocked = bank_normaliser(BANK, GALLERY, beta=LN2)
    assert blocked.log_denominator == pytest.approx(normaliser.log_denominator, rel=1e-12)
    assert blocked.active.tolist() == normaliser.active.tolist()


def test_the_denominator_is_computed_in_log_space() -> None:
    # exp(1000) overflows a float64; log Z of two bank rows scoring 1 is 1000 + ln 2 all the same
    big = bank_normaliser(np.array([[1.0], [1.0]]), np.array([[1.0]]), beta=1000.0)
    assert big.log_denominator[0] == pytest.approx(1000.0 + LN2, rel=1e-12)


def test_normalised_scores_of_both_methods(normaliser) -> None:
    raw = QUERIES @ GALLERY.T
    inverted = np.exp(normalise_rows(raw, normaliser, "invsoftmax"))
    assert inverted[0] == pytest.approx([2**0.5 / 7, 1 / 5, 2**-0.5 / 1.75], rel=1e-12)
    assert inverted[1] == pytest.approx([0.5 / 7, 1 / 5, 2 / 1.75], rel=1e-12)
    qb = np.exp(normalise_rows(raw, normaliser, "qbnorm"))
    assert qb[0] == pytest.approx(inverted[0], rel=1e-12)  # top-1 g0 is active
    assert qb[1] == pytest.approx([0.5, 1.0, 2.0], rel=1e-12)  # top-1 g2 is not: 2 ** s
    assert normalise_rows(raw, normaliser, "none").tolist() == raw.tolist()


def test_rerank_of_a_candidate_pool(normaliser) -> None:
    scores, positions = np.array([0.5, 0.0, -0.5]), np.array([0, 1, 2])
    new, order, applied = rerank("qbnorm", scores, positions, normaliser, 2)
    assert (order.tolist(), applied) == ([2, 0], True)
    assert np.exp(new) == pytest.approx([2**-0.5 / 1.75, 2**0.5 / 7], rel=1e-12)
    kept, order, applied = rerank("qbnorm", np.array([1.0, 0.0, -1.0]), np.array([2, 1, 0]), normaliser, 3)
    assert (order.tolist(), applied) == ([2, 1, 0], False)
    assert kept == pytest.approx([LN2, 0.0, -LN2], abs=1e-15)
    same, order, applied = rerank("none", scores, positions, normaliser, 2)
    assert (same.tolist(), order.tolist(), applied) == ([0.5, 0.0], [0, 1], False)


def test_rerank_breaks_ties_by_position() -> None:
    flat = hubness.Normaliser(log_denominator=np.zeros(4), active=np.ones(4, dtype=bool), beta=1.0)
    _, order, _ = rerank("invsoftmax", np.array([1.0, 1.0, 0.5, 1.0]), np.array([3, 2, 0, 1]), flat, 4)
    assert order.tolist() == [1, 2, 3, 0]


def test_hub_share_counts_the_most_frequent_top1_items() -> None:
    assert hub_share(np.array([5, 5, 5, 1, 1, 2, 3]), items=2) == pytest.approx(5 / 7)
    assert hub_share(np.array([0, 1, 2, 3]), items=10) == 1.0


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _brute(scores: np.ndarray, bank_scores: np.ndarray, method: str) -> np.ndarray:
    """Queries in rows: exp(20 s) / sum_b exp(20 s(b, g)) straight from the definition (small, so
    nothing overflows), for every query (invsoftmax) or those whose raw top-1 some bank query
    also ranks first (qbnorm); the others keep exp(20 s)."""
    numerator = np.exp(20.0 * scores.astype(np.float64))
    denominator = np.exp(20.0 * bank_scores.astype(np.float64)).sum(axis=0)
    hubs = set(np.argmax(bank_scores, axis=1).tolist())
    normalised = [method == "invsoftmax" or int(np.argmax(row)) in hubs for row in scores]
    return np.log(np.where(np.array(normalised)[:, None], numerator / denominator, numerator))


@pytest.mark.parametrize("method", ["qbnorm", "invsoftmax"])
def test_the_evaluation_ranks_as_the_brute_force_normalisation_of_the_full_matrix(method) -> None:
    from aoq.label_metrics import label_metrics_of_scores
    from aoq.metrics import i2t, rsum, t2i
    from aoq_train.evaluate import evaluate_hubness

    img, cap, bank_img, bank_cap = _unit(20, 8, 1), _unit(100, 8, 2), _unit(40, 8, 3), _unit(200, 8, 4)
    split = SimpleNamespace(captions=[f"c{i}" for i in range(100)], captions_per_image=5, labels=[[f"group:{i % 3}"] for i in range(20)])
    bank = (bank_img, bank_cap, hubness.bank_provenance("train", bank_img, bank_cap))
    got = evaluate_hubness(img, cap, split, method, bank, ndcg_k=10)
    i2t_sims = _brute(img @ cap.T, bank_img @ cap.T, method)  # image queries, captions normalised
    t2i_sims = _brute(cap @ img.T, bank_cap @ img.T, method).T
    want_i2t, want_t2i = i2t(i2t_sims, 5), t2i(t2i_sims, 5)
    assert got["i2t"] == pytest.approx(want_i2t) and got["t2i"] == pytest.approx(want_t2i)
    assert got["rsum"] == pytest.approx(rsum(want_i2t, want_t2i))
    assert got["hubness"]["hub_share"]["t2i"] == hub_share(np.argmax(t2i_sims, axis=0))
    assert got["hubness"]["bank"] == {"split": "train", "images": 40, "captions": 200, "beta": 20.0, "k": 1,
                                      "content_hash": bank[2]["content_hash"]}
    groups = np.eye(3)[np.arange(20) % 3]
    want_labels = label_metrics_of_scores(i2t_sims, t2i_sims.T, groups, 5, 10)
    assert got["labels"]["t2i"] == pytest.approx(want_labels["t2i"]) and got["labels"]["n_labels"] == 3
    plain = evaluate_hubness(img, cap, split, "none", None)
    assert plain["i2t"] == i2t(img @ cap.T, 5) and plain["hubness"]["bank"] == {}
    assert (got["i2t"], got["t2i"]) != (plain["i2t"], plain["t2i"])  # the normalisation changed something
