"""Failure cases: test queries one model gets right at rank 1 and the other does not.

``aoq index`` stores each model's full-gallery ground-truth ranks
(:func:`aoq_serve.index.reports.gallery_ranks`) in the catalogue's ``query_ranks`` table and
their digest (:func:`aoq_serve.store.catalogue.ranks_digest`) in the model's index manifest. Each
request reads the two models' ranks of one direction, checks them against those digests (an
edited or damaged row must not silently change the answer) and pairs them by query id, so the
pair is chosen per request (default: the baseline-role and aoq-role models).

Queries that are the same case twice (text -> image: captions of one text, such as both vendors'
names of one emoji, with the same two ranks) are listed once with their count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sqlalchemy.orm import Session

from aoq_serve.registry import ServingModel
from aoq_serve.store import catalogue

Direction = Literal["t2i", "i2t"]


class RanksChanged(Exception):
    """A model's stored ranks differ from what ``aoq index`` recorded; the message says which."""


Which = Literal["baseline_only", "aoq_only", "both"]


@dataclass(frozen=True)
class FailureCase:
    """One listed case: its first query id, both ranks, and how many queries it stands for."""

    query_id: int
    left_rank: float
    right_rank: float
    copies: int = 1


def _distinct(order: np.ndarray, keys: np.ndarray, lr: np.ndarray, rr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first of each run of equal (key, left rank, right rank) in ``order``, its count),
    in ``order``'s order."""
    rows = np.stack([keys.astype(np.float64), lr[order], rr[order]], axis=1)
    _, first, inverse, counts = np.unique(rows, axis=0, return_index=True, return_inverse=True, return_counts=True)
    kept = np.sort(first)
    return order[kept], counts[inverse.reshape(-1)[kept]]


def verified_ranks(session: Session, served: ServingModel, direction: Direction) -> tuple[np.ndarray, np.ndarray]:
    """(query ids, ranks) of a model's stored ranks, in query id order, checked against its index.

    Raises:
        RanksChanged: the stored ranks differ from what ``aoq index`` recorded.
    """
    query_ids, ranks = catalogue.query_ranks(session, served.model_id, direction)
    recorded = (served.index.config.get("ranks_hash") or {}).get(direction)
    if recorded != catalogue.ranks_digest(query_ids, ranks):
        raise RanksChanged(f"the stored {direction} ranks of model {served.name!r} differ from what aoq index "
                                f"recorded (the catalogue was edited or damaged); re-run aoq index")
    return query_ids, ranks


def failure_cases(
    session: Session, left: ServingModel, right: ServingModel, direction: Direction, which: Which,
    limit: int, offset: int = 0, key_of: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[int, int, list[FailureCase]]:
    """Queries where the left model (the baseline) or the right one (AOQ) fails at rank 1.

    ``baseline_only``: left rank > 1 and right rank 1; ``aoq_only``: the reverse; ``both``: both > 1.
    Ordered by how badly the failing side ranks the ground truth (worst first), then query id.
    ``key_of`` maps query ids to a key (a caption's text): queries of one key with the same two
    ranks are one case, listed at its first query id with their count.

    Returns:
        ``(cases, queries, [FailureCase, ...])``: how many cases and queries match, and the
        requested page of cases.

    Raises:
        RanksChanged: either model's stored ranks fail their check.
    """
    left_ids, left_ranks = verified_ranks(session, left, direction)
    right_ids, right_ranks = verified_ranks(session, right, direction)
    query_ids, li, ri = np.intersect1d(left_ids, right_ids, assume_unique=True, return_indices=True)
    lr, rr = left_ranks[li], right_ranks[ri]
    keep, badness = {
        "baseline_only": ((lr > 1) & (rr == 1), lr),
        "aoq_only": ((lr == 1) & (rr > 1), rr),
        "both": ((lr > 1) & (rr > 1), lr + rr),
    }[which]
    chosen = np.flatnonzero(keep)
    order = chosen[np.lexsort((query_ids[chosen], -badness[chosen]))]
    counts = np.ones(order.size, dtype=np.int64)
    if key_of is not None and order.size:
        order, counts = _distinct(order, key_of(query_ids[order]), lr, rr)
    page = slice(offset, offset + limit)
    return int(order.size), int(chosen.size), [
        FailureCase(int(query_ids[i]), float(lr[i]), float(rr[i]), int(c)) for i, c in zip(order[page], counts[page])]
