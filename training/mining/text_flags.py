"""Compiled work of the text filters (``identity`` and ``semantic``,
:mod:`aoq_train.mining.filters`) over the deep lists and over the whole gallery (numba).

Both filters depend on text ids only, so a candidate's flags are one or two table lookups. With
numpy each slice of candidates cost several full passes (gathers of text ids, keys, a bitmap
gather, shifts, a nonzero for the identity test, fancy-indexed copies of the slice, and a fresh
count of every flag up to the slice); here every candidate is looked up once, in place, and a
row stops as soon as it keeps enough. The bits are those of
:func:`aoq_train.mining.filters.flag_rows`: bit ``k`` for ``ORDER[k]``, one per enabled filter
that flags the candidate on its own. Every function releases the GIL and is compiled on first
use, then cached beside this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

from aoq_train.mining.filters import ORDER, FilterInputs

#: the filters these kernels evaluate; ``teacher`` reads the model's scores and keeps numpy's
#: einsum (its float32 sums decide ties at ``rho``)
TEXT_FILTERS = ("identity", "semantic")


@dataclass(frozen=True)
class TextTables:
    """What the kernels read for one direction: the filters' bits (0 when off), the text ids and
    the semantic filter's table: a bitmap (image-major for image anchors, text-major for caption
    anchors, so that one anchor's lookups stay near each other) or, when that would be too
    large, the sorted image-major keys."""

    identity_bit: int
    semantic_bit: int
    cpi: int
    text_ids: np.ndarray
    n_texts: int
    n_images: int
    bitmap: np.ndarray
    near: np.ndarray
    use_bitmap: bool

    def args(self) -> tuple:
        """The positional arguments every kernel takes after its own."""
        return (self.identity_bit, self.semantic_bit, self.cpi, self.text_ids, self.n_texts, self.n_images, self.bitmap,
                self.near, self.use_bitmap)


def text_only(filters: Sequence[str]) -> bool:
    """Whether every enabled filter is a text filter (these kernels then flag everything)."""
    return set(filters) <= set(TEXT_FILTERS)


def text_tables(inputs: FilterInputs, filters: Sequence[str], image_anchors: bool) -> TextTables:
    """The kernels' inputs for the enabled text ``filters``, for image or caption anchors."""
    semantic = "semantic" in filters
    bitmap = None
    if semantic:
        bitmap = inputs.image_near_bitmap if image_anchors else inputs.text_near_bitmap
    near = inputs.image_near_texts if semantic and bitmap is None else np.zeros(1, dtype=np.int64)
    return TextTables(
        identity_bit=1 << ORDER.index("identity") if "identity" in filters else 0,
        semantic_bit=1 << ORDER.index("semantic") if semantic else 0,
        cpi=inputs.captions_per_image,
        text_ids=np.ascontiguousarray(inputs.text_ids, dtype=np.int64),
        n_texts=int(inputs.text_ids.max()) + 1,
        n_images=len(inputs.text_ids) // inputs.captions_per_image,
        bitmap=np.zeros(1, dtype=np.uint8) if bitmap is None else bitmap,
        near=np.ascontiguousarray(near, dtype=np.int64),
        use_bitmap=bitmap is not None,
    )


@njit(nogil=True, cache=True, inline="always")
def _semantic(image_anchors: bool, anchor: int, text: int, cand: int, ids: np.ndarray, n_texts: int, n_images: int,
              bitmap: np.ndarray, near: np.ndarray, use_bitmap: bool) -> bool:
    """Whether the text (the candidate caption's, or the anchor caption's, ``text``) is one of
    the image's texts or near one."""
    if image_anchors:
        key = anchor * n_texts + ids[cand]
    elif use_bitmap:
        key = text * n_images + cand  # the text-major bitmap
    else:
        key = cand * n_texts + text
    if use_bitmap:
        return (bitmap[key >> 3] >> (key & 7)) & 1 != 0
    j = np.searchsorted(near, key)
    return j < near.shape[0] and near[j] == key


@njit(nogil=True, cache=True, inline="always")
def _identity(image_anchors: bool, anchor: int, text: int, cand: int, ids: np.ndarray, cpi: int) -> bool:
    """Whether the text (as in :func:`_semantic`) is one of the image's own texts."""
    image = anchor if image_anchors else cand
    wanted = ids[cand] if image_anchors else text
    for j in range(image * cpi, (image + 1) * cpi):
        if ids[j] == wanted:
            return True
    return False


@njit(nogil=True, cache=True)
def flag_progressively(lists: np.ndarray, anchors: np.ndarray, needs: np.ndarray, width: int, image_anchors: bool,
                       bits: np.ndarray, kept: np.ndarray, identity_bit: int, semantic_bit: int, cpi: int,
                       ids: np.ndarray, n_texts: int, n_images: int, bitmap: np.ndarray, near: np.ndarray,
                       use_bitmap: bool) -> int:
    """Flag row ``i`` of ``lists`` (anchor ``anchors[i]``) into ``bits`` (``UNCHECKED`` where
    not flagged) slice by slice, ``[0, width)``, then slices twice as wide each time, until it
    keeps ``needs[i]`` candidates or runs out; ``kept[i]`` is then how many of its flagged
    candidates no filter flags. Returns the end of the last slice any row was flagged over.
    The same slices, row by row, as ``false_negatives._flag_progressively`` takes for all rows
    together, so the artefact's flags and depth are the same."""
    checked = 0
    length = lists.shape[1]
    for r in range(lists.shape[0]):
        need, anchor = needs[r], anchors[r]
        text = ids[anchor]  # the caption anchor's text (image anchors: unused)
        count = 0
        start, step = 0, width
        while need > 0 and start < length:
            stop = min(length, start + step)
            for c in range(start, stop):
                cand = lists[r, c]
                b = 0
                # an identical text is a near-duplicate too: with both filters on, identity is
                # looked up only where semantic flags
                if semantic_bit and _semantic(image_anchors, anchor, text, cand, ids, n_texts, n_images, bitmap, near,
                                              use_bitmap):
                    b = semantic_bit
                if identity_bit and (b or not semantic_bit) and _identity(image_anchors, anchor, text, cand, ids, cpi):
                    b |= identity_bit
                bits[r, c] = b
                if b == 0:
                    count += 1
            start, step = stop, 2 * step
            if count >= need:
                break
        kept[r] = count
        checked = max(checked, start)
    return checked


@njit(nogil=True, cache=True)
def mask_flagged(scores: np.ndarray, anchors: np.ndarray, image_anchors: bool, available: np.ndarray,
                 identity_bit: int, semantic_bit: int, cpi: int, ids: np.ndarray, n_texts: int, n_images: int,
                 bitmap: np.ndarray, near: np.ndarray, use_bitmap: bool) -> None:
    """Set to -inf every score of ``scores`` (row ``i``: anchor ``anchors[i]`` against the whole
    gallery) that an enabled filter flags, so that a ranking of what remains finds the first
    unflagged candidates at once; ``available[i]``: the finite scores left in row ``i``. Scores
    already -inf (excluded) are not looked up."""
    for r in range(scores.shape[0]):
        anchor = anchors[r]
        text = ids[anchor]
        n = 0
        for c in range(scores.shape[1]):
            if scores[r, c] == -np.inf:
                continue
            if semantic_bit:  # identity flags nothing semantic does not
                flagged = _semantic(image_anchors, anchor, text, c, ids, n_texts, n_images, bitmap, near, use_bitmap)
            else:
                flagged = identity_bit != 0 and _identity(image_anchors, anchor, text, c, ids, cpi)
            if flagged:
                scores[r, c] = -np.inf
            else:
                n += 1
        available[r] = n
