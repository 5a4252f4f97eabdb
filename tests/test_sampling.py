"""Round-2 sampling (docs/method.md, Sampling): exact draws on hand-built lists, collisions, bounds, errors,
draws local to each anchor, the rank distributions, and the optional false-negative filter on hand-built facts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from aoq.config import ConfigError, Round2Config
from aoq.data.dataset import SplitData
from aoq.data.facts import SplitFacts, facts_hold, index_facts, parse_fact
from aoq_train.round2.train import false_negative_check
from aoq_train.round2.sampling import (
    RANK,
    TILDE,
    DrawKey,
    draw_ranks,
    normal_rank_pmf,
    sample_offline_negatives,
)


class ScriptedDraws:
    """Stands in for DrawKey: the rank and the ``t~_off`` offset of every (anchor, attempt) come
    from tables (``{anchor: [value at attempt 0, 1, ...]}``; offsets default to 0)."""

    def __init__(self, ranks: dict[int, list[int]], tildes: dict[int, list[int]] | None = None) -> None:
        self.ranks, self.tildes = ranks, tildes or {}
        self.calls: list[tuple[int, int, list[int], int]] = []

    def integers(self, anchors: np.ndarray, attempt: int, stream: int, high: int) -> np.ndarray:
        self.calls.append((stream, attempt, [int(a) for a in anchors], high))
        table = self.ranks if stream == RANK else self.tildes
        out = np.array([table.get(int(a), [0] * (attempt + 1))[attempt] for a in anchors], dtype=np.int64)
        assert ((out >= 0) & (out < high)).all()
        return out


# 4 images x 2 captions: captions 2k and 2k+1 belong to image k.
IMG_TOP_CAPS = np.array([
    [2, 5, 7, 4],  # image 0 (its own captions 0, 1 excluded)
    [6, 0, 4, 1],  # image 1
    [1, 7, 3, 0],  # image 2
    [4, 2, 5, 0],  # image 3
], dtype=np.int32)
CAP_TOP_IMGS = np.array([
    [3, 2],  # caption 0 (image 0)
    [2, 1],  # caption 1
    [0, 3],  # caption 2 (image 1)
    [2, 3],  # caption 3
    [1, 0],  # caption 4 (image 2)
    [3, 0],  # caption 5
    [2, 1],  # caption 6 (image 3)
    [0, 1],  # caption 7
], dtype=np.int32)


def test_exact_draws_follow_the_design() -> None:
    # h_t=4, h_i=2: i_off index = n * 2 // 4 = n // 2.
    draws = ScriptedDraws({0: [0], 3: [3], 4: [1], 7: [2]}, {0: [1], 3: [0], 4: [0], 7: [1]})
    got = sample_offline_negatives([0, 3, 4, 7], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, draws)
    # caption 0 (image 0), n=0: t_off = 2, i_off = CAP_TOP_IMGS[0][0] = 3
    # caption 3 (image 1), n=3: t_off = 1, i_off = CAP_TOP_IMGS[3][1] = 3
    # caption 4 (image 2), n=1: t_off = 7, i_off = CAP_TOP_IMGS[4][0] = 1
    # caption 7 (image 3), n=2: t_off = 5, i_off = CAP_TOP_IMGS[7][1] = 1
    np.testing.assert_array_equal(got.rank, [0, 3, 1, 2])
    np.testing.assert_array_equal(got.t_off, [2, 1, 7, 5])
    np.testing.assert_array_equal(got.i_off, [3, 3, 1, 1])
    np.testing.assert_array_equal(got.t_off_tilde, [7, 6, 2, 3])  # i_off * 2 + u, u = 1, 0, 0, 1
    np.testing.assert_array_equal(got.i_off_tilde, [1, 0, 3, 2])  # t_off // 2
    assert got.collisions == 0
    assert draws.calls == [(RANK, 0, [0, 3, 4, 7], 4), (TILDE, 0, [0, 3, 4, 7], 2)]


def test_collisions_are_redrawn_for_those_captions_only() -> None:
    # caption 1 (image 0), n=0: t_off = 2 (image 1), i_off = CAP_TOP_IMGS[1][0] = 2: no collision.
    # caption 2 (image 1), n=1: t_off = 0 (image 0), i_off = CAP_TOP_IMGS[2][0] = 0: collision,
    #   redrawn n=2: t_off = 4 (image 2), i_off = CAP_TOP_IMGS[2][1] = 3: fine.
    draws = ScriptedDraws({1: [0], 2: [1, 2]}, {1: [0], 2: [0, 1]})
    got = sample_offline_negatives([1, 2], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, draws)
    np.testing.assert_array_equal(got.rank, [0, 2])
    np.testing.assert_array_equal(got.t_off, [2, 4])
    np.testing.assert_array_equal(got.i_off, [2, 3])
    np.testing.assert_array_equal(got.t_off_tilde, [4, 7])
    # the second attempt asks for caption 2 alone, under its own attempt number
    assert draws.calls == [(RANK, 0, [1, 2], 4), (TILDE, 0, [1, 2], 2), (RANK, 1, [2], 4), (TILDE, 1, [2], 2)]


def test_fallback_after_max_tries() -> None:
    # Image 0's list holds only captions of images 1 and 2, caption 0's list only images 1 and 2,
    # arranged so that every rank collides: n=0,1 -> (t_off image 1, i_off 1); n=2,3 -> (2, 2).
    img_top = np.array([[2, 3, 4, 5], [0, 1, 4, 5], [0, 1, 2, 3]], dtype=np.int32)
    cap_top = np.array([[1, 2]] * 6, dtype=np.int32)
    got = sample_offline_negatives([0], img_top, cap_top, 4, 2, ScriptedDraws({0: [0, 3, 1]}), max_tries=3)
    # last draw n=1: t_off = 3 (image 1); fallback i_off = first of [1, 2] that is not image 1.
    np.testing.assert_array_equal(got.t_off, [3])
    np.testing.assert_array_equal(got.i_off, [2])
    np.testing.assert_array_equal(got.t_off_tilde, [4])
    np.testing.assert_array_equal(got.i_off_tilde, [1])
    assert got.collisions == 0
    # with a list of one image there is no way out: the collision is kept and counted
    got = sample_offline_negatives([0], img_top, cap_top[:, :1], 2, 1, ScriptedDraws({0: [0, 1]}), max_tries=2)
    assert (got.t_off[0] // 2, got.i_off[0], got.collisions) == (1, 1, 1)


def _random_lists(rng: np.random.Generator, n_img: int, cpi: int, ht: int, hi: int):
    """Valid mined lists: distinct ids, own positives excluded, random order."""
    n_cap = n_img * cpi
    caps = np.stack([rng.permutation(np.setdiff1d(np.arange(n_cap), np.arange(i * cpi, (i + 1) * cpi)))[:ht]
                     for i in range(n_img)])
    imgs = np.stack([rng.permutation(np.setdiff1d(np.arange(n_img), [c // cpi]))[:hi] for c in range(n_cap)])
    return caps.astype(np.int32), imgs.astype(np.int32)


@pytest.mark.parametrize("sampling", ["uniform", "normal"])
def test_bounds_relations_and_determinism(sampling: str) -> None:
    cpi, ht, hi = 5, 30, 6
    caps, imgs = _random_lists(np.random.default_rng(0), 40, cpi, ht + 10, hi + 3)
    c = np.arange(200)
    got = sample_offline_negatives(c, caps, imgs, ht, hi, DrawKey(1, 0), sampling)
    i = c // cpi
    assert ((got.rank >= 0) & (got.rank < ht)).all()
    assert (got.t_off == caps[i, got.rank]).all()
    assert (got.i_off == imgs[c, got.rank * hi // ht]).all()  # within the first h_i
    assert (got.i_off_tilde == got.t_off // cpi).all()
    assert (got.t_off_tilde // cpi == got.i_off).all()
    assert (got.t_off // cpi != got.i_off).all()  # never a positive derived pair
    assert (got.t_off // cpi != i).all() and (got.i_off != i).all()
    again = sample_offline_negatives(c, caps, imgs, ht, hi, DrawKey(1, 0), sampling)
    other = sample_offline_negatives(c, caps, imgs, ht, hi, DrawKey(1, 1), sampling)  # another epoch
    assert all((a == b).all() for a, b in zip(
        (got.t_off, got.i_off, got.t_off_tilde, got.rank), (again.t_off, again.i_off, again.t_off_tilde, again.rank)))
    assert (got.rank != other.rank).any()


def test_a_changed_list_changes_only_the_draws_of_the_anchors_that_read_it() -> None:
    cpi, ht, hi = 5, 30, 6
    caps, imgs = _random_lists(np.random.default_rng(0), 40, cpi, ht, hi)
    c = np.arange(200)
    before = sample_offline_negatives(c, caps, imgs, ht, hi, DrawKey(7, 3))
    # a near-tie swapped in one mined list of image 12, and in one of caption 77
    caps[12, [3, 4]] = caps[12, [4, 3]]
    imgs[77, [0, 1]] = imgs[77, [1, 0]]
    after = sample_offline_negatives(c, caps, imgs, ht, hi, DrawKey(7, 3))
    changed = np.zeros(200, dtype=bool)
    for a, b in zip((before.t_off, before.i_off, before.t_off_tilde, before.i_off_tilde, before.rank),
                    (after.t_off, after.i_off, after.t_off_tilde, after.i_off_tilde, after.rank)):
        changed |= a != b
    readers = (c // cpi == 12) | (c == 77)
    assert not changed[~readers].any()  # every other anchor keeps its negatives, draw for draw
    assert changed[readers].any()  # (the swap was drawn from: the test can fail)


def test_uniform_ranks_cover_the_depth_evenly() -> None:
    ranks = draw_ranks(DrawKey(0, 0), np.arange(60000), 0, 300)
    assert ranks.min() == 0 and ranks.max() == 299 and abs(ranks.mean() - 149.5) < 2
    assert np.bincount(ranks // 30, minlength=10).min() > 5700  # 6,000 expected per tenth


def test_normal_ranks_follow_the_truncated_folded_normal() -> None:
    # by hand at h_t = 5, centre 2.5, sd 1.25: P(rank 0) = P(|x| < 1) / P(|x| < 5)
    def folded(y):
        return norm.cdf((y - 2.5) / 1.25) - norm.cdf((-y - 2.5) / 1.25)

    pmf = normal_rank_pmf(5, 0.5, 0.25)
    assert pmf == pytest.approx([(folded(r + 1) - folded(r)) / folded(5) for r in range(5)])
    # the defaults make the top ranks rarer than uniform; a wide scale or centre 0 do not
    for h_t in (5, 11, 300):
        assert normal_rank_pmf(h_t, 0.5, 0.25)[0] < 1 / h_t < normal_rank_pmf(h_t, 0.5, 0.5)[0]
        assert normal_rank_pmf(h_t, 0.0, 0.5)[0] == normal_rank_pmf(h_t, 0.0, 0.5).max()
    ranks = draw_ranks(DrawKey(0, 0), np.arange(60000), 0, 300, "normal")
    shares = np.bincount(ranks // 30, minlength=10) / ranks.size
    assert shares == pytest.approx(np.add.reduceat(normal_rank_pmf(300, 0.5, 0.25), np.arange(0, 300, 30)), abs=0.006)


def test_depth_beyond_the_mined_lists_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"h_t=5 exceeds the mined top_captions=4.*--top-captions 5"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 5, 2, DrawKey(0, 0))
    with pytest.raises(ValueError, match=r"h_i=3 exceeds the mined top_images=2"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 3, DrawKey(0, 0))
    with pytest.raises(ValueError, match=r"caption ids must lie in \[0, 8\)"):
        sample_offline_negatives([8], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, DrawKey(0, 0))
    with pytest.raises(ValueError, match="sampling must be"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, DrawKey(0, 0), "beta")


# The false-negative filter (not in the paper). 3 images x 2 captions:
# image 0 a red circle; image 1 a blue circle (its colour variant); image 2 a red circle and a green square.
FACTS = SplitFacts(
    images=[
        ["count(1)", "shape(0,circle)", "colour(0,red)"],
        ["count(1)", "shape(0,circle)", "colour(0,blue)"],
        ["count(2)", "shape(0,circle)", "colour(0,red)", "shape(1,square)", "colour(1,green)"],
    ],
    captions=[
        ["colour(?0,red)", "shape(?0,circle)"],  # 0 "a red circle"
        ["count(1)", "colour(?0,red)", "shape(?0,circle)"],  # 1 "a single red circle"
        ["shape(?0,circle)"],  # 2 "a circle": true of every image
        ["colour(?0,blue)", "shape(?0,circle)"],  # 3 "a blue circle": states the change, false for 0
        ["colour(?0,red)", "shape(?0,circle)", "colour(?1,green)", "shape(?1,square)"],  # 4
        ["colour(?0,red)", "shape(?0,circle)"],  # 5 "a red circle": true of image 0
    ],
)
FN_TOP_CAPS = np.array([[2, 3, 5, 4], [0, 1, 4, 5], [0, 1, 2, 3]], dtype=np.int32)
FN_TOP_IMGS = np.array([[2, 1], [2, 1], [0, 2], [0, 2], [0, 1], [1, 0]], dtype=np.int32)


def test_facts_hold_binds_distinct_objects_and_never_trusts_a_caption_without_facts() -> None:
    truth = FACTS.caption_true_of(np.repeat(np.arange(6), 3), np.tile(np.arange(3), 6)).reshape(6, 3)
    np.testing.assert_array_equal(truth, [
        [1, 0, 1], [1, 0, 0], [1, 1, 1], [0, 1, 0], [0, 0, 1], [1, 0, 1],
    ])
    index = index_facts(FACTS.images[2])
    two_red = [parse_fact("colour(?0,red)"), parse_fact("colour(?1,red)")]
    assert not facts_hold(two_red, index)  # one red object cannot be two
    assert facts_hold([parse_fact("colour(?0,red)"), parse_fact("colour(?1,green)")], index)
    empty = SplitFacts(images=FACTS.images[:1], captions=[[], []])
    assert not empty.caption_true_of([0], [0]).any()


def test_false_negative_filter_skips_exactly_the_false_negatives() -> None:
    # caption 0 (image 0): n=0 gives t_off 2 ("a circle", true of image 0): redrawn; n=1 gives
    # t_off 3 (a true negative) but i_off 2 (caption 0 is true of image 2): redrawn; n=3 gives t_off 4
    # and i_off 1, both true negatives, and t~_off = 1 * 2 + 1 = 3 ("a blue circle"), false of
    # i~_off = image 2: kept.
    # caption 1 ("a single red circle"), n=1: t_off 3 and i_off 2 (which has two objects): true
    # negatives, near-duplicates that differ in what the captions say; t~_off 4 is false of image 1: kept.
    draws = ScriptedDraws({0: [0, 1, 3], 1: [1]}, {0: [0, 0, 1], 1: [0]})
    got = sample_offline_negatives([0, 1], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, draws, caption_true_of=FACTS.caption_true_of)
    np.testing.assert_array_equal(got.rank, [3, 1])
    np.testing.assert_array_equal(got.t_off, [4, 3])
    np.testing.assert_array_equal(got.i_off, [1, 2])
    np.testing.assert_array_equal(got.t_off_tilde, [3, 4])
    assert (got.filtered, got.false_negatives, got.collisions) == (2, 0, 0)
    assert [call[:3] for call in draws.calls if call[0] == RANK] == [(RANK, 0, [0, 1]), (RANK, 1, [0]), (RANK, 2, [0])]
    # off: the same first draw is kept, false negatives and all
    off = sample_offline_negatives([0, 1], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, ScriptedDraws({0: [0], 1: [1]}))
    np.testing.assert_array_equal(off.t_off, [2, 3])
    assert (off.filtered, off.false_negatives) == (0, 0)
    # bounded: after max_tries draws a false negative is kept and counted
    stuck = sample_offline_negatives([0], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, ScriptedDraws({0: [0, 2]}),
                                     max_tries=2, caption_true_of=FACTS.caption_true_of)
    np.testing.assert_array_equal(stuck.t_off, [5])
    assert (stuck.filtered, stuck.false_negatives) == (2, 1)


def test_false_negative_filter_checks_the_derived_pairs() -> None:
    # caption 0, n=3 both times: t_off 4 (image 2), i_off 1. With offset 0, t~_off = caption 2, "a
    # circle", which is true of i~_off = image 2: the pair (i~_off, t~_off) is a match, redrawn; with
    # offset 1, t~_off = caption 3, "a blue circle", false of image 2: kept.
    draws = ScriptedDraws({0: [3, 3]}, {0: [0, 1]})
    got = sample_offline_negatives([0], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, draws, caption_true_of=FACTS.caption_true_of)
    assert (got.t_off[0], got.i_off[0], got.t_off_tilde[0], got.filtered) == (4, 1, 3, 1)
    # the pair (i_off, t_off): caption 3 ("a blue circle", image 1) draws n=0: t_off 0 ("a red
    # circle", false of image 1) and i_off 2 (caption 3 is false of it), but "a red circle" is true
    # of image 2: the derived pair is a match, redrawn; n=1: t_off 1 ("a single red circle"),
    # false of image 2: kept
    top_imgs = np.array([[2, 0]] * 6, dtype=np.int32)
    pair = sample_offline_negatives([3], FN_TOP_CAPS, top_imgs, 4, 2, ScriptedDraws({3: [0, 1]}),
                                    caption_true_of=FACTS.caption_true_of)
    assert (pair.rank[0], pair.t_off[0], pair.i_off[0], pair.filtered) == (1, 1, 2, 1)


def test_the_round2_oracle_needs_facts_and_uses_them() -> None:
    train = SplitData("train", ["a cat", "red", "a dog", "red"], 2, ["0", "1"], source="fixture (split train)")
    assert false_negative_check(train, Round2Config()) is None
    with pytest.raises(ConfigError, match="needs the structured facts.*mining.filters"):
        false_negative_check(train, Round2Config(false_negative_filter=True))
    train.facts = SplitFacts(images=[["x"], ["y"]], captions=[["x"], ["y"]])
    assert false_negative_check(train, Round2Config(false_negative_filter=True)) == train.facts.caption_true_of
