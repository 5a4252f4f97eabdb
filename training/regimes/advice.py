"""The one-line advice of ``aoq mine``: should this set pay for a second round? Read from the
regime map's evidence file (written with docs/results-regimes.md by ``aoq regimes``).

The advice names a predictor only when the map found it reliable (its bootstrap interval of
Spearman's rho over cells excludes 0) and it can be measured from the mining diagnostics at
hand; it then reports this set's value and the mean gain of the map's cells nearest to it in
that predictor. Otherwise it says there is no reliable predictor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aoq_train.regimes.predictors import PREDICTORS, predictor_values

#: the evidence file beside the page (the repository's docs/)
EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "results-regimes.json"
#: how many of the map's cells nearest in the predictor the advice averages
NEAREST = 3


def read_evidence(path: Path = EVIDENCE) -> dict[str, Any] | None:
    """The map's evidence, or None when it has not been written (the map has not been run)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def advice_line(diagnostics: dict[str, Any], evidence: dict[str, Any] | None) -> str:
    """The advice for a set with these mining diagnostics (module docstring)."""
    if evidence is None:
        return "advice: no reliable predictor of AOQ's gain (the regime map has not been run: docs/regimes.md)"
    measured = predictor_values(diagnostics)
    usable = {name: c for name, c in evidence["correlations"].items()
              if c["reliable"] and measured.get(name) is not None}
    n_cells = len(evidence["cells"])
    if not usable:
        return (f"advice: no reliable predictor of AOQ's gain measurable here (regime map, {n_cells} cells: "
                f"{evidence['page']})")
    name, c = max(usable.items(), key=lambda item: abs(item[1]["rho"]))
    value = float(measured[name])
    cells = sorted(evidence["cells"], key=lambda cell: abs(cell["predictors"][name] - value))[:NEAREST]
    gain = float(np.mean([cell["gain"] for cell in cells]))
    low, high = (f(cell["predictors"][name] for cell in evidence["cells"]) for f in (min, max))
    # A set beyond every cell of the map gets its edge cells: say so rather than imply a match.
    beyond = "" if low <= value <= high else f" (outside the map's {low:+.3f} to {high:+.3f}: an extrapolation)"
    return (f"advice: {PREDICTORS[name]} predicts AOQ's gain over the baseline across the regime map "
            f"(Spearman {c['rho']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}], {n_cells} cells, {evidence['page']}); "
            f"here it is {value:+.3f}{beyond}, and the map's {len(cells)} nearest cells gained {gain:+.1f} rsum "
            "on average")
