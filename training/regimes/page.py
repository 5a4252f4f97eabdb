"""docs/results-regimes.md and its evidence file, from the map's finished runs only
(docs/regimes.md): per-arm heatmaps of the paired rsum difference to the baseline, AOQ against
GOAL, a per-cell table of the premise diagnostics, the two shares and the epochs run, and the
predictor correlations across cells."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from aoq.io import atomic_write_json, atomic_write_text
from aoq_train.pipeline.arms import arm_label
from aoq_train.regimes.predictors import MIN_CELLS, PREDICTORS, correlations
from aoq_train.regimes.runs import GAIN_ARM, PROTOCOL, MapSetup, differences, machine_counts
from aoq_train.report.tables import interval_method, paired_interval

#: the mark of a cell whose interval excludes 0
CLEAR = "**"
#: where the reference points come from (measured on their own pages)
REFERENCES = ("Reference points, measured on their own pages with their own sizes (not part of this map): "
              "emoji, [results-emoji.md](results-emoji.md) and "
              "[results-false-negatives.md](results-false-negatives.md): AOQ +4.0 [−1.3, +9.3], identity-filtered "
              "AOQ +5.6 [+1.9, +9.3], GOAL cir x con +6.5 [+1.1, +11.9] rsum against the baseline (n=10); the "
              "default synthetic set (4,000 training scenes with contrastive captions, [results.md](results.md)): "
              "AOQ −0.3 [−2.1, +1.5] on 5K (n=5).")


def interval_cell(diffs: list[float]) -> str:
    """``+1.2 [−0.3, +2.7]``, marked when the interval excludes 0; ``—`` without runs."""
    if not diffs:
        return "—"
    mean, low, high = paired_interval(diffs)
    if len(diffs) == 1:
        return f"{mean:+.1f} (n=1)"
    clear = low > 0 or high < 0
    text = f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
    return (f"{CLEAR}{text}{CLEAR}" if clear else text) + f" (n={len(diffs)})"


def heatmap(setup: MapSetup, knobs: tuple[str, str], jobs: dict[str, list[dict[str, Any]]], arm: str,
            reference: str = "baseline") -> str:
    """Markdown grid: rows the first knob's levels, columns the second's, each cell the paired
    difference ``arm - reference`` with its interval."""
    first, second = knobs
    rows = sorted({c.value(first) for c in setup.cells})
    cols = sorted({c.value(second) for c in setup.cells})
    by_levels = {(c.value(first), c.value(second)): jobs[c.name] for c in setup.cells}
    lines = [f"| {first} \\ {second} | " + " | ".join(str(c) for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for r in rows:
        lines.append(f"| {r} | " + " | ".join(interval_cell(differences(by_levels.get((r, c), []), arm, reference))
                                             for c in cols) + " |")
    return "\n".join(lines)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def cell_table(setup: MapSetup, jobs: dict[str, list[dict[str, Any]]]) -> str:
    """Per cell: premise held, S_on − S_off per direction, both shares, epochs run per method."""
    methods = ("baseline", *setup.arms)
    lines = ["| cell | runs | premise held | S_on − S_off images / captions | false negatives % | near neighbours % | "
             + " | ".join(f"epochs {arm_label(m)}" for m in methods) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(methods)]
    for cell in setup.cells:
        js = jobs[cell.name]
        if not js:
            lines.append(f"| {cell.name} | 0 | " + " | ".join("—" for _ in range(4 + len(methods))) + " |")
            continue
        gap = {d: statistics.fmean(j["on_minus_off"][d] for j in js) for d in ("image", "caption")}
        lines.append(
            f"| {cell.name} | {len(js)} | {sum(j['premise_holds'] for j in js)}/{len(js)} | "
            f"{gap['image']:+.3f} / {gap['caption']:+.3f} | "
            f"{_pct(_mean([j['predictors']['false_negatives'] for j in js]))} | "
            f"{_pct(_mean([j['predictors']['near_neighbours'] for j in js]))} | "
            + " | ".join(f"{statistics.fmean(j['epochs'][m] for j in js):.1f}" for m in methods) + " |")
    return "\n".join(lines)


def cell_evidence(setup: MapSetup, jobs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per cell with runs: the mean gain of AOQ over the baseline and the mean of each predictor."""
    out = []
    for cell in setup.cells:
        js = jobs[cell.name]
        if js:
            out.append({"cell": cell.name, "runs": len(js),
                        "gain": statistics.fmean(differences(js, GAIN_ARM)),
                        "predictors": {p: _mean([j["predictors"][p] for j in js]) for p in PREDICTORS}})
    return out


def predictor_section(corr: dict[str, dict[str, Any]], gains: list[float]) -> list[str]:
    """The correlation table and its verdict; ``gains``: each cell's mean AOQ - baseline."""
    n_cells = len(gains)
    lines = ["| predictor (after round 1) | Spearman rho with AOQ's gain | 95% bootstrap interval over cells | "
             "reliable |", "|---|---:|---:|---|"]
    for name, c in corr.items():
        if c["rho"] != c["rho"]:
            lines.append(f"| {PREDICTORS[name]} | — (did not vary) | — | no |")
            continue
        interval = "—" if c["low"] != c["low"] else f"[{c['low']:+.2f}, {c['high']:+.2f}]"
        lines.append(f"| {PREDICTORS[name]} | {c['rho']:+.2f} | {interval} | {'yes' if c['reliable'] else 'no'} |")
    reliable = [PREDICTORS[n] for n, c in corr.items() if c["reliable"]]
    if reliable:
        verdict = (f"A user can read **{', '.join(reliable)}** after round 1: the interval over the {n_cells} cells "
                   "excludes 0. `aoq mine` prints the advice line from this page's evidence file (for the "
                   "predictors its diagnostics measure).")
        if max(gains) < 0 or min(gains) > 0:
            # A rank correlation says nothing about the sign: with one sign everywhere the predictor
            # orders how much AOQ loses (or wins), it does not find where the second round pays.
            side = ("below", "loses", "where it wins") if max(gains) < 0 else ("above", "wins", "where it loses")
            verdict += (f" Every cell's mean difference is {side[0]} the baseline ({min(gains):+.1f} to "
                        f"{max(gains):+.1f}): on this map the predictors order how much AOQ {side[1]}, "
                        f"not {side[2]}.")
    elif n_cells < MIN_CELLS:
        verdict = (f"**No predictor is reliable**: {n_cells} cells are fewer than the {MIN_CELLS} a bootstrap over "
                   "cells needs. `aoq mine` says so (\"no reliable predictor\").")
    else:
        verdict = (f"**No predictor is reliable**: every interval over the {n_cells} cells includes 0 (or the "
                   "predictor did not vary). `aoq mine` says so (\"no reliable predictor\").")
    return lines + ["", verdict]


def pilot_section(pilot: dict[str, Any] | None, knobs: tuple[str, str]) -> list[str]:
    if pilot is None:
        return [f"Knobs given on the command line: {knobs[0]} and {knobs[1]} (no pilot).", ""]
    lines = ["Pilot: **one seed per level of each knob** (the other knobs at their defaults), the baseline "
             "and AOQ only, AOQ minus the baseline rsum; the two knobs with the widest range over their levels make the grid.", "",
             "| knob | AOQ − baseline per level | range |", "|---|---|---:|"]
    for knob, row in pilot["knobs"].items():
        levels = ", ".join(f"{level}: {d:+.1f}" for level, d in row["levels"])
        lines.append(f"| {knob} | {levels} | {row['range']:.1f} |")
    return lines + ["", f"Picked: **{knobs[0]}** and **{knobs[1]}**.", *_yardstick(pilot, knobs), ""]


def _yardstick(pilot: dict[str, Any], knobs: tuple[str, str]) -> list[str]:
    """What the seed alone moves: the pilot cells at their knob's default level are one generator
    setting with different set seeds, so a knob's range says something only above theirs."""
    defaults = pilot.get("defaults") or {}
    values, spread = defaults.get("differences") or [], defaults.get("range", float("nan"))
    if len(values) < 2:
        return []
    within = [k for k, row in pilot["knobs"].items() if not row["range"] > spread]
    picked = [k for k in knobs if k in within]
    return ["", f"Seed yardstick: the {len(values)} pilot cells at their knob's default level are one and the same "
            f"generator setting, differing only in their set's seed; their AOQ − baseline runs from {min(values):+.1f} "
            f"to {max(values):+.1f} (range {spread:.1f}). "
            + (f"Knobs whose range is not above it, not told apart from the seed by this pilot: {', '.join(within)}. "
               if within else "Every knob's range is above it. ")
            + (f"Among the picked: {', '.join(picked)}." if picked else "Both picked knobs' ranges are above it.")]


def _budget(setup: MapSetup) -> str:
    """How long each round trains, from the map's config as every run loads it."""
    from aoq.config import load_config

    cfg = load_config(setup.config, list(setup.overrides))
    patience = setup.patience

    def one(name: str, optim: Any) -> str:
        if optim.schedule == "plateau":
            return (f"{name} to its dev plateau (patience {patience or optim.patience}, {optim.plateaus} plateaus, "
                    f"cap {optim.epochs} epochs)")
        return f"{name} {optim.epochs} epochs ({optim.schedule} schedule)"

    return f"{one('round 1', cfg.train)}, {one('round 2', cfg.round2)}"


def _machines(runs: list[dict[str, Any]], pilot: dict[str, Any] | None) -> str:
    """The CPUs the jobs ran on, with how many each (grid and pilot)."""
    counts = machine_counts(runs)
    for cpu, n in (pilot or {}).get("machines", {}).items():
        counts[cpu] = counts.get(cpu, 0) + n
    return ", ".join(f"{cpu} ({n} job{'s' * (n != 1)})" for cpu, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def write_page(setup: MapSetup, knobs: tuple[str, str], jobs: dict[str, list[dict[str, Any]]],
               pilot: dict[str, Any] | None, command: str, out: Path, evidence: Path) -> dict[str, Any]:
    """Write the page and its evidence file atomically; returns the evidence."""
    cells = cell_evidence(setup, jobs)
    corr = correlations(cells) if len(cells) >= 3 else {}
    runs = [j for js in jobs.values() for j in js]
    minutes = sum(j["minutes"] for j in runs) + (pilot["minutes"] if pilot else 0.0)
    n = min((len(js) for js in jobs.values()), default=0)
    page = str(out.name)
    lines = ["# When does offline mining pay? The regime map", "",
             f"Written by `aoq regimes` on {time.strftime('%Y-%m-%d')} from {len(runs)} finished runs in "
             f"{setup.root}; {len(cells)} cells x up to {len(setup.replicates)} paired seeds. Ran on: {_machines(runs, pilot)}; "
             f"budget: {minutes:.0f} min ({minutes / 60:.1f} h) of training and validation (sum over every arm, pilot included). "
             "Regenerate with:", "", f"    {command}", "",
             "Every cell's replicate is its own synthetic set (seed derived from the cell and the replicate); "
             "the arms of a replicate share it, its round-1 model and mined lists (paired). Budgets: "
             f"{_budget(setup)}; rsum on the whole test split ({PROTOCOL}). "
             + (f"Intervals: {interval_method(n)}; {CLEAR}bold{CLEAR}: the interval excludes 0." if n >= 2 else
                "One seed per cell: no interval, a direction only (n is shown with every figure)."),
             "", "## Pilot", "", *pilot_section(pilot, knobs)]
    for arm in setup.arms:
        lines += [f"## {arm_label(arm)} − baseline (Δ rsum)", "", heatmap(setup, knobs, jobs, arm), ""]
    if "goal-cir-con" in setup.arms:
        lines += ["## AOQ − GOAL cir x con (Δ rsum)", "", heatmap(setup, knobs, jobs, GAIN_ARM, "goal-cir-con"), ""]
    lines += ["## Per cell", "",
              "Premise diagnostics of the baseline's mined lists (mean over replicates), the share of sampled "
              "candidates that are false negatives (positives under the evaluation's rule) and near neighbours "
              "(true of the anchor by the scenes' facts, negatives under the rule), epochs run per method.", "",
              cell_table(setup, jobs), "", "## Does anything measured before round 2 predict the gain?", ""]
    lines += predictor_section(corr, [c["gain"] for c in cells]) if corr else ["Too few cells with runs for a correlation."]
    lines += ["", "## Reference points", "", REFERENCES, ""]
    atomic_write_text(out, "\n".join(lines))
    data = {"page": f"docs/{page}", "cells": cells, "correlations": corr,
            "knobs": list(knobs), "gain_arm": GAIN_ARM, "replicates": n}
    atomic_write_json(evidence, _finite(data))
    return data


def _finite(tree: Any) -> Any:
    """The tree with nan as None (strict JSON)."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_finite(v) for v in tree]
    if isinstance(tree, float) and not np.isfinite(tree):
        return None
    return tree
