"""The exactness checks that benchmarks/mining.py reports: brute-force lists (float64 products, and
the miner's canonical rule), the worst score swap between two sets of lists, the share of lists
two miners hold byte for byte."""

from __future__ import annotations

import numpy as np

from aoq_train.mining.canonical import canonical_pairs


def identical_lists(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """The share of the lists (image lists and caption lists together) that two miners' results
    hold byte for byte: same ids in the same order."""
    same = [(x == y).all(axis=1) for x, y in zip(a, b)]
    return float(np.concatenate(same).mean())


def agreement(img: np.ndarray, cap: np.ndarray, a: tuple[np.ndarray, np.ndarray],
              b: tuple[np.ndarray, np.ndarray]) -> str:
    """How far two miners' lists (image lists, caption lists) agree: the share holding the same
    ids, and where not, the largest float64 score by which an id only ``b`` kept beats one only
    ``a`` kept (:func:`worst_swap`)."""
    parts = []
    for name, queries, gallery, x, y in (("image", img, cap, a[0], b[0]), ("caption", cap, img, a[1], b[1])):
        differ = np.flatnonzero((np.sort(x, axis=1) != np.sort(y, axis=1)).any(axis=1))
        swap = worst_swap(queries[differ], gallery, y[differ], x[differ]) if differ.size else 0.0
        parts.append(f"{1 - differ.size / len(x):.4%} of the {name} lists hold the same ids (worst swap {swap:.1e})")
    return "against fp32 mode: " + "; ".join(parts)


def worst_swap(queries: np.ndarray, gallery: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Over the rows whose lists ``a`` and ``b`` hold different ids: the largest float64 score
    by which an id only ``a`` kept beats an id only ``b`` kept (<= 0 where ``b`` is not worse).
    Float32 near-ties give ~1e-8; a member ``b`` wrongly filtered out gives a gap of its own size."""
    worst = 0.0
    for r in range(len(a)):
        only_a, only_b = np.setdiff1d(a[r], b[r]), np.setdiff1d(b[r], a[r])
        if only_a.size:
            q = queries[r].astype(np.float64)
            worst = max(worst, float((gallery[only_a] @ q).max() - (gallery[only_b] @ q).min()))
    return worst


def brute_force(queries: np.ndarray, gallery: np.ndarray, own: list[slice], k: int) -> np.ndarray:
    """Top-k gallery ids of each query from float64 products, its ``own`` gallery ids excluded."""
    gallery64 = gallery.astype(np.float64)  # once: a float32 @ float64 product would upcast it per query
    out = np.empty((len(queries), k), dtype=np.int64)
    for n, q in enumerate(queries):
        scores = gallery64 @ q.astype(np.float64)
        scores[own[n]] = -np.inf
        out[n] = np.argsort(-scores, kind="stable")[:k]
    return out


def canonical_brute_force(queries: np.ndarray, gallery: np.ndarray, own: list[slice], k: int) -> np.ndarray:
    """Top-k gallery ids of each query by canonical scores (the miner's rule: every pair scored by
    :func:`aoq_train.mining.canonical.canonical_pairs`, ties to the lower id), ``own`` excluded."""
    out = np.empty((len(queries), k), dtype=np.int64)
    ids = np.arange(len(gallery))
    for n, q in enumerate(queries):
        scores = canonical_pairs(q[None], gallery, np.zeros(len(gallery), np.int64), ids)
        scores[own[n]] = -np.inf
        out[n] = np.argsort(-scores, kind="stable")[:k]
    return out
