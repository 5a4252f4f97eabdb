"""What ``aoq index`` computes from the gallery embeddings for the service to show: the
ground-truth ranks of every query (the failure cases), and what ``/metrics/{model}`` shows (the
evaluation tables, the training curves of the checkpoint's metrics log, the cross-retrieval rank
histogram of the AOQ supplement and, for a gallery with labels, the label-wise metrics)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aoq.label_metrics import label_metrics
from aoq.metrics import (
    METRIC_KEYS,
    cross_retrieval_ranks,
    evaluate_embeddings,
    i2t_ranks,
    rank_histogram,
    t2i_ranks,
)

log = logging.getLogger(__name__)

#: the COCO protocols need 5 folds of 1,000 images.
LARGE_GALLERY = 5000


def gallery_ranks(img_emb: np.ndarray, cap_emb: np.ndarray, captions_per_image: int,
                  texts: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """1-based expected full-gallery ranks (``aoq.metrics``' tie rule): ``t2i`` per caption (its
    best positive image), ``i2t`` per image (its best positive caption); ``texts`` selects the
    text rule (identical caption texts are one answer)."""
    sims = np.asarray(img_emb, dtype=np.float32) @ np.asarray(cap_emb, dtype=np.float32).T
    return {
        "t2i": t2i_ranks(sims, captions_per_image, texts) + 1,
        "i2t": i2t_ranks(sims, captions_per_image, texts) + 1,
    }


def _table(result: dict) -> dict[str, Any]:
    return {
        "i2t": {k: float(result["i2t"][k]) for k in METRIC_KEYS},
        "t2i": {k: float(result["t2i"][k]) for k in METRIC_KEYS},
        "rsum": float(result["rsum"]),
    }


def evaluation_tables(img_emb: np.ndarray, cap_emb: np.ndarray, captions_per_image: int,
                      texts: Sequence[str] | None = None) -> dict[str, dict]:
    """``{"full": table}``, plus ``1k5fold`` and ``5k`` when the gallery has 5,000 images or more."""
    protocols = ["full"] + (["1k5fold", "5k"] if len(img_emb) >= LARGE_GALLERY else [])
    return {p: _table(evaluate_embeddings(img_emb, cap_emb, captions_per_image, p, texts=texts)) for p in protocols}


def curves(log_path: Path, round_number: int) -> list[dict[str, Any]]:
    """R@1 and rsum per epoch from a trainer's ``metrics.jsonl`` (its ``dev_*`` fields)."""
    points = []
    for line in log_path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        points.append({
            "epoch": int(record["epoch"]),
            "round": round_number,
            "i2t_r1": record.get("dev_i2t_r1"),
            "t2i_r1": record.get("dev_t2i_r1"),
            "rsum": record.get("dev_rsum"),
        })
    return points


def cross_histogram(img_emb: np.ndarray, cap_emb: np.ndarray, captions_per_image: int) -> dict[str, list]:
    """Histogram of the cross-retrieval ranks of every positive pair, ``{"bins", "counts"}``."""
    sims = np.asarray(img_emb, dtype=np.float32) @ np.asarray(cap_emb, dtype=np.float32).T
    counts = rank_histogram(cross_retrieval_ranks(sims, captions_per_image))
    return {"bins": list(counts), "counts": list(counts.values())}


def label_table(img_emb: np.ndarray, cap_emb: np.ndarray, captions_per_image: int,
                image_labels: np.ndarray, k: int = 10) -> dict[str, Any]:
    """mAP@R and NDCG@k both ways (``aoq.label_metrics.label_metrics``), as fractions; None (not
    NaN, which JSON lacks) where no query has a relevant item."""
    result = label_metrics(img_emb, cap_emb, image_labels, captions_per_image, k)

    def value(x: float) -> float | None:
        return None if np.isnan(x) else float(x)

    return {
        "k": k,
        "n_labels": int(np.asarray(image_labels).shape[1]),
        **{d: {"map_at_r": value(result[d]["map_at_r"]), "ndcg": value(result[d][f"ndcg_at_{k}"])}
           for d in ("i2t", "t2i")},
    }


def model_report(
    img_emb: np.ndarray,
    cap_emb: np.ndarray,
    captions_per_image: int,
    logs: list[tuple[Path, int]],
    image_labels: np.ndarray | None = None,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Tables, curves (from the readable logs among ``(path, round)``), the rank histogram and,
    with ``image_labels`` ((n_images, L) multi-hot), ``"labels"``: :func:`label_table`. The tables
    follow the text rule when ``texts`` (the gallery's captions) are given."""
    points: list[dict[str, Any]] = []
    for path, round_number in logs:
        try:
            points.extend(curves(path, round_number))
        except (OSError, ValueError, KeyError) as exc:
            log.warning("%s: metrics log not used (%s)", path, exc)
    report = {
        "tables": evaluation_tables(img_emb, cap_emb, captions_per_image, texts),
        "curves": points,
        "rank_histogram": cross_histogram(img_emb, cap_emb, captions_per_image),
    }
    if image_labels is not None:
        report["labels"] = label_table(img_emb, cap_emb, captions_per_image, image_labels)
    return report
