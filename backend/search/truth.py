"""The correct answers of a query under the model's evaluation rule (``eval.positives``,
docs/evaluation.md), in the searched scope and in the evaluation split, and where the best of
them ranks.

- ``pair``: a caption's correct image is its own; an image's correct captions are its own.
- ``text``: a text's correct images are every image one of whose captions has that normalised
  text; an image's correct captions are every caption whose text is one of its own captions'.

A query is known when it is a gallery item: a text equal (normalised) to a gallery caption, or a
gallery image. The rank in the evaluation split is the one ``aoq index`` stored for the failure
cases and ``aoq evaluate`` averages; the rank in the scope is the one the results list shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aoq.names import PositiveRule
from aoq_serve.index.faiss_index import tied_rank
from aoq_serve.schemas import Scope
from aoq_serve.search.gallery import GalleryView

_NONE = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Truth:
    """Positions of the correct items (images for a text, captions for an image): in the
    searched scope, and in the evaluation split when the query is one of its items."""

    in_scope: np.ndarray
    in_eval: np.ndarray
    #: t2i: the gallery caption the query matched (the pair rule's own image is its image).
    caption: int | None = None


NO_TRUTH = Truth(_NONE, _NONE)


def _within(positions: np.ndarray, span: range) -> np.ndarray:
    return positions[(positions >= span.start) & (positions < span.stop)]


def text_truth(view: GalleryView, rule: PositiveRule, text: str, scope: Scope) -> Truth:
    """The correct images of a sentence (none when it is no gallery caption's text)."""
    key = view.key_of_text(text)
    if key is None:
        return NO_TRUTH
    copies = view.key_captions(key)
    evaluated = _within(copies, view.eval.captions)
    if rule == "text":
        holders = np.unique(view.caption_owner[copies])
        caption = int(evaluated[0]) if evaluated.size else int(copies[0])
        return Truth(_within(holders, view.image_range(scope)), _within(holders, view.eval.images), caption)
    # pair: the own image of one caption of that text, the evaluation split's first when it has one
    scoped = _within(copies, view.caption_range(scope))
    caption = int(evaluated[0] if evaluated.size else scoped[0] if scoped.size else copies[0])
    own = view.caption_owner[caption : caption + 1]
    return Truth(_within(own, view.image_range(scope)), own if evaluated.size else _NONE, caption)


def image_truth(view: GalleryView, rule: PositiveRule, image: int, scope: Scope) -> Truth:
    """The correct captions of a gallery image."""
    captions = view.captions_of(image)
    own = np.arange(captions.start, captions.stop, dtype=np.int64)
    evaluated = image in view.eval.images
    if rule == "pair":
        return Truth(_within(own, view.caption_range(scope)), own if evaluated else _NONE)

    def holding(span: range) -> np.ndarray:
        return np.sort(np.concatenate([_NONE] + [view.key_captions(int(k), span) for k in np.unique(view.keys[own])]))

    return Truth(holding(view.caption_range(scope)), holding(view.eval.captions) if evaluated else _NONE)


def rank_among(scores: np.ndarray, span: range, truth: np.ndarray) -> float:
    """Rank of the best of ``truth`` (positions) among the items of ``span``, from ``scores`` of
    those items (``scores[i]`` is position ``span.start + i``)."""
    correct = np.zeros(len(scores), dtype=bool)
    correct[truth - span.start] = True
    return tied_rank(scores[~correct], scores[correct])
