"""The block scan of flat indexes (aoq_serve.index.scan): the exact top list of a reference sum,
ties by gallery position, the same scores alone and in any batch, FAISS's contract at the edges,
and what the service loads for a flat index on the CPU."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from aoq_serve.index.faiss_index import IndexSpec, load_model_index, search_many, write_model_index
from aoq_serve.index.scan import WIDTH, FlatScan, _scan
from aoq_serve.search.batching import MAX_BATCH


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference(x: np.ndarray, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` by a float64 product, ties broken by position."""
    scores = x.astype(np.float64) @ query.astype(np.float64)
    order = np.lexsort((np.arange(len(x)), -scores))[:k]
    return scores[order], order


@pytest.mark.parametrize("n", [1, WIDTH - 1, WIDTH, 3 * WIDTH + 5])
def test_top_lists_are_those_of_a_reference_product(n):
    x, queries = _unit(n, 24, 0), _unit(7, 24, 1)
    ids = np.arange(n, dtype=np.int64) * 5 + 2
    scores, found = FlatScan.from_vectors(x, ids).search(queries, min(10, n))
    for q, query in enumerate(queries):
        ref_scores, ref_positions = _reference(x, query, min(10, n))
        assert np.array_equal(found[q], ids[ref_positions])
        np.testing.assert_allclose(scores[q], ref_scores, atol=1e-6)


def test_equal_scores_are_ordered_by_gallery_position():
    base = _unit(50, 16, 2)
    x = np.concatenate([base, base[::-1], base])  # every item three times, in blocks far apart
    scan = FlatScan.from_vectors(x, np.arange(len(x), dtype=np.int64))
    scores, found = scan.search(base[:5], 6)
    for q in range(5):
        twins = sorted([q, 99 - q, 100 + q])
        assert list(found[q, :3]) == twins
        assert scores[q, 0] == scores[q, 1] == scores[q, 2]


def test_a_query_scores_the_same_alone_and_anywhere_in_any_batch():
    x = _unit(5 * WIDTH + 17, 32, 3)
    x[7] = x[300]  # a tie across blocks
    queries = np.concatenate([x[[7, 11, 300]], _unit(MAX_BATCH + 3, 32, 4)])
    scan = FlatScan.from_vectors(x, np.arange(len(x), dtype=np.int64))
    alone = [scan.search(q[None], 12) for q in queries]
    rng = np.random.default_rng(5)
    for size in (2, 3, 5, MAX_BATCH, len(queries)):
        picked = rng.choice(len(queries), size, replace=False)
        scores, found = scan.search(queries[picked], 12)
        for row, q in enumerate(picked):
            assert np.array_equal(found[row], alone[q][1][0]) and np.array_equal(scores[row], alone[q][0][0])


def test_faiss_contract_at_the_edges():
    x = _unit(3, 8, 6)
    scan = FlatScan.from_vectors(x, np.array([10, 20, 30], dtype=np.int64))
    scores, found = scan.search(x[:2], 5)
    assert scores.shape == found.shape == (2, 5)
    assert list(found[0, 3:]) == [-1, -1] and np.isneginf(scores[0, 3:]).all()
    assert [len(ids) for _, ids in search_many(scan, x[:2], 5)] == [3, 3]
    with pytest.raises(ValueError, match="dimension 8"):
        scan.search(np.zeros((1, 9), dtype=np.float32), 1)


def test_a_flat_index_loads_as_the_scan_and_answers_as_faiss(tmp_path):
    images, captions = _unit(300, 16, 7), _unit(200, 16, 8)
    ids = {"images": np.arange(300, dtype=np.int64) + 1, "captions": np.arange(200, dtype=np.int64) + 1}
    write_model_index(tmp_path / "m", {"images": images, "captions": captions}, ids, IndexSpec("flat"), {"model": "m"})
    loaded = load_model_index(tmp_path / "m")
    assert isinstance(loaded.faiss["images"], FlatScan) and loaded.faiss["images"].ntotal == 300
    exact = faiss.IndexIDMap(faiss.IndexFlatIP(16))
    exact.add_with_ids(images, ids["images"])
    queries = _unit(20, 16, 9)
    want_scores, want_ids = exact.search(queries, 10)
    got = search_many(loaded.faiss["images"], queries, 10)
    for q, (scores, found) in enumerate(got):
        assert np.array_equal(found, want_ids[q])
        np.testing.assert_allclose(scores, want_scores[q], atol=1e-6)


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("dim, count", [(1, 1), (24, 3), (33, 2), (128, 5), (300, 4)])
@pytest.mark.parametrize("whole", [True, False])
def test_scores_are_the_float32_sums_in_dimension_order_with_either_kernel(dim, count, wide, whole):
    """Both kernels (two queries at a time for AVX-512, one for AVX2) give every score exactly as
    ``s = 0; s = s + q_c * x_c`` for c = 0, 1, ..., each operation rounded to float32 (numpy's
    float32 arithmetic is that, elementwise): the definition the service's answers keep on any CPU.
    Every item ranked (``whole``), or a top 10, which fills in the first block, so that the later
    blocks are first compared with its last score as a whole."""
    x, queries = _unit(3 * WIDTH + 9, dim, 10), _unit(count, dim, 11)
    n = len(x)
    k = n if whole else 10
    scan = FlatScan.from_vectors(x, np.arange(n, dtype=np.int64))
    scores = np.full((count, k), -np.inf, dtype=np.float32)
    where = np.empty((count, k), dtype=np.int64)
    _scan(scan.blocks, n, queries, k, scores, where, np.empty((count, WIDTH), dtype=np.float32), wide)
    for q, query in enumerate(queries):
        want = np.zeros(n, dtype=np.float32)
        for c in range(dim):
            want = want + query[c] * x[:, c]
        order = np.lexsort((np.arange(n), -want))[:k]
        assert np.array_equal(where[q], order)
        assert np.array_equal(scores[q].view(np.uint32), want[order].view(np.uint32))
