"""The false-negative section of ``aoq report``: how many mined candidates are true of their
anchor, and how well each filter of ``mining.filters`` finds them (docs/method.md, False negatives).

Ground truth, where the data has it:

* the synthetic benchmark's structured facts: a candidate caption is a false negative when every
  fact it states holds of the anchor image (:meth:`aoq.data.facts.SplitFacts.caption_true_of`);
* the emoji set (a Karpathy JSON whose entries name their ``base`` emoji): the candidate's text is
  one of the anchor's texts, or its picture shows the same base emoji (another skin tone, gender
  form or vendor);
* otherwise identical text only (:func:`aoq.data.facts.text_identity`), a lower bound.

Each filter is scored as a detector over the candidates of the unfiltered lists' top (what round
2 would otherwise sample from): precision = flagged and true / flagged, recall = flagged and true
/ true.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aoq.data.dataset import SplitData
from aoq.data.facts import text_identity
from aoq.data.karpathy import SPLIT_NAMES
from aoq.mined import MinedNegatives
from aoq.names import FALSE_NEGATIVE_FILTERS

#: ``f(caption_ids, image_ids) -> bool array``: caption k is true of image k.
TrueOf = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Truth:
    """Which (caption, image) pairs of a training split count as matches, and by what rule."""

    rule: str
    true_of: TrueOf


def split_truth(split: SplitData, data_path: str | Path, data_format: str) -> Truth:
    """The best ground truth the training split allows (module docstring)."""
    if split.facts is not None:
        return Truth("the synthetic benchmark's facts", split.facts.caption_true_of)
    same_text = text_identity(split.captions, split.captions_per_image)
    bases = _bases(Path(data_path)) if data_format == "karpathy" else None
    if bases is None or len(bases) != split.n_images:
        return Truth("identical text", same_text)
    cpi = split.captions_per_image

    def true_of(captions: np.ndarray, images: np.ndarray) -> np.ndarray:
        captions, images = np.asarray(captions).reshape(-1), np.asarray(images).reshape(-1)
        return same_text(captions, images) | (bases[captions // cpi] == bases[images])

    return Truth("identical text, or the same base emoji (skin tone, gender form or vendor)", true_of)


def _bases(json_path: Path) -> np.ndarray | None:
    """The ``base`` of every training image of a Karpathy JSON (in the reader's order), or None
    when the entries do not name one."""
    entries = [e for e in json.loads(json_path.read_text())["images"] if SPLIT_NAMES.get(e.get("split")) == "train"]
    if not entries or not all(isinstance(e.get("base"), str) for e in entries):
        return None
    ids = {b: k for k, b in enumerate(dict.fromkeys(e["base"] for e in entries))}
    return np.array([ids[e["base"]] for e in entries], dtype=np.int64)


def detector_scores(mined: MinedNegatives, truth: Truth, top_captions: int, top_images: int) -> dict[str, Any]:
    """Per enabled filter (each on its own, and together): precision and recall as a
    false-negative detector over the unfiltered top of both directions' raw lists, and the share of
    those candidates that are false negatives (``true``)."""
    if mined.filtered is None:
        raise ValueError(f"{mined.path}: unfiltered lists carry no filter flags")
    f = mined.filtered
    img_raw, cap_raw = np.asarray(f["img_raw"])[:, :top_captions], np.asarray(f["cap_raw"])[:, :top_images]
    img_rows = np.repeat(np.arange(img_raw.shape[0]), img_raw.shape[1])
    cap_rows = np.repeat(np.arange(cap_raw.shape[0]), cap_raw.shape[1])
    true = np.concatenate([truth.true_of(img_raw.reshape(-1), img_rows),
                           truth.true_of(cap_rows, cap_raw.reshape(-1))])
    bits = np.concatenate([np.asarray(f["img_flags"])[:, :top_captions].reshape(-1),
                           np.asarray(f["cap_flags"])[:, :top_images].reshape(-1)])
    flags = {name: (bits >> k & 1).astype(bool) for k, name in enumerate(FALSE_NEGATIVE_FILTERS)
             if name in mined.filters}  # the mining evaluates only the enabled filters
    flags["enabled"] = np.any([flags[name] for name in mined.filters], axis=0)
    return {"true": float(true.mean()), **{name: _scores(flag, true) for name, flag in flags.items()}}


def _scores(flagged: np.ndarray, true: np.ndarray) -> dict[str, float]:
    hits = float(np.count_nonzero(flagged & true))
    return {"flagged": float(flagged.mean()),
            "precision": hits / np.count_nonzero(flagged) if flagged.any() else float("nan"),
            "recall": hits / np.count_nonzero(true) if true.any() else float("nan")}


def detectors_table(per_seed: dict[str, list[dict[str, Any]]], labels: dict[str, str]) -> str:
    """Markdown: per filtered arm, what its enabled filters flag and how precise they are, then each
    filter on its own (means over seeds, percent)."""
    lines = ["| lists of | false negatives in the unfiltered top | flagged by the arm's filters | precision | recall | "
             + " | ".join(f"{name}: flagged / precision / recall" for name in FALSE_NEGATIVE_FILTERS) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(FALSE_NEGATIVE_FILTERS)]
    for arm, seeds in per_seed.items():
        def mean(*keys: str) -> float:
            values = [s[keys[0]][keys[1]] if len(keys) == 2 else s[keys[0]] for s in seeds]
            values = [v for v in values if v == v]  # a filter that flagged nothing has no precision
            return 100 * statistics.fmean(values) if values else float("nan")

        singles = [f"{mean(n, 'flagged'):.1f} / {mean(n, 'precision'):.0f} / {mean(n, 'recall'):.0f}"
                   if n in seeds[0] else "—" for n in FALSE_NEGATIVE_FILTERS]
        lines.append(f"| {labels[arm]} | {mean('true'):.1f} | {mean('enabled', 'flagged'):.1f} | "
                     f"{mean('enabled', 'precision'):.0f} | {mean('enabled', 'recall'):.0f} | " + " | ".join(singles) + " |")
    return "\n".join(lines)


def _plain_share(mined: MinedNegatives, truth: Truth, h_t: int, h_i: int) -> float:
    """The share of false negatives among the candidates round 2 samples from (unfiltered lists)."""
    img, cap = np.asarray(mined.img_top_caps)[:, :h_t], np.asarray(mined.cap_top_imgs)[:, :h_i]
    true = np.concatenate([truth.true_of(img.reshape(-1), np.repeat(np.arange(img.shape[0]), img.shape[1])),
                           truth.true_of(np.repeat(np.arange(cap.shape[0]), cap.shape[1]), cap.reshape(-1))])
    return float(true.mean())


def false_negative_section(run_dirs: list[Path], methods: dict[str, str], cfg: Any) -> list[str]:
    """The page's section (when an arm trains on filtered lists): the false negatives in the lists
    each round-2 arm trains on, the filters' precision and recall against the training split's
    ground truth, and the premise before and after filtering."""
    from aoq.data.load import load_split
    from aoq.mined import load_mined
    from aoq_train.pipeline.arms import resolve_arm
    from aoq_train.report.tables import is_round1

    folders = {}
    for arm in methods:
        if not is_round1(arm):
            folders.setdefault(resolve_arm(arm).mined_folder, arm)
    if len(folders) < 2:
        return []
    truth = split_truth(load_split(cfg.data, "train"), cfg.data.path, cfg.data.format)
    plain: list[float] = []
    scores: dict[str, list[dict[str, Any]]] = {}
    gaps: dict[str, list[tuple[float, float]]] = {}
    for run_dir in run_dirs:
        before = load_mined(run_dir / "mined").diagnostics  # the baseline's unfiltered lists
        for folder, arm in folders.items():
            mined = load_mined(run_dir / folder)
            diag = mined.diagnostics
            h_t, h_i = diag["settings"]["h_t"], diag["settings"]["h_i"]
            if mined.filtered is None:
                plain.append(_plain_share(mined, truth, h_t, h_i))
                continue
            scores.setdefault(arm, []).append(detector_scores(mined, truth, h_t, h_i))
            if resolve_arm(arm).teacher is None:  # mined by the baseline: the plain lists are its "before"
                gaps.setdefault(arm, []).append((before["caption_anchors"]["on_minus_off"],
                                                 diag["caption_anchors"]["on_minus_off"]))
    lines = ["## False negatives in the mined lists", "",
             f"Ground truth: {truth.rule}. Within the depth round 2 samples from (h_t / h_i), "
             f"{100 * statistics.fmean(plain):.1f}% of the candidates of the unfiltered lists are true of their anchor "
             f"(mean over {len(plain)} seeds). Each filter scored as a false-negative detector there "
             "(percent, means over seeds; a filter that flags nothing has no precision; — : not one of the arm's "
             "filters, not evaluated):", "",
             detectors_table(scores, {a: methods[a] for a in scores}), "",
             "Caption anchors' S_on − S_off (in-batch hardest minus offline negative, round-1 model) before and "
             "after filtering, means over seeds: "
             + "; ".join(f"{methods[a]}: {statistics.fmean(b for b, _ in g):+.3f} -> {statistics.fmean(x for _, x in g):+.3f}"
                         for a, g in gaps.items()) + ".", ""]
    return lines
