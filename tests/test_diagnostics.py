"""Hardness diagnostics (training/mining/diagnostics.py) on hand-built embeddings, exact values."""

from __future__ import annotations

import numpy as np
import pytest

from aoq.config import ConfigError, Round2Config
from aoq_train.mining.diagnostics import hardness_diagnostics, summary_line
from aoq_train.mining.job import diagnostics_settings
from aoq_train.round2.depth import Depths, checked_depths, round2_depths
from aoq_train.round2.sampling import sampling_depths

# One caption per image; img_emb = I, so S = img_emb @ cap_emb.T = cap_emb.T = SCORES.
SCORES = np.array([
    [0.9, 0.8, 0.1, 0.5],
    [0.2, 0.9, 0.7, 0.3],
    [0.6, 0.1, 0.7, 0.4],
    [0.3, 0.5, 0.2, 0.45],
])
# top-2 mined lists of SCORES (own item left out), best first
IMG_TOP_CAPS = np.array([[1, 3], [2, 3], [0, 3], [1, 0]], dtype=np.int32)
CAP_TOP_IMGS = np.array([[2, 3], [0, 3], [1, 3], [0, 2]], dtype=np.int32)
BATCHES = np.array([[0, 2], [1, 3]])


def _diagnose(**r2):
    cfg = Round2Config(batch_size=2, h_t=1, h_i=1, alpha=0.5, beta=1.5, **r2)
    settings = diagnostics_settings(cfg, round2_depths(cfg, 4, 4))
    return hardness_diagnostics(np.eye(4), SCORES.T.copy(), 1, IMG_TOP_CAPS, CAP_TOP_IMGS, settings, BATCHES)


def test_ranks_scores_hinges_and_weights_by_hand():
    d = _diagnose()
    img, cap = d["image_anchors"], d["caption_anchors"]
    # anchors in batch order 0, 2, 1, 3. Image anchors' in-batch hardest caption: i0 -> t2 (.1, rank 3
    # of {.8, .1, .5}), i2 -> t0 (.6, rank 1), i1 -> t3 (.3, rank 2 of {.2, .7, .3}), i3 -> t1 (.5, rank 1)
    assert img["in_batch_rank"]["mean"] == pytest.approx((3 + 1 + 2 + 1) / 4)
    assert img["in_batch_rank"]["max"] == 3 and img["in_batch_rank"]["min"] == 1
    assert img["in_batch_within_depth"] == 0.5  # ranks <= h_t = 1
    # caption anchors: t0 -> i2 (.6, rank 1), t2 -> i0 (.1, rank 3), t1 -> i3 (.5, rank 2), t3 -> i1 (.3, rank 3)
    assert cap["in_batch_rank"]["mean"] == pytest.approx((1 + 3 + 2 + 3) / 4)
    # h_t = h_i = 1: the offline negatives are the top-1 of the lists: rank 1 everywhere
    assert img["offline_rank"]["max"] == 1 and cap["offline_rank"]["max"] == 1
    assert img["offline_score"] == pytest.approx((0.8 + 0.6 + 0.7 + 0.5) / 4)
    # S_on - S_off: images (.1-.8, .6-.6, .3-.7, .5-.5); captions (.6-.6, .1-.7, .5-.8, .3-.5)
    assert img["on_minus_off"] == pytest.approx(-1.1 / 4)
    assert cap["on_minus_off"] == pytest.approx(-1.1 / 4)
    assert img["offline_harder"] == 0.5 and cap["offline_harder"] == 0.75
    # hinges with g1 = .2, g2 = 0 and positives (.9, .7, .9, .45):
    # online i2t active for i2 (.2-.7+.6) and i3 (.2-.45+.5); online t2i for t3 (.2-.45+.3);
    # offline i2t for i3 (.5 > .45); offline t2i for t3 (S(i0, t3) = .5 > .45), not t2 (.7 = .7);
    # pair S(i_off, t_off): t3 -> S(i0, t1) = .8 > .45; pair~ S(image of t_off, caption of i_off):
    # t2 -> S(i0, t1) = .8 > .7.
    assert d["hinges_active"] == {"online_i2t": 0.5, "online_t2i": 0.25, "offline_i2t": 0.25,
                                  "offline_t2i": 0.25, "pair": 0.25, "pair_tilde": 0.25}
    # w = beta - (S_off - S_on) / alpha: images 1.5 - (1.4, 0, .8, 0); captions 1.5 - (0, 1.2, .6, .4)
    w_i, w_t = d["adaptive_weight"]["image"], d["adaptive_weight"]["caption"]
    assert w_i["min"] == pytest.approx(0.1) and w_i["max"] == pytest.approx(1.5)
    assert w_i["mean"] == pytest.approx((0.1 + 1.5 + 0.7 + 1.5) / 4)
    assert w_t["median"] == pytest.approx((0.9 + 1.1) / 2) and w_t["negative"] == 0.0
    assert d["premise_holds"] and d["warnings"] == [] and d["anchors"] == 4
    assert "premise holds" in summary_line(d)


def test_warns_when_offline_negatives_are_easier():
    # the warning names the depth and the remedy
    weak = hardness_diagnostics(np.eye(4), SCORES.T.copy(), 1, IMG_TOP_CAPS[:, ::-1].copy(),
                                CAP_TOP_IMGS[:, ::-1].copy(),
                                diagnostics_settings(Round2Config(batch_size=2, h_t=1, h_i=1), Depths(1, 1)), BATCHES)
    # reversed lists put the 2nd-best negative first: images i0, i2, i1, i3 get t3, t3, t3, t0,
    # S_off = (.5, .4, .3, .3) against S_on = (.1, .6, .3, .5): mean S_on - S_off = 0, not below
    assert weak["image_anchors"]["offline_score"] == pytest.approx((0.5 + 0.4 + 0.3 + 0.3) / 4)
    assert weak["image_anchors"]["on_minus_off"] == pytest.approx(0.0, abs=1e-12)
    assert not weak["premise_holds"]
    assert "not harder" in weak["warnings"][0] and "h_t=1" in weak["warnings"][0]
    assert "WARNING" in summary_line(weak)


def test_relative_depth_scales_with_the_split():
    # COCO: 113,287 images, 566,435 captions, batch 128: h_rel 0.07 -> 310 / 62 (the paper: 300 / 60)
    assert sampling_depths("relative", 0, 0, 0.07, 113_287, 566_435, 128) == (310, 62)
    # the synthetic training split: 4,000 images, 20,000 captions
    assert sampling_depths("relative", 0, 0, 0.07, 4000, 20_000, 128) == (11, 2)
    assert sampling_depths("relative", 0, 0, 0.001, 4000, 20_000, 128) == (1, 1)  # at least 1
    assert sampling_depths("absolute", 300, 60, None, 4000, 20_000, 128) == (300, 60)
    with pytest.raises(ValueError, match="h_rel"):
        sampling_depths("relative", 300, 60, None, 4000, 20_000, 128)


def test_relative_depth_is_checked_against_the_mined_lists():
    lists = np.zeros((40, 10), dtype=np.int32), np.zeros((200, 2), dtype=np.int32)
    ok = Round2Config(depth="relative", h_rel=0.5, batch_size=10, min_depth=1)  # 200 / 10 * .5 = 10, 40 / 10 * .5 = 2
    assert checked_depths(*lists, ok, "mined") == (10, 2)
    deep = Round2Config(depth="relative", h_rel=0.6, batch_size=10)  # 12 > 10
    with pytest.raises(ConfigError, match=r"mined: h_t=12 exceeds the mined top_captions=10.*h_rel=0.6"):
        checked_depths(*lists, deep, "mined")


def test_relative_depth_has_a_floor_and_says_when_it_binds(caplog):
    r2 = Round2Config(depth="relative", h_rel=0.5, batch_size=10)  # h_i = 2 < the default floor 3
    with caplog.at_level("WARNING"):
        assert round2_depths(r2, 40, 200) == (10, 3)
    assert "raised to the floor round2.min_depth=3 (h_t=10, h_i=3)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert round2_depths(r2.model_copy(update={"h_rel": 1.5}), 40, 200) == (30, 6)
    assert caplog.text == ""  # above the floor: nothing to say


def test_relative_depth_needs_h_rel():
    from aoq.config import config_from_dict

    with pytest.raises(ConfigError, match="round2.depth=relative needs round2.h_rel"):
        config_from_dict({"data": {"path": "x"}, "round2": {"depth": "relative"}})
    # relative depths are not compared with mining.top_captions at load time (they need the split)
    cfg = config_from_dict({"data": {"path": "x"}, "mining": {"top_captions": 5},
                            "round2": {"depth": "relative", "h_rel": 0.07}})
    assert cfg.round2.h_rel == 0.07


def test_certain_false_negatives_count_mined_captions_with_the_anchors_own_text():
    from aoq_train.mining.diagnostics import certain_false_negatives

    # 3 images x 2 captions; image 1's caption 3 repeats image 0's "red" and image 2 says "Red "
    captions = ["a cat", "red", "a dog", "red", "a bird", "Red "]
    img_top_caps = np.array([[3, 2, 5], [1, 4, 0], [0, 2, 1]])
    # depth 2: image 0 mined 3 ("red": own text) and 2; image 1 mined 1 ("red": own text) and 4;
    # image 2 mined 0 and 2 (neither says "red") -> 2 of 6 pairs, 2 of 3 images
    assert certain_false_negatives(img_top_caps, captions, 2, depth=2) == {"pairs": 2 / 6, "images": 2 / 3}
    # depth 3 adds image 0's 5 ("Red ": own text after folding) and image 2's 1 ("red": own) -> 4 of 9
    assert certain_false_negatives(img_top_caps, captions, 2, depth=3) == {"pairs": 4 / 9, "images": 1.0}
