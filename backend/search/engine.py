"""The two searches, on one served model: a sentence against the gallery images, an image
(a gallery image id or an upload) against the gallery captions.

Scope ``all`` ranks every split the index holds (FAISS); scope ``test`` ranks the evaluation
split alone, scored exactly against its embeddings (one matrix-vector product: an evaluation
split is small next to a training split). The correct answers follow the model's evaluation
rule (:mod:`aoq_serve.search.truth`); under the text rule the captions of one text are one answer, so an
image query lists each text once with the number of captions it stands for.

``normalise`` re-ranks by a query-time hubness correction (:mod:`aoq.hubness`, docs/serving.md,
Hubness correction) with the normalisers stored with the index: scope ``test`` normalises every
score of the split (exact, as ``aoq evaluate --hubness``); scope ``all`` re-ranks a FAISS pool of
``CANDIDATE_FACTOR * k`` raw candidates (an item the normaliser would lift from beyond the pool is
missed). A scope that holds the bank's own split (scope ``all`` holds the training split) is refused
a correction (:func:`check_bank`): it would push every training item down. Ranks of the ground truth are always computed on every normalised score of the scope.

Two ranks of the ground truth are given: in the searched scope (what the list shows) and among
the evaluation split's items (what the failure cases and the metrics count). A rank is read
from the results when they hold everything scoring at or above the best correct item;
otherwise it is computed against every embedding of the scope.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from aoq.hubness import CANDIDATE_FACTOR, Normaliser, normalise_rows, query_applies, rerank
from aoq.names import Normalisation, PositiveRule
from aoq_serve.errors import ServiceError
from aoq_serve.index import faiss_index
from aoq_serve.index.bank import MANIFEST_KEY as BANK_KEY
from aoq_serve.registry import ServingModel
from aoq_serve.schemas import (
    THUMBNAIL_SIZE,
    CaptionHit,
    GalleryImage,
    ImageHit,
    Scope,
    SearchContext,
    SearchImageOut,
    SearchTextOut,
)
from aoq_serve.search import batching
from aoq_serve.search.featurize import encode_text, encode_upload
from aoq_serve.search.gallery import GalleryView
from aoq_serve.search.truth import Truth, image_truth, rank_among, text_truth

#: named ground-truth images an answer carries (a text of many copies has many correct images).
MAX_NAMED_TRUTH = 8
#: an image query under the text rule asks for this many times k captions, then more until it
#: has k distinct texts.
FETCH_FACTOR = 4


@dataclass(frozen=True)
class Urls:
    """Absolute URLs of images, built from the service's public base (:func:`aoq_serve.guards.hosts.public_base`)."""

    base: str

    def image(self, image_id: int) -> str:
        return f"{self.base}/images/{image_id}"

    def thumbnail(self, image_id: int, size: int = THUMBNAIL_SIZE) -> str:
        return f"{self.base}/images/{image_id}?size={size}"


def gallery_image(served: ServingModel, position: int, urls: Urls) -> GalleryImage:
    """The image at a gallery position, named."""
    view = served.gallery.view
    image_id = int(served.gallery.ids.image_ids[position])
    return GalleryImage(image_id=image_id, name=view.name(position), split=view.image_split(position),
                        image_url=urls.image(image_id), thumbnail_url=urls.thumbnail(image_id))


def _rule(served: ServingModel) -> PositiveRule:
    return served.checkpoint.config.eval.positives


@dataclass(frozen=True)
class _Query:
    """One search on one served model: what it ranks (``modality``: the gallery's images or
    captions), the query's vector, the scope searched and the normalisation.

    A scope's scores (a matrix-vector product over the scope, then its normalisation) are
    computed at most once per search: its top list, the ranks of the correct items and the text
    rule's wider caption lists all read them from ``_scored``, which the same query in another
    scope (:meth:`within`) shares.
    """

    served: ServingModel
    modality: str
    vector: np.ndarray
    scope: Scope
    normalise: Normalisation
    _scored: dict[Scope, tuple[np.ndarray, bool]] = field(default_factory=dict, repr=False, compare=False)

    def within(self, scope: Scope) -> _Query:
        """The same query searching ``scope``."""
        return replace(self, scope=scope, _scored=self._scored)

    def span(self, scope: Scope | None = None) -> range:
        """Gallery positions of the ranked items of a scope (default: the searched one)."""
        view, scope = self.served.gallery.view, scope or self.scope
        return view.image_range(scope) if self.modality == "images" else view.caption_range(scope)

    def scored(self, scope: Scope | None = None) -> tuple[np.ndarray, bool]:
        """Every score of a scope under ``normalise`` (indexed from the scope's first item), and
        whether the query was normalised.

        Raises:
            ServiceError: 409 a normalisation on an index built without a hubness bank.
        """
        scope = scope or self.scope
        if scope not in self._scored:
            span = self.span(scope)
            embeddings = self.served.index.embeddings[self.modality][span.start:span.stop]
            raw = np.asarray(embeddings @ self.vector.astype(np.float32), dtype=np.float32)
            if self.normalise == "none":
                self._scored[scope] = raw, False
            else:
                normaliser = _normaliser(self, scope)
                applied = bool(query_applies(self.normalise, np.argmax(raw)[None], normaliser.active)[0])
                self._scored[scope] = normalise_rows(raw[None, :], normaliser, self.normalise)[0], applied
        return self._scored[scope]


def check_bank(served: ServingModel, scope: Scope, normalise: Normalisation) -> None:
    """Refuse a hubness correction in a scope that holds its bank's own split: the bank (the
    training captions or images) retrieves its own split's items most, so the correction pushes
    every one of them down and the list is biased against them.

    Raises:
        ServiceError: 422 naming the split and the principled alternatives.
    """
    if normalise == "none" or served.index.hubness is None:
        return
    bank = (served.index.config.get(BANK_KEY) or {}).get("split")
    view = served.gallery.view
    held = [s.split for s in view.spans] if scope == "all" else [view.eval.split]
    if bank in held:
        raise ServiceError(422, f"hubness correction {normalise!r} is refused in scope {scope!r}: it holds the "
                                f"{bank} split, whose items are the correction's own bank, so every {bank} item "
                                "would be pushed down; search scope 'test' (the evaluation split, disjoint from the "
                                "bank) or use normalise 'none'")


def _normaliser(query: _Query, scope: Scope) -> Normaliser:
    """The stored normaliser of a scope's items (indexed from the scope's first item).

    Raises:
        ServiceError: 409 the index was built without a hubness bank.
    """
    served = query.served
    if served.index.hubness is None:
        raise ServiceError(409, f"model {served.name!r}: its index holds no hubness bank (built before normalisation "
                                "existed); run aoq index again, or search with normalise none")
    whole = served.index.hubness[query.modality][scope]
    span = query.span(scope) if scope == "test" else range(len(whole.active))
    return Normaliser(log_denominator=whole.log_denominator[span.start:span.stop],
                      active=whole.active[span.start:span.stop], beta=whole.beta)


@dataclass(frozen=True)
class _Top:
    """A scope's best items, best first, and whether the query was normalised."""

    scores: np.ndarray
    positions: np.ndarray
    normalised: bool


def _top(query: _Query, k: int) -> _Top:
    """The top ``k`` (scores, gallery positions) of the searched scope, best first."""
    if query.scope == "all":
        plain = query.normalise == "none"
        normaliser = None if plain else _normaliser(query, "all")
        scores, ids = batching.search(query.served.index.faiss[query.modality], query.vector,
                                      k if plain else k * CANDIDATE_FACTOR)
        positions = np.searchsorted(query.served.index.ids[query.modality], ids)
        return _Top(*rerank(query.normalise, scores, positions, normaliser, k))
    scores, applied = query.scored()
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.lexsort((top, -scores[top]))]
    return _Top(scores[top], top + query.span().start, applied)


def _exact(query: _Query) -> bool:
    """Whether a top list holds everything scoring above its last item (a re-ranked pool need not)."""
    return query.scope == "test" or (query.served.index.config["index_type"] == "flat" and query.normalise == "none")


def _scope_rank(query: _Query, top: _Top, truth: np.ndarray) -> float:
    found = np.isin(top.positions, truth)
    if found.any() and _exact(query):
        # Exact top list: everything scoring at or above the best correct item is in it too,
        # unless a tie runs past the cut (the last score equals it): then rank the whole scope.
        best = top.scores[found].max()
        if top.scores[-1] < best:
            return faiss_index.tied_rank(top.scores[~found], top.scores[found])
    return rank_among(query.scored()[0], query.span(), truth)


def _ranks(query: _Query, top: _Top, truth: Truth) -> tuple[float | None, float | None]:
    """(rank in the scope, rank in the evaluation split) of the best correct item."""
    in_scope = _scope_rank(query, top, truth.in_scope) if truth.in_scope.size else None
    if not truth.in_eval.size:
        return in_scope, None
    if query.scope == "test":
        return in_scope, in_scope
    return in_scope, rank_among(query.scored("test")[0], query.span("test"), truth.in_eval)


def _context(query: _Query, top: _Top) -> SearchContext:
    view = query.served.gallery.view
    return SearchContext(scope=query.scope, searched=len(query.span()), eval_split=view.eval.split,
                         positives=_rule(query.served), normalise=query.normalise, normalised=top.normalised)


def search_text(served: ServingModel, query: str, k: int, urls: Urls, scope: Scope = "all",
                normalise: Normalisation = "none", intended: str | None = None) -> SearchTextOut:
    """Rank the images of a scope for a sentence; ``intended`` (a caption text) names the correct
    answers of a free-text sentence (none when no caption of the gallery has it: a dataset subset
    may lack a showcased example's answer).

    Raises:
        ServiceError: 409 a normalisation on an index built without a hubness bank; 422 a
            normalisation in a scope holding the bank's split.
    """
    start = time.perf_counter()
    check_bank(served, scope, normalise)
    view, ids = served.gallery.view, served.gallery.ids
    ask = _Query(served, "images", encode_text(served.checkpoint, query), scope, normalise)
    top = _top(ask, k)
    scores, positions = top.scores, top.positions
    truth = text_truth(view, _rule(served), intended or query, scope)
    scope_rank, eval_rank = _ranks(ask, top, truth)
    correct = set(truth.in_scope.tolist())
    results = [ImageHit(rank=r + 1, score=float(s), is_ground_truth=int(p) in correct,
                        **gallery_image(served, int(p), urls).model_dump())
               for r, (s, p) in enumerate(zip(scores, positions))]
    outside = None
    if scope == "test" and normalise == "none":  # scope all is refused a correction (check_bank)
        wide_top = _top(ask.within("all"), k)
        wide_scores, wide = wide_top.scores, wide_top.positions
        beyond = [r for r, p in enumerate(wide) if p not in view.eval.images]
        if beyond:
            r = beyond[0]
            outside = ImageHit(rank=r + 1, score=float(wide_scores[r]), is_ground_truth=False,
                               **gallery_image(served, int(wide[r]), urls).model_dump())
    return SearchTextOut(
        model=served.name, query=query, intended=intended,
        caption_id=None if truth.caption is None else int(ids.caption_ids[truth.caption]),
        query_split=None if truth.caption is None else view.caption_split(truth.caption),
        context=_context(ask, top),
        ground_truth_ids=[int(ids.image_ids[p]) for p in truth.in_scope],
        ground_truth=[gallery_image(served, int(p), urls) for p in truth.in_scope[:MAX_NAMED_TRUTH]],
        scope_rank=scope_rank, ground_truth_rank=eval_rank, results=results, outside=outside,
        latency_ms=(time.perf_counter() - start) * 1000,
    )


@dataclass(frozen=True)
class _Row:
    rank: int
    position: int
    score: float
    copies: int


def _caption_rows(view: GalleryView, rule: PositiveRule, scores: np.ndarray, positions: np.ndarray, k: int,
                  span: range, own: dict[int, int]) -> list[_Row]:
    """The first ``k`` rows of a caption list: every caption under the pair rule; under the text
    rule each text once, at the rank of its best caption, shown by the query image's own caption
    of that text when it has one (``own``: key -> position)."""
    if rule == "pair":
        return [_Row(r + 1, int(p), float(s), 1) for r, (s, p) in enumerate(zip(scores[:k], positions[:k]))]
    rows: list[_Row] = []
    seen: set[int] = set()
    descending = -scores
    for s, p in zip(scores, positions):
        key = int(view.keys[p])
        if key in seen:
            continue
        seen.add(key)
        above = int(np.searchsorted(descending, -s, side="left"))  # captions scoring strictly more
        rows.append(_Row(above + 1, own.get(key, int(p)), float(s), view.copies(key, span)))
        if len(rows) == k:
            break
    return rows


def _listed(query: _Query, k: int, own: dict[int, int]) -> tuple[list[_Row], _Top]:
    """The rows of a caption list and the top list they were read from: under the text rule,
    wider searches until ``k`` distinct texts are found or the scope is exhausted."""
    view, rule = query.served.gallery.view, _rule(query.served)
    span = query.span()
    fetch = k if rule == "pair" else min(len(span), k * FETCH_FACTOR)
    while True:
        top = _top(query, fetch)
        rows = _caption_rows(view, rule, top.scores, top.positions, k, span, own)
        if len(rows) >= k or fetch >= len(span):
            return rows, top
        fetch = min(len(span), fetch * FETCH_FACTOR)


def _caption_hit(served: ServingModel, row: _Row, correct: set[int], urls: Urls) -> CaptionHit:
    gallery, view = served.gallery, served.gallery.view
    owner = int(view.caption_owner[row.position])
    image_id = int(gallery.ids.image_ids[owner])
    return CaptionHit(rank=row.rank, caption_id=int(gallery.ids.caption_ids[row.position]),
                      text=gallery.captions[row.position], copies=row.copies, image_id=image_id,
                      image_name=view.name(owner), split=view.caption_split(row.position),
                      thumbnail_url=urls.thumbnail(image_id), score=row.score,
                      is_ground_truth=row.position in correct)


def gallery_query(served: ServingModel, image_id: int, scope: Scope,
                  urls: Urls) -> tuple[int, Truth, dict[int, int], list[str], GalleryImage]:
    """A gallery image as a query: its position, its truth in ``scope``, its own captions (key ->
    position), their distinct texts and its picture.

    Raises:
        ServiceError: 404 the id is not a gallery image of the model.
    """
    gallery = served.gallery
    view = gallery.view
    position = gallery.image_position(image_id)
    if position is None:
        raise ServiceError(
            404, f"image {image_id} is not in the gallery of model {served.name!r} "
            f"(dataset {gallery.dataset!r}, splits {', '.join(s.split for s in view.spans)})"
        )
    captions = view.captions_of(position)
    own = {int(view.keys[c]): c for c in captions}
    texts = list(dict.fromkeys(gallery.captions[c] for c in captions))
    return (position, image_truth(view, _rule(served), position, scope), own, texts,
            gallery_image(served, position, urls))


def search_image(
    served: ServingModel, k: int, urls: Urls, image_id: int | None = None, upload: Image.Image | None = None,
    scope: Scope = "all", normalise: Normalisation = "none",
) -> SearchImageOut:
    """Rank the captions of a scope for a gallery image (by id) or an uploaded image.

    Raises:
        ServiceError: 404 the id is not a gallery image of the model; 422 an upload the model
            cannot featurise; 409 a normalisation on an index built without a hubness bank;
            422 a normalisation in a scope holding the bank's split.
    """
    start = time.perf_counter()
    check_bank(served, scope, normalise)
    gallery = served.gallery
    view = gallery.view
    truth, query, own, texts = None, None, {}, []
    if image_id is not None:
        position, truth, own, texts, query = gallery_query(served, image_id, scope, urls)
        vector = np.asarray(served.index.embeddings["images"][position], dtype=np.float32)
    else:
        vector = encode_upload(served.checkpoint, upload, gallery.synthetic, gallery.dataset)
    ask = _Query(served, "captions", vector, scope, normalise)
    rows, top = _listed(ask, k, own)
    scope_rank = eval_rank = None
    correct: set[int] = set()
    if truth is not None:
        scope_rank, eval_rank = _ranks(ask, top, truth)
        correct = set(truth.in_scope.tolist())
    outside = None
    if scope == "test" and normalise == "none":  # scope all is refused a correction (check_bank)
        shown = {int(view.keys[r.position]) for r in rows}
        wide, _ = _listed(ask.within("all"), k, own)
        beyond = [r for r in wide if r.position not in view.eval.captions and int(view.keys[r.position]) not in shown]
        if beyond:
            outside = _caption_hit(served, beyond[0], set(), urls)
    return SearchImageOut(
        model=served.name, image_id=image_id, query=query, context=_context(ask, top),
        ground_truth_ids=[] if truth is None else [int(gallery.ids.caption_ids[c]) for c in truth.in_scope],
        ground_truth_texts=texts, scope_rank=scope_rank, ground_truth_rank=eval_rank,
        results=[_caption_hit(served, r, correct, urls) for r in rows], outside=outside,
        latency_ms=(time.perf_counter() - start) * 1000,
    )
