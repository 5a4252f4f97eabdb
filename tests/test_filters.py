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
    near_duplicate_keys,
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
TAU, RHO = 0.9, 0.95


def inputs(tau: float = TAU, rho: float = RHO) -> FilterInputs:
    """The fixture's filter inputs; the near-duplicate pairs from one vector per distinct text."""
    ids = text_ids(TEXTS)
    first = np.unique(ids, return_index=True)[1]
    return FilterInputs(2, ids, near_duplicate_keys(SENTENCES[first], tau), SCORES, np.eye(8), rho)


INPUTS = inputs()
IMAGE_LISTS = np.array([[2, 3, 4, 6], [0, 4, 5, 7], [0, 1, 6, 7], [0, 1, 2, 4]])
CAPTION_LISTS = np.array([[1, 2], [2, 3], [0, 2], [0, 3], [0, 1], [3, 0], [1, 2], [2, 0]])


def test_text_ids_fold_case_and_white_space() -> None:
    assert text_ids(TEXTS).tolist() == [0, 1, 0, 2, 3, 4, 5, 6]


def test_all_filters_flag_the_planted_false_negatives_in_order() -> None:
    images = flag_image_lists(IMAGE_LISTS, INPUTS, ["identity", "semantic", "teacher"])
    # image 0: c2 has its own text (identity, 1), c3 paraphrases it (cosine 0.95: semantic, 2), the
    # model scores c4 0.75 > 0.95 x 0.7, the mean of its own captions (teacher, 3); image 1: c0 is its twin's text
    assert images.tolist() == [[1, 2, 3, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    captions = flag_caption_lists(CAPTION_LISTS, INPUTS, ["identity", "semantic", "teacher"])
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
    got_images = flag_image_lists(IMAGE_LISTS, INPUTS, [name])
    got_captions = flag_caption_lists(CAPTION_LISTS, INPUTS, [name])
    assert got_images[:2].tolist() == images and not got_images[2:].any()
    assert got_captions[:5].tolist() == captions and not got_captions[5:].any()
    assert set(np.unique(np.concatenate([got_images.ravel(), got_captions.ravel()]))) <= {0, code}


def test_the_semantic_bitmap_and_the_binary_search_flag_the_same(monkeypatch) -> None:
    """Small sets look (image, text) keys up in a bitmap, large ones by binary search: same flags."""
    from aoq_train.mining import filters

    rng = np.random.default_rng(5)
    texts = [f"t{rng.integers(0, 40)}" for _ in range(3 * 50)]
    ids = text_ids(texts)
    sentences = rng.normal(size=(int(ids.max()) + 1, 3))
    sentences /= np.linalg.norm(sentences, axis=1, keepdims=True)
    keys = near_duplicate_keys(sentences, 0.8)
    lists, caption_lists = rng.integers(0, 150, size=(50, 30)), rng.integers(0, 50, size=(150, 10))
    got = {}
    for limit in (filters.NEAR_BITMAP_BITS, 0):
        monkeypatch.setattr(filters, "NEAR_BITMAP_BITS", limit)
        data = FilterInputs(3, ids, keys)
        got[limit] = (flag_image_lists(lists, data, ["semantic"]), flag_caption_lists(caption_lists, data, ["semantic"]))
        assert (data.image_near_bitmap is None) == (limit == 0)
    (a, b), (c, d) = got.values()
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(b, d)
    assert 0 < (a > 0).mean() < 1 and 0 < (b > 0).mean() < 1


def test_thresholds_move_what_the_model_based_filters_flag() -> None:
    # tau above 0.95: only identical texts remain semantic duplicates; rho 1.0: only candidates the
    # model scores above the positive itself (c2, c3, c4 above 0.7 for image 0; c0 0.85 > 0.8 for
    # image 1); rho 1.2: above 0.84 and 0.96
    assert flag_image_lists(IMAGE_LISTS, inputs(tau=0.96), ["semantic"])[:2].tolist() == [[2, 0, 0, 0], [2, 0, 0, 0]]
    assert flag_image_lists(IMAGE_LISTS, inputs(rho=1.0), ["teacher"])[:2].tolist() == [[3, 3, 3, 0], [3, 0, 0, 0]]
    assert flag_image_lists(IMAGE_LISTS, inputs(rho=1.2), ["teacher"])[:2].tolist() == [[3, 3, 0, 0], [0, 0, 0, 0]]


def test_near_duplicate_keys_keep_pairs_at_or_above_tau() -> None:
    ids = text_ids(TEXTS)
    first = np.unique(ids, return_index=True)[1]  # 7 distinct texts: "a red heart" once
    keys = near_duplicate_keys(SENTENCES[first], 0.9)
    # text 0 ("a red heart") and text 2 ("red heart symbol"): cosine 0.95; texts 5 and 6 (japan): 1.0
    assert keys.tolist() == [0 * 7 + 2, 5 * 7 + 6]
    assert near_duplicate_keys(SENTENCES[first], 1.0).tolist() == [5 * 7 + 6]


def test_no_filter_flags_nothing_and_unknown_names_are_refused() -> None:
    assert not flag_image_lists(IMAGE_LISTS, INPUTS, []).any()
    with pytest.raises(ValueError, match="unknown false-negative filters"):
        flag_image_lists(IMAGE_LISTS, INPUTS, ["duplicates"])
    with pytest.raises(ValueError, match="near-duplicate text pairs"):
        flag_image_lists(IMAGE_LISTS, FilterInputs(2, text_ids(TEXTS)), ["semantic"])


def test_compact_keeps_the_first_unflagged_candidates_in_order() -> None:
    codes = flag_image_lists(IMAGE_LISTS, INPUTS, ["identity", "semantic", "teacher"])
    assert compact(IMAGE_LISTS, codes, 1).tolist() == [[6], [4], [0], [0]]
    assert compact(IMAGE_LISTS[1:], codes[1:], 3).tolist() == [[4, 5, 7], [0, 1, 6], [0, 1, 2]]
    assert compact(IMAGE_LISTS, codes, 2) is None  # image 0 keeps one


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
    from aoq_train.mining import false_negatives
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
    # flagged over the first slice only: no list lost more than its margin to the one repeated text
    assert raw.shape == (12, int(np.ceil(false_negatives.SLICE_FACTOR * 20)))
    # the identity bit is exactly "the mined caption has one of the image's own texts"
    assert ((flags & 1).astype(bool) == np.array([[ids[c] in own[i] for c in row] for i, row in enumerate(raw)])).all()
    for i in range(12):
        assert mined.img_top_caps[i].tolist() == [c for c, f in zip(raw[i], flags[i]) if not f & 1][:20]
    assert (flags & 1).sum() >= 2  # images 0, 1 and 2 each had a planted duplicate to remove
    assert not {1, 2} & set(mined.cap_top_imgs[0].tolist())  # caption 0's text is also theirs
    stats = mined.diagnostics["filters"]
    assert stats["filters"] == ["identity"] and stats["image_lists"]["enabled"]["lists"] > 0
    # a changed filter is another artefact: mined again, here without filters
    assert cli_main(mine) == 0 and "mined in" in capsys.readouterr().out
    plain = load_mined(tmp_path / "run" / "mined")
    assert plain.filters == [] and plain.filtered is None
    np.testing.assert_array_equal(plain.img_top_caps, raw[:, :20])  # the unfiltered top of the same ranking


def test_detector_scores_by_hand() -> None:
    from aoq_train.mining.truth import Truth, detector_scores

    # 2 images x 2 captions; caption 2 is a false negative of image 0 (the evaluation's rule), and
    # caption 0 a near neighbour of image 1 (true by the broader rule only), nothing else
    filtered = {"img_raw": np.array([[2, 3], [0, 1]]), "img_flags": np.array([[0b001, 0b100], [0b011, 0b000]]),
                "cap_raw": np.array([[1], [1], [0], [0]]), "cap_flags": np.array([[0b001], [0], [0b100], [0]])}
    positive = lambda c, i: np.isin(np.asarray(c) * 10 + np.asarray(i), [20])  # noqa: E731
    broad = lambda c, i: np.isin(np.asarray(c) * 10 + np.asarray(i), [20, 1])  # noqa: E731
    got = detector_scores(filtered, ["identity", "teacher"], Truth("hand", positive, "broad", broad), 2, 1)
    # candidates in order: images (0: c2 FN, c3 -; 1: c0 near, c1 -), captions (c0-i1 near, c1-i1 -, c2-i0 FN, c3-i0 -)
    assert got["false_negatives"] == 0.25 and got["near_neighbours"] == 0.25
    # identity flags c2-i0 (image side), c0-i1 (image side), c0-i1 (caption side)
    assert got["identity"] == {"flagged": 3 / 8, "false_negatives": {"precision": 1 / 3, "recall": 0.5},
                               "near_neighbours": {"precision": 2 / 3, "recall": 1.0}}
    assert "semantic" not in got  # not one of the lists' filters: its bits are not read
    assert got["teacher"] == {"flagged": 2 / 8, "false_negatives": {"precision": 0.5, "recall": 0.5},
                              "near_neighbours": {"precision": 0.0, "recall": 0.0}}
    assert got["enabled"]["false_negatives"] == {"precision": 0.4, "recall": 1.0}
    # no broader ground truth: near neighbours unknown, not zero
    alone = detector_scores(filtered, ["identity"], Truth("hand", positive), 2, 1)
    assert alone["near_neighbours"] is None and alone["identity"]["near_neighbours"] is None


def test_positives_hold_the_evaluations_rule() -> None:
    """False negatives are counted with the evaluation's own positives: identical text under the
    text rule (a twin's copy), nothing but the own captions under the pair rule."""
    from aoq.metrics import positives_of

    texts = ["a cat", "A  cat ", "dog", "bird"]  # 2 images x 2 captions; captions 0 and 1 are one text
    text = positives_of(2, 2, texts)
    caps, imgs = np.array([0, 1, 2, 3, 2, 0]), np.array([0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(text.holds(caps, imgs), [True, True, False, False, True, False])
    pair = positives_of(2, 2, None)
    np.testing.assert_array_equal(pair.holds(caps, imgs), [True, True, False, False, True, False])
    texts2 = ["a cat", "x", "a cat", "y"]  # image 1's caption 2 repeats image 0's caption 0
    np.testing.assert_array_equal(positives_of(2, 2, texts2).holds(np.array([2, 0, 3]), np.array([0, 1, 0])),
                                  [True, True, False])
    np.testing.assert_array_equal(positives_of(2, 2, None).holds(np.array([2, 0]), np.array([0, 1])), [False, False])


@pytest.mark.parametrize("text", [False, True], ids=["with-teacher", "text-only"])
@pytest.mark.parametrize("depth_factor", [1, 2, 16])
@pytest.mark.parametrize("values", ["whole", "real", "near"])
def test_filtered_lists_equal_the_brute_force_whatever_the_mined_depth(monkeypatch, depth_factor, values,
                                                                       text) -> None:
    """The lists equal filtering every anchor's whole ranking in the miner's order (canonical
    score, ties by id), whether a row finds its candidates in the deep list or has to be ranked
    over the whole gallery: with whole-number embeddings (exact products, many ties) and with
    real-valued ones, and with captions a few ulps apart (where a float32 product and the canonical
    score order two captions differently). Text filters only (``text``) take the compiled path
    (aoq_train.mining.text_flags), any other set numpy's."""
    from aoq_train.mining import false_negatives
    from aoq_train.mining.canonical import canonical_pairs
    from aoq_train.mining.filters import first_flag, flag_rows

    monkeypatch.setattr(false_negatives, "DEPTH_FACTOR", depth_factor)
    rng = np.random.default_rng(3)
    n_images, cpi, top_c, top_i = 30, 3, 4, 3
    dim = 64 if values == "near" else 5  # long sums: float32 rounding differs from the canonical score's
    img = (2 * rng.normal(size=(n_images, dim))).astype(np.float32)
    cap = (np.repeat(img, cpi, axis=0) + 2 * rng.normal(size=(n_images * cpi, dim))).astype(np.float32)
    if values == "whole":  # exact ties
        img, cap = img.round(), cap.round()
    if values == "near":  # captions a few ulps apart: float32 products and canonical scores order them apart
        cap = np.repeat(cap[:6], len(cap) // 6, axis=0)
        cap = np.nextafter(cap, np.where(rng.random(cap.shape) < 0.5, np.inf, -np.inf)).astype(np.float32)
    texts = [f"t{rng.integers(0, 25)}" for _ in range(n_images * cpi)]  # many repeated texts
    filters = ["identity"] if values == "near" else ["identity", "teacher"]  # near: the teacher flags all
    if text:
        filters = ["identity", "semantic"]
    ids = text_ids(texts)
    sentences = rng.normal(size=(int(ids.max()) + 1, 4))
    sentences /= np.linalg.norm(sentences, axis=1, keepdims=True)
    data = FilterInputs(cpi, ids, near_duplicate_keys(sentences, 0.8), img, cap, 0.8)

    def ranking(queries: np.ndarray, gallery: np.ndarray, row: int, own: np.ndarray) -> np.ndarray:
        scores = canonical_pairs(queries, gallery, np.full(len(gallery), row), np.arange(len(gallery)))
        order = np.lexsort((np.arange(len(scores)), -scores))
        return order[~np.isin(order, own)]

    def mine(top_captions: int, top_images: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([ranking(img, cap, i, np.arange(i * cpi, (i + 1) * cpi))[:top_captions]
                          for i in range(n_images)]),
                np.array([ranking(cap, img, c, [c // cpi])[:top_images] for c in range(len(cap))]))

    got_img, got_cap, raw = false_negatives.filtered_lists(mine, top_c, top_i, n_images, cpi, data, filters)
    full_img, full_cap = mine(cpi * (n_images - 1), n_images - 1)
    for got, full, image_anchors, top in ((got_img, full_img, True, top_c), (got_cap, full_cap, False, top_i)):
        codes = first_flag(flag_rows(full, np.arange(len(full)), data, filters, image_anchors), filters)
        want = np.array([row[code == 0][:top] for row, code in zip(full, codes)])
        np.testing.assert_array_equal(got, want)
    # the raw lists are the ranking's head, with the enabled filters' bits over the first depth candidates
    np.testing.assert_array_equal(raw["img_raw"], full_img[:, :raw["img_raw"].shape[1]])
    bits = flag_rows(full_img[:, :top_c], np.arange(n_images), data, filters, True)
    np.testing.assert_array_equal(raw["img_flags"][:, :top_c], bits)


def _random_filter_inputs(seed: int, n_images: int, cpi: int, n_texts: int, tau: float) -> FilterInputs:
    """Random captions drawn from ``n_texts`` texts (many repeated), random sentence vectors and
    embeddings: the filters flag a good share of every deep list, and some rows run out of it."""
    rng = np.random.default_rng(seed)
    ids = text_ids([f"t{rng.integers(0, n_texts)}" for _ in range(n_images * cpi)])
    sentences = rng.normal(size=(int(ids.max()) + 1, 4))
    sentences /= np.linalg.norm(sentences, axis=1, keepdims=True)
    img = rng.normal(size=(n_images, 8)).astype(np.float32)
    cap = (np.repeat(img, cpi, axis=0) + rng.normal(size=(n_images * cpi, 8))).astype(np.float32)
    return FilterInputs(cpi, ids, near_duplicate_keys(sentences, tau), img, cap)


def _exact_miner(data: FilterInputs):
    """``mine(top_captions, top_images)``: every anchor's exact ranking (canonical score, then id)."""
    from aoq_train.mining.canonical import canonical_pairs

    img, cap, cpi = data.img_emb, data.cap_emb, data.captions_per_image

    def ranking(queries: np.ndarray, gallery: np.ndarray, row: int, own: np.ndarray, k: int) -> np.ndarray:
        scores = canonical_pairs(queries, gallery, np.full(len(gallery), row), np.arange(len(gallery)))
        order = np.lexsort((np.arange(len(scores)), -scores))
        return order[~np.isin(order, own)][:k]

    def mine(top_captions: int, top_images: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([ranking(img, cap, i, np.arange(i * cpi, (i + 1) * cpi), top_captions)
                          for i in range(len(img))]),
                np.array([ranking(cap, img, c, [c // cpi], top_images) for c in range(len(cap))]))

    return mine


@pytest.mark.parametrize("bitmap", [True, False], ids=["bitmap", "binary-search"])
@pytest.mark.parametrize("filters", [["identity"], ["semantic"], ["identity", "semantic"]])
def test_the_compiled_text_path_gives_numpys_lists_flags_and_depths(monkeypatch, filters, bitmap) -> None:
    """Text filters only are flagged by compiled kernels and ranked over the whole gallery with
    the flagged items set aside first; forcing numpy's path (the teacher's) gives the same
    artefact, byte for byte: lists, raw lists, every flag (unchecked ones included) and the
    depth flagged, with the semantic filter's bitmaps and with its binary search."""
    from aoq_train.mining import false_negatives, filters as filters_module

    if not bitmap:
        monkeypatch.setattr(filters_module, "NEAR_BITMAP_BITS", 0)
    monkeypatch.setattr(false_negatives, "DEPTH_FACTOR", 2)
    n_images, cpi = 60, 3
    got = {}
    for compiled in (True, False):
        data = _random_filter_inputs(7, n_images, cpi, 10, 0.7)  # every filter runs rows out
        assert (data.image_near_bitmap is not None) == bitmap
        monkeypatch.setattr(false_negatives, "text_only", lambda names, on=compiled: on)
        got[compiled] = false_negatives.filtered_lists(_exact_miner(data), 6, 4, n_images, cpi, data, filters)
    (img_a, cap_a, raw_a), (img_b, cap_b, raw_b) = got[True], got[False]
    np.testing.assert_array_equal(img_a, img_b)
    np.testing.assert_array_equal(cap_a, cap_b)
    assert img_a.dtype == img_b.dtype == cap_a.dtype == np.int32
    assert raw_a.keys() == raw_b.keys()
    for key in raw_a:
        assert raw_a[key].shape == raw_b[key].shape and raw_a[key].dtype == raw_b[key].dtype, key
        np.testing.assert_array_equal(raw_a[key], raw_b[key])
    assert (raw_a["cap_flags"] == 0x80).any()  # some rows stopped early: unchecked flags compared too


@pytest.mark.parametrize("depth_factor", [1, 8], ids=["ranked-beyond-the-deep-lists", "deep-lists-whole"])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_gallery_too_small_for_the_filters_is_refused_naming_the_anchor(monkeypatch, compiled,
                                                                          depth_factor) -> None:
    """Both paths refuse lists the whole gallery cannot fill, naming the first anchor short,
    whether the rest of the gallery was ranked or the deep lists already held all of it."""
    from aoq_train.mining import false_negatives

    monkeypatch.setattr(false_negatives, "text_only", lambda names: compiled)
    monkeypatch.setattr(false_negatives, "DEPTH_FACTOR", depth_factor)
    cpi, n_images = 2, 6
    texts = ["same"] * 8 + [f"t{i}" for i in range(4)]  # captions 0-7 (images 0-3) share one text
    ids = text_ids(texts)
    rng = np.random.default_rng(0)
    img = rng.normal(size=(n_images, 4)).astype(np.float32)
    cap = rng.normal(size=(n_images * cpi, 4)).astype(np.float32)
    data = FilterInputs(cpi, ids, near_duplicate_keys(np.eye(int(ids.max()) + 1), 0.9), img, cap)
    # caption 0's own image is 0; images 1-3 hold its text: only images 4 and 5 remain, 3 wanted
    with pytest.raises(ValueError, match="the caption list of anchor 0 fewer than 3 candidates"):
        false_negatives.filtered_lists(_exact_miner(data), 2, 3, n_images, cpi, data, ["identity"])
