"""The fused pass (both directions from one pass over the score matrix, training/mining/fused.py):
identical ids to the brute force in both directions, at tile, chunk and block edges, with k
larger than a chunk, in bf16 mode, through its safety valves, and after an interruption."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.mining_helpers import Stop, exact_embeddings, reference, stop_at
from aoq_train.mining import canonical, fused, kernels, mine_offline_negatives
from aoq_train.mining.bf16 import filter_levels
from aoq_train.mining.keys import LOWEST, PAD, decode_ids, decode_scores, encode_keys
from aoq_train.mining.pools import Pool, sampled_threshold


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 7 rows and small samples, so that tiny cases cross every edge of the pass: the
    sample phase covers only the first rows, the rest goes through row tiles."""
    monkeypatch.setattr(fused, "ROW_TILE", 7)
    monkeypatch.setattr(fused, "COL_HITS", 4)
    monkeypatch.setattr(fused, "ROW_HITS", 4)


def _count_row_tiles(monkeypatch) -> list[tuple[int, int, bool]]:
    calls = []
    original = fused.FusedPass._row_tile

    def counting(self, p0, p1, wanted):
        calls.append((p0, p1, wanted))
        return original(self, p0, p1, wanted)

    monkeypatch.setattr(fused.FusedPass, "_row_tile", counting)
    return calls


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize(("seed", "n_img", "cpi", "dim", "levels", "ht", "hi", "block", "chunk"), [
    (0, 101, 5, 6, 2, 40, 9, 16, 37),     # massive ties; nothing divides anything
    (1, 64, 3, 8, 4, 150, 20, 64, 32),    # k = 150 larger than a chunk (32) and than a row tile (7)
    (2, 90, 1, 5, 2, 60, 60, 13, 1000),   # one chunk wider than the gallery; k_cols = 60 of 89 images
    (3, 77, 2, 16, 1024, 30, 5, 10, 19),  # entries with 10 significant bits: bf16 products are inexact
])
def test_identical_to_brute_force_both_directions(small_tiles, monkeypatch, precision, seed, n_img, cpi, dim,
                                                  levels, ht, hi, block, chunk) -> None:
    rng = np.random.default_rng(seed)
    img, cap = exact_embeddings(rng, n_img, dim, levels), exact_embeddings(rng, n_img * cpi, dim, levels)
    tiles = _count_row_tiles(monkeypatch)
    got = mine_offline_negatives(img, cap, cpi, ht, hi, block_size=block, gallery_chunk=chunk, precision=precision,
                                 progress=False)
    ref = reference(img, cap, cpi, ht, hi)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert tiles and all(wanted for _, _, wanted in tiles)  # the row tiles ran, not only the sample phase


def test_bf16_gives_the_fp32_ids_where_bf16_products_are_inexact(small_tiles) -> None:
    """Entries of 10 significant bits: every float32 product is exact, every bf16 one rounded, so
    the filter must let each member through its margin and the re-scoring must decide."""
    rng = np.random.default_rng(11)
    img, cap = exact_embeddings(rng, 120, 16, 1024), exact_embeddings(rng, 600, 16, 1024)
    assert not np.array_equal(img, img.astype(np.float32).view(np.uint32) & 0xFFFF0000)  # not bf16 values
    fp32 = mine_offline_negatives(img, cap, 5, 80, 12, block_size=32, gallery_chunk=50, progress=False)
    bf16 = mine_offline_negatives(img, cap, 5, 80, 12, block_size=32, gallery_chunk=50, precision="bf16",
                                  progress=False)
    np.testing.assert_array_equal(bf16[0], fp32[0])
    np.testing.assert_array_equal(bf16[1], fp32[1])


def _cancelling_embeddings(rng: np.random.Generator, n_img: int, cpi: int) -> tuple[np.ndarray, np.ndarray]:
    """d = 17: entries +-1/4 and a last coordinate (1 for images, -1/2 for captions) that puts the
    lists' k-th best scores near 0. The images of the pass's first row tile hold bfloat16 values;
    the others have their first 8 entries scaled by c = 1 + 3 * 2**-10, which bf16 rounds away,
    so where the scaled part and the rest cancel, a bf16 product (0) lies ~1e-3 below a float32
    score that is itself ~1e-3: far more than a bf16 step there. Every float32 product is exact."""
    sign = np.array([-0.25, 0.25], np.float32)
    img = np.concatenate([rng.choice(sign, (n_img, 16)), np.ones((n_img, 1), np.float32)], axis=1)
    cap = np.concatenate([rng.choice(sign, (n_img * cpi, 16)), np.full((n_img * cpi, 1), -0.5, np.float32)], axis=1)
    scaled = np.setdiff1d(np.arange(n_img), fused.processing_order(n_img, 0)[: fused.ROW_TILE])
    img[scaled[:, None], np.arange(8)] *= np.float32(1 + 3 * 2**-10)
    return img, cap


def test_bf16_filter_margin_is_a_bound_not_what_a_first_tile_shows(small_tiles, monkeypatch) -> None:
    """Thresholds start at LOWEST (every score passes, the pools are cut many times), so they
    rise to exact k-th bests early. On data whose first tile has exact bf16 products and whose
    other products err by up to ~1e-3 where the scores are ~1e-3 (:func:`_cancelling_embeddings`),
    the proven margin keeps every member; a margin read from the first tile (0 here: the
    previous version took twice its largest error) loses some."""
    monkeypatch.setattr(fused, "sampled_threshold", lambda blocks, k, n, axis=1: np.full(
        blocks[0].shape[1 - axis], LOWEST, dtype=np.float32))
    img, cap = _cancelling_embeddings(np.random.default_rng(0), 200, 5)
    ref = reference(img, cap, 5, 30, 6)
    got = mine_offline_negatives(img, cap, 5, 30, 6, block_size=16, gallery_chunk=37, precision="bf16", progress=False)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    monkeypatch.setattr(fused.bf16_filter, "error_bound", lambda *arrays: 0.0)
    first_tile_margin = mine_offline_negatives(img, cap, 5, 30, 6, block_size=16, gallery_chunk=37,
                                               precision="bf16", progress=False)
    assert not (np.array_equal(first_tile_margin[0], ref[0]) and np.array_equal(first_tile_margin[1], ref[1]))


def test_every_score_is_computed_once(small_tiles, monkeypatch) -> None:
    """Both directions come from one pass: the scores computed are the matrix once, plus the
    sample rows' threshold tiles (the sample phase reads its rows' thresholds first) and the
    first tile the bound's premise is checked on."""
    rng = np.random.default_rng(5)
    img, cap = exact_embeddings(rng, 70, 8, 8), exact_embeddings(rng, 350, 8, 8)
    computed = []
    original = fused.FusedPass._dense

    def counting(self, p0, p1, ci, slot=0, raw=False):
        computed.append((p1 - p0) * (self.bounds[ci + 1] - self.bounds[ci]))
        return original(self, p0, p1, ci, slot, raw)

    monkeypatch.setattr(fused.FusedPass, "_dense", counting)
    mine_offline_negatives(img, cap, 5, 40, 9, block_size=16, gallery_chunk=30, precision="fp32", progress=False)
    miner = fused.FusedPass(img, cap, 5, 40, 9, chunk=30)
    prepass = miner.sample_height * miner.bounds[miner.sample_chunks]
    premise = min(miner.sample_height, fused.ROW_TILE) * miner.bounds[1]
    assert sum(computed) == 70 * 350 + prepass + premise
    assert prepass < 70 * 350 // 4


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_thresholds_guessed_too_high_redo_every_list_exactly(small_tiles, monkeypatch, precision) -> None:
    rng = np.random.default_rng(6)
    img, cap = exact_embeddings(rng, 40, 6, 4), exact_embeddings(rng, 120, 6, 4)
    monkeypatch.setattr(fused, "sampled_threshold", lambda blocks, k, n, axis=1: np.full(
        blocks[0].shape[1 - axis], 1e9, dtype=np.float32))
    redone = []
    original = fused.FusedPass._redo

    def counting(self, which, ids, out):
        redone.append((which, ids.size))
        return original(self, which, ids, out)

    monkeypatch.setattr(fused.FusedPass, "_redo", counting)
    got = mine_offline_negatives(img, cap, 3, 25, 6, block_size=8, gallery_chunk=16, precision=precision,
                                 progress=False)
    ref = reference(img, cap, 3, 25, 6)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert sum(n for which, n in redone if which == 0) == 40 and sum(n for which, n in redone if which == 1) == 120


def test_everything_passing_compacts_the_pools_and_stays_exact(small_tiles, monkeypatch) -> None:
    """No usable sample (every score passes): the pools overflow, are cut to their best k and the
    thresholds raised to the k-th best (the running bound), many times."""
    rng = np.random.default_rng(8)
    img, cap = exact_embeddings(rng, 60, 6, 4), exact_embeddings(rng, 300, 6, 4)
    monkeypatch.setattr(fused, "sampled_threshold", lambda blocks, k, n, axis=1: np.full(
        blocks[0].shape[1 - axis], LOWEST, dtype=np.float32))
    cuts = []
    original = kernels.append

    def counting(*args):
        cuts.append(original(*args))
        return cuts[-1]

    monkeypatch.setattr(kernels, "append", counting)
    got = mine_offline_negatives(img, cap, 5, 20, 7, block_size=16, gallery_chunk=25, progress=False)
    ref = reference(img, cap, 5, 20, 7)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert sum(cuts) >= 10


def test_interrupted_pass_resumes_without_redoing_finished_image_blocks(small_tiles, tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(9)
    img, cap = exact_embeddings(rng, 80, 6, 4), exact_embeddings(rng, 240, 6, 4)

    monkeypatch.setattr(fused, "COL_HITS", 1)  # a short sample phase: most rows go through row tiles
    with pytest.raises(Stop):
        mine_offline_negatives(img, cap, 3, 30, 8, block_size=16, gallery_chunk=20, work_dir=tmp_path,
                               progress=False, on_block=stop_at("img_top_caps", 32))
    assert sorted(p.name for p in (tmp_path / "parts").glob("*.npy")) == [
        f"img_top_caps_{first:010d}.npy" for first in (0, 16, 32)]
    tiles = _count_row_tiles(monkeypatch)
    got = mine_offline_negatives(img, cap, 3, 30, 8, block_size=16, gallery_chunk=20, work_dir=tmp_path,
                                 progress=False)
    ref = reference(img, cap, 3, 30, 8)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    # every row is scored again for the columns, but only rows of the two missing blocks get lists
    assert {(p0, wanted) for p0, _, wanted in tiles if p0 < 48} == {(p0, False) for p0, _, _ in tiles if p0 < 48}
    assert all(wanted for p0, _, wanted in tiles if p0 >= 48)


# --------------------------------------------------------------------------- pools and thresholds


def test_pool_keeps_the_best_k_and_raises_the_threshold_to_the_kth_score() -> None:
    pool = Pool(2, cap=4)
    ids = np.arange(10)
    threshold = np.array([0.0, 0.3], np.float32)
    scores = np.array([0.5, 0.1, 0.9, 0.3, 0.7, -0.0], np.float32)
    assert pool.add(np.array([0, 0, 0, 1, 1, 0]), np.array([1, 2, 3, 4, 5, 6]), ids, scores, 2, threshold) == 0
    np.testing.assert_array_equal(pool.fill, [4, 2])  # 0.3 reaches list 1's 0.3; -0.0 (as +0.0) list 0's 0.0
    assert pool.keys[0, 3] == encode_keys(np.array([0.0], np.float32), np.array([6]))[0]  # keyed as +0.0
    # list 0 is full: cut to 0.9, 0.5 before 0.2 is looked at, which then no longer reaches the new 0.5
    assert pool.add(np.array([0, 0]), np.array([6, 0]), ids, np.array([0.2, 0.5], np.float32), 2, threshold) == 1
    np.testing.assert_array_equal(threshold, np.array([0.5, 0.3], np.float32))
    best, short = pool.best(2)
    np.testing.assert_array_equal(decode_ids(best), [[3, 0], [5, 4]])  # 0.5 twice: the lower id (0) first
    np.testing.assert_array_equal(short, [False, False])
    np.testing.assert_array_equal(pool.rth_best(3), np.array([0.5, -np.inf], np.float32))  # 0.9, 0.5, 0.5
    np.testing.assert_array_equal(pool.rth_best(2), np.array([0.5, 0.3], np.float32))
    best, short = pool.best(5)
    assert best[1, 2] == PAD and short.tolist() == [True, True]
    padded = pool.padded(4)
    assert (padded[0, 3:] == PAD).all() and (padded[1, 2:] == PAD).all()
    again = Pool(2, cap=4)
    again.load(padded, pool.fill)
    np.testing.assert_array_equal(again.best(3)[0], pool.best(3)[0])


@pytest.mark.parametrize("cap,k", [(40, 1), (40, 7), (40, 40), (3000, 1), (3000, 2000)])
def test_pool_selections_keep_each_lists_keys_and_find_its_best(cap: int, k: int) -> None:
    rng = np.random.default_rng(5)
    keys = rng.integers(-6, 6, size=(300, cap)).astype(np.int64)  # many equal keys: the partition's hard case
    keys[:100] = rng.integers(-(2**62), 2**62, size=(100, cap))
    keys[100:110] = 3  # lists of one key repeated
    fill = rng.integers(0, cap + 1, size=300)
    fill[:3] = cap, 0, k  # full, empty, exactly k
    pool = Pool(300, cap=cap, keys=keys.copy())
    pool.fill[:] = fill
    held = [np.sort(row[:n]) for row, n in zip(keys, fill)]  # each list's keys, ascending

    def keeps_its_keys() -> None:
        for row, n, sorted_keys in zip(pool.keys, fill, held):
            np.testing.assert_array_equal(np.sort(row[:n]), sorted_keys)

    rth = pool.rth_best(k)
    keeps_its_keys()
    for value, n, sorted_keys in zip(rth, fill, held):
        assert value == (decode_scores(sorted_keys[n - k : n - k + 1])[0] if n >= k else -np.inf)
    best, short = pool.best(k)
    for row, n, sorted_keys in zip(best, fill, held):
        top = sorted_keys[::-1][:k]
        np.testing.assert_array_equal(row[: len(top)], top)  # decreasing
        assert (row[len(top) :] == PAD).all()
    np.testing.assert_array_equal(short, fill < k)
    keeps_its_keys()  # the best k first, the list's other keys after them


@pytest.mark.parametrize("dtype, value", [(np.float32, -np.inf), (np.uint16, fused.BF16_NEG_INF),
                                          (np.int32, fused.INT32_MIN)])
def test_mask_own_marks_only_the_own_positives_inside_the_tiles_columns(dtype, value) -> None:
    scores = np.ones((3, 10), dtype=dtype)
    own = np.array([[19, 20, 29], [30, 5, 25], [22, 22, 0]])  # a tile of columns [20, 30)
    kernels.mask_own(scores, own, 20, 30, value)
    expected = np.ones((3, 10), dtype=dtype)
    expected[0, [0, 9]] = value
    expected[1, 5] = value
    expected[2, 2] = value
    np.testing.assert_array_equal(scores, expected)


def test_scan_finds_the_scores_reaching_either_level_in_row_major_order() -> None:
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((5, 21)).astype(np.float32)  # a width that is not a multiple of 8
    scores[3, 4] = -np.inf  # an own positive
    tr = rng.standard_normal(5).astype(np.float32) + 1
    tc = rng.standard_normal(21).astype(np.float32) + 1
    tr[3] = LOWEST
    out = np.empty(scores.size, np.int32), np.empty(scores.size, np.int32), np.empty(scores.size, np.float32)
    mask = np.full(64, 1, np.uint8)  # stale flags past the width must not count
    n = kernels.scan(scores, tr, tc, mask, *out)
    r, c = np.nonzero(scores >= np.minimum(tr[:, None], tc[None, :]))
    np.testing.assert_array_equal(out[0][:n], r)
    np.testing.assert_array_equal(out[1][:n], c)
    np.testing.assert_array_equal(out[2][:n], scores[r, c])
    assert (r == 3).sum() == 20  # every finite score of the row whose level is the lowest


def test_bf16_scan_compares_bit_patterns_exactly_as_float32_would() -> None:
    """The bf16 scan reads bit patterns against keys of filter levels; it must agree with the
    float32 compare of the same bfloat16 values with the same levels (as float32), at levels
    between two bfloat16 values (floored), exactly on one, of either sign, ``LOWEST`` (every
    finite score passes, -inf fails) and +inf (nothing passes)."""
    rng = np.random.default_rng(4)
    bits = (rng.standard_normal((6, 70)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bits[2, 5], bits[4, 9], bits[1, 3] = 0xFF80, 0x8000, 0x0000  # -inf (an own positive), -0.0, +0.0
    values = (bits.astype(np.uint32) << 16).view(np.float32)
    tr = rng.standard_normal(6).astype(np.float32) + 1
    tr[0] = values[0, 7]  # exactly a bfloat16 value: that score passes
    tr[1] = np.nextafter(values[1, 8], np.float32(np.inf))  # just above one: floored to it, it passes
    tr[2], tr[3] = LOWEST, np.inf
    tr[4] = -np.abs(tr[4]) - np.float32(1e-3)  # a negative level between two bfloat16 values
    tc = np.full(70, np.inf, dtype=np.float32)
    tc[::3] = rng.standard_normal(24).astype(np.float32)
    out = np.empty(bits.size, np.int32), np.empty(bits.size, np.int32)
    mask = np.full(128, 1, np.uint8)
    for margin in (0.0, 0.01):
        n = kernels.scan_bf16(bits, kernels.bf16_filter_keys(tr, margin), kernels.bf16_filter_keys(tc, margin), mask,
                              *out)
        r, c = np.nonzero(values >= np.minimum(filter_levels(tr, margin)[:, None], filter_levels(tc, margin)[None, :]))
        np.testing.assert_array_equal(out[0][:n], r)
        np.testing.assert_array_equal(out[1][:n], c)
        assert 7 in c[r == 0] and 8 in c[r == 1]  # columns 7 and 8 have no level of their own (+inf)
        assert (r == 2).sum() == 69  # LOWEST: every finite score, not the -inf
        assert (r == 3).sum() == np.isin(c[r == 3], np.arange(0, 70, 3)).sum()  # +inf: only column levels


def test_rescore_gives_canonical_scores_at_the_positions() -> None:
    rng = np.random.default_rng(8)
    q, g = rng.standard_normal((30, 64)).astype(np.float32), rng.standard_normal((50, 64)).astype(np.float32)
    rows, cols = np.array([0, 0, 3, 9], np.int32), np.array([1, 40, 2, 0], np.int32)
    out = np.empty(4, np.float32)
    canonical.rescore(q, g, 10, 5, rows, cols, out)
    np.testing.assert_array_equal(out, canonical.canonical_pairs(q, g, 10 + rows, 5 + cols))
    exact = (q[10 + rows].astype(np.float64) * g[5 + cols]).sum(axis=1)
    np.testing.assert_array_equal(out, exact.astype(np.float32))  # here the float32 rounding of the exact sum


def test_sampled_threshold_of_the_whole_population_lets_k_through() -> None:
    """A sample that is the whole population: at least k scores reach the threshold, always
    (the r-th best group maximum has r >= k groups, hence scores, at or above it)."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((50, 2000)).astype(np.float32)
    for k in (1, 10, 300):
        for blocks in ([scores], [scores[:, :700], scores[:, 700:]]):
            t = sampled_threshold(blocks, k, 2000)
            assert ((scores >= t[:, None]).sum(axis=1) >= k).all()
        # columns (axis=0) give what rows give on the transpose
        np.testing.assert_array_equal(sampled_threshold([scores.T.copy()], k, 2000, axis=0),
                                      sampled_threshold([scores], k, 2000))
    assert (sampled_threshold([scores[:, :5]], 10, 2000) == LOWEST).all()  # too small a sample


def test_an_interruption_drops_the_row_tiles_queued_ahead(small_tiles, monkeypatch) -> None:
    """The next block's tiles are queued while a block's lists are saved; an error there (here
    the interruption) cancels those not started instead of scoring them all first."""
    rng = np.random.default_rng(14)
    img, cap = exact_embeddings(rng, 200, 6, 4), exact_embeddings(rng, 600, 6, 4)
    monkeypatch.setattr(fused, "COL_HITS", 1)
    started = []
    original = fused.FusedPass._row_tile

    def slow(self, p0, p1, wanted):
        started.append(p0)
        time.sleep(0.05)  # long enough that the interruption comes while most tiles still wait
        return original(self, p0, p1, wanted)

    monkeypatch.setattr(fused.FusedPass, "_row_tile", slow)
    with pytest.raises(Stop):
        mine_offline_negatives(img, cap, 3, 30, 8, block_size=56, gallery_chunk=20, precision="fp32",
                               progress=False, on_block=stop_at("img_top_caps", 56))
    queued = [p for p in started if p >= 112]  # the block after the interrupted one: 8 tiles of 7 rows
    assert started and len(queued) < 8


def test_a_worker_done_early_starts_on_the_next_block(small_tiles, monkeypatch) -> None:
    """The next block's tiles are queued while a block is waited for: a worker that finishes its
    last tile of a block starts on the next block while the other still scores that block's last
    (slow) tile, instead of waiting for it; the column thresholds are re-estimated meanwhile (at a
    quarter and half of the rows) from each chunk's own row count, and the lists stay exact."""
    rng = np.random.default_rng(15)
    img, cap = exact_embeddings(rng, 120, 6, 4), exact_embeddings(rng, 360, 6, 4)
    monkeypatch.setattr(fused, "COL_HITS", 1)
    block = 28  # four tiles of 7 rows
    spans = []
    original = fused.FusedPass._row_tile

    def timed(self, p0, p1, wanted):
        start = time.monotonic()
        time.sleep(0.15 if p1 % block == 0 else 0.01)  # each block's last tile is the slow one
        out = original(self, p0, p1, wanted)
        spans.append((p0 // block, start, time.monotonic()))
        return out

    monkeypatch.setattr(fused.FusedPass, "_row_tile", timed)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = mine_offline_negatives(img, cap, 3, 30, 8, block_size=block, gallery_chunk=20, precision="fp32",
                                     progress=False)
    finally:
        torch.set_num_threads(threads)
    ref = reference(img, cap, 3, 30, 8)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    blocks = sorted({b for b, _, _ in spans})
    assert len(blocks) == 5
    for b in blocks[1:-1]:  # each full block's last tile is still running when the next block starts
        assert min(s for c, s, _ in spans if c == b + 1) < max(e for c, _, e in spans if c == b)


def test_interrupted_pass_resumes_from_its_column_snapshot(small_tiles, tmp_path, monkeypatch) -> None:
    """With a snapshot of the column pools after every block, a rerun starts at the last one:
    no sample phase, no row scored twice, and still the brute-force ids."""
    rng = np.random.default_rng(10)
    img, cap = exact_embeddings(rng, 80, 6, 4), exact_embeddings(rng, 240, 6, 4)
    monkeypatch.setattr(fused, "COL_HITS", 1)
    monkeypatch.setattr(fused, "SNAPSHOT_SECONDS", 0.0)

    with pytest.raises(Stop):
        mine_offline_negatives(img, cap, 3, 30, 8, block_size=16, gallery_chunk=20, work_dir=tmp_path,
                               progress=False, on_block=stop_at("img_top_caps", 32))
    assert (tmp_path / "parts" / "columns.npz").is_file()  # saved after the block ending at row 32
    tiles = _count_row_tiles(monkeypatch)
    phases = []
    monkeypatch.setattr(fused.FusedPass, "_sample_phase", lambda *a: phases.append(a))
    got = mine_offline_negatives(img, cap, 3, 30, 8, block_size=16, gallery_chunk=20, work_dir=tmp_path,
                                 progress=False)
    ref = reference(img, cap, 3, 30, 8)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    assert not phases and min(p0 for p0, _, _ in tiles) == 32
    assert {wanted for p0, _, wanted in tiles if p0 < 48} == {False}  # block 32 was saved before the stop
    assert not list((tmp_path / "parts").glob("columns*"))  # dropped once the caption lists are saved
