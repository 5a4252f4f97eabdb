"""Canonical lists (training/mining/canonical.py): the canonical score is what its definition says
on every implementation, its margins are bounds, and the mined lists are byte-identical whatever
the products that found the candidates (bf16 filter or float32, fused pass, per-direction path,
FAISS), on the seeded benchmark's data and on data where float32 summation orders disagree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from aoq_train.mining import canonical, fused, mine_offline_negatives, topk
from aoq_train.mining.keys import LOWEST
from tests.mining_helpers import canonical_reference, exact_embeddings, near_tie_embeddings, reference

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "mining.py"
_spec = importlib.util.spec_from_file_location("bench_mining_canonical", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _definition(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The module docstring's definition, written out with scalar float64 operations: the
    reference both implementations must equal bit for bit."""
    out = np.empty(len(q), dtype=np.float32)
    for n in range(len(q)):
        lanes = [0.0] * 32
        for j in range(q.shape[1]):
            lanes[j % 32] = lanes[j % 32] + float(q[n, j]) * float(g[n, j])
        for w in (16, 8, 4, 2, 1):
            for lane in range(w):
                lanes[lane] = lanes[lane] + lanes[lane + w]
        out[n] = 0.0 if abs(lanes[0]) < 2.0**-126 else np.float32(lanes[0])
    return out


@pytest.mark.parametrize("d", [1, 5, 31, 32, 33, 64, 100, 512])
def test_both_implementations_follow_the_definition_bit_for_bit(d: int) -> None:
    rng = np.random.default_rng(d)
    q = (rng.standard_normal((40, d)) * rng.choice([1e-3, 1.0, 1e3], (40, 1))).astype(np.float32)
    g = rng.standard_normal((60, d)).astype(np.float32)
    qi, gi = rng.integers(0, 40, 300), rng.integers(0, 60, 300)
    qi[:150] = np.sort(qi[:150])  # runs of one query: its gallery rows are scored two at a time
    want = _definition(q[qi], g[gi])
    kernel = canonical.canonical_pairs(q, g, qi, gi)
    rows = canonical.canonical_rows(torch.from_numpy(q[qi]), torch.from_numpy(g[gi]), rows_at_once=37).numpy()
    np.testing.assert_array_equal(kernel.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(rows.view(np.uint32), want.view(np.uint32))
    exact = (q[qi].astype(np.float64) * g[gi]).sum(axis=1)
    bound = canonical.canonical_error(d, float(np.linalg.norm(q, axis=1).max()), float(np.linalg.norm(g, axis=1).max()))
    assert (np.abs(kernel - exact) <= bound).all()


def test_where_the_terms_sit_decides_a_rounding_and_tiny_scores_are_zero() -> None:
    """Rows 0 and 1 have the same exact score, 1 + 2**-24 + 2**-52, just above the midpoint of
    two float32 values. Row 0 (d = 33): lane 0 holds 1 and then 2**-53 (1 + 2**-53, a float64
    tie, rounded to even: 1), lane 1 holds 2**-53, lane 2 2**-24; pairwise, 1 + 2**-24, then
    + 2**-53 (a tie again, to even: 1 + 2**-24), which float32 rounds (a tie, to even) to 1.
    Row 1: lane 0 holds 1 + 2**-52 (exact), lane 2 2**-24: 1 + 2**-24 + 2**-52, rounded up to
    1 + 2**-23. Row 2: 2**-130 is below float32's normal range: 0."""
    q = np.zeros((3, 33), np.float32)
    g = np.zeros((3, 33), np.float32)
    q[:, [0, 1, 2, 32]] = 1.0
    g[0, [0, 1, 2, 32]] = [1.0, 2.0**-53, 2.0**-24, 2.0**-53]
    g[1, [0, 2, 32]] = [1.0, 2.0**-24, 2.0**-52]
    g[2, 0], q[2, 0] = 2.0**-70, 2.0**-60
    got = canonical.canonical_pairs(q, g, np.arange(3), np.arange(3))
    np.testing.assert_array_equal(got, np.array([1.0, 1.0 + 2.0**-23, 0.0], np.float32))
    np.testing.assert_array_equal(got, _definition(q, g))
    rows = canonical.canonical_rows(torch.from_numpy(q), torch.from_numpy(g)).numpy()
    np.testing.assert_array_equal(rows, got)


def test_float32_margin_bounds_every_summation_order_on_near_tie_data() -> None:
    img, cap = near_tie_embeddings(np.random.default_rng(0), 30, 5)
    margin = canonical.float32_margin(img, cap)
    qi, gi = np.repeat(np.arange(30), 150), np.tile(np.arange(150), 30)
    canon = canonical.canonical_pairs(img, cap, qi, gi).reshape(30, 150).astype(np.float64)
    forward, backward = np.zeros((30, 150), np.float32), np.zeros((30, 150), np.float32)
    for j in range(img.shape[1]):
        forward = forward + img[:, j, None] * cap[None, :, j]
        backward = backward + img[:, -1 - j, None] * cap[None, :, -1 - j]
    for fast in (img @ cap.T, forward, backward):
        assert np.abs(fast - canon).max() <= margin
    assert np.abs(forward - backward).max() > 1e-7  # the orders do disagree here, by far more than float32's step


def test_max_norm_is_an_upper_bound_and_a_tight_one() -> None:
    """The margins' norms are summed in float32 and inflated by the proven bound: never below
    the exact norm (float64 of the float32 entries), within 1e-4 above it, also for rows whose
    entries span many orders of magnitude and for rows with subnormal squares."""
    rng = np.random.default_rng(3)
    for x in (rng.standard_normal((3000, 512)), rng.standard_normal((50, 37)) * 10.0 ** rng.integers(-15, 16, (50, 37)),
              np.full((4, 8), 1e-25)):
        x = x.astype(np.float32)
        exact = float(np.sqrt((x.astype(np.float64) ** 2).sum(axis=1)).max())
        got = canonical.max_norm(x, rows=1000)
        assert exact <= got <= exact * (1 + 1e-4) + 1e-17
    assert canonical.max_norm(torch.ones(5, 4)) >= 2.0


def test_float32_levels_are_the_largest_float32_values_at_or_below_level_minus_margin() -> None:
    rng = np.random.default_rng(1)
    levels = np.concatenate([rng.standard_normal(500), [0.0, -0.0, 1e-40, -1e-40, LOWEST, np.inf]]).astype(np.float32)
    for margin in (0.0, 3e-5, 1e-45):
        got = canonical.float32_levels(levels, margin)
        wanted = levels.astype(np.float64) - margin
        inside = np.isfinite(wanted) & (wanted >= LOWEST)
        assert (got[inside].astype(np.float64) <= wanted[inside]).all()
        above = np.nextafter(got[inside], np.float32(np.inf)).astype(np.float64)
        assert (above > wanted[inside]).all()  # the next float32 up would be above: the largest
    # LOWEST stays LOWEST (every finite score passes, -inf fails), +inf stays +inf (nothing passes)
    assert canonical.float32_levels(np.array([LOWEST, np.inf], np.float32), 1.0).tolist() == [LOWEST, np.inf]


# --------------------------------------------------------------------------- the lists


def test_bf16_and_fp32_mining_modes_byte_identical_on_the_seeded_benchmark() -> None:
    """The benchmark's data (benchmarks/mining.py: seeded random unit vectors, d = 512) at its
    --quick size: both precision modes give the same bytes in both directions, and sampled lists
    equal the canonical brute force."""
    gen = torch.Generator().manual_seed(0)
    img, cap = bench.unit_vectors(2000, 512, gen), bench.unit_vectors(10000, 512, gen)
    fp32 = mine_offline_negatives(img, cap, 5, 200, 40, 4096, "cpu", precision="fp32", progress=False)
    bf16 = mine_offline_negatives(img, cap, 5, 200, 40, 4096, "cpu", precision="bf16", progress=False)
    for a, b in zip(fp32, bf16):
        assert a.tobytes() == b.tobytes()
    assert bench.identical_lists(fp32, bf16) == 1.0
    rows, cols = np.arange(0, 2000, 97), np.arange(0, 10000, 487)
    ref = canonical_reference(img, cap, 5, 200, 40, rows, cols)
    np.testing.assert_array_equal(fp32[0][rows], ref[0])
    np.testing.assert_array_equal(fp32[1][cols], ref[1])


def _old_rule(precision: str):
    """The previous version's decision, emulated: fp32 mode kept the tiles' float32 BLAS scores,
    the bf16 filter re-scored in float32 in its own order (here: from the last coordinate to the
    first)."""

    def rescore(q, g, p0, c0, rows, cols, out):
        if precision == "bf16":
            acc = np.zeros(len(rows), np.float32)
            for j in reversed(range(q.shape[1])):
                acc = acc + q[p0 + rows, j] * g[c0 + cols, j]
            out[:] = acc

    return rescore


def test_near_ties_where_float32_orders_disagree_give_one_canonical_list_everywhere(monkeypatch) -> None:
    """On data where float32 sums of different orders rank differently (near_tie_embeddings):
    the fused pass in both modes, the per-direction path (two CPU devices, the code CUDA runs)
    and FAISS all give the canonical brute force's lists, byte for byte. The previous rule
    (float32 scores, ties by id) gave lists that depended on the summation order: emulated, its
    two modes differ here, and the float32 brute force differs from the canonical one."""
    img, cap = near_tie_embeddings(np.random.default_rng(3), 80, 5)
    ref = canonical_reference(img, cap, 5, 60, 12)
    runs = {
        "fp32": dict(precision="fp32", block_size=32, gallery_chunk=70),
        "bf16": dict(precision="bf16", block_size=32, gallery_chunk=70),
        "devices": dict(device=["cpu", "cpu"], block_size=32, gallery_chunk=64),
        "faiss": dict(backend="faiss", block_size=32),
    }
    for name, kwargs in runs.items():
        got = mine_offline_negatives(img, cap, 5, 60, 12, progress=False, **kwargs)
        assert got[0].tobytes() == ref[0].tobytes() and got[1].tobytes() == ref[1].tobytes(), name
    old = {}
    for precision in ("fp32", "bf16"):
        monkeypatch.setattr(fused.canonical, "rescore", _old_rule(precision))
        monkeypatch.setattr(fused.bf16_filter, "tile_within_bound", lambda *args: True)  # no premise check then
        old[precision] = mine_offline_negatives(img, cap, 5, 60, 12, block_size=32, gallery_chunk=70,
                                                precision=precision, progress=False)
    monkeypatch.undo()
    assert not np.array_equal(old["fp32"][0], old["bf16"][0])
    assert not np.array_equal(old["fp32"][1], old["bf16"][1])
    # what the previous version was tested against; its sums' order is the BLAS kernel's, so which
    # direction's near-ties it decides otherwise depends on the CPU (both on Zen 5, only the image
    # lists on Zen 4)
    float32_brute_force = reference(img, cap, 5, 60, 12)
    assert not all(np.array_equal(a, b) for a, b in zip(float32_brute_force, ref))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_list_redone_or_every_score_passing_stays_canonical(small_tiles, monkeypatch, precision) -> None:
    """The safety valves on near-tie data: thresholds guessed too high (every list redone by
    topk.exact_rows) and thresholds at LOWEST (every score a candidate, pools cut many times)."""
    img, cap = near_tie_embeddings(np.random.default_rng(4), 40, 3)
    ref = canonical_reference(img, cap, 3, 25, 6)
    for level in (1e9, LOWEST):
        monkeypatch.setattr(fused, "sampled_threshold", lambda blocks, k, n, axis=1, level=level: np.full(
            blocks[0].shape[1 - axis], level, dtype=np.float32))
        got = mine_offline_negatives(img, cap, 3, 25, 6, block_size=8, gallery_chunk=16, precision=precision,
                                     progress=False)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(fused, "ROW_TILE", 7)
    monkeypatch.setattr(fused, "COL_HITS", 4)
    monkeypatch.setattr(fused, "ROW_HITS", 4)


def test_exact_ties_still_go_to_the_lower_id() -> None:
    """Exactly representable data with massive ties: canonical scores are the exact ones, so the
    lists are the float32 brute force's (ties by id) in every path."""
    rng = np.random.default_rng(2)
    img, cap = exact_embeddings(rng, 31, 4, 2), exact_embeddings(rng, 93, 4, 2)
    ref = reference(img, cap, 3, 50, 9)
    for kwargs in (dict(precision="fp32"), dict(precision="bf16"), dict(device=["cpu", "cpu"]),
                   dict(backend="faiss")):
        got = mine_offline_negatives(img, cap, 3, 50, 9, block_size=8, progress=False, **kwargs)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_array_equal(got[1], ref[1])


def test_subnormal_entries_are_flushed_before_mining() -> None:
    """A subnormal input entry is read as zero (no denormals-are-zero mode can change a canonical
    score): the lists equal those of the flushed embeddings, and the inputs are not modified."""
    rng = np.random.default_rng(5)
    img, cap = near_tie_embeddings(rng, 30, 2)
    dirty = img.copy()
    dirty[::3, -1] = np.float32(1e-40)
    flushed, finite = canonical.canonical_inputs(dirty)
    assert finite and flushed is not dirty and (flushed[::3, -1] == 0).all() and (dirty[::3, -1] != 0).all()
    assert canonical.canonical_inputs(img)[0] is img  # nothing to flush: no copy
    got = mine_offline_negatives(dirty, cap, 2, 20, 5, block_size=8, progress=False)
    want = canonical_reference(flushed, cap, 2, 20, 5)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_products_outside_the_bound_are_refused(monkeypatch) -> None:
    """The margins assume IEEE float32 products (accumulation in float32): products that are
    further off (as with reduced-precision float32 matmuls) stop the run instead of silently
    missing list members, in the fused pass and in the per-direction path."""
    from aoq_train.mining import driver

    gen = torch.Generator().manual_seed(6)
    img, cap = bench.unit_vectors(40, 64, gen), bench.unit_vectors(120, 64, gen)
    original = fused.FusedPass._dense

    def coarse(self, p0, p1, ci, slot=0, raw=False):
        scores = original(self, p0, p1, ci, slot, raw)
        return scores if raw else (scores.view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16-truncated

    monkeypatch.setattr(fused.FusedPass, "_dense", coarse)
    with pytest.raises(RuntimeError, match="float32 products are further"):
        mine_offline_negatives(img, cap, 3, 20, 5, precision="fp32", progress=False)
    monkeypatch.undo()
    direction, margin = driver.directions(img, cap, 3, 20, 5)[0], canonical.float32_margin(img, cap)
    coarse_gallery = torch.from_numpy(cap).bfloat16().float()
    with pytest.raises(RuntimeError, match="canonical scores than the"):
        driver.check_products(direction, torch.device("cpu"), coarse_gallery, margin)
    with pytest.raises(RuntimeError, match="canonical scores than the"):
        topk.exact_rows(direction, torch.from_numpy(img), np.arange(40), coarse_gallery, margin)
    driver.check_products(direction, torch.device("cpu"), torch.from_numpy(cap), margin)  # float32 products pass


def test_the_device_scorer_gives_the_host_kernel_bits() -> None:
    """The per-direction path scores candidates on the GPU by elementwise torch operations
    (``Scorer`` with a gallery tensor); run here on the CPU, in pieces of 7 pairs, it gives the
    compiled kernel's bits."""
    img, cap = near_tie_embeddings(np.random.default_rng(7), 20, 3, d=72)
    direction = topk.directions(img, cap, 3, 10, 4)[1]  # captions against images
    rng = np.random.default_rng(0)
    qids, gids = rng.integers(0, 60, 500), rng.integers(0, 20, 500)
    host = topk.Scorer(direction, 0.0)(qids, gids)
    device = topk.Scorer(direction, 0.0, torch.from_numpy(img), pairs_at_once=7)(qids, gids)
    np.testing.assert_array_equal(device.view(np.uint32), host.view(np.uint32))
    np.testing.assert_array_equal(host, canonical.canonical_pairs(cap, img, qids, gids))
