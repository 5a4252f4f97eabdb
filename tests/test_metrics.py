"""Tests of aoq/metrics.py and aoq/ranks.py: hand-computed protocol values, ties by expected rank,
text positives, folds, histogram, naive loops."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from aoq import metrics as M
from aoq import ranks as R

# 2 images x 10 captions (5 per image). Image 0 owns captions 0-4, image 1 captions 5-9.
TINY = np.array(
    [
        [0.1, 0.5, 0.2, 0.3, 0.4, 0.9, 0.35, 0.05, 0.0, 0.45],
        [0.7, 0.1, 0.2, 0.3, 0.0, 0.95, 0.4, 0.5, 0.6, 0.35],
    ]
)


# --------------------------------------------------------------------------- hand-computed


def test_tiny_ranks_by_hand():
    # image 0: best caption 0.5, one negative above (0.9) -> 1; image 1: best 0.95 beats all -> 0
    assert M.i2t_ranks(TINY).tolist() == [1, 0]
    # caption 0: image 1 scores 0.7 > 0.1 -> 1; captions 2, 3 tie with the other image (0.2 = 0.2,
    # 0.3 = 0.3): a random order puts the positive first half the time -> 0.5; caption 9: image 0
    # scores 0.45 > 0.35 -> 1; all others beat the other image.
    assert M.t2i_ranks(TINY).tolist() == [1, 0, 0.5, 0.5, 0, 0, 0, 0, 0, 1]
    assert M.i2t_ranks(TINY).dtype == np.float64 and M.t2i_ranks(TINY).dtype == np.float64


def test_tiny_metrics_by_hand():
    # i2t ranks [1, 0]: median 0.5 -> floor 0 -> medr 1 (an even count), mean 0.5 -> meanr 1.5
    assert M.i2t(TINY) == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.5}
    # t2i: six sure hits, two half hits (the ties), two misses at K = 1; expected ranks 0 x6,
    # 0.5 x2, 1 x2: median 0 -> medr 1, mean 0.3 -> meanr 1.3
    assert M.t2i(TINY) == {"r1": 70.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": pytest.approx(1.3)}
    assert M.rsum(M.i2t(TINY), M.t2i(TINY)) == 520.0
    result = M.evaluate_sims(TINY)
    assert set(result) == {"i2t", "t2i", "rsum", "merged"}
    assert result["rsum"] == 520.0 and result["i2t"] == M.i2t(TINY) and result["merged"] == 0


def designed_t2i(ranks: list[int]) -> np.ndarray:
    """One caption per image; caption c's column gives the other images the scores 1..n-1 and its
    own image n - 0.5 - rank, so exactly ``rank`` images are above it."""
    n = len(ranks)
    sims = np.zeros((n, n))
    for c, r in enumerate(ranks):
        others = [i for i in range(n) if i != c]
        sims[others, c] = np.arange(1, n)
        sims[c, c] = n - 0.5 - r
    return sims


def test_recalls_medr_meanr_on_designed_ranks():
    ranks = [0, 0, 1, 4, 5, 9, 10, 11, 2, 3, 0, 7]
    sims = designed_t2i(ranks)
    assert M.t2i_ranks(sims, captions_per_image=1).tolist() == ranks
    got = M.t2i(sims, captions_per_image=1)
    # r < 1: 3 of 12; r < 5: 7 of 12; r < 10: 10 of 12
    assert got["r1"] == pytest.approx(25.0)
    assert got["r5"] == pytest.approx(700 / 12)
    assert got["r10"] == pytest.approx(1000 / 12)
    # sorted: 0 0 0 1 2 3 | 4 5 7 9 10 11 -> median (3 + 4) / 2 = 3.5 -> floor 3 -> medr 4
    assert got["medr"] == 4.0
    assert got["meanr"] == pytest.approx(52 / 12 + 1)


def sure(ranks: list[int]) -> R.RankStats:
    """Rank statistics of queries without ties."""
    n = len(ranks)
    return R.RankStats(np.array(ranks), np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64))


def test_medr_even_count_floors_the_median():
    assert M.recall_metrics(sure([0, 1]))["medr"] == 1.0  # median 0.5
    assert M.recall_metrics(sure([2, 5, 7, 20]))["medr"] == 7.0  # median 6
    assert M.recall_metrics(sure([2, 5, 8, 20]))["medr"] == 7.0  # median 6.5 -> 6 -> 7
    assert M.recall_metrics(sure([4]))["medr"] == 5.0


# --------------------------------------------------------------------------- ties


def test_one_tie_is_half_a_hit():
    # the hit probability of one query: 0 above, 1 negative tied, the positive alone at its score
    assert R.RankStats(np.array([0]), np.array([1]), np.array([1])).hit_probability(1).tolist() == [0.5]
    # the same through the protocol: image 0's caption ties image 1's caption; image 1 is sure
    sims = np.array([[0.5, 0.5], [0.1, 0.9]])
    assert M.i2t(sims, captions_per_image=1)["r1"] == 75.0
    assert M.i2t_ranks(sims, captions_per_image=1).tolist() == [0.5, 0.0]


def test_ties_by_expected_rank():
    # all equal, 3 images x 5 captions: the 5 positives and 10 negatives of an image query in a
    # random order; no negative first with probability 5/15, expected negatives before the first
    # positive 10 / (5 + 1)
    flat = np.ones((3, 15))
    assert M.i2t_ranks(flat).tolist() == pytest.approx([10 / 6] * 3)
    assert M.t2i_ranks(flat).tolist() == [1.0] * 15  # 2 other images, 2 / (1 + 1)
    assert M.i2t(flat)["r1"] == pytest.approx(100 / 3) and M.t2i(flat)["r1"] == pytest.approx(100 / 3)
    # one negative strictly above, one tied with the best positive, two positives at that score
    sims = np.zeros((2, 10))
    sims[0, :5] = [0.2, 0.5, 0.1, 0.1, 0.5]
    sims[0, 5:] = [0.5, 0.6, 0.4, 0.0, 0.0]
    sims[1, 5:] = 1.0
    stats = R.i2t_stats(R.array_fn(sims), R.Positives.pairs(2, 5))
    assert (stats.above[0], stats.tied[0], stats.peers[0]) == (1, 1, 2)
    assert M.i2t_ranks(sims)[0] == pytest.approx(1 + 1 / 3)
    assert stats.hit_probability(1)[0] == 0.0 and stats.hit_probability(2)[0] == pytest.approx(2 / 3)
    # caption 1: its image scores 0.5 and image 1 ties it at 0.5 -> 0.5
    sims[1, 1] = 0.5
    assert M.t2i_ranks(sims)[1] == 0.5
    sims[1, 1] = 0.49
    assert M.t2i_ranks(sims)[1] == 0


def test_constant_scores_give_exactly_the_chance_level():
    # A collapsed model: 100 images, 500 captions, every score 0. Independently of the code: an
    # image query hits the top K unless its K places all go to the 495 negatives,
    # 1 - C(495, K) / C(500, K); a caption query hits with K / 100.
    chance = sum(100 * (1 - math.comb(495, k) / math.comb(500, k)) + k for k in (1, 5, 10))
    result = M.evaluate_sims(np.zeros((100, 500)), captions_per_image=5)
    assert result["rsum"] == pytest.approx(chance, abs=1e-9)
    assert result["rsum"] == pytest.approx(M.chance_rsum(100, 5), abs=1e-9)
    # expected ranks: 495 / 6 = 82.5 (i2t), 99 / 2 = 49.5 (t2i)
    assert (result["i2t"]["medr"], result["i2t"]["meanr"]) == (83.0, 83.5)
    assert (result["t2i"]["medr"], result["t2i"]["meanr"]) == (50.0, 50.5)
    # the embeddings path (blockwise products) follows the same rule
    emb = M.evaluate_embeddings(np.ones((100, 4)), np.ones((500, 4)), 5)
    assert emb["rsum"] == pytest.approx(chance, abs=1e-9) and emb["i2t"]["medr"] == 83.0
    # and so does the cross-retrieval rank: r_i = 1 + 49.5, r_t = 1 + 247.5 -> max(5 r_i - 4, r_t)
    assert set(M.cross_retrieval_ranks(np.zeros((100, 500))).tolist()) == {248.5}


# --------------------------------------------------------------------------- text positives

# 3 images x 2 captions; images 0 and 1 share the text "red heart" (twins, as two vendors' drawings
# of one emoji): identical texts embed identically, so their scores tie exactly.
TWIN_TEXTS = ["red heart", "love", "Red  heart", "a heart", "flag", "japan"]
TWINS = np.array([
    [0.9, 0.3, 0.9, 0.2, 0.1, 0.0],
    [0.8, 0.1, 0.8, 0.7, 0.2, 0.1],
    [0.5, 0.1, 0.5, 0.1, 0.6, 0.4],
])


def test_text_positives_merge_identical_texts_in_both_directions():
    positives = R.Positives.texts(TWIN_TEXTS, 2)
    pairs = sorted(zip(positives.images.tolist(), positives.captions.tolist()))
    assert pairs == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (1, 3), (2, 4), (2, 5)]
    assert positives.merged == 2
    # pair rule: each twin's own caption ties the other's at the top -> half a place; the text
    # rule makes the twin's caption a positive -> rank 0
    assert M.i2t_ranks(TWINS, 2).tolist() == [0.5, 0.5, 0.0]
    assert M.i2t_ranks(TWINS, 2, TWIN_TEXTS).tolist() == [0.0, 0.0, 0.0]
    # caption 2 ("Red  heart", image 1): image 0 scores higher -> rank 1 by pair, 0 by text
    assert M.t2i_ranks(TWINS, 2).tolist() == [0, 0, 1, 0, 0, 0]
    assert M.t2i_ranks(TWINS, 2, TWIN_TEXTS).tolist() == [0, 0, 0, 0, 0, 0]
    text, pair = M.evaluate_sims(TWINS, 2, TWIN_TEXTS), M.evaluate_sims(TWINS, 2)
    assert text["rsum"] == 600.0 and text["merged"] == 2
    assert pair["i2t"]["r1"] == pytest.approx(100 * 2 / 3) and pair["merged"] == 0
    # the embeddings path and the 1K folds take the same rule
    img = np.eye(3)
    assert M.evaluate_embeddings(img, TWINS.T, 2, texts=TWIN_TEXTS)["rsum"] == 600.0


def test_text_positives_within_folds():
    texts = ["a", "b", "a", "c", "a", "d", "e", "f"]  # image 2 shares "a" with image 0, another fold
    positives = R.Positives.texts(texts, 2)
    assert positives.merged == 6  # "a": 3 images x 3 captions, 3 of them their own
    first, second = positives.fold(0, 2), positives.fold(2, 2)
    assert sorted(zip(first.images.tolist(), first.captions.tolist())) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (1, 3)]
    assert sorted(zip(second.images.tolist(), second.captions.tolist())) == [(0, 0), (0, 1), (1, 2), (1, 3)]


def test_equals_argsort_convention_without_ties():
    rng = np.random.default_rng(3)
    sims = rng.permutation(20 * 100).reshape(20, 100).astype(np.float64)  # all distinct
    # VSE++ evaluation code: position in the descending argsort
    i2t_expected = [
        min(np.where(np.argsort(sims[k])[::-1] == c)[0][0] for c in range(5 * k, 5 * k + 5)) for k in range(20)
    ]
    t2i_expected = [np.where(np.argsort(sims[:, c])[::-1] == c // 5)[0][0] for c in range(100)]
    assert M.i2t_ranks(sims).tolist() == i2t_expected
    assert M.t2i_ranks(sims).tolist() == t2i_expected


# --------------------------------------------------------------------------- naive loops


def naive_i2t_ranks(sims, cpi):
    ranks = []
    for k in range(sims.shape[0]):
        own = [sims[k, c] for c in range(cpi * k, cpi * k + cpi)]
        best = max(own)
        others = [sims[k, c] for c in range(sims.shape[1]) if c // cpi != k]
        above = sum(1 for s in others if s > best)
        tied = sum(1 for s in others if s == best)
        ranks.append(above + tied / (own.count(best) + 1))
    return ranks


def naive_t2i_ranks(sims, cpi):
    ranks = []
    for c in range(sims.shape[1]):
        positive = sims[c // cpi, c]
        others = [sims[j, c] for j in range(sims.shape[0]) if j != c // cpi]
        ranks.append(sum(1 for s in others if s > positive) + sum(1 for s in others if s == positive) / 2)
    return ranks


@pytest.mark.parametrize("cpi", [1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vectorised_equals_naive_loop(cpi, dtype, monkeypatch):
    rng = np.random.default_rng(cpi)
    # few distinct values, so ties are frequent
    sims = rng.integers(0, 12, size=(23, 23 * cpi)).astype(dtype)
    # tiny blocks so that block edges fall inside the matrix
    monkeypatch.setattr(R, "BLOCK_ELEMENTS", 40)
    assert M.i2t_ranks(sims, cpi).tolist() == pytest.approx(naive_i2t_ranks(sims, cpi))
    assert M.t2i_ranks(sims, cpi).tolist() == pytest.approx(naive_t2i_ranks(sims, cpi))
    # the sims-function path (used for embeddings) agrees with the array path
    positives = R.Positives.pairs(23, cpi)
    fn = lambda r, c: sims[r, c]  # noqa: E731
    assert R.i2t_stats(fn, positives).expected().tolist() == pytest.approx(naive_i2t_ranks(sims, cpi))
    assert R.t2i_stats(fn, positives).expected().tolist() == pytest.approx(naive_t2i_ranks(sims, cpi))


def test_hit_probability_equals_the_mean_over_tie_orders():
    # every order of 3 tied negatives and 2 tied positives behind 1 negative above, enumerated
    from itertools import permutations
    stats = R.RankStats(np.array([1]), np.array([3]), np.array([2]))
    orders = set(permutations("nnnpp"))
    for k in range(1, 7):
        hits = [1 + order.index("p") < k for order in orders]
        assert stats.hit_probability(k)[0] == pytest.approx(np.mean(hits)), k
    assert stats.expected()[0] == pytest.approx(np.mean([1 + order.index("p") for order in orders]))


# --------------------------------------------------------------------------- protocols


def small_embeddings(n_images: int, cpi: int = 5, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n_images, dim))
    cap = np.repeat(img, cpi, axis=0) + 0.9 * rng.standard_normal((n_images * cpi, dim))
    return img, cap


def test_fold_1k_is_the_mean_over_consecutive_folds():
    img, cap = small_embeddings(12)
    sims = img @ cap.T
    got = M.fold_1k(sims, fold_images=2, n_folds=5)  # uses the first 10 of 12 images
    folds = [M.evaluate_sims(sims[2 * f : 2 * f + 2, 10 * f : 10 * f + 10]) for f in range(5)]
    assert got["protocol"] == "1k5fold" and got["n_images"] == 10 and got["fold_images"] == 2
    assert got["folds"] == folds
    for direction in ("i2t", "t2i"):
        for key in M.METRIC_KEYS:
            assert got[direction][key] == pytest.approx(np.mean([f[direction][key] for f in folds]))
    assert got["rsum"] == pytest.approx(np.mean([f["rsum"] for f in folds]))
    assert 0 < got["rsum"] < 600  # neither trivial nor perfect
    # a fold only sees its own images: the result differs from the full 10-image evaluation
    assert got["rsum"] != pytest.approx(M.evaluate_sims(sims[:10, :50])["rsum"])


def test_fold_1k_accepts_a_sims_function():
    img, cap = small_embeddings(10)
    sims = img @ cap.T
    calls = []

    def fn(rows, cols):
        calls.append((rows, cols))
        return sims[rows, cols]

    assert M.fold_1k(fn, n_images=10, fold_images=2, n_folds=5) == M.fold_1k(sims, fold_images=2, n_folds=5)
    # only blocks inside the diagonal folds are ever requested
    for rows, cols in calls:
        fold = rows.start // 2
        assert rows.stop <= 2 * fold + 2 and 10 * fold <= cols.start and cols.stop <= 10 * fold + 10
    with pytest.raises(ValueError, match="needs n_images"):
        M.fold_1k(fn)


def test_fold_1k_defaults_and_too_few_images():
    params = inspect.signature(M.fold_1k).parameters
    assert params["fold_images"].default == 1000 and params["n_folds"].default == 5
    with pytest.raises(ValueError, match=r"at least 5,000 images \(5 folds of 1,000\); this set has 10"):
        M.fold_1k(np.zeros((10, 50)))
    with pytest.raises(ValueError, match="at least 10 images"):
        M.fold_1k(np.zeros((9, 45)), fold_images=2, n_folds=5)


def test_evaluate_embeddings_protocols(monkeypatch):
    monkeypatch.setattr(R, "BLOCK_ELEMENTS", 64)  # many blocks even on a tiny set
    img, cap = small_embeddings(11)
    sims = img @ cap.T
    full = M.evaluate_embeddings(img, cap, 5, "full")
    assert full["protocol"] == "full" and full["n_images"] == 11
    expected = M.evaluate_sims(sims)
    for direction in ("i2t", "t2i"):
        assert full[direction] == pytest.approx(expected[direction])
    five = M.evaluate_embeddings(img, cap, 5, "5k", fold_images=2, n_folds=5)
    assert five["protocol"] == "5k" and five["n_images"] == 10
    assert five["rsum"] == pytest.approx(M.evaluate_sims(sims[:10, :50])["rsum"])
    one = M.evaluate_embeddings(img, cap, 5, "1k5fold", fold_images=2, n_folds=5)
    assert one["protocol"] == "1k5fold"
    assert one["rsum"] == pytest.approx(M.fold_1k(sims, fold_images=2, n_folds=5)["rsum"])
    with pytest.raises(ValueError, match="5k protocol needs at least 5,000 images"):
        M.evaluate_embeddings(img, cap, 5, "5k")
    with pytest.raises(ValueError, match="unknown protocol"):
        M.evaluate_embeddings(img, cap, 5, "2k")


def test_evaluate_embeddings_rejects_bad_input():
    img, cap = small_embeddings(4)
    with pytest.raises(ValueError, match="same d"):
        M.evaluate_embeddings(img, cap[:, :3])
    with pytest.raises(ValueError, match="20 captions for 3 images"):
        M.evaluate_embeddings(img[:3], cap)
    bad = img.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        M.evaluate_embeddings(bad, cap)


@pytest.mark.parametrize(
    "sims, cpi, message",
    [
        (np.zeros(10), 5, "2-D"),
        (np.zeros((2, 9)), 5, "9 captions for 2 images"),
        (np.zeros((0, 0)), 5, "at least one image"),
        (np.zeros((2, 10)), 0, "captions_per_image"),
        (np.array([["a"] * 5]), 5, "real numbers"),
    ],
)
def test_invalid_sims_raise(sims, cpi, message):
    with pytest.raises(ValueError, match=message):
        M.i2t(sims, cpi)


def test_nan_positive_is_rejected():
    sims = TINY.copy()
    sims[1, 7] = np.nan
    for fn in (M.i2t, M.t2i, M.cross_retrieval_ranks):
        with pytest.raises(ValueError, match="NaN"):
            fn(sims)


# --------------------------------------------------------------------------- cross-retrieval


def test_pair_and_cross_retrieval_ranks_by_hand():
    r_i, r_t = M.pair_ranks(TINY)
    assert r_i.tolist() == [2, 1, 1.5, 1.5, 1, 1, 1, 1, 1, 2]  # t2i ranks + 1
    # image 0's negatives are captions 5-9: [.9, .35, .05, 0, .45]; its other captions never count
    # caption 0 (.1): .9 .35 .45 above -> 4; caption 1 (.5): .9 -> 2; caption 4 (.4): .9 .45 -> 3
    # image 1's negatives are captions 0-4: [.7, .1, .2, .3, 0]
    assert r_t.tolist() == [4, 2, 4, 4, 3, 1, 2, 2, 2, 2]
    # max(5 r_i - 4, r_t)
    assert M.cross_retrieval_ranks(TINY).tolist() == [6, 2, 4, 4, 3, 1, 2, 2, 2, 6]


def test_cross_retrieval_ranks_equal_a_naive_loop(monkeypatch):
    monkeypatch.setattr(R, "BLOCK_ELEMENTS", 100)
    rng = np.random.default_rng(9)
    sims = rng.integers(0, 30, size=(9, 45)).astype(np.float32)
    expected = []
    for c in range(45):
        k = c // 5
        images = [sims[j, c] for j in range(9) if j != k]
        captions = [sims[k, d] for d in range(45) if d // 5 != k]
        r_i = 1 + sum(s > sims[k, c] for s in images) + sum(s == sims[k, c] for s in images) / 2
        r_t = 1 + sum(s > sims[k, c] for s in captions) + sum(s == sims[k, c] for s in captions) / 2
        expected.append(max(5 * r_i - 4, r_t))
    assert M.cross_retrieval_ranks(sims).tolist() == pytest.approx(expected)


def test_rank_histogram():
    ranks = np.array([6, 2, 4, 4, 3, 1, 2, 2, 2, 6, 20, 21, 100, 101, 200, 201, 5000])
    assert M.rank_histogram(ranks) == {
        "1": 1, "2-5": 7, "6-20": 3, "21-100": 2, "101-200": 2, ">200": 2,
    }
    assert list(M.rank_histogram(M.cross_retrieval_ranks(TINY)).values()) == [1, 7, 2, 0, 0, 0]
    # an expected rank between two integers counts in the interval of its integer part
    assert M.rank_histogram(np.array([1.5, 5.5, 6.0])) == {"1": 1, "2-5": 1, "6-20": 1, "21-100": 0,
                                                         "101-200": 0, ">200": 0}
    # custom bins; rank 4 falls in no bin and is not counted
    assert M.rank_histogram(ranks, bins=((1, 3), (5, None))) == {"1-3": 6, ">4": 9}


@pytest.mark.parametrize(
    "ranks, bins, message",
    [
        (np.array([0, 1]), M.DEFAULT_BINS, "1-based"),
        (np.array(["1", "2"]), M.DEFAULT_BINS, "numbers"),
        (np.array([1, 2]), ((1, 5), (3, 8)), "non-overlapping"),
        (np.array([1, 2]), ((1, None), (3, 8)), "non-overlapping"),
        (np.array([1, 2]), ((4, 2),), "ascending"),
    ],
)
def test_rank_histogram_rejects_bad_input(ranks, bins, message):
    with pytest.raises(ValueError, match=message):
        M.rank_histogram(ranks, bins)


def test_chance_rsum_matches_the_mean_of_random_rankings():
    # 4 images x 2 captions: i2t P(rank < 1) = 2/8, P(rank < 5) = 1 - C(6,5)/C(8,5) = 1 - 6/56;
    # K = 10 > 8 captions -> 1; t2i: 1/4, 1, 1.
    expected = 100 * (2 / 8 + (1 - 6 / 56) + 1) + 100 * (1 / 4 + 1 + 1)
    assert M.chance_rsum(4, 2) == pytest.approx(expected)
    rng = np.random.default_rng(0)
    runs = [M.evaluate_sims(rng.standard_normal((4, 8)), 2)["rsum"] for _ in range(4000)]
    assert np.mean(runs) == pytest.approx(expected, abs=3.0)
