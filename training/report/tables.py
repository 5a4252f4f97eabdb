"""The tables and statistics of ``aoq report``: means over seeds, paired intervals of the
difference to the baseline (Student-t over seeds, n shown), per-seed rsum, hardness diagnostics
and budgets (a run the epoch cap stopped is flagged), batch-time ratios, within-family recall."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from aoq_train.pipeline.arms import resolve_arm

BOOTSTRAP_SAMPLES = 10_000
#: below this many paired seeds a percentile bootstrap is too narrow (about 1.6x at 5 seeds): the
#: interval is Student's t on the differences; from this many on, the bootstrap.
BOOTSTRAP_MIN_SEEDS = 20
#: the mark of a method with runs the epoch cap stopped (they may not have converged)
CAPPED = "†"

KEYS = (("i2t", "r1"), ("i2t", "r5"), ("i2t", "r10"), ("t2i", "r1"), ("t2i", "r5"), ("t2i", "r10"))


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mean_spread(mean: float, std: float, n: int, digits: int = 1) -> str:
    """``12.3 ± 1.4``: a mean ± std over ``n`` seeds; one seed has no spread, so its value alone
    (a ``± 0.0`` would read as a measured spread of zero)."""
    return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def mean_std_cell(values: list[float], digits: int = 1) -> str:
    """:func:`mean_spread` of ``values``, one per seed."""
    return mean_spread(*mean_std(values), len(values), digits)


def seeds_count(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def paired_interval(differences: list[float], samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                    ) -> tuple[float, float, float]:
    """Mean of paired per-seed differences and its 95% interval.

    With fewer than ``BOOTSTRAP_MIN_SEEDS`` seeds, Student's t: ``mean ± t(0.975, n-1) sd / sqrt(n)``;
    with more, the percentile bootstrap of the mean (``samples`` resamples of the seeds with
    replacement, a fixed generator so the page is reproducible). With one seed there is no
    interval: (value, nan, nan).
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("paired_interval needs at least one difference")
    mean = float(d.mean())
    if d.size == 1:
        return mean, float("nan"), float("nan")
    if d.size < BOOTSTRAP_MIN_SEEDS:
        half = float(stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))
        return mean, mean - half, mean + half
    picks = np.random.default_rng(seed).integers(0, d.size, size=(samples, d.size))
    low, high = np.percentile(d[picks].mean(axis=1), [2.5, 97.5])
    return mean, float(low), float(high)


def format_difference(differences: list[float], digits: int = 1) -> str:
    """``+4.6 [-1.9, +11.1] (n=5)``: the mean paired difference, its 95% interval (Student-t
    below 20 seeds, bootstrap from 20), and how many seeds; one seed shows only its value."""
    mean, low, high = paired_interval(differences)
    n = len(differences)
    if n == 1:
        return f"{mean:+.{digits}f} (n=1)"
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] (n={n})"


def interval_method(n: int) -> str:
    """How the page's intervals over ``n`` paired seeds are computed, in words."""
    if n == 1:
        return "one seed: each difference to the baseline is shown without an interval (a direction, not a result)"
    if n >= BOOTSTRAP_MIN_SEEDS:
        return (f"percentile bootstrap over the {n} paired seeds ({BOOTSTRAP_SAMPLES:,} resamples) of the mean "
                "difference to the baseline, 95%")
    return (f"paired Student-t interval over the {n} seeds of the mean difference to the baseline, 95% "
            f"(t with {n - 1} degrees of freedom; n is shown with every interval)")


def rsum_differences(collected: dict[str, Any], arm: str, protocol: str, reference: str = "baseline") -> list[float]:
    """rsum of ``arm`` minus ``reference``'s, per seed (paired: same seed, data and round 1)."""
    return [s["results"][arm][protocol]["rsum"] - s["results"][reference][protocol]["rsum"]
            for s in collected["seeds"]]


def pairs_table(collected: dict[str, Any], pairs: tuple[tuple[str, str], ...], protocol: str) -> str:
    """rsum (and, with labels, mean NDCG) of each ``(arm, reference)`` pair: the paired mean
    difference ``arm - reference`` with its 95% interval and n, for comparisons other than the
    baseline (filtered against plain AOQ, against the best round-1 objective, ...)."""
    ndcg = label_protocol(collected["seeds"][0]["results"]["baseline"])
    header = "| method | against | Δ rsum [95% CI] |" + (" Δ NDCG@10 (mean of both) [95% CI] |" if ndcg else "")
    lines = [header, "|---|---|---:|" + ("---:|" if ndcg else "")]
    for arm, reference in pairs:
        row = (f"| {method_label(collected, arm)} | {method_label(collected, reference)} | "
               f"{format_difference(rsum_differences(collected, arm, protocol, reference))} |")
        if ndcg:
            scores = [(label_scores(s["results"][arm][ndcg]), label_scores(s["results"][reference][ndcg]))
                      for s in collected["seeds"]]
            row += f" {format_difference([a['ndcg'] - b['ndcg'] for a, b in scores], 2)} |"
        lines.append(row)
    return "\n".join(lines)


def budget(history: list[dict[str, Any]]) -> dict[str, float]:
    """Epochs run, epoch of the best dev rsum (epochs to plateau) and wall time of one run."""
    best = max(history, key=lambda h: h["dev_rsum"]) if history else {"epoch": 0}
    return {"epochs": len(history), "best_epoch": best["epoch"],
            "minutes": sum(h["train_time_s"] + h["val_time_s"] for h in history) / 60}


def capped_runs(collected: dict[str, Any], arm: str) -> int:
    """How many of an arm's runs the epoch cap stopped (their metrics log's last ``stop``)."""
    return sum(bool(h) and h[-1].get("stop") == "cap" for h in (s["history"][arm] for s in collected["seeds"]))


def method_label(collected: dict[str, Any], arm: str) -> str:
    """The method's name, marked when the epoch cap stopped any of its runs."""
    return collected["methods"][arm] + (f" {CAPPED}" if capped_runs(collected, arm) else "")


def results_table(collected: dict[str, Any], protocol: str) -> str:
    """Mean ± std over seeds of R@K and rsum per method, and rsum minus the baseline's with its
    paired 95% interval and n."""
    header = "| method | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | rsum | Δ rsum vs baseline [95% CI] |"
    lines = [header, "|---|" + "---:|" * 8]
    for arm, label in collected["methods"].items():
        runs = [s["results"][arm][protocol] for s in collected["seeds"]]
        cells = [mean_std_cell([r[d][k] for r in runs]) for d, k in KEYS] + [mean_std_cell([r["rsum"] for r in runs])]
        delta = "—" if arm == "baseline" else format_difference(rsum_differences(collected, arm, protocol))
        lines.append(f"| {method_label(collected, arm)} | " + " | ".join(cells) + f" | {delta} |")
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


def diagnostic_cells(seeds: list[dict[str, Any]], arm: str) -> list[str]:
    """Seed means of the hardness diagnostics of ``arm``'s own lists (image / caption anchors),
    or dashes without them."""
    diags = [d for d in (s["arm_diagnostics"][arm] for s in seeds) if d]
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
             "| wall time (min) | stopped by the cap |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in collected["methods"]:
        diag = ["—"] * 5 if is_round1(arm) else diagnostic_cells(collected["seeds"], arm)
        runs = [budget(s["history"][arm]) for s in collected["seeds"]]
        spend = [f"{statistics.fmean(r[k] for r in runs):.{d}f}" for k, d in
                 (("epochs", 1), ("best_epoch", 1), ("minutes", 1))]
        spend.append(f"{capped_runs(collected, arm)} of {len(runs)}")
        lines.append(f"| {method_label(collected, arm)} | " + " | ".join(diag + spend) + " |")
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
    kind, and the paired interval of the ``all`` figure minus the baseline's."""
    kinds = sorted(next(iter(scores.values()))[0])
    head = "| method | " + " | ".join(kinds) + " | Δ all vs baseline [95% CI] |"
    lines = [head, "|---|" + "---:|" * (len(kinds) + 1)]
    base = [r["all"]["i2t_r1"] + r["all"]["t2i_r1"] for r in scores["baseline"]]
    for method, per_seed in scores.items():
        cells = []
        for kind in kinds:
            cells.append(mean_std_cell([r[kind]["i2t_r1"] + r[kind]["t2i_r1"] for r in per_seed if kind in r]))
        if method == "baseline":
            delta = "—"
        else:
            delta = format_difference([r["all"]["i2t_r1"] + r["all"]["t2i_r1"] - b for r, b in zip(per_seed, base)])
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
    mean-NDCG difference to the baseline with its paired 95% interval; None when the
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
        cells = [mean_std_cell([r[key] for r in runs], 2) for key in ("i2t_map", "i2t_ndcg", "t2i_map", "t2i_ndcg")]
        delta = "—" if arm == "baseline" else format_difference([r["ndcg"] - b for r, b in zip(runs, base)], 2)
        lines.append(f"| {method_label(collected, arm)} | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines)
