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
