"""False-negative filters of the mined lists (docs/method.md, False negatives): which mined
candidates are probably true of their anchor, and the lists that remain without them.

A mined list is ordered by the round-1 model's score, so its top is where captions that also
describe the anchor collect (a second caption of the same emoji, a paraphrase, a caption of a
twin picture). Round 2 would push them below the positive. Each filter flags such candidates;
they apply in a fixed order and a candidate keeps the first filter that flagged it:

1. ``identity``: the candidate's text equals one of the anchor's own texts (case and white space
   folded). For an image anchor: the mined caption's text is one of the image's captions; for a
   caption anchor: the caption's text is one of the mined image's captions. Always a false
   negative.
2. ``semantic``: a frozen sentence encoder (the packaged all-MiniLM-L6-v2, mean pooled and L2
   normalised) finds the texts near-identical: the largest cosine between the candidate caption
   and the image's own captions (image anchor), or between the anchor caption and the mined
   image's captions (caption anchor), is at least ``tau``. Sentence vectors depend on the text
   only, so the test reads a precomputed set of near-duplicate text pairs
   (:func:`near_duplicate_keys`).
3. ``teacher``: the mining model itself scores the candidate above ``rho`` times the anchor's
   positive score (NV-Retriever's "TopK-PercPos"): for an image anchor the mean score of its own
   captions, for a caption anchor the score of its own image.

The lists round 2 samples from keep the first ``h`` unflagged candidates of each row
(:func:`compact`), so a list still offers ``h`` candidates after filtering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from aoq.data.facts import normalised_text
from aoq.names import FALSE_NEGATIVE_FILTERS

#: the order the filters apply in; a candidate's code is the 1-based position of the first that
#: flags it, and bit ``code - 1`` of its flags says whether that filter alone flags it
ORDER = FALSE_NEGATIVE_FILTERS
#: the code of a candidate no filter flagged
KEPT = 0
#: elements of the largest temporary of a block of rows
BLOCK_ELEMENTS = 1 << 22
#: the largest (image, text) bitmap the semantic filter builds (32 MiB); beyond, binary search
NEAR_BITMAP_BITS = 1 << 28


@dataclass(frozen=True)
class FilterInputs:
    """What the filters read, for a training split of ``len(text_ids)`` captions.

    Attributes:
        captions_per_image: captions per image; caption ``c`` belongs to image ``c // cpi``.
        text_ids: (N_c,) the same id for captions of the same normalised text.
        near_duplicates: sorted keys ``a * T + b`` (``a < b`` text ids, ``T`` distinct texts) of the
            text pairs whose sentence vectors' cosine is at least ``tau`` (``semantic``), or None.
        img_emb / cap_emb: the mining model's embeddings (``teacher``), or None.
        rho: the ``teacher`` threshold.
    """

    captions_per_image: int
    text_ids: np.ndarray
    near_duplicates: np.ndarray | None = None
    img_emb: np.ndarray | None = None
    cap_emb: np.ndarray | None = None
    rho: float = 0.95

    @cached_property
    def image_near_texts(self) -> np.ndarray:
        """Sorted keys ``i * T + t``: text ``t`` is one of image ``i``'s texts or near-duplicates
        one of them, so that ``semantic`` looks up one key per (image, text) instead of one per
        pair of texts."""
        if self.near_duplicates is None:
            raise ValueError("the semantic filter needs the near-duplicate text pairs")
        ids = self.text_ids
        n_texts = int(ids.max()) + 1
        a, b = np.divmod(self.near_duplicates, n_texts)
        src, dst = np.concatenate([a, b, np.arange(n_texts)]), np.concatenate([b, a, np.arange(n_texts)])
        order = np.argsort(src, kind="stable")
        starts = np.searchsorted(src[order], np.arange(n_texts + 1))
        counts = np.diff(starts)[ids]  # neighbours (itself included) of every caption's text
        first = np.repeat(starts[ids] - np.cumsum(counts) + counts, counts)
        neighbours = dst[order][first + np.arange(counts.sum())]
        images = np.repeat(np.arange(len(ids)) // self.captions_per_image, counts)
        # a sort and a comparison with the next key: np.unique (hash based in recent numpy) was
        # many times slower on these few million int64 keys
        keys = np.sort(images * n_texts + neighbours)
        return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys

    @cached_property
    def image_near_bitmap(self) -> np.ndarray | None:
        """:attr:`image_near_texts` as a bitmap over all (image, text) keys (bit ``k % 8`` of byte
        ``k // 8``), a lookup many times faster than a binary search; None when it would hold
        more than ``NEAR_BITMAP_BITS`` bits."""
        n_texts = int(self.text_ids.max()) + 1
        n_keys = (len(self.text_ids) // self.captions_per_image) * n_texts
        return None if n_keys > NEAR_BITMAP_BITS else _bitmap(self.image_near_texts, n_keys)

    @cached_property
    def text_near_bitmap(self) -> np.ndarray | None:
        """:attr:`image_near_bitmap` text-major, keys ``t * N_i + i``: the images tested for one
        caption anchor's text are then neighbouring bits, where the image-major layout puts
        every image in another cache line; None when it would hold more than
        ``NEAR_BITMAP_BITS`` bits."""
        n_images, n_texts = len(self.text_ids) // self.captions_per_image, int(self.text_ids.max()) + 1
        if n_images * n_texts > NEAR_BITMAP_BITS:
            return None
        images, texts = np.divmod(self.image_near_texts, n_texts)
        return _bitmap(np.sort(texts * n_images + images), n_images * n_texts)


def _bitmap(keys: np.ndarray, n_keys: int) -> np.ndarray:
    """Sorted distinct keys in ``[0, n_keys)`` as a bitmap (bit ``k % 8`` of byte ``k // 8``)."""
    bitmap = np.zeros((n_keys + 7) // 8, dtype=np.uint8)
    if len(keys):  # each byte's bits are one run of the sorted keys, or-ed by a reduceat (ufunc.at is slow)
        byte = keys >> 3
        starts = np.flatnonzero(np.concatenate([[True], byte[1:] != byte[:-1]]))
        bitmap[byte[starts]] = np.bitwise_or.reduceat((1 << (keys & 7)).astype(np.uint8), starts)
    return bitmap


def text_ids(captions: Sequence[str]) -> np.ndarray:
    """One int64 id per caption, equal for captions of the same normalised text (numbered in
    order of first appearance)."""
    keys: dict[str, int] = {}
    # each distinct caption is normalised once (datasets repeat captions); dict.fromkeys keeps
    # first appearances in order, so the ids are those of normalising every caption in turn
    ids = {c: keys.setdefault(normalised_text(c), len(keys)) for c in dict.fromkeys(captions)}
    return np.fromiter(map(ids.__getitem__, captions), dtype=np.int64, count=len(captions))


def near_duplicate_keys(vectors: np.ndarray, tau: float) -> np.ndarray:
    """The sorted keys ``a * T + b`` of the pairs ``a < b`` of the ``T`` unit vectors (one per
    distinct text, in text-id order) whose dot product is at least ``tau``, by an exact range
    search (FAISS, float32)."""
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    # the range search keeps scores above the radius: the next float32 below tau keeps "at least tau"
    limits, _, found = index.range_search(vectors, float(np.nextafter(np.float32(tau), np.float32(-1))))
    first = np.repeat(np.arange(len(vectors), dtype=np.int64), np.diff(limits.astype(np.int64)))
    keep = first < found
    return np.sort(first[keep] * len(vectors) + found[keep].astype(np.int64))


def flag_image_lists(lists: np.ndarray, inputs: FilterInputs, filters: Sequence[str]) -> np.ndarray:
    """Filter codes (uint8, ``KEPT`` or a filter's 1-based position in ``ORDER``) of every mined
    caption of every image's list ``lists`` (N_i, D)."""
    return first_flag(flag_bits(lists, inputs, filters, image_anchors=True), filters)


def flag_caption_lists(lists: np.ndarray, inputs: FilterInputs, filters: Sequence[str]) -> np.ndarray:
    """Filter codes of every mined image of every caption's list ``lists`` (N_c, D)."""
    return first_flag(flag_bits(lists, inputs, filters, image_anchors=False), filters)


def flag_bits(lists: np.ndarray, inputs: FilterInputs, filters: Sequence[str], image_anchors: bool) -> np.ndarray:
    """Per candidate, one bit per filter of ``filters`` that flags it on its own (bit ``k`` for
    ``ORDER[k]``; uint8), image anchors' lists or caption anchors' lists."""
    return flag_rows(lists, np.arange(np.shape(lists)[0]), inputs, filters, image_anchors)


def flag_rows(lists: np.ndarray, rows: np.ndarray, inputs: FilterInputs, filters: Sequence[str],
              image_anchors: bool) -> np.ndarray:
    """:func:`flag_bits` of the anchors ``rows`` only, whose candidates are ``lists`` (one row of
    ``lists`` per anchor of ``rows``)."""
    unknown = sorted(set(filters) - set(ORDER))
    if unknown:
        raise ValueError(f"unknown false-negative filters {unknown}; expected some of {list(ORDER)}")
    lists, rows = np.asarray(lists, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    bits = np.zeros(lists.shape, dtype=np.uint8)
    dim = inputs.img_emb.shape[1] if "teacher" in filters and inputs.img_emb is not None else 1
    step = max(1, BLOCK_ELEMENTS // (max(1, lists.shape[1]) * inputs.captions_per_image * dim))
    for start in range(0, len(rows), step):
        block = slice(start, min(start + step, len(rows)))
        hits = {name: _TESTS[name](rows[block], lists[block], inputs, image_anchors)
                for name in ("semantic", "teacher") if name in filters}
        if "identity" in filters and "semantic" in hits:  # identical texts are near-identical too:
            r, c = np.nonzero(hits["semantic"])  # test identity only where semantic flagged
            hits["identity"] = np.zeros_like(hits["semantic"])
            hits["identity"][r, c] = _identity(rows[block][r], lists[block][r, c][:, None], inputs, image_anchors)[:, 0]
        elif "identity" in filters:
            hits["identity"] = _identity(rows[block], lists[block], inputs, image_anchors)
        for k, name in enumerate(ORDER):
            if name in hits:
                bits[block] |= hits[name].astype(np.uint8) << k
    return bits


def first_flag(bits: np.ndarray, filters: Sequence[str]) -> np.ndarray:
    """The code of each candidate under the enabled ``filters``: the first of them (in ``ORDER``)
    whose bit is set, ``KEPT`` when none."""
    codes = np.zeros(np.shape(bits), dtype=np.uint8)
    for k, name in reversed(list(enumerate(ORDER))):
        if name in filters:
            codes[(np.asarray(bits) >> k & 1).astype(bool)] = k + 1
    return codes


def enabled_bits(filters: Sequence[str]) -> int:
    """The flag bits of the enabled ``filters``: a candidate is kept (its :func:`first_flag` is
    ``KEPT``) exactly where its flags and these have no bit in common."""
    return sum(1 << k for k, name in enumerate(ORDER) if name in filters)


def _own_captions(images: np.ndarray, cpi: int) -> np.ndarray:
    """(..., cpi) caption ids of the images."""
    return images[..., None] * cpi + np.arange(cpi)


def _text_pairs(rows: np.ndarray, cands: np.ndarray, inputs: FilterInputs,
                image_anchors: bool) -> tuple[np.ndarray, np.ndarray]:
    """The text ids to compare, broadcast to (rows, candidates, cpi): the candidate caption's
    against the image's own (image anchors), the anchor caption's against the candidate image's."""
    cpi, ids = inputs.captions_per_image, inputs.text_ids
    if image_anchors:
        return ids[cands][:, :, None], ids[_own_captions(rows, cpi)][:, None, :]
    return ids[rows][:, None, None], ids[_own_captions(cands, cpi)]


def _identity(rows: np.ndarray, cands: np.ndarray, inputs: FilterInputs, image_anchors: bool) -> np.ndarray:
    a, b = _text_pairs(rows, cands, inputs, image_anchors)
    return (a == b).any(axis=2)


def _semantic(rows: np.ndarray, cands: np.ndarray, inputs: FilterInputs, image_anchors: bool) -> np.ndarray:
    n_texts = int(inputs.text_ids.max()) + 1
    if image_anchors:  # the candidate caption's text near one of the anchor image's texts
        keys = rows[:, None] * n_texts + inputs.text_ids[cands]
    else:  # the anchor caption's text near one of the candidate image's texts
        keys = cands * n_texts + inputs.text_ids[rows][:, None]
    bitmap = inputs.image_near_bitmap
    if bitmap is not None:
        return (bitmap[keys >> 3] >> (keys & 7).astype(np.uint8) & 1).astype(bool)
    near = inputs.image_near_texts
    return near[np.minimum(np.searchsorted(near, keys), len(near) - 1)] == keys


def _teacher(rows: np.ndarray, cands: np.ndarray, inputs: FilterInputs, image_anchors: bool) -> np.ndarray:
    img, cap, cpi = inputs.img_emb, inputs.cap_emb, inputs.captions_per_image
    if img is None or cap is None:
        raise ValueError("the teacher filter needs the mining model's embeddings")
    if image_anchors:
        scores = np.einsum("rd,rkd->rk", img[rows], cap[cands])
        positive = np.einsum("rd,rjd->rj", img[rows], cap[_own_captions(rows, cpi)]).mean(axis=1)
    else:
        scores = np.einsum("rd,rkd->rk", cap[rows], img[cands])
        positive = np.einsum("rd,rd->r", cap[rows], img[rows // cpi])
    return scores > inputs.rho * positive[:, None]


_TESTS = {"identity": _identity, "semantic": _semantic, "teacher": _teacher}


def compact(lists: np.ndarray, codes: np.ndarray, depth: int) -> np.ndarray | None:
    """The first ``depth`` unflagged ids of every row, in list order; None when a row has fewer
    (mine deeper and filter again)."""
    lists = np.asarray(lists)
    out = np.empty((lists.shape[0], depth), dtype=np.int32)
    # one compiled walk per row that stops at its depth: a stable argsort of the flags sorted
    # every row in full (deep lists are many times deeper than what they keep)
    return out if _compact_rows(lists, np.asarray(codes) == KEPT, depth, out) else None


@njit(nogil=True, cache=True)
def _compact_rows(lists: np.ndarray, kept: np.ndarray, depth: int, out: np.ndarray) -> bool:
    """The first ``depth`` ids of every row of ``lists`` where ``kept``, in list order, into
    ``out``; False (``out`` incomplete) when a row keeps fewer."""
    for r in range(lists.shape[0]):
        j = 0
        for c in range(lists.shape[1]):
            if j == depth:
                break
            if kept[r, c]:
                out[r, j] = lists[r, c]
                j += 1
        if j < depth:
            return False
    return True
