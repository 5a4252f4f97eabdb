"""The false-negative filters of the mined lists (training/mining/filters.py) on a fixture whose
false negatives are planted by hand: each filter flags exactly its planted candidates, in the
fixed order, and the compacted lists keep the first unflagged candidates."""

from __future__ import annotations

import numpy as np
import pytest

from aoq_train.mining.filters import (
    FilterInputs,
    compact,
    flag_caption_lists,
    flag_image_lists,
    short_rows,
    text_ids,
)

# 4 images x 2 captions: caption c belongs to image c // 2. Image 1 is the twin of image 0 (an
# identical caption text, c2 = c0), c3 paraphrases c0, c4 is a near neighbour the model scores high.
TEXTS = ["a red heart", "love", "A red  heart", "red heart symbol", "a blue heart", "sadness", "flag of japan",
         "japan"]


def _unit(*rows: list[float]) -> np.ndarray:
    m = np.array(rows, dtype=np.float64)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


SENTENCES = _unit([1, 0, 0], [0, 1, 0], [1, 0, 0], [0.95, 0.31, 0], [0.6, 0.8, 0], [0, 0, 1], [0, 0.6, 0.8],
                  [0, 0.6, 0.8])
# the mining model's scores S(image, caption), as embeddings: caption c = the c-th unit vector
SCORES = np.array([
    [0.8, 0.6, 0.9, 0.85, 0.75, 0.2, 0.1, 0.3],
    [0.85, 0.1, 0.9, 0.7, 0.3, 0.05, 0.0, 0.02],
    [0.5, 0.4, 0.2, 0.1, 0.7, 0.6, 0.0, 0.1],
    [0.1, 0.2, 0.05, 0.0, 0.1, 0.3, 0.9, 0.8],
])
INPUTS = FilterInputs(2, text_ids(TEXTS), SENTENCES, SCORES, np.eye(8))
IMAGE_LISTS = np.array([[2, 3, 4, 6], [0, 4, 5, 7], [0, 1, 6, 7], [0, 1, 2, 4]])
CAPTION_LISTS = np.array([[1, 2], [2, 3], [0, 2], [0, 3], [0, 1], [3, 0], [1, 2], [2, 0]])
TAU, RHO = 0.9, 0.95


def test_text_ids_fold_case_and_white_space() -> None:
    assert text_ids(TEXTS).tolist() == [0, 1, 0, 2, 3, 4, 5, 6]


def test_all_filters_flag_the_planted_false_negatives_in_order() -> None:
    images = flag_image_lists(IMAGE_LISTS, INPUTS, ["identity", "semantic", "teacher"], TAU, RHO)
    # image 0: c2 has its own text (identity, 1), c3 paraphrases it (cosine 0.95: semantic, 2), the
    # model scores c4 0.75 > 0.95 x 0.7, the mean of its own captions (teacher, 3); image 1: c0 is its twin's text
    assert images.tolist() == [[1, 2, 3, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    captions = flag_caption_lists(CAPTION_LISTS, INPUTS, ["identity", "semantic", "teacher"], TAU, RHO)
    # c0 and c2: the other twin holds their text; c3: image 0's captions say it (0.95); c4: image 0
    # scores it 0.75 > 0.95 x 0.7, its own image's score
    assert captions.tolist() == [[1, 0], [0, 0], [1, 0], [2, 0], [3, 0], [0, 0], [0, 0], [0, 0]]


@pytest.mark.parametrize("name, code, images, captions", [
    ("identity", 1, [[1, 0, 0, 0], [1, 0, 0, 0]], [[1, 0], [0, 0], [1, 0], [0, 0], [0, 0]]),
    # identical texts are also semantically identical: the twins' texts too
    ("semantic", 2, [[2, 2, 0, 0], [2, 0, 0, 0]], [[2, 0], [0, 0], [2, 0], [2, 0], [0, 0]]),
    # c2 scores 0.9 > 0.95 x 0.9 for image 0: the teacher flags it too
    ("teacher", 3, [[3, 3, 3, 0], [3, 0, 0, 0]], [[3, 0], [0, 0], [3, 0], [3, 0], [3, 0]]),
])
def test_each_filter_alone_flags_exactly_its_planted_candidates(name, code, images, captions) -> None:
    got_images = flag_image_lists(IMAGE_LISTS, INPUTS, [name], TAU, RHO)
    got_captions = flag_caption_lists(CAPTION_LISTS, INPUTS, [name], TAU, RHO)
    assert got_images[:2].tolist() == images and not got_images[2:].any()
    assert got_captions[:5].tolist() == captions and not got_captions[5:].any()
    assert set(np.unique(np.concatenate([got_images.ravel(), got_captions.ravel()]))) <= {0, code}


def test_thresholds_move_what_the_model_based_filters_flag() -> None:
    # tau above 0.95: only identical texts remain semantic duplicates; rho 1.0: only candidates the
    # model scores above the positive itself (c2, c3, c4 above 0.7 for image 0; c0 0.85 > 0.8 for
    # image 1); rho 1.2: above 0.84 and 0.96
    assert flag_image_lists(IMAGE_LISTS, INPUTS, ["semantic"], 0.96, RHO)[:2].tolist() == [[2, 0, 0, 0],
                                                                                          [2, 0, 0, 0]]
    assert flag_image_lists(IMAGE_LISTS, INPUTS, ["teacher"], TAU, 1.0)[:2].tolist() == [[3, 3, 3, 0], [3, 0, 0, 0]]
    assert flag_image_lists(IMAGE_LISTS, INPUTS, ["teacher"], TAU, 1.2)[:2].tolist() == [[3, 3, 0, 0], [0, 0, 0, 0]]


def test_no_filter_flags_nothing_and_unknown_names_are_refused() -> None:
    assert not flag_image_lists(IMAGE_LISTS, INPUTS, [], TAU, RHO).any()
    with pytest.raises(ValueError, match="unknown false-negative filters"):
        flag_image_lists(IMAGE_LISTS, INPUTS, ["duplicates"], TAU, RHO)
    with pytest.raises(ValueError, match="sentence vectors"):
        flag_image_lists(IMAGE_LISTS, FilterInputs(2, text_ids(TEXTS)), ["semantic"], TAU, RHO)


def test_compact_keeps_the_first_unflagged_candidates_in_order() -> None:
    codes = flag_image_lists(IMAGE_LISTS, INPUTS, ["identity", "semantic", "teacher"], TAU, RHO)
    assert compact(IMAGE_LISTS, codes, 1).tolist() == [[6], [4], [0], [0]]
    assert compact(IMAGE_LISTS[1:], codes[1:], 3).tolist() == [[4, 5, 7], [0, 1, 6], [0, 1, 2]]
    assert compact(IMAGE_LISTS, codes, 2) is None and short_rows(codes, 2) == 1  # image 0 keeps one


def test_first_flag_and_removed_by_follow_the_fixed_order() -> None:
    from aoq.mined import removed_by
    from aoq_train.mining.filters import first_flag

    bits = np.array([[0b000, 0b001, 0b110, 0b101]], dtype=np.uint8)  # none; identity; semantic+teacher; identity+teacher
    assert first_flag(bits, ["identity", "semantic", "teacher"]).tolist() == [[0, 1, 2, 1]]
    assert first_flag(bits, ["teacher"]).tolist() == [[0, 0, 3, 3]]
    assert removed_by(bits, ["semantic", "teacher"]) == [None, None, "semantic", "teacher"]
    assert removed_by(bits, []) == [None] * 4


@pytest.mark.slow
def test_aoq_mine_with_filters_keeps_the_depth_and_records_what_each_removed(tmp_path, monkeypatch, capsys) -> None:
    import torch

    from aoq.checkpoint import save_checkpoint
    from aoq.config import config_from_dict
    from aoq.data.load import load_split
    from aoq.data.vocab import Vocabulary
    from aoq.mined import load_mined
    from aoq.models.joint import build_model
    from aoq_cli.main import main as cli_main
    from tests.fixtures import write_precomp_fixture

    monkeypatch.setenv("AOQ_FEATURE_CACHE", str(tmp_path / "cache"))  # the sentence vectors' cache
    data = write_precomp_fixture(tmp_path / "data", {"train": 12, "dev": 3, "test": 3}, regions=2, dim=6)
    captions = (data / "train_caps.txt").read_text().splitlines()
    captions[5] = captions[10] = captions[0]  # images 1 and 2 repeat image 0's first caption
    (data / "train_caps.txt").write_text("\n".join(captions) + "\n")
    cfg = config_from_dict({
        "name": "m", "out_dir": str(tmp_path / "run"), "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"embed_dim": 8, "word_dim": 8}, "mining": {"top_captions": 20, "top_images": 5},
        "round2": {"h_t": 10, "h_i": 2},
    })
    split = load_split(cfg.data, "train")
    vocab = Vocabulary.build(split.captions, 1)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ckpt", build_model(cfg.model, len(vocab), 6), cfg, vocab, {"rsum": 0.0})
    mine = ["mine", "--checkpoint", str(tmp_path / "ckpt"), "--no-progress"]

    assert cli_main([*mine, "--set", "mining.filters=[identity]"]) == 0
    mined = load_mined(tmp_path / "run" / "mined")
    assert mined.filters == ["identity"] and mined.img_top_caps.shape == (12, 20) and mined.cap_top_imgs.shape == (60, 5)
    ids = text_ids(captions)
    own = [set(ids[i * 5:(i + 1) * 5].tolist()) for i in range(12)]
    raw, flags = np.asarray(mined.filtered["img_raw"]), np.asarray(mined.filtered["img_flags"])
    assert raw.shape == (12, 40)  # mined twice as deep, then filtered
    # the identity bit is exactly "the mined caption has one of the image's own texts"
    assert ((flags & 1).astype(bool) == np.array([[ids[c] in own[i] for c in row] for i, row in enumerate(raw)])).all()
    for i in range(12):
        assert mined.img_top_caps[i].tolist() == [c for c, f in zip(raw[i], flags[i]) if not f & 1][:20]
    assert (flags & 1).sum() >= 2  # images 0, 1 and 2 each had a planted duplicate to remove
    assert not {1, 2} & set(mined.cap_top_imgs[0].tolist())  # caption 0's text is also theirs
    stats = mined.diagnostics["filters"]
    assert stats["filters"] == ["identity"] and stats["image_lists"]["enabled"]["lists"] > 0
    assert "before_filters" in mined.diagnostics
    # a changed filter is another artefact: mined again, here without filters
    assert cli_main(mine) == 0 and "mined in" in capsys.readouterr().out
    plain = load_mined(tmp_path / "run" / "mined")
    assert plain.filters == [] and plain.filtered is None
    np.testing.assert_array_equal(plain.img_top_caps, raw[:, :20])  # the unfiltered top of the same ranking


def test_detector_scores_by_hand() -> None:
    from pathlib import Path

    from aoq.mined import MinedNegatives
    from aoq_train.report.false_negatives import Truth, detector_scores

    # 2 images x 2 captions; caption 2 is true of image 0 and caption 0 of image 1, nothing else
    filtered = {"img_raw": np.array([[2, 3], [0, 1]]), "img_flags": np.array([[0b001, 0b100], [0b011, 0b000]]),
                "cap_raw": np.array([[1], [1], [0], [0]]), "cap_flags": np.array([[0b001], [0], [0b100], [0]])}
    mined = MinedNegatives(np.zeros((2, 2), np.int32), np.zeros((4, 1), np.int32),
                           {"filters": ["identity", "teacher"]}, Path("m"), filtered)
    truth = Truth("hand", lambda c, i: np.isin(np.asarray(c) * 10 + np.asarray(i), [20, 1]))
    got = detector_scores(mined, truth, 2, 1)
    # candidates in order: images (0: c2 T, c3 F; 1: c0 T, c1 F), captions (c0-i1 T, c1-i1 F, c2-i0 T, c3-i0 F)
    assert got["true"] == 0.5
    assert got["identity"] == {"flagged": 3 / 8, "precision": 1.0, "recall": 0.75}
    assert got["semantic"] == {"flagged": 1 / 8, "precision": 1.0, "recall": 0.25}
    assert got["teacher"] == {"flagged": 2 / 8, "precision": 0.5, "recall": 0.25}
    # the enabled ones together: identity or teacher
    assert got["enabled"] == {"flagged": 5 / 8, "precision": 0.8, "recall": 1.0}
