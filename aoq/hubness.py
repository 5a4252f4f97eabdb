"""Query-time hubness correction: the inverted softmax and QB-Norm (docs/serving.md, Hubness correction).

Pure functions on arrays, shared by the evaluation (``aoq evaluate --hubness``, exact: every score
of the split) and the service (a FAISS candidate pool re-ranked), so both apply one definition.

A *bank* of typical queries (the training split's captions for text->image, its images for
image->text) says how strongly each gallery item ``g`` is already retrieved:
``log Z(g) = logsumexp_b beta * s(b, g)``. A normalised query ranks by the log of the inverted
softmax, ``beta * s(q, g) - log Z(g)``. QB-Norm's dynamic variant normalises a query only when its
raw top-1 item is in the *activation set* (the items that are the top-1 of at least one bank query);
its other queries keep ``beta * s(q, g)``, which orders like the raw score.

Ties in a top-1 go to the lowest gallery position (``np.argmax``), the service's tie rule.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from aoq.names import Normalisation
from aoq.ranks import BLOCK_ELEMENTS, SimsFn

#: inverse temperature of the softmax over the bank: QB-Norm's published setting (Bogolin et al.,
#: CVPR 2022), used for the plain inverted softmax too so that both share one denominator.
BETA = 20.0
#: the activation set holds each bank query's top ``ACTIVATION_K`` items; QB-Norm's dynamic
#: inverted softmax uses 1, the only value offered.
ACTIVATION_K = 1
#: a normalised FAISS search re-ranks ``CANDIDATE_FACTOR * k`` raw candidates (an approximation:
#: an item outside that pool is never listed however much the normaliser would lift it).
CANDIDATE_FACTOR = 10
#: the hubness figure: the share of queries whose top-1 is one of this many most frequent top-1 items.
HUB_ITEMS = 10


@dataclass(frozen=True)
class Normaliser:
    """What a bank says of each item of one gallery (arrays indexed by gallery position)."""

    #: ``logsumexp_b beta * s(b, g)``, float64
    log_denominator: np.ndarray
    #: whether the item is the top-1 of at least one bank query
    active: np.ndarray
    beta: float = BETA


def bank_provenance(split: str, images: np.ndarray, captions: np.ndarray, beta: float = BETA) -> dict:
    """What a normaliser was computed from: the bank's split, its size, a hash of its embeddings
    (float32 bytes, images then captions) and the method's constants."""
    digest = hashlib.sha256()
    for part in (images, captions):
        digest.update(np.ascontiguousarray(part, dtype=np.float32).tobytes())
    return {"split": split, "images": int(len(images)), "captions": int(len(captions)),
            "content_hash": digest.hexdigest(), "beta": beta, "k": ACTIVATION_K}


def _rows_per_block(columns: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(1, columns))


def bank_normaliser(bank: np.ndarray, gallery: np.ndarray, beta: float = BETA) -> Normaliser:
    """The normaliser of ``gallery`` (n_gallery, d) under a ``bank`` (n_bank, d) of queries, exact:
    the bank is scored in blocks of rows and the log-denominators merged in log space."""
    gallery64 = np.asarray(gallery, dtype=np.float64)
    log_z = np.full(gallery64.shape[0], -np.inf)
    active = np.zeros(gallery64.shape[0], dtype=bool)
    step = _rows_per_block(gallery64.shape[0])
    # one block-sized buffer, every step in place: a block is far larger than the caches, and a
    # fresh array per step cost as much again in page faults as the arithmetic (same values)
    buffer = np.empty((min(step, len(bank)), gallery64.shape[0]))
    for lo in range(0, len(bank), step):
        rows = np.asarray(bank[lo:lo + step], dtype=np.float64)
        scaled = np.matmul(rows, gallery64.T, out=buffer[:len(rows)])
        active[np.argmax(scaled, axis=1)] = True
        np.multiply(scaled, beta, out=scaled)
        peak = scaled.max(axis=0)
        # logsumexp of each column, shifted by its maximum so that exp never overflows
        np.exp(np.subtract(scaled, peak, out=scaled), out=scaled)
        log_z = np.logaddexp(log_z, peak + np.log(scaled.sum(axis=0)))
    return Normaliser(log_denominator=log_z, active=active, beta=beta)


def query_applies(method: Normalisation, top1: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Which queries are normalised, from each query's raw top-1 gallery position."""
    top1 = np.asarray(top1)
    if method == "none":
        return np.zeros(top1.shape, dtype=bool)
    if method == "invsoftmax":
        return np.ones(top1.shape, dtype=bool)
    return active[top1]


def rescore(scores: np.ndarray, log_denominator: np.ndarray, applies: np.ndarray, beta: float = BETA) -> np.ndarray:
    """Log-normalised scores (float64) of queries in rows against the items whose log-denominators
    are ``log_denominator``: ``beta * s - log Z`` where ``applies``, ``beta * s`` elsewhere."""
    scaled = beta * np.asarray(scores, dtype=np.float64)
    return scaled - np.where(np.asarray(applies)[..., None], log_denominator, 0.0)


def normalise_rows(scores: np.ndarray, normaliser: Normaliser, method: Normalisation) -> np.ndarray:
    """Queries in rows against the whole gallery of ``normaliser``: raw scores for ``none``, else
    the log-normalised scores (each row's own top-1 decides QB-Norm)."""
    if method == "none":
        return np.asarray(scores)
    applies = query_applies(method, np.argmax(scores, axis=1), normaliser.active)
    return rescore(scores, normaliser.log_denominator, applies, normaliser.beta)


def rerank(method: Normalisation, scores: np.ndarray, positions: np.ndarray, normaliser: Normaliser | None, k: int
           ) -> tuple[np.ndarray, np.ndarray, bool]:
    """The best ``k`` of a raw candidate pool (``scores`` best first, gallery ``positions``) under
    ``method`` (``normaliser`` None only for ``none``): (scores, positions, whether the query was
    normalised). Ties go to the lower position."""
    if method == "none" or normaliser is None or not len(positions):
        return scores[:k], positions[:k], False
    applies = bool(query_applies(method, positions[:1], normaliser.active)[0])
    new = rescore(scores[None, :], normaliser.log_denominator[positions], np.array([applies]), normaliser.beta)[0]
    order = np.lexsort((positions, -new))[:k]
    return new[order], positions[order], applies


def hub_share(top1: np.ndarray, items: int = HUB_ITEMS) -> float:
    """The share of queries whose top-1 is one of the ``items`` most frequent top-1 items."""
    counts = np.bincount(np.asarray(top1, dtype=np.int64))
    return float(np.sort(counts)[::-1][:items].sum() / max(1, len(top1)))


def direction_fns(img: np.ndarray, cap: np.ndarray, images: Normaliser, captions: Normaliser,
                  method: Normalisation) -> tuple[SimsFn, SimsFn]:
    """Sims functions (:mod:`aoq.metrics` layout, (n_images, n_captions)) of each direction under
    ``method``: image queries against the captions normalised by ``captions`` (bank: training
    images), caption queries against the images normalised by ``images`` (bank: training captions).
    Each block scores its queries against the whole gallery first: QB-Norm needs every query's
    raw top-1."""

    def i2t_fn(rows: slice, cols: slice) -> np.ndarray:
        return normalise_rows(img[rows] @ cap.T, captions, method)[:, cols]

    def t2i_fn(rows: slice, cols: slice) -> np.ndarray:
        return normalise_rows(cap[cols] @ img.T, images, method).T[rows]

    return i2t_fn, t2i_fn


def top1_per_query(i2t_fn: SimsFn, t2i_fn: SimsFn, n_images: int, n_captions: int) -> dict[str, np.ndarray]:
    """Each query's top-1 gallery position under the two sims functions, read in blocks:
    ``{"i2t": caption per image, "t2i": image per caption}``."""
    step_images, step_captions = _rows_per_block(n_captions), _rows_per_block(n_images)
    i2t = [np.argmax(i2t_fn(slice(lo, min(lo + step_images, n_images)), slice(0, n_captions)), axis=1)
           for lo in range(0, n_images, step_images)]
    t2i = [np.argmax(t2i_fn(slice(0, n_images), slice(lo, min(lo + step_captions, n_captions))), axis=0)
           for lo in range(0, n_captions, step_captions)]
    return {"i2t": np.concatenate(i2t), "t2i": np.concatenate(t2i)}
