"""What the service knows of a gallery's items beyond their embeddings: the split each one comes
from, its name, its caption texts as the evaluation rule compares them, and the two search
scopes (the whole catalogue, or the evaluation split alone).

A gallery is one or more catalogued splits of a dataset, in id order: ``aoq index`` assigns each
split one contiguous run of image ids and one of caption ids, so every split, and in particular
the evaluation split, is one contiguous range of positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aoq.data.facts import normalised_text
from aoq_serve.schemas import Scope


@dataclass(frozen=True)
class Span:
    """Where one split lies in the gallery: its image and caption positions."""

    split: str
    images: range
    captions: range


class GalleryView:
    """Splits, names and caption-text identities of a gallery's items, by position.

    Args:
        spans: the gallery's splits in position order (they tile both position ranges).
        caption_owner: ``caption_owner[c]``: position of the image caption ``c`` belongs to
            (non-decreasing: captions follow their images).
        captions: caption texts by position.
        eval_split: the split the evaluation, its ranks and the failure cases use.
    """

    def __init__(self, spans: Sequence[Span], caption_owner: np.ndarray, captions: Sequence[str],
                 eval_split: str) -> None:
        by_split = {s.split: s for s in spans}
        if eval_split not in by_split:
            raise ValueError(f"the evaluation split {eval_split!r} is not in the gallery ({', '.join(by_split)})")
        self.spans = tuple(spans)
        self.eval = by_split[eval_split]
        self.caption_owner = np.asarray(caption_owner, dtype=np.int64)
        self.n_images = self.spans[-1].images.stop if self.spans else 0
        self.n_captions = len(captions)
        # Captions of image p are caption_owner's run of p: [first[p], first[p + 1]).
        self._first = np.searchsorted(self.caption_owner, np.arange(self.n_images + 1))
        keys: dict[str, int] = {}
        self.keys = np.fromiter((keys.setdefault(normalised_text(t), len(keys)) for t in captions),
                                dtype=np.int64, count=len(captions))
        self._key_of = keys
        order = np.argsort(self.keys, kind="stable")
        self._by_key = order  # caption positions grouped by key, increasing within a key
        self._key_start = np.searchsorted(self.keys[order], np.arange(len(keys) + 1))
        self._names = [captions[f] if f < len(captions) else "" for f in self._first[:-1]]
        # each image's caption texts normalised, for the gallery's filter box
        self._search_text = ["\n".join(normalised_text(c) for c in captions[self._first[p]:self._first[p + 1]])
                             for p in range(self.n_images)]

    # -- items --------------------------------------------------------------------------------

    def name(self, image_position: int) -> str:
        """An image's name: its first caption (for the emoji set, the CLDR short name)."""
        return self._names[image_position]

    def image_split(self, image_position: int) -> str:
        return next(s.split for s in self.spans if image_position in s.images)

    def caption_split(self, caption_position: int) -> str:
        return next(s.split for s in self.spans if caption_position in s.captions)

    def captions_of(self, image_position: int) -> range:
        """Caption positions of an image."""
        return range(int(self._first[image_position]), int(self._first[image_position + 1]))

    # -- scopes -------------------------------------------------------------------------------

    def image_range(self, scope: Scope) -> range:
        return self.eval.images if scope == "test" else range(self.n_images)

    def caption_range(self, scope: Scope) -> range:
        return self.eval.captions if scope == "test" else range(self.n_captions)

    # -- caption texts as one answer ----------------------------------------------------------

    def key_of_text(self, text: str) -> int | None:
        """The identity of a text among the gallery's captions (normalised), or None."""
        return self._key_of.get(normalised_text(text))

    def key_captions(self, key: int, within: range | None = None) -> np.ndarray:
        """Caption positions holding text ``key`` (increasing), those in ``within`` when given."""
        positions = self._by_key[self._key_start[key]:self._key_start[key + 1]]
        if within is None:
            return positions
        lo, hi = np.searchsorted(positions, [within.start, within.stop])
        return positions[lo:hi]

    def copies(self, key: int, within: range) -> int:
        """How many captions of ``within`` hold text ``key``."""
        return len(self.key_captions(key, within))

    # -- browsing -----------------------------------------------------------------------------

    def matching(self, query: str, within: range) -> np.ndarray:
        """Image positions of ``within`` one of whose captions contains ``query`` (case folded)."""
        needle = normalised_text(query)
        if not needle:
            return np.arange(within.start, within.stop, dtype=np.int64)
        return np.fromiter((p for p in within if needle in self._search_text[p]), dtype=np.int64)
