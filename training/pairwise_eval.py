"""Evaluate a cross-attention model (``model.pairwise``) on a split: its score matrix in
bounded-memory blocks, a shortlist of an embedding model re-scored (and what the cut costs), or
two models' scores averaged (the paper's 2-model ensembles)."""

from __future__ import annotations

import time

import numpy as np
import torch

from aoq.data.dataset import SplitData
from aoq.data.vocab import Vocabulary
from aoq.embed import EncodedFragments, encode_fragments
from aoq.label_metrics import split_label_metrics
from aoq.metrics import FOLD_IMAGES, N_FOLDS, evaluate_directions, evaluate_scores, fold_1k
from aoq.models.joint import JointModel
from aoq.names import PositiveRule
from aoq.pair_scores import (
    COCO_5K,
    PairScoreFn,
    ScoringTime,
    fold_scores,
    rescore_shortlist,
    score_matrix,
    shortlist,
    shortlist_sims,
)
from aoq.ranks import array_fn


def evaluate_pairwise(
    model: JointModel,
    vocab: Vocabulary,
    split: SplitData,
    protocol: str = "full",
    *,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    positives: PositiveRule = "pair",
    progress: bool = False,
    shortlist_by: tuple[np.ndarray, np.ndarray] | None = None,
    shortlist_n: int = 100,
    shortlist_cost: bool = False,
    ensemble: tuple[JointModel, Vocabulary] | None = None,
    ndcg_k: int = 10,
) -> dict:
    """Recalls of a cross-attention model (``model.pairwise``): its score matrix in bounded-memory
    blocks (:func:`aoq.pair_scores.score_matrix`), or with ``shortlist_by`` (an embedding model's
    (image, caption) embeddings of the split) the top ``shortlist_n`` of that model's ranking
    re-scored in each direction (protocol full only).

    Returns:
        As :func:`evaluate_model`, plus ``"scoring"``: ``seconds``, ``pairs`` scored and
        ``projected_coco5k_s`` (the time of the same work on COCO 5K at the measured rate: the
        whole matrix, the five 1K fold blocks under 1k5fold, or every query's shortlist); with a
        shortlist, ``shortlist`` = N; with ``shortlist_cost`` also the whole matrix scored and
        ``"shortlist_cost"``: the full scoring's recalls (``full``) and, per metric, the re-ranked
        value minus the full one (``difference``; negative: recall the cut loses). With
        ``ensemble`` (a second cross-attention model and its vocabulary) every score is the two
        models' average (the paper's SCAN and BFAN rows) and ``scoring`` the time of both.
        Protocol ``labels`` (a labelled split) is ``full`` plus ``"labels"``, the label-wise
        metrics of the same score matrices (re-ranked ones with a shortlist), NDCG cut at ``ndcg_k``.
    """
    if shortlist_cost and shortlist_by is None:
        raise ValueError("the shortlist's cost needs a shortlist (--shortlist-by)")
    if protocol in ("5k", "1k5fold") and split.n_images < COCO_5K[0]:
        raise ValueError(f"the {protocol} protocol needs at least {COCO_5K[0]:,} images; this set has {split.n_images:,}")
    dev = next(model.parameters()).device if device is None else torch.device(device)
    members = [(m.pair_scores, encode_fragments(m, v, split, batch_size=batch_size, device=dev, progress=progress))
               for m, v in [(model, vocab), *([ensemble] if ensemble is not None else [])]]
    texts = split.captions if positives == "text" else None
    if shortlist_by is not None:
        if protocol not in ("full", "labels"):
            raise ValueError("shortlist re-ranking evaluates the whole split (protocol full or labels)")
        start = time.perf_counter()
        base = shortlist_by[0] @ shortlist_by[1].T
        i2t_short, t2i_short = shortlist(base, shortlist_n), shortlist(base.T, shortlist_n)
        i2t = shortlist_sims(base, i2t_short, _mean([rescore_shortlist(fn, frag, i2t_short, "images", dev, progress)
                                                    for fn, frag in members]))
        t2i = shortlist_sims(base.T, t2i_short, _mean([rescore_shortlist(fn, frag, t2i_short, "captions", dev,
                                                                         progress) for fn, frag in members])).T
        timing = ScoringTime(time.perf_counter() - start, i2t_short.size + t2i_short.size)
        result = evaluate_directions(array_fn(i2t), array_fn(t2i), split.n_images, split.captions_per_image, texts)
        result.update(_labels(protocol, i2t, t2i.T, split, ndcg_k))
        result["shortlist"] = int(i2t_short.shape[1])
        if shortlist_cost:
            result["shortlist_cost"] = _shortlist_cost(result, members, dev, split, texts, progress)
        coco_pairs = (COCO_5K[0] + COCO_5K[1]) * result["shortlist"]  # every query's shortlist
    elif protocol == "1k5fold":
        folds = [fold_scores(fn, frag, dev, FOLD_IMAGES, N_FOLDS, progress) for fn, frag in members]
        timing = _summed([t for _, t in folds])
        result = fold_1k(lambda rows, cols: _mean([f(rows, cols) for f, _ in folds]), split.captions_per_image,
                         n_images=FOLD_IMAGES * N_FOLDS, texts=texts)
        coco_pairs = FOLD_IMAGES * N_FOLDS * COCO_5K[1]  # five folds of 1,000 x 5,000
    else:
        images = range(COCO_5K[0]) if protocol == "5k" else None
        sims, timing = _mean_matrix(members, dev, images, progress)
        result = evaluate_scores(sims, split.captions_per_image, "full" if protocol == "labels" else protocol,
                                 texts=texts)
        result.update(_labels(protocol, sims, sims.T, split, ndcg_k))
        coco_pairs = COCO_5K[0] * COCO_5K[1]
    scoring = {"seconds": timing.seconds, "pairs": timing.pairs, "projected_coco5k_s": timing.projected_seconds(coco_pairs)}
    return {**result, "positives": positives, "scoring": scoring}


def _labels(protocol: str, i2t: np.ndarray, t2i: np.ndarray, split: SplitData, ndcg_k: int) -> dict:
    """Protocol ``labels``: the label-wise metrics of each direction's own scores (queries in rows)."""
    if protocol != "labels":
        return {}
    return {"protocol": "labels", "labels": split_label_metrics(i2t, t2i, split, ndcg_k)}


#: one cross-attention model of an evaluation: its pair score function and its encoded split.
Member = tuple[PairScoreFn, EncodedFragments]


def _mean(scores: list[np.ndarray]) -> np.ndarray:
    """The members' average score matrix (the paper's two-model ensembles); one member's own."""
    return sum(scores[1:], scores[0]) / len(scores) if len(scores) > 1 else scores[0]


def _summed(timings: list[ScoringTime]) -> ScoringTime:
    """The members' time for their common pairs (each member scores every pair)."""
    return ScoringTime(sum(t.seconds for t in timings), timings[0].pairs)


def _mean_matrix(members: list[Member], device: torch.device, images: range | None,
                 progress: bool) -> tuple[np.ndarray, ScoringTime]:
    parts = [score_matrix(fn, frag, device, images, progress) for fn, frag in members]
    return _mean([p for p, _ in parts]), _summed([t for _, t in parts])


#: the metrics whose shortlist cost is reported, per direction.
COST_METRICS = ("r1", "r5", "r10", "medr", "meanr")


def _shortlist_cost(short: dict, members: list[Member], device: torch.device, split: SplitData,
                    texts: list[str] | None, progress: bool) -> dict:
    """The full scoring's recalls of the split and the re-ranked ones minus them, per metric."""
    sims, timing = _mean_matrix(members, device, None, progress)
    full = evaluate_scores(sims, split.captions_per_image, "full", texts=texts)
    difference = {d: {m: short[d][m] - full[d][m] for m in COST_METRICS} for d in ("i2t", "t2i")}
    return {"full": {d: full[d] for d in ("i2t", "t2i", "rsum")},
            "difference": {**difference, "rsum": short["rsum"] - full["rsum"]}, "full_seconds": timing.seconds}
