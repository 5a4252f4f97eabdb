"""The tables and statistics of ``aoq report``: means over seeds, paired bootstrap intervals of
the difference to the baseline, per-seed rsum, hardness diagnostics and budgets, batch-time ratios,
within-family recall."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from aoq_train.pipeline.arms import resolve_arm

BOOTSTRAP_SAMPLES = 10_000

KEYS = (("i2t", "r1"), ("i2t", "r5"), ("i2t", "r10"), ("t2i", "r1"), ("t2i", "r5"), ("t2i", "r10"))


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def paired_bootstrap(differences: list[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                     ) -> tuple[float, float, float]:
    """Mean of paired per-seed differences and its percentile bootstrap 95% interval.

    The seeds are resampled with replacement (``samples`` times, a fixed generator, so the report
    is reproducible); the interval is the 2.5th and 97.5th percentile of the resampled means.
    With one seed the interval is that one value.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("paired_bootstrap needs at least one difference")
    picks = np.random.default_rng(seed).integers(0, d.size, size=(samples, d.size))
    means = d[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(low), float(high)


def rsum_differences(collected: dict[str, Any], arm: str, protocol: str) -> list[float]:
    """rsum of ``arm`` minus the baseline's, per seed (paired: same seed, data and round 1)."""
    return [s["results"][arm][protocol]["rsum"] - s["results"]["baseline"][protocol]["rsum"]
            for s in collected["seeds"]]


def budget(history: list[dict[str, Any]]) -> dict[str, float]:
    """Epochs run, epoch of the best dev rsum (epochs to plateau) and wall time of one run."""
    best = max(history, key=lambda h: h["dev_rsum"]) if history else {"epoch": 0}
    return {"epochs": len(history), "best_epoch": best["epoch"],
            "minutes": sum(h["train_time_s"] + h["val_time_s"] for h in history) / 60}


def results_table(collected: dict[str, Any], protocol: str) -> str:
    """Mean ± std over seeds of R@K and rsum per method, and rsum minus the baseline's with its
    paired bootstrap 95% interval."""
    header = "| method | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | rsum | Δ rsum vs baseline [95% CI] |"
    lines = [header, "|---|" + "---:|" * 8]
    for arm, label in collected["methods"].items():
        runs = [s["results"][arm][protocol] for s in collected["seeds"]]
        cells = [mean_std([r[d][k] for r in runs]) for d, k in KEYS] + [mean_std([r["rsum"] for r in runs])]
        delta = "—"
        if arm != "baseline":
            mean, low, high = paired_bootstrap(rsum_differences(collected, arm, protocol))
            delta = f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        lines.append(f"| {label} | " + " | ".join(f"{m:.1f} ± {s:.1f}" for m, s in cells) + f" | {delta} |")
    return "\n".join(lines)


def per_seed_rsum(collected: dict[str, Any], protocol: str) -> str:
    """rsum of every method for every seed (so the spread behind the means is visible)."""
    arms = list(collected["methods"])
    lines = ["| seed | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for s in collected["seeds"]:
        lines.append(f"| {Path(s['run_dir']).name} | "
                     + " | ".join(f"{s['results'][arm][protocol]['rsum']:.1f}" for arm in arms) + " |")
    return "\n".join(lines)


def is_round1(arm: str) -> bool:
    """The baseline and round-1 arms: trained without the mined lists, so their diagnostics do not apply."""
    return arm == "baseline" or resolve_arm(arm).round == 1


def diagnostic_cells(seeds: list[dict[str, Any]]) -> list[str]:
    """Seed means of the hardness diagnostics (image / caption anchors), or dashes without them."""
    diags = [s["diagnostics"] for s in seeds if s["diagnostics"]]
    if not diags:
        return ["—"] * 5

    def both(key: str, fmt: str, pick=lambda v: v) -> str:
        return " / ".join(format(statistics.fmean(pick(d[side][key]) for d in diags), fmt)
                          for side in ("image_anchors", "caption_anchors"))

    depth = sorted({f"{d['settings']['h_t']} / {d['settings']['h_i']}" for d in diags})
    median = lambda v: v["median"]  # noqa: E731
    held = sum(d["premise_holds"] for d in diags)
    return [", ".join(depth), both("in_batch_rank", ".0f", median), both("offline_rank", ".0f", median),
            both("on_minus_off", "+.3f"), f"{held} of {len(diags)}"]


def diagnostics_table(collected: dict[str, Any]) -> str:
    """Per method: the mined lists' hardness diagnostics (round-2 arms) and the training budget."""
    lines = ["| method | h_t / h_i | in-batch hardest rank, median (img / cap) | offline rank, median "
             "(img / cap) | S_on − S_off (img / cap) | premise held (seeds) | epochs run | best epoch "
             "| wall time (min) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm, label in collected["methods"].items():
        diag = ["—"] * 5 if is_round1(arm) else diagnostic_cells(collected["seeds"])
        runs = [budget(s["history"][arm]) for s in collected["seeds"]]
        spend = [f"{statistics.fmean(r[k] for r in runs):.{d}f}" for k, d in
                 (("epochs", 1), ("best_epoch", 1), ("minutes", 1))]
        lines.append(f"| {label} | " + " | ".join(diag + spend) + " |")
    return "\n".join(lines)


def batch_time_ratios(collected: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """Per-batch training time of each round-2 arm over the baseline's, from the logs.

    The first epoch is left out when there are more (it pays for warm-up). Returns, per arm,
    (mean baseline s/batch, mean arm s/batch, mean ratio, std of the per-seed ratios).
    """
    out = {}
    for arm in (a for a in collected["methods"] if a != "baseline"):
        base_t, arm_t, ratios = [], [], []
        for s in collected["seeds"]:
            b = [h["batch_time_s"] for h in s["history"]["baseline"]]
            a = [h["batch_time_s"] for h in s["history"][arm]]
            b, a = (b[1:] or b), (a[1:] or a)
            base_t.append(statistics.fmean(b))
            arm_t.append(statistics.fmean(a))
            ratios.append(arm_t[-1] / base_t[-1])
        out[arm] = (statistics.fmean(base_t), statistics.fmean(arm_t), *mean_std(ratios))
    return out


def within_family_table(scores: dict[str, list[dict[str, dict[str, float]]]], names: dict[str, str]) -> str:
    """Markdown: per method, the within-family R@1 (i2t + t2i, mean ± std over seeds) per change
    kind, and the paired bootstrap interval of the ``all`` figure minus the baseline's."""
    kinds = sorted(next(iter(scores.values()))[0])
    head = "| method | " + " | ".join(kinds) + " | Δ all vs baseline [95% CI] |"
    lines = [head, "|---|" + "---:|" * (len(kinds) + 1)]
    base = [r["all"]["i2t_r1"] + r["all"]["t2i_r1"] for r in scores["baseline"]]
    for method, per_seed in scores.items():
        cells = []
        for kind in kinds:
            values = [r[kind]["i2t_r1"] + r[kind]["t2i_r1"] for r in per_seed if kind in r]
            mean, std = mean_std(values)
            cells.append(f"{mean:.1f} ± {std:.1f}")
        if method == "baseline":
            delta = "—"
        else:
            diffs = [r["all"]["i2t_r1"] + r["all"]["t2i_r1"] - b for r, b in zip(per_seed, base)]
            mean, low, high = paired_bootstrap(diffs)
            delta = f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        lines.append(f"| {names[method]} | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines)


def label_scores(result: dict[str, Any]) -> dict[str, float] | None:
    """Label-wise metrics of one evaluation in percent (``i2t_map``, ``t2i_map``, ``i2t_ndcg``,
    ``t2i_ndcg``, and ``ndcg``: the mean of both directions' NDCG), None without labels."""
    labels = result.get("labels")
    if not labels:
        return None
    ndcg = f"ndcg_at_{labels['k']}"
    out = {f"{d}_{short}": 100 * labels[d][key] for d in ("i2t", "t2i")
           for short, key in (("map", "map_at_r"), ("ndcg", ndcg))}
    out["ndcg"] = (out["i2t_ndcg"] + out["t2i_ndcg"]) / 2
    return out


def label_protocol(results: dict[str, Any]) -> str | None:
    """The protocol of one model's comparison results that holds the label-wise metrics (1K
    5-fold on a 5,000-image split, else full), None without them."""
    return next((p for p in ("1k5fold", "full") if "labels" in results.get(p, {})), None)


def label_table(collected: dict[str, Any]) -> str | None:
    """Mean ± std over seeds of mAP@R and NDCG@k per direction and method (percent), and the
    mean-NDCG difference to the baseline with its paired bootstrap 95% interval; None when the
    results carry no label-wise metrics."""
    protocol = label_protocol(collected["seeds"][0]["results"]["baseline"])
    if protocol is None:
        return None
    per_arm = {arm: [label_scores(s["results"][arm][protocol]) for s in collected["seeds"]]
               for arm in collected["methods"]}
    if any(v is None for runs in per_arm.values() for v in runs):
        return None
    k = collected["seeds"][0]["results"]["baseline"][protocol]["labels"]["k"]
    lines = [f"| method | i2t mAP@R | i2t NDCG@{k} | t2i mAP@R | t2i NDCG@{k} | Δ NDCG@{k} (mean of both) vs "
             "baseline [95% CI] |", "|---|" + "---:|" * 5]
    base = [r["ndcg"] for r in per_arm["baseline"]]
    for arm, label in collected["methods"].items():
        runs = per_arm[arm]
        cells = [mean_std([r[key] for r in runs]) for key in ("i2t_map", "i2t_ndcg", "t2i_map", "t2i_ndcg")]
        delta = "—"
        if arm != "baseline":
            mean, low, high = paired_bootstrap([r["ndcg"] - b for r, b in zip(runs, base)])
            delta = f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]"
        lines.append(f"| {label} | " + " | ".join(f"{m:.2f} ± {sd:.2f}" for m, sd in cells) + f" | {delta} |")
    return "\n".join(lines)
