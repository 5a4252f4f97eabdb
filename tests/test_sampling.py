"""Round-2 sampling (docs/method.md, Sampling): exact draws on hand-built lists, collisions, bounds, errors,
and the optional false-negative filter on hand-built facts."""

from __future__ import annotations

import numpy as np
import pytest

from aoq.config import Round2Config
from aoq.data.dataset import SplitData
from aoq.data.facts import SplitFacts, facts_hold, index_facts, parse_fact
from aoq_train.round2.train import false_negative_check
from aoq_train.mining.sampling import draw_ranks, sample_offline_negatives


class ScriptedRng:
    """Stands in for np.random.Generator: ``integers`` returns the scripted arrays in order."""

    def __init__(self, *draws: list[int]) -> None:
        self.draws = [np.asarray(d, dtype=np.int64) for d in draws]
        self.calls: list[tuple[int, int, int]] = []

    def integers(self, low: int, high: int, size: int) -> np.ndarray:
        self.calls.append((low, high, size))
        out = self.draws.pop(0)
        assert out.shape == (size,) and ((out >= low) & (out < high)).all()
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
    rng = ScriptedRng([0, 3, 1, 2], [1, 0, 0, 1])
    got = sample_offline_negatives([0, 3, 4, 7], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, rng)
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
    assert rng.calls == [(0, 4, 4), (0, 2, 4)]


def test_collisions_are_redrawn_for_those_captions_only() -> None:
    # caption 1 (image 0), n=0: t_off = 2 (image 1), i_off = CAP_TOP_IMGS[1][0] = 2: no collision.
    # caption 2 (image 1), n=1: t_off = 0 (image 0), i_off = CAP_TOP_IMGS[2][0] = 0: collision,
    #   redrawn n=2: t_off = 4 (image 2), i_off = CAP_TOP_IMGS[2][1] = 3: fine.
    rng = ScriptedRng([0, 1], [2], [0, 1])
    got = sample_offline_negatives([1, 2], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, rng)
    np.testing.assert_array_equal(got.rank, [0, 2])
    np.testing.assert_array_equal(got.t_off, [2, 4])
    np.testing.assert_array_equal(got.i_off, [2, 3])
    np.testing.assert_array_equal(got.t_off_tilde, [4, 7])
    assert rng.calls == [(0, 4, 2), (0, 4, 1), (0, 2, 2)]


def test_fallback_after_max_tries() -> None:
    # Image 0's list holds only captions of images 1 and 2, caption 0's list only images 1 and 2,
    # arranged so that every rank collides: n=0,1 -> (t_off image 1, i_off 1); n=2,3 -> (2, 2).
    img_top = np.array([[2, 3, 4, 5], [0, 1, 4, 5], [0, 1, 2, 3]], dtype=np.int32)
    cap_top = np.array([[1, 2]] * 6, dtype=np.int32)
    rng = ScriptedRng([0], [3], [1], [0])
    got = sample_offline_negatives([0], img_top, cap_top, 4, 2, rng, max_tries=3)
    # last draw n=1: t_off = 3 (image 1); fallback i_off = first of [1, 2] that is not image 1.
    np.testing.assert_array_equal(got.t_off, [3])
    np.testing.assert_array_equal(got.i_off, [2])
    np.testing.assert_array_equal(got.t_off_tilde, [4])
    np.testing.assert_array_equal(got.i_off_tilde, [1])
    assert got.collisions == 0
    # with a list of one image there is no way out: the collision is kept and counted
    got = sample_offline_negatives([0], img_top, cap_top[:, :1], 2, 1, ScriptedRng([0], [1], [0]), max_tries=2)
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
    got = sample_offline_negatives(c, caps, imgs, ht, hi, np.random.default_rng(1), sampling)
    i = c // cpi
    assert ((got.rank >= 0) & (got.rank < ht)).all()
    assert (got.t_off == caps[i, got.rank]).all()
    assert (got.i_off == imgs[c, got.rank * hi // ht]).all()  # within the first h_i
    assert (got.i_off_tilde == got.t_off // cpi).all()
    assert (got.t_off_tilde // cpi == got.i_off).all()
    assert (got.t_off // cpi != got.i_off).all()  # never a positive derived pair
    assert (got.t_off // cpi != i).all() and (got.i_off != i).all()
    again = sample_offline_negatives(c, caps, imgs, ht, hi, np.random.default_rng(1), sampling)
    other = sample_offline_negatives(c, caps, imgs, ht, hi, np.random.default_rng(2), sampling)
    assert all((a == b).all() for a, b in zip(
        (got.t_off, got.i_off, got.t_off_tilde, got.rank), (again.t_off, again.i_off, again.t_off_tilde, again.rank)))
    assert (got.rank != other.rank).any()


def test_uniform_and_normal_rank_distributions() -> None:
    rng = np.random.default_rng(0)
    uniform = draw_ranks(rng, 60000, 300)
    normal = draw_ranks(rng, 60000, 300, "normal")  # half-normal, sd = 150 ranks
    assert uniform.min() == 0 and uniform.max() == 299 and abs(uniform.mean() - 149.5) < 2
    assert normal.min() == 0 and normal.max() <= 299
    # |Normal(0, 150)| truncated to [0, 300): mean 150 sqrt(2/pi) (1 - e^-2) / erf(sqrt 2) = 108.4,
    # minus ~0.5 for the floor
    assert abs(normal.mean() - 107.9) < 2
    hist = np.bincount(normal // 50, minlength=6)
    assert (np.diff(hist) < 0).all()  # the hardest ranks are the most likely
    centred = draw_ranks(rng, 60000, 300, "normal", center=0.5, scale=0.15)
    assert abs(centred.mean() - 149.5) < 2 and (centred < 30).mean() < 0.01


def test_depth_beyond_the_mined_lists_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"h_t=5 exceeds the mined top_captions=4.*--top-captions 5"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 5, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"h_i=3 exceeds the mined top_images=2"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"caption ids must lie in \[0, 8\)"):
        sample_offline_negatives([8], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="sampling must be"):
        sample_offline_negatives([0], IMG_TOP_CAPS, CAP_TOP_IMGS, 4, 2, np.random.default_rng(0), "beta")


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
    # caption 0 (image 0): n=0 gives t_off 2 ("a circle", true of image 0) and i_off 2 (caption 0
    # is true of image 2): redrawn; n=1 gives t_off 3 (true negative) but i_off 2 again: redrawn;
    # n=3 gives t_off 4 and i_off 1, both true negatives: kept.
    # caption 1 ("a single red circle"), n=1: t_off 3 and i_off 2 (which has two objects): both
    # true negatives, near-duplicates that differ in what the captions say: kept at once.
    rng = ScriptedRng([0, 1], [1], [3], [0, 1])
    got = sample_offline_negatives([0, 1], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, rng, caption_true_of=FACTS.caption_true_of)
    np.testing.assert_array_equal(got.rank, [3, 1])
    np.testing.assert_array_equal(got.t_off, [4, 3])
    np.testing.assert_array_equal(got.i_off, [1, 2])
    assert (got.filtered, got.false_negatives, got.collisions) == (2, 0, 0)
    assert rng.calls == [(0, 4, 2), (0, 4, 1), (0, 4, 1), (0, 2, 2)]
    # off: the same first draw is kept, false negatives and all
    off = sample_offline_negatives([0, 1], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, ScriptedRng([0, 1], [0, 1]))
    np.testing.assert_array_equal(off.t_off, [2, 3])
    assert (off.filtered, off.false_negatives) == (0, 0)
    # bounded: after max_tries draws a false negative is kept and counted
    stuck = sample_offline_negatives([0], FN_TOP_CAPS, FN_TOP_IMGS, 4, 2, ScriptedRng([0], [2], [0]),
                                     max_tries=2, caption_true_of=FACTS.caption_true_of)
    np.testing.assert_array_equal(stuck.t_off, [5])
    assert (stuck.filtered, stuck.false_negatives) == (2, 1)


def test_filter_without_facts_drops_captions_by_text_identity() -> None:
    # image 0: "a cat", "red"; image 1: "a dog", "red"
    train = SplitData("train", ["a cat", "red", "a dog", "red"], 2, ["0", "1"], source="fixture (split train)")
    assert false_negative_check(train, Round2Config()) is None
    true_of = false_negative_check(train, Round2Config(false_negative_filter=True))
    # caption 3 ("red") is true of image 0 (its caption 1 says "red"), caption 2 ("a dog") is not
    np.testing.assert_array_equal(true_of(np.array([3, 2, 0, 1]), np.array([0, 0, 1, 1])), [True, False, False, True])
    train.facts = SplitFacts(images=[["x"], ["y"]], captions=[["x"], ["y"]])
    assert false_negative_check(train, Round2Config(false_negative_filter=True)) == train.facts.caption_true_of
