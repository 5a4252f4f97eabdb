"""The multi-seed result of the baseline and AOQ pair, read from a results page that ``aoq report``
wrote (``aoq ui --results docs/results-emoji.md``), so the Metrics tab can put the one served seed
beside it: one seed of AOQ is a draw from a wide distribution.

Read: the "full test split, mean ± std over seeds" table (rsum and the paired difference to the
baseline with its interval and n) and the "rsum per seed" table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: the rows of the two methods in the results page's tables
BASELINE_ROW, AOQ_ROW = "Baseline", "AdapOffQuin"
BASELINE_COLUMN, AOQ_COLUMN = "baseline", "aoq"


class ResultsError(ValueError):
    """The results page cannot be read; the message names the file and what is missing."""


@dataclass(frozen=True)
class SeedSummary:
    """The pair's multi-seed figures, as the results page prints them."""

    source: str
    baseline_rsum: str  # "178.9 ± 8.1"
    aoq_rsum: str
    difference: str  # "+4.0 [-1.3, +9.3] (n=10)": AOQ - baseline, paired 95% interval
    per_seed: dict[int, tuple[float, float]]  # seed -> (baseline rsum, AOQ rsum)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def load_seed_summary(path: str | Path) -> SeedSummary:
    """The baseline/AOQ figures of a results page.

    Raises:
        ResultsError: the file is missing or lacks the tables.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read the results page ({exc})") from None
    rows = {name: next((_cells(line) for line in lines if line.startswith(f"| {name}")), None)
            for name in (BASELINE_ROW, AOQ_ROW)}
    header = next((_cells(line) for line in lines if line.startswith("| seed |")), None)
    if None in rows.values() or header is None or BASELINE_COLUMN not in header or AOQ_COLUMN not in header:
        raise ResultsError(f"{path}: no baseline and AOQ rows in its mean \u00b1 std and rsum-per-seed tables")
    b, a = header.index(BASELINE_COLUMN), header.index(AOQ_COLUMN)
    per_seed = {}
    for line in lines:
        if match := re.match(r"\| seed(\d+) \|", line):
            cells = _cells(line)
            per_seed[int(match.group(1))] = (float(cells[b]), float(cells[a]))
    baseline, aoq = rows[BASELINE_ROW], rows[AOQ_ROW]
    return SeedSummary(source=path.name, baseline_rsum=baseline[-2], aoq_rsum=aoq[-2], difference=aoq[-1],
                       per_seed=per_seed)
