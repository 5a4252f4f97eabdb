"""What the mining tests share: a brute-force reference, exactly representable embeddings, and a
callback that stops a run after a given block."""

from __future__ import annotations

import numpy as np


class Stop(Exception):
    """Raised by a :func:`stop_at` callback: stands for a run killed after a block was saved."""


def stop_at(direction: str, first: int):
    """An ``on_block`` callback that interrupts mining once block ``first`` of ``direction`` is saved."""

    def on_block(name: str, block: int) -> None:
        if name == direction and block == first:
            raise Stop

    return on_block


def reference(img: np.ndarray, cap: np.ndarray, cpi: int, ht: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: the full matrix, own positives at -inf, stable argsort of -score."""
    s = img @ cap.T
    for i in range(len(img)):
        s[i, i * cpi : (i + 1) * cpi] = -np.inf
    st = cap @ img.T
    st[np.arange(len(cap)), np.arange(len(cap)) // cpi] = -np.inf
    return (
        np.argsort(-s, axis=1, kind="stable")[:, :ht].astype(np.int32),
        np.argsort(-st, axis=1, kind="stable")[:, :hi].astype(np.int32),
    )


def exact_embeddings(rng: np.random.Generator, n: int, d: int, levels: int) -> np.ndarray:
    """Vectors whose entries are multiples of 1/levels: every dot product is exact in float32,
    so any summation order (BLAS blocking, FAISS, numpy) gives bit-identical scores, and a
    small ``levels`` makes exact ties frequent."""
    return (rng.integers(-levels, levels + 1, (n, d)) / levels).astype(np.float32)


def canonical_reference(img: np.ndarray, cap: np.ndarray, cpi: int, ht: int, hi: int,
                        rows: np.ndarray | None = None, cols: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Brute force under the canonical rule: every pair's canonical score (the compiled kernel,
    which tests/test_mining_canonical.py holds to the definition), own positives at -inf, stable
    argsort of -score (ties: lower id first). ``rows`` / ``cols``: only these image / caption
    lists (all by default)."""
    from aoq_train.mining.canonical import canonical_pairs

    rows = np.arange(len(img)) if rows is None else rows
    cols = np.arange(len(cap)) if cols is None else cols
    out = []
    for queries, gallery, picked, k, own in ((img, cap, rows, ht, lambda q: np.arange(q * cpi, (q + 1) * cpi)),
                                             (cap, img, cols, hi, lambda q: np.array([q // cpi]))):
        qi, gi = np.repeat(picked, len(gallery)), np.tile(np.arange(len(gallery)), len(picked))
        s = canonical_pairs(queries, gallery, qi, gi).reshape(len(picked), len(gallery))
        for n, q in enumerate(picked):
            s[n, own(q)] = -np.inf
        out.append(np.argsort(-s, axis=1, kind="stable")[:, :k].astype(np.int32))
    return out[0], out[1]


def near_tie_embeddings(rng: np.random.Generator, n_img: int, cpi: int, d: int = 64
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Data on which no two float32 summation orders rank alike (d a multiple of 4): every
    caption's first d/2 entries are pairs +-v (v uniform in [0.5, 1), full float32 significands)
    in a random order, every image's are 1, so they cancel exactly in the true score but leave a
    float32 sum an order-dependent rounding residue of ~1e-6; the true scores come from the last
    d/2 entries (uniform in +-1e-3 on both sides), a few 1e-6 apart."""
    half = d // 2
    v = rng.uniform(0.5, 1.0, (n_img * cpi, half // 2)).astype(np.float32)
    big = np.concatenate([v, -v], axis=1)
    big = np.take_along_axis(big, rng.permuted(np.tile(np.arange(half), (len(big), 1)), axis=1), axis=1)
    cap = np.concatenate([big, rng.uniform(-1e-3, 1e-3, (n_img * cpi, half))], axis=1).astype(np.float32)
    img = np.concatenate([np.ones((n_img, half)), rng.uniform(-1e-3, 1e-3, (n_img, half))], axis=1)
    return img.astype(np.float32), cap
