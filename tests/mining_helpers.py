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
