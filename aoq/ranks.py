"""Where each query's answer lands among the gallery: ties by expected rank, identical texts as
one answer (docs/evaluation.md, Ties and Positives).

**Positives.** The matches of a query are a set of (image, caption) pairs, :class:`Positives`:

* ``pair`` (the published COCO / Flickr30K protocol): caption ``c`` matches image ``c // cpi``
  only;
* ``text``: caption ``c`` also matches every image one of whose own captions has the same
  normalised text (:func:`aoq.data.facts.normalised_text`). Identical texts embed identically,
  so on a dataset whose pictures share caption texts (emoji vendors, COCO's repeated captions)
  the pair rule cannot tell them apart and scores 0 image->text R@1 for every model.

**Ties.** A query's rank is where its best positive lands when the tied items are put in a
uniformly random order. With ``above`` negatives scoring strictly more than the best positive,
``tied`` negatives scoring the same and ``peers`` positives sharing that best score, the number
``X`` of tied negatives placed before the first of the peers has

    P(X >= j) = prod_{i < j} (tied - i) / (tied + peers - i),    E[X] = tied / (peers + 1),

so ``R@K = P(above + X < K)`` and the expected 0-based rank is ``above + tied / (peers + 1)``.
Constant scores give exactly the chance level, and a positive tied with one negative is half a
hit at K = 1. Scores are compared exactly, as float values of the array or block that holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from aoq.data.facts import normalised_text

#: ``fn(image_slice, caption_slice) -> scores`` of those images against those captions.
SimsFn = Callable[[slice, slice], np.ndarray]
#: number of score elements handled per block (bounds the temporary boolean arrays).
BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Positives:
    """The matching (image, caption) pairs of a gallery of ``n_images`` images and
    ``cpi * n_images`` captions, as two parallel int64 arrays, sorted by image then caption."""

    n_images: int
    captions_per_image: int
    images: np.ndarray
    captions: np.ndarray

    @classmethod
    def pairs(cls, n_images: int, captions_per_image: int) -> Positives:
        """Each caption matches its own image only."""
        captions = np.arange(n_images * captions_per_image, dtype=np.int64)
        return cls(n_images, captions_per_image, captions // captions_per_image, captions)

    @classmethod
    def texts(cls, texts: Sequence[str], captions_per_image: int) -> Positives:
        """Each caption matches every image that has a caption of the same normalised text."""
        n_captions = len(texts)
        n_images = n_captions // captions_per_image
        check_layout(n_images, n_captions, captions_per_image, what="caption texts")
        keys = {t: k for k, t in enumerate(dict.fromkeys(normalised_text(t) for t in texts))}
        text_id = np.fromiter((keys[normalised_text(t)] for t in texts), dtype=np.int64, count=n_captions)
        owner = np.arange(n_captions, dtype=np.int64) // captions_per_image
        # (text, image) once per image that has the text, then every caption of that text
        holders = np.unique(np.stack([text_id, owner], axis=1), axis=0)
        by_text = np.argsort(text_id, kind="stable")
        first = np.searchsorted(text_id[by_text], np.arange(len(keys) + 1))
        sizes = first[holders[:, 0] + 1] - first[holders[:, 0]]
        images = np.repeat(holders[:, 1], sizes)
        captions = np.concatenate([by_text[first[t]:first[t + 1]] for t in holders[:, 0]]) if len(holders) else \
            np.empty(0, dtype=np.int64)
        order = np.lexsort((captions, images))
        return cls(n_images, captions_per_image, images[order], captions[order].astype(np.int64))

    def holds(self, captions: np.ndarray, images: np.ndarray) -> np.ndarray:
        """Element-wise: is caption ``captions[k]`` a positive of image ``images[k]``? (bool array):
        the evaluation's own rule, for counting false negatives among mined candidates."""
        captions = np.asarray(captions, dtype=np.int64).reshape(-1)
        images = np.asarray(images, dtype=np.int64).reshape(-1)
        n_captions = self.n_images * self.captions_per_image
        keys = self.images * n_captions + self.captions  # sorted: the pairs are sorted by image, then caption
        wanted = images * n_captions + captions
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        return keys[at] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)

    @property
    def merged(self) -> int:
        """Pairs matched beyond each caption's own image: how many duplicates the text rule merged."""
        return len(self.images) - self.n_images * self.captions_per_image

    def fold(self, first_image: int, n_images: int) -> Positives:
        """The positives within images ``[first_image, first_image + n_images)`` and their
        captions, re-indexed from 0 (a COCO 1K fold)."""
        cpi = self.captions_per_image
        lo, hi = first_image, first_image + n_images
        keep = (self.images >= lo) & (self.images < hi) & (self.captions >= lo * cpi) & (self.captions < hi * cpi)
        return Positives(n_images, cpi, self.images[keep] - lo, self.captions[keep] - lo * cpi)


@dataclass(frozen=True)
class RankStats:
    """Per query: negatives strictly above its best positive, negatives tied with it, and
    positives sharing that best score (at least 1)."""

    above: np.ndarray
    tied: np.ndarray
    peers: np.ndarray

    def expected(self) -> np.ndarray:
        """0-based expected rank under a uniformly random order of tied items (float64)."""
        return self.above + self.tied / (self.peers + 1.0)

    def hit_probability(self, k: int) -> np.ndarray:
        """P(rank < k) per query: 1 when the best positive is certainly in the top ``k``, 0 when
        certainly not, a fraction when the cut falls inside its tie group."""
        room = k - self.above  # how many tied negatives may precede the first peer
        miss = np.ones(len(self.above), dtype=np.float64)  # P(X >= room)
        tied, total = self.tied.astype(np.float64), (self.tied + self.peers).astype(np.float64)
        for i in range(int(max(0, room.max(initial=0)))):
            # past the tie group the numerator is 0 (X <= tied); the denominator stays >= 1 there
            miss *= np.where(i < room, np.maximum(tied - i, 0.0) / np.maximum(total - i, 1.0), 1.0)
        return np.where(room <= 0, 0.0, 1.0 - miss)


def check_layout(n_images: int, n_captions: int, captions_per_image: int, what: str = "sims") -> None:
    if not isinstance(captions_per_image, (int, np.integer)) or captions_per_image < 1:
        raise ValueError(f"captions_per_image must be a positive integer, got {captions_per_image!r}")
    if n_images < 1:
        raise ValueError(f"{what}: needs at least one image, got {n_images}")
    if n_captions != captions_per_image * n_images:
        raise ValueError(
            f"{what}: {n_captions} captions for {n_images} images, expected "
            f"captions_per_image * n_images = {captions_per_image * n_images}"
        )


def _blocks(total: int, other: int):
    """Slices of ``total`` so that one block holds about ``BLOCK_ELEMENTS`` elements."""
    step = max(1, BLOCK_ELEMENTS // max(1, other))
    for start in range(0, total, step):
        yield slice(start, min(start + step, total))


def _stats(block: np.ndarray, query: np.ndarray, item: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """(above, tied, peers) of each query of ``block`` (queries along the other axis than
    ``axis``); its positives are the cells ``(query[j], item[j])``, query indices local to the block."""
    n = block.shape[1 - axis]
    values = block[query, item] if axis == 1 else block[item, query]
    # A NaN positive would compare False against everything and rank first; scanning every score
    # for NaN would cost as much as ranking, so only the positives are checked.
    if np.isnan(values).any():
        raise ValueError("the scores of positive pairs contain NaN: ranks would be meaningless")
    best = np.full(n, -np.inf, dtype=np.float64)
    np.maximum.at(best, query, values)
    if np.isneginf(best).any():
        raise ValueError("a query has no positive (or only -inf scores for them): its rank is undefined")
    level = best.astype(block.dtype)[:, None] if axis == 1 else best.astype(block.dtype)[None, :]
    above = np.count_nonzero(block > level, axis=axis)
    peers = np.bincount(query, weights=values == best[query], minlength=n).astype(np.int64)
    return above, np.count_nonzero(block == level, axis=axis) - peers, peers


def _by(keys: np.ndarray, n: int) -> np.ndarray:
    """Where each of the ``n`` key values starts in the sorted ``keys`` (``n + 1`` offsets)."""
    return np.searchsorted(keys, np.arange(n + 1))


def i2t_stats(fn: SimsFn, positives: Positives) -> RankStats:
    """Rank statistics of every image query against all captions, in image blocks."""
    n_images, n_captions = positives.n_images, positives.n_images * positives.captions_per_image
    starts = _by(positives.images, n_images)
    out = [np.empty(n_images, dtype=np.int64) for _ in range(3)]
    for rows in _blocks(n_images, n_captions):
        block = np.asarray(fn(rows, slice(0, n_captions)))
        lo, hi = starts[rows.start], starts[rows.stop]
        stats = _stats(block, positives.images[lo:hi] - rows.start, positives.captions[lo:hi], axis=1)
        for array, value in zip(out, stats):
            array[rows] = value
    return RankStats(*out)


def t2i_stats(fn: SimsFn, positives: Positives) -> RankStats:
    """Rank statistics of every caption query against all images, in caption blocks (each
    positive compared inside the very block it is read from, so a blockwise product is never
    compared with a differently rounded copy)."""
    n_images, n_captions = positives.n_images, positives.n_images * positives.captions_per_image
    order = np.lexsort((positives.images, positives.captions))
    caps, imgs = positives.captions[order], positives.images[order]
    starts = _by(caps, n_captions)
    out = [np.empty(n_captions, dtype=np.int64) for _ in range(3)]
    for cols in _blocks(n_captions, n_images):
        block = np.asarray(fn(slice(0, n_images), cols))
        lo, hi = starts[cols.start], starts[cols.stop]
        for array, value in zip(out, _stats(block, caps[lo:hi] - cols.start, imgs[lo:hi], axis=0)):
            array[cols] = value
    return RankStats(*out)


def array_fn(sims: np.ndarray) -> SimsFn:
    """The sims function of a score array."""
    return lambda rows, cols: sims[rows, cols]
