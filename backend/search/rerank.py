"""The two searches on a re-ranker: a cross-attention model (SCAN, BFAN) over the FAISS
shortlist of an embedding model (docs/serving.md, Re-rankers).

The shortlisting model searches the scope as it does alone (:mod:`aoq_serve.search.engine`) for
its top ``n``; the cross-attention model encodes the query into fragments (a sentence's word
states, an image's regions) and scores it against those ``n`` items' stored fragments with the
core's blocked pair scoring (:func:`aoq.pair_scores.score_sentence`, ``score_image``); the list is the shortlist
re-sorted by those scores (ties in the shortlist's order). ``k`` above ``n`` is refused, and so
is a hubness correction (the scores are no embedding's).

Ranks of the ground truth follow the offline shortlist protocol
(:func:`aoq.pair_scores.shortlist_sims`): the best correct item's rank among the re-scored
shortlist when it is in it, else its rank in the shortlisting model's order (below the whole
shortlist).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from aoq.embed import sentence_words
from aoq.names import Normalisation
from aoq.pair_scores import StatsScoreFn, score_image, score_sentence
from aoq_serve.errors import ServiceError
from aoq_serve.index.faiss_index import tied_rank
from aoq_serve.registry import ServingModel
from aoq_serve.schemas import ImageHit, RerankContext, Scope, SearchContext, SearchImageOut, SearchTextOut
from aoq_serve.search.engine import (
    MAX_NAMED_TRUTH,
    Urls,
    _caption_hit,
    _caption_rows,
    _Query,
    _rule,
    _Top,
    _top,
    gallery_image,
    gallery_query,
)
from aoq_serve.search.featurize import encode_text, encode_upload
from aoq_serve.search.truth import rank_among, text_truth

#: the re-ranker's scores of one query against the gallery items at some positions.
Scorer = Callable[[np.ndarray], np.ndarray]


def check_request(served: ServingModel, k: int, normalise: Normalisation) -> None:
    """Refuse what a re-ranker cannot answer.

    Raises:
        ServiceError: 422 ``k`` above the shortlist's length, or a hubness correction.
    """
    rerank = served.rerank
    assert rerank is not None
    if k > rerank.n:
        raise ServiceError(422, f"model {served.name!r} re-ranks the top {rerank.n} of {rerank.base.name!r}: "
                                f"k must be at most {rerank.n}, got {k}")
    if normalise != "none":
        raise ServiceError(422, f"model {served.name!r} is a re-ranker: its scores are no embedding's, so it takes "
                                f"no hubness correction; use normalise 'none'")


def _score(served: ServingModel) -> tuple[StatsScoreFn, torch.device]:
    model = served.checkpoint.model
    return model.pair_scores, next(model.parameters()).device


def _reranked(ask: _Query, n: int, score: Scorer) -> _Top:
    """The scope's top ``n`` by the shortlisting model, re-sorted by ``score(positions)`` (ties
    in the shortlist's order), with those scores."""
    short = _top(ask, n)
    scores = np.asarray(score(short.positions), dtype=np.float32)
    order = np.lexsort((np.arange(len(scores)), -scores))
    return _Top(scores[order], short.positions[order], False)


def _rank(ask: _Query, top: _Top, truth: np.ndarray) -> float:
    found = np.isin(top.positions, truth)
    if found.any():
        return tied_rank(top.scores[~found], top.scores[found])
    return rank_among(ask.scored()[0], ask.span(), truth)


def _ranks(ask: _Query, top: _Top, n: int, score: Scorer, in_scope: np.ndarray, in_eval: np.ndarray,
           ) -> tuple[float | None, float | None]:
    """(rank in the scope, rank in the evaluation split), the latter from a shortlist of the
    evaluation split itself when the scope is wider."""
    scope_rank = _rank(ask, top, in_scope) if in_scope.size else None
    if not in_eval.size:
        return scope_rank, None
    if ask.scope == "test":
        return scope_rank, scope_rank
    within = ask.within("test")
    return scope_rank, _rank(within, _reranked(within, n, score), in_eval)


def _context(ask: _Query, served: ServingModel) -> SearchContext:
    view = served.gallery.view
    rerank = RerankContext(kind=served.info.image_encoder, shortlist_by=served.rerank.base.name,
                           shortlist_n=served.rerank.n)
    return SearchContext(scope=ask.scope, searched=len(ask.span()), eval_split=view.eval.split,
                         positives=_rule(served), normalise="none", normalised=False, rerank=rerank)


def search_text(served: ServingModel, query: str, k: int, urls: Urls, scope: Scope = "all",
                normalise: Normalisation = "none", intended: str | None = None) -> SearchTextOut:
    """:func:`aoq_serve.search.engine.search_text` for a re-ranker (no ``outside`` item)."""
    start = time.perf_counter()
    check_request(served, k, normalise)
    rerank, view, ids = served.rerank, served.gallery.view, served.gallery.ids
    ask = _Query(rerank.base, "images", encode_text(rerank.base.checkpoint, query), scope, "none")
    words = sentence_words(served.checkpoint.model, served.checkpoint.vocab, query)
    pair_scores, device = _score(served)

    def score(positions: np.ndarray) -> np.ndarray:
        return score_sentence(pair_scores, words, rerank.fragments.regions, positions, device, rerank.stats)

    top = _reranked(ask, rerank.n, score)
    truth = text_truth(view, _rule(served), intended or query, scope)
    scope_rank, eval_rank = _ranks(ask, top, rerank.n, score, truth.in_scope, truth.in_eval)
    correct = set(truth.in_scope.tolist())
    results = [ImageHit(rank=r + 1, score=float(s), is_ground_truth=int(p) in correct,
                        **gallery_image(served, int(p), urls).model_dump())
               for r, (s, p) in enumerate(zip(top.scores[:k], top.positions[:k]))]
    return SearchTextOut(
        model=served.name, query=query, intended=intended,
        caption_id=None if truth.caption is None else int(ids.caption_ids[truth.caption]),
        query_split=None if truth.caption is None else view.caption_split(truth.caption),
        context=_context(ask, served), ground_truth_ids=[int(ids.image_ids[p]) for p in truth.in_scope],
        ground_truth=[gallery_image(served, int(p), urls) for p in truth.in_scope[:MAX_NAMED_TRUTH]],
        scope_rank=scope_rank, ground_truth_rank=eval_rank, results=results, outside=None,
        latency_ms=(time.perf_counter() - start) * 1000,
    )


def search_image(
    served: ServingModel, k: int, urls: Urls, image_id: int | None = None, upload: Image.Image | None = None,
    scope: Scope = "all", normalise: Normalisation = "none",
) -> SearchImageOut:
    """:func:`aoq_serve.search.engine.search_image` for a re-ranker (no ``outside`` item; under
    the text rule, the distinct texts among the shortlist, so possibly fewer than ``k``)."""
    start = time.perf_counter()
    check_request(served, k, normalise)
    rerank, gallery = served.rerank, served.gallery
    view = gallery.view
    truth, query, own, texts = None, None, {}, []
    if image_id is not None:
        position, truth, own, texts, query = gallery_query(served, image_id, scope, urls)
        vector = np.asarray(rerank.base.index.embeddings["images"][position], dtype=np.float32)
        regions = rerank.fragments.regions[position]
    else:
        vector = encode_upload(rerank.base.checkpoint, upload, gallery.synthetic, gallery.dataset)
        regions = encode_upload(served.checkpoint, upload, gallery.synthetic, gallery.dataset)
    ask = _Query(rerank.base, "captions", vector, scope, "none")

    pair_scores, device = _score(served)

    def score(positions: np.ndarray) -> np.ndarray:
        return score_image(pair_scores, regions, rerank.fragments, positions, device)

    top = _reranked(ask, rerank.n, score)
    rows = _caption_rows(view, _rule(served), top.scores, top.positions, k, ask.span(), own)
    scope_rank = eval_rank = None
    correct: set[int] = set()
    if truth is not None:
        scope_rank, eval_rank = _ranks(ask, top, rerank.n, score, truth.in_scope, truth.in_eval)
        correct = set(truth.in_scope.tolist())
    return SearchImageOut(
        model=served.name, image_id=image_id, query=query, context=_context(ask, served),
        ground_truth_ids=[] if truth is None else [int(gallery.ids.caption_ids[c]) for c in truth.in_scope],
        ground_truth_texts=texts, scope_rank=scope_rank, ground_truth_rank=eval_rank,
        results=[_caption_hit(served, r, correct, urls) for r in rows], outside=None,
        latency_ms=(time.perf_counter() - start) * 1000,
    )
