"""Does anything measured before round 2 predict AOQ's gain? (docs/regimes.md, Predictors)

Every candidate predictor is measured after round 1 only, from the baseline's mined lists and
their hardness diagnostics (:mod:`aoq_train.mining.diagnostics`) and the round-1 training log:

* ``s_on_minus_off``: mean ``S_on - S_off`` of both directions (negative: the premise holds);
* ``rank_ratio``: median global rank of the offline negative over that of the in-batch hardest,
  mean of both directions (below 1: offline negatives are harder);
* ``false_negatives`` / ``near_neighbours``: their shares among the sampled candidates
  (:mod:`aoq_train.mining.truth`);
* ``round1_dev_rsum``: the round-1 model's best dev rsum;
* ``family_share``: the generator's share of near-duplicate families (synthetic sets only).

Across cells, each is rank-correlated (Spearman) with the cell's mean gain, and the correlation
gets a percentile bootstrap interval over cells (cells resampled with replacement). A predictor
is *reliable* when that interval excludes 0 over at least ``MIN_CELLS`` cells.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

#: predictor -> how pages name it, in the order they show them
PREDICTORS = {
    "s_on_minus_off": "S_on − S_off",
    "rank_ratio": "offline / in-batch rank (medians)",
    "false_negatives": "false-negative share",
    "near_neighbours": "near-neighbour share",
    "round1_dev_rsum": "round-1 dev rsum",
    "family_share": "family share",
}
#: bootstrap resamples of the cells (a fixed generator: the page is reproducible)
RESAMPLES = 2000
#: fewer cells than this and no predictor is called reliable: a bootstrap over a handful of cells
#: redraws the same few and its interval is far too narrow (the issue's grid is 3 x 3)
MIN_CELLS = 9


def predictor_values(diagnostics: dict[str, Any], round1_dev_rsum: float | None = None,
                     family_share: float | None = None) -> dict[str, float | None]:
    """The predictors of one set from its mining diagnostics (None: not measured)."""
    directions = [diagnostics[f"{d}_anchors"] for d in ("image", "caption")]
    shares = diagnostics.get("shares") or {}
    return {
        "s_on_minus_off": float(np.mean([d["on_minus_off"] for d in directions])),
        "rank_ratio": float(np.mean([d["offline_rank"]["median"] / d["in_batch_rank"]["median"] for d in directions])),
        "false_negatives": shares.get("false_negatives"),
        "near_neighbours": shares.get("near_neighbours"),
        "round1_dev_rsum": round1_dev_rsum,
        "family_share": family_share,
    }


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); nan when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_interval(x: np.ndarray, y: np.ndarray, resamples: int = RESAMPLES,
                      seed: int = 0) -> tuple[float, float, float]:
    """(rho, low, high): Spearman's rho over the cells and its 95% percentile bootstrap interval
    (resamples whose rho is undefined, a constant side, are left out)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rho = spearman(x, y)
    picks = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    draws = np.array([spearman(x[p], y[p]) for p in picks])
    draws = draws[np.isfinite(draws)]
    if not np.isfinite(rho) or draws.size == 0:
        return rho, float("nan"), float("nan")
    low, high = np.percentile(draws, [2.5, 97.5])
    return rho, float(low), float(high)


def correlations(cells: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per predictor measured in every cell: rho, its interval, the number of cells, and
    ``reliable`` (the interval excludes 0, over ``MIN_CELLS`` cells or more; nan: the predictor
    or the gain did not vary). ``cells``: ``{"gain", "predictors"}`` each."""
    out: dict[str, dict[str, float | int]] = {}
    gains = np.array([c["gain"] for c in cells], dtype=np.float64)
    for name in PREDICTORS:
        values = [c["predictors"].get(name) for c in cells]
        if any(v is None for v in values):
            continue
        rho, low, high = spearman_interval(np.array(values, dtype=np.float64), gains)
        out[name] = {"rho": rho, "low": low, "high": high, "cells": len(cells),
                     "reliable": bool(len(cells) >= MIN_CELLS and np.isfinite(low) and (low > 0 or high < 0))}
    return out
