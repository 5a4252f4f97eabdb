"""The int8 filter's guarantee (training/mining/int8.py): the error bound holds, the scan compares
exactly, and the lists are the float32 mode's, byte for byte, on near-ties that int8 products
cannot tell apart, while a margin below the bound loses members."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aoq_train.mining import canonical, fused, int8, kernels, mine_offline_negatives
from aoq_train.mining.keys import LOWEST


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_quantize_rounds_each_row_to_its_scale() -> None:
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]])
    xi, scales = int8.quantize(x)
    assert scales.tolist() == [pytest.approx(1 / 127), 1.0]
    assert xi.tolist() == [[64, -127, 32], [0, 0, 0]]  # 63.5 rounds to even: 64


def test_error_bounds_hold_for_every_pair_and_are_not_loose_by_orders() -> None:
    rng = np.random.default_rng(0)
    q, g = _unit(rng, 300, 256), _unit(rng, 500, 256)
    q[:5] = 0.0  # zero rows (scale 1, no error) beside ones with a large coordinate (a coarse grid)
    q[5:10, 0] = 50.0
    q[5:10] /= np.linalg.norm(q[5:10], axis=1, keepdims=True)
    q, g = torch.from_numpy(q), torch.from_numpy(g)
    (qi, qs), (gi, gs) = int8.quantize(q), int8.quantize(g)
    bounds = int8.error_bounds(q, g, qi, qs, gi, gs)
    v = (int8.products(qi, gi).double() * qs.double()[:, None]) * gs.double()[None, :]  # the scan's float64 value
    rows, cols = np.indices((300, 500)).reshape(2, -1)
    canonical_scores = torch.from_numpy(canonical.canonical_pairs(q.numpy(), g.numpy(), rows, cols).reshape(300, 500))
    errors = (v - canonical_scores.double()).abs()
    copies = torch.from_numpy(int8.as_float32(int8.products(qi, gi).numpy(), qs.double().numpy(), gs.double().numpy(),
                                              np.empty((300, 500), np.float32)))
    assert (copies.double() - canonical_scores.double()).abs().max() <= bounds.margin
    per_pair = torch.from_numpy(bounds.rows[:, None].astype(np.float64) + bounds.columns[None, :])
    assert (errors <= per_pair).all()
    assert bounds.rows.dtype == bounds.columns.dtype == np.float32
    assert (per_pair <= bounds.margin * (1 + 1e-4)).all()  # the float32 scan's roundings add ~1e-7
    assert per_pair.mean() < 0.75 * bounds.margin  # the rows' error norms differ: the point of the per-pair form
    assert errors.max() > bounds.margin / 20  # the same order: the filter's width is what int8 rounding costs
    # the float32 scan with these terms: a pair whose canonical score reaches its row's level passes it
    p, scales = int8.products(qi, gi).numpy(), (qs.numpy(), gs.numpy())
    mask, found, cols = np.empty(512 + 64, np.uint8), np.empty(p.size, np.int32), np.empty(p.size, np.int32)
    never = np.full(500, np.inf, np.float32)
    for c in range(0, 500, 7):
        level = canonical_scores[:, c].numpy().copy()
        n = kernels.scan_int8(p, *scales, level, never, bounds.rows, bounds.columns, mask, found, cols)
        hits = found[:n][cols[:n] == c]
        np.testing.assert_array_equal(hits, np.arange(300))
    zero_rows, zero_columns = np.zeros(300, np.float32), np.zeros(500, np.float32)  # no bound: members are lost
    n = kernels.scan_int8(p, *scales, canonical_scores[:, 0].numpy().copy(), never, zero_rows, zero_columns, mask,
                          found, cols)
    assert (cols[:n] == 0).sum() < 290


def test_float32_copy_of_a_tile_is_the_float64_value_rounded_once() -> None:
    rng = np.random.default_rng(3)
    p = rng.integers(-(2**31) + 1, 2**31 - 1, size=(37, 53), dtype=np.int32)
    p[0] = np.iinfo(np.int32).min  # an own positive's product
    q_scales = rng.random(37) * 10.0 ** rng.integers(-30, 5, 37)  # down to float32's subnormals and beyond
    g_scales = rng.random(53) * 10.0 ** rng.integers(-30, 5, 53)
    expected = ((p.astype(np.float64) * q_scales[:, None]) * g_scales[None, :]).astype(np.float32)
    out = np.empty(p.shape, np.float32)
    assert int8.as_float32(p, q_scales, g_scales, out) is out
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_error_bounds_refuse_dimensions_whose_products_may_overflow() -> None:
    x = torch.zeros(1, 140_000)  # 127^2 d >= 2^31
    xi, s = int8.quantize(x)
    with pytest.raises(ValueError, match="overflow"):
        int8.error_bounds(x, x, xi, s, xi, s)


def test_int8_scan_compares_in_float32_with_each_pairs_bound_and_never_passes_an_own_positive() -> None:
    rng = np.random.default_rng(3)
    p = rng.integers(-2000, 2000, (5, 70)).astype(np.int32)
    p[2, 7] = np.iinfo(np.int32).min
    qs, gs = rng.uniform(1e-3, 2e-3, 5).astype(np.float32), rng.uniform(1e-3, 2e-3, 70).astype(np.float32)
    a, b = rng.uniform(0, 1e-3, 5).astype(np.float32), rng.uniform(0, 1e-3, 70).astype(np.float32)
    values = (p.astype(np.float32) * qs[:, None]) * gs[None, :] + (a[:, None] + b[None, :])  # float32 throughout
    tr = np.array([0.0, LOWEST, np.inf, 1e-3, -1e-3], np.float32)
    tc = np.where(rng.random(70) < 0.5, np.inf, 2e-3).astype(np.float32)
    mask, rows, cols = np.empty(128 + 64, np.uint8), np.empty(p.size, np.int32), np.empty(p.size, np.int32)
    n = kernels.scan_int8(p, qs, gs, tr, tc, a, b, mask, rows, cols)
    want = values >= np.minimum(tr[:, None], tc[None, :])
    want[2, 7] = False
    r, c = np.nonzero(want)
    np.testing.assert_array_equal(rows[:n], r)
    np.testing.assert_array_equal(cols[:n], c)
    assert n and not ((rows[:n] == 2) & (cols[:n] == 7)).any()


def _near_ties(rng: np.random.Generator, n_img: int, cpi: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Images: near-copies of one unit vector ``u`` (noise ~1e-5); captions: ``c u + sqrt(1 -
    c^2) r`` with ``r`` orthogonal to ``u`` and ``c`` one of 4 levels. Each level holds ~120
    captions whose canonical scores differ by ~1e-5, far less than an int8 product's error
    (~1e-3): the k-th places fall among near-ties that only the canonical re-score can order."""
    u = _unit(rng, 1, d)[0]
    img = (u + rng.standard_normal((n_img, d)).astype(np.float32) * 1e-5).astype(np.float32)
    r = rng.standard_normal((n_img * cpi, d))
    r -= (r @ u)[:, None] * u
    r /= np.linalg.norm(r, axis=1, keepdims=True)
    c = rng.choice([0.1, 0.2, 0.3, 0.4], n_img * cpi)[:, None]
    return img, (c * u + np.sqrt(1 - c**2) * r).astype(np.float32)


def reference(img: np.ndarray, cap: np.ndarray, cpi: int, ht: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute force of canonical scores (the miner's rule: higher score, then lower id), own
    positives excluded."""
    rows, cols = np.indices((len(img), len(cap))).reshape(2, -1)
    s = canonical.canonical_pairs(img, cap, rows, cols).reshape(len(img), len(cap))
    st = s.T.copy()
    s[np.arange(len(img))[:, None], np.arange(len(img))[:, None] * cpi + np.arange(cpi)] = -np.inf
    st[np.arange(len(cap)), np.arange(len(cap)) // cpi] = -np.inf
    return (np.argsort(-s, axis=1, kind="stable")[:, :ht].astype(np.int32),
            np.argsort(-st, axis=1, kind="stable")[:, :hi].astype(np.int32))


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(fused, "ROW_TILE", 7)
    monkeypatch.setattr(fused, "COL_HITS", 4)
    monkeypatch.setattr(fused, "ROW_HITS", 4)


def test_int8_lists_equal_the_fp32_reference_on_near_ties(small_tiles) -> None:
    img, cap = _near_ties(np.random.default_rng(7), 96, 5, 32)
    ref = reference(img, cap, 5, 30, 7)
    fp32 = mine_offline_negatives(img, cap, 5, 30, 7, block_size=16, gallery_chunk=41, precision="fp32", progress=False)
    got = mine_offline_negatives(img, cap, 5, 30, 7, block_size=16, gallery_chunk=41, precision="int8", progress=False)
    for a, b, c in zip(got, fp32, ref):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a, b)


def test_a_margin_below_the_bound_loses_members(small_tiles, monkeypatch) -> None:
    """The same near-ties with thresholds that start at LOWEST (they rise to exact k-th bests
    early, as the pools are cut) and a margin of 0: members whose int8 value lies below a level
    their canonical score reaches are filtered out, so the lists differ: the bound is needed."""
    monkeypatch.setattr(fused, "sampled_threshold", lambda blocks, k, n, axis=1: np.full(
        blocks[0].shape[1 - axis], LOWEST, dtype=np.float32))
    img, cap = _near_ties(np.random.default_rng(7), 96, 5, 32)
    ref = reference(img, cap, 5, 30, 7)
    got = mine_offline_negatives(img, cap, 5, 30, 7, block_size=16, gallery_chunk=41, precision="int8", progress=False)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    monkeypatch.setattr(fused.int8, "error_bounds", lambda q, g, *rest: int8.Bounds(
        canonical.FLOAT32_TINY, np.zeros(len(q)), np.zeros(len(g))))
    with pytest.raises(RuntimeError, match="int8 products are further"):  # the premise check sees it on a tile
        mine_offline_negatives(img, cap, 5, 30, 7, block_size=16, gallery_chunk=41, precision="int8", progress=False)
    monkeypatch.setattr(fused.bf16_filter, "tile_within_bound", lambda *args: True)
    lossy = mine_offline_negatives(img, cap, 5, 30, 7, block_size=16, gallery_chunk=41, precision="int8",
                                   progress=False)
    assert not (np.array_equal(lossy[0], ref[0]) and np.array_equal(lossy[1], ref[1]))


@pytest.mark.parametrize(("fp32_ms", "pays"), [(4.1, False), (6.0, True), (9.0, True)])
def test_int8_pays_only_where_its_products_cover_the_wider_bound(monkeypatch, fp32_ms: float, pays: bool) -> None:
    # 4.1x: the speed-up of an Intel Xeon without AMX whose int8 pass was no faster than its float32 one
    timings = iter([fp32_ms * 1e-3, 1e-3])
    monkeypatch.setattr(int8, "best_seconds", lambda fn, repeats: next(timings))
    int8.int8_speedup.cache_clear()
    try:
        assert int8.int8_pays() is pays
    finally:
        int8.int8_speedup.cache_clear()


@pytest.mark.parametrize(("int8_x", "bf16_x", "beats"), [
    (4.33, 2.26, True),  # an AMD Zen 4's tile products: int8 saves 0.22 of the float32 time; its pass was faster
    (9.2, 4.6, False),  # an AMD Zen 5's: 0.11; the two passes tied
    (30.0, 9.0, False),  # an AMX CPU's bf16: nothing left for int8 to save that pays for its extra candidates
    (0.0, 2.26, False),  # no exact int8 products
])
def test_int8_filter_is_taken_over_bf16_only_where_its_products_save_much_more(
        monkeypatch, int8_x: float, bf16_x: float, beats: bool) -> None:
    monkeypatch.setattr(int8, "int8_speedup", lambda: int8_x)
    assert int8.int8_beats_bf16(bf16_x) is beats


def test_int8_pays_is_measured_once_per_process(monkeypatch) -> None:
    first = int8.int8_speedup()
    assert first >= 0.0 and int8.int8_pays() is (first >= int8.INT8_PAYS_FACTOR)
    monkeypatch.setattr(int8.torch, "mm", None)  # a second measurement would fail
    assert int8.int8_speedup() == first
