"""The exactness checks that benchmarks/mining.py reports (brute force, worst swap, identical lists)
must be able to say no: a swapped id shows as the score gap it costs, identical lists as 0, and
one list in another order lowers the share of identical lists."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "mining.py"
_spec = importlib.util.spec_from_file_location("bench_mining", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_brute_force_excludes_own_ids_and_keeps_the_best() -> None:
    gallery = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]] * np.array([[1], [2], [3], [4], [5]], np.float32)
    queries = np.ones((2, 4), dtype=np.float32)
    got = bench.brute_force(queries, gallery, [slice(4, 5), slice(0, 2)], 2)
    np.testing.assert_array_equal(got, [[3, 2], [4, 3]])  # scores 1..5 by id; own ids skipped


def test_worst_swap_is_zero_for_equal_sets_and_the_gap_for_a_wrong_member() -> None:
    rng = np.random.default_rng(0)
    queries, gallery = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    exact = bench.brute_force(queries, gallery, [slice(0, 0)] * 3, 5)
    assert bench.worst_swap(queries, gallery, exact, exact[:, ::-1].copy()) == 0.0  # order alone is no swap
    wrong = exact.copy()
    wrong[1, 4] = bench.brute_force(queries[1:2], gallery, [slice(0, 0)], 6)[0, 5]  # the 6th best for the 5th
    scores = gallery.astype(np.float64) @ queries[1].astype(np.float64)
    assert np.isclose(bench.worst_swap(queries, gallery, exact, wrong), scores[exact[1, 4]] - scores[wrong[1, 4]])
    assert bench.worst_swap(queries, gallery, exact, wrong) > 0


def test_identical_lists_counts_lists_that_differ_anywhere() -> None:
    a = (np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(10, dtype=np.int32).reshape(5, 2))
    assert bench.identical_lists(a, (a[0].copy(), a[1].copy())) == 1.0
    swapped = a[0].copy()
    swapped[1, [2, 3]] = swapped[1, [3, 2]]  # the same ids, another order: not identical
    assert bench.identical_lists(a, (swapped, a[1])) == 7 / 8


def test_canonical_brute_force_is_the_miners_rule() -> None:
    from tests.mining_helpers import canonical_reference, near_tie_embeddings

    img, cap = near_tie_embeddings(np.random.default_rng(1), 12, 3)
    ref = canonical_reference(img, cap, 3, 10, 4)
    got = bench.canonical_brute_force(img[[2, 7]], cap, [slice(6, 9), slice(21, 24)], 10)
    np.testing.assert_array_equal(got, ref[0][[2, 7]])


def test_only_modes_slower_than_float32_and_not_the_default_are_left_untimed(monkeypatch) -> None:
    monkeypatch.setattr(bench, "SPEEDUPS", {"bf16": lambda: 0.12, "int8": lambda: 2.5})
    assert bench.slow_modes("fp32") == {"bf16": 0.12}
    assert bench.slow_modes("bf16") == {}  # the default is always timed, however its products compare
    monkeypatch.setattr(bench, "SPEEDUPS", {"bf16": lambda: 1.0, "int8": lambda: 0.0})  # 0: not exact here
    assert bench.slow_modes("fp32") == {"int8": 0.0}
