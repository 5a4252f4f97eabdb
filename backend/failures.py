"""Failure cases: test queries one model gets right at rank 1 and the other does not.

``aoq index`` stores each model's full-gallery ground-truth ranks
(:func:`aoq_serve.index.reports.gallery_ranks`) in the
catalogue's ``query_ranks`` table; the failure cases of any pair of models over the same gallery
are then one self-join of that table (:func:`failure_cases`), so the pair is chosen per request
(default: the baseline-role and aoq-role models).
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from aoq_serve.store.db import QueryRank

Direction = Literal["t2i", "i2t"]
Which = Literal["baseline_only", "aoq_only", "both"]


def failure_cases(
    session: Session, left_model: int, right_model: int, direction: Direction, which: Which,
    limit: int, offset: int = 0,
) -> tuple[int, list[tuple[int, float, float]]]:
    """Queries where the left model (the baseline) or the right one (AOQ) fails at rank 1.

    ``baseline_only``: left rank > 1 and right rank 1; ``aoq_only``: the reverse; ``both``: both > 1.
    Ordered by how badly the failing side ranks the ground truth (worst first), then query id.

    Returns:
        ``(total, [(query_id, left_rank, right_rank), ...])`` for the requested page.
    """
    left, right = aliased(QueryRank), aliased(QueryRank)
    condition = {
        "baseline_only": and_(left.rank > 1, right.rank == 1),
        "aoq_only": and_(left.rank == 1, right.rank > 1),
        "both": and_(left.rank > 1, right.rank > 1),
    }[which]
    order = {
        "baseline_only": [left.rank.desc()],
        "aoq_only": [right.rank.desc()],
        "both": [(left.rank + right.rank).desc()],
    }[which]
    base = (
        select(left.query_id, left.rank, right.rank)
        .join(right, and_(right.query_id == left.query_id, right.direction == left.direction))
        .where(left.model_id == left_model, right.model_id == right_model, left.direction == direction, condition)
    )
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    rows = session.execute(base.order_by(*order, left.query_id).limit(limit).offset(offset)).all()
    return int(total), [(int(q), float(lr), float(rr)) for q, lr, rr in rows]
