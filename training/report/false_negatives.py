"""The false-negative section of ``aoq report``: how many mined candidates are false negatives
(positives under the evaluation's own rule) and near neighbours (true of the anchor by a broader
ground truth, negatives under that rule), and how well each filter of ``mining.filters`` finds
either kind (:mod:`aoq_train.mining.truth`; docs/method.md, False negatives).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from aoq.names import FALSE_NEGATIVE_FILTERS
from aoq_train.mining.truth import KINDS, Truth, list_shares
from aoq_train.mining.truth import detector_scores as _detector_scores

def detector_scores(mined: Any, truth: Truth, top_captions: int, top_images: int) -> dict[str, Any]:
    """:func:`aoq_train.mining.truth.detector_scores` of a filtered artefact."""
    if mined.filtered is None:
        raise ValueError(f"{mined.path}: unfiltered lists carry no filter flags")
    return _detector_scores(mined.filtered, list(mined.filters), truth, top_captions, top_images)


def _mean(values: list[float | None]) -> float:
    """Percent mean of the known values (a filter that flagged nothing has no precision)."""
    known = [v for v in values if v is not None and v == v]
    return 100 * statistics.fmean(known) if known else float("nan")


def _pr(seeds: list[dict[str, Any]], name: str, kind: str) -> str:
    if seeds[0][name][kind] is None:
        return "— / —"
    return (f"{_mean([s[name][kind]['precision'] for s in seeds]):.0f} / "
            f"{_mean([s[name][kind]['recall'] for s in seeds]):.0f}")


def detectors_table(per_seed: dict[str, list[dict[str, Any]]], labels: dict[str, str]) -> str:
    """Markdown: per filtered arm, the share of each kind in the unfiltered top, what its enabled
    filters flag and their precision / recall against each kind, then each filter on its own
    (means over seeds, percent)."""
    lines = ["| lists of | false negatives in the unfiltered top | near neighbours there | flagged by the arm's filters "
             "| precision / recall: false negatives | precision / recall: near neighbours | "
             + " | ".join(f"{name}: flagged, P / R false neg., P / R near" for name in FALSE_NEGATIVE_FILTERS) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(FALSE_NEGATIVE_FILTERS)]
    for arm, seeds in per_seed.items():
        singles = [f"{_mean([s[n]['flagged'] for s in seeds]):.1f}, {_pr(seeds, n, KINDS[0])}, {_pr(seeds, n, KINDS[1])}"
                   if n in seeds[0] else "—" for n in FALSE_NEGATIVE_FILTERS]
        lines.append(f"| {labels[arm]} | {_mean([s[KINDS[0]] for s in seeds]):.1f} | "
                     f"{_mean([s[KINDS[1]] for s in seeds]):.1f} | {_mean([s['enabled']['flagged'] for s in seeds]):.1f} | "
                     f"{_pr(seeds, 'enabled', KINDS[0])} | {_pr(seeds, 'enabled', KINDS[1])} | "
                     + " | ".join(singles) + " |")
    return "\n".join(lines)


def _folders(methods: dict[str, str]) -> dict[str, str]:
    """Each round-2 list folder of the report's arms -> the first arm that trains on it."""
    from aoq_train.pipeline.arms import resolve_arm
    from aoq_train.report.tables import is_round1

    folders: dict[str, str] = {}
    for arm in methods:
        if not is_round1(arm):
            folders.setdefault(resolve_arm(arm).mined_folder, arm)
    return folders


def needs_truth(methods: dict[str, str]) -> bool:
    """Whether the report has a false-negative section: an arm trains on lists other than the
    baseline's (filtered ones, or another model's)."""
    return len(_folders(methods)) >= 2


def seed_false_negatives(run_dir: Path, methods: dict[str, str], truth: Truth) -> dict[str, Any]:
    """What the section reads from one seed's mined lists: the shares of both kinds in the
    unfiltered lists (``plain``), each filtered arm's detector scores (``scores``) and, for an arm
    filtering the baseline's own lists, S_on − S_off of its caption anchors before and after
    (``gaps``); with the truth's rules, so that the section can be written from this alone."""
    from aoq.mined import load_mined
    from aoq_train.pipeline.arms import resolve_arm

    before = load_mined(run_dir / "mined").diagnostics  # the baseline's unfiltered lists
    out: dict[str, Any] = {"positive_rule": truth.positive_rule, "broad_rule": truth.broad_rule,
                           "plain": [], "scores": {}, "gaps": {}}
    for folder, arm in _folders(methods).items():
        mined = load_mined(run_dir / folder)
        diag = mined.diagnostics
        h_t, h_i = diag["settings"]["h_t"], diag["settings"]["h_i"]
        if mined.filtered is None:
            out["plain"].append(list_shares(mined.img_top_caps, mined.cap_top_imgs, truth, h_t, h_i))
            continue
        out["scores"][arm] = detector_scores(mined, truth, h_t, h_i)
        if resolve_arm(arm).teacher is None:  # mined by the baseline: the plain lists are its "before"
            out["gaps"][arm] = [before["caption_anchors"]["on_minus_off"], diag["caption_anchors"]["on_minus_off"]]
    return out


def false_negative_section(seeds: list[dict[str, Any]], methods: dict[str, str]) -> list[str]:
    """The page's section (when an arm trains on filtered lists) from the seeds'
    :func:`seed_false_negatives`: both kinds in the lists each round-2 arm trains on, the filters'
    precision and recall against each, and the premise before and after filtering."""
    from aoq_train.report.tables import seeds_count

    per_seed = [s["false_negatives"] for s in seeds if s.get("false_negatives")]
    if not per_seed:
        return []
    plain = [p for s in per_seed for p in s["plain"]]
    scores: dict[str, list[dict[str, Any]]] = {}
    gaps: dict[str, list[list[float]]] = {}
    for s in per_seed:
        for arm, score in s["scores"].items():
            scores.setdefault(arm, []).append(score)
        for arm, gap in s["gaps"].items():
            gaps.setdefault(arm, []).append(gap)
    positive_rule, broad_rule = per_seed[0]["positive_rule"], per_seed[0]["broad_rule"]
    near = _mean([p["near_neighbours"] for p in plain])
    lines = ["## False negatives and near neighbours in the mined lists", "",
             f"False negatives: candidates that are positives of their anchor under the evaluation's own rule "
             f"({positive_rule}). Near neighbours: negatives under that rule that "
             + (f"{broad_rule} makes true of the anchor." if broad_rule else
                "a broader ground truth would make true of the anchor (this data carries none: unknown).")
             + f" Within the depth round 2 samples from (h_t / h_i), the unfiltered lists hold "
             f"{_mean([p['false_negatives'] for p in plain]):.1f}% false negatives and "
             + ("an unknown share of near neighbours" if near != near else f"{near:.1f}% near neighbours")
             + f" (mean over {seeds_count(len(plain))}). Each filter scored as a detector of either kind there "
             "(percent, means over seeds; a filter that flags nothing has no precision; — : not one of the arm's "
             "filters, or the kind is unknown):", "",
             detectors_table(scores, {a: methods[a] for a in scores}), "",
             "Caption anchors' S_on − S_off (in-batch hardest minus offline negative, at the model that mined) "
             "before and "
             "after filtering, means over seeds: "
             + "; ".join(f"{methods[a]}: {statistics.fmean(b for b, _ in g):+.3f} -> {statistics.fmean(x for _, x in g):+.3f}"
                         for a, g in gaps.items()) + ".", ""]
    return lines
