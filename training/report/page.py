"""The page ``aoq report`` writes: setup, tables per protocol, diagnostics and budgets,
within-family recall, sweeps, cost, figures and the hand-written notes, from finished runs."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any


from aoq.config import ExperimentConfig
from aoq.io import atomic_write_text
from aoq_train.report.runs import (
    collapsed_file,
    PROTOCOLS,
    ReportSetup,
    collect,
    machine_counts,
    seed_config,
    sweep_setup,
)
from aoq_train.report.false_negatives import false_negative_section
from aoq_train.report.figures import curves_figure, histogram_figure
from aoq_train.report.tables import (
    batch_time_ratios,
    diagnostic_cells,
    diagnostics_table,
    is_round1,
    label_protocol,
    label_scores,
    label_table,
    CAPPED,
    capped_runs,
    format_difference,
    pairs_table,
    interval_method,
    mean_spread,
    mean_std,
    method_label,
    per_seed_rsum,
    seeds_count,
    results_table,
    rsum_differences,
    within_family_table,
)

log = logging.getLogger(__name__)


def _family_section(collected: dict[str, Any]) -> list[str]:
    """Within-family R@1 on the test split, when the data has families (the synthetic benchmark)."""
    seeds = collected["seeds"]
    if any(s["family"] is None for s in seeds):
        return []
    scores = {m: [s["family"][m] for s in seeds] for m in collected["methods"]}
    sizes = next(iter(scores.values()))[0]
    return [
        "## Within-family R@1 (test split)", "",
        "R@1 of each query among the members of its own one-change family only (i2t + t2i, so 200 is "
        "perfect), per change kind of the query's image; ties by expected rank "
        f"([synthetic.md](synthetic.md)). Images in families: {int(sizes['all']['images'])}, mean family "
        f"size {sizes['all']['mean_family_size']:.2f}.", "",
        within_family_table(scores, collected["methods"]), "",
    ]


def _protocols(collected: dict[str, Any]) -> list[str]:
    """The protocols every seed was evaluated on: 5K and 1K when the test split allows, and full."""
    available = set.intersection(*(set(s["results"]["baseline"]) for s in collected["seeds"]))
    return [p for p in PROTOCOLS if p in available]


#: where ``aoq report`` writes by default (aoq_cli.report); other places are named in the command.
DEFAULT_OUT, DEFAULT_FIGURES = Path("docs/results.md"), Path("docs/figures")


def _command(setup: ReportSetup, out: Path, figures: Path) -> str:
    """The ``aoq report --run`` command line that regenerates this page (and its figures)."""
    parts = ["aoq report --run", f"--config {setup.config}", f"--seeds {','.join(map(str, setup.seeds))}",
             f"--arms {','.join(setup.arms)}", f"--runs {setup.runs_root}"]
    if setup.patience is not None:
        parts.append(f"--patience {setup.patience}")
    if setup.synth:
        parts.append(f"--synth --data {setup.data_dir} --train {setup.train} --dev {setup.dev} --test {setup.test}")
    parts += [f"--set {o}" for o in setup.overrides]
    for sweep in setup.sweeps:
        parts.append(f"--sweep '{sweep.name}" + (f":{','.join(sweep.overrides)}" if sweep.overrides else "")
                     + f"@{','.join(sweep.arms)}'")
    if setup.sweeps:
        parts.append(f"--sweep-seeds {','.join(map(str, setup.sweep_seeds))}")
    if setup.pairs:
        parts.append(f"--pairs {','.join(f'{a}:{b}' for a, b in setup.pairs)}")
    if setup.workers > 1:
        parts.append(f"--workers {setup.workers}")
    if setup.threads is not None:
        parts.append(f"--threads {setup.threads}")
    if setup.records is not None:
        parts.append(f"--records {setup.records}")
    if out != DEFAULT_OUT or figures != DEFAULT_FIGURES:
        parts.append(f"--out {out} --figures {figures}")
    return " ".join(parts)


def _setup_section(setup: ReportSetup, cfg: ExperimentConfig, collected: dict[str, Any]) -> list[str]:
    diag = next((s["diagnostics"] for s in collected["seeds"] if s["diagnostics"]), None)
    r1, r2 = cfg.train, cfg.round2
    depth = (f"h_t = {diag['settings']['h_t']}, h_i = {diag['settings']['h_i']}" if diag
             else f"h_t = {r2.h_t}, h_i = {r2.h_i}") + (f" (relative depth h_rel = {r2.h_rel:g})"
                                                         if r2.depth == "relative" else "")
    data = (f"`aoq synth --out {setup.data_dir} --train {setup.train} --dev {setup.dev} --test {setup.test}` "
            "(the demo's generator and seed)" if setup.synth
            else f"`{cfg.data.name}` ({cfg.data.format}, `{cfg.data.path}`)")
    round1_arms = [a for a in collected["methods"] if a != "baseline" and is_round1(a)]
    stop = "; ".join(f"{name}: {_schedule(optim)}" for name, optim in (("round 1", r1), ("round 2", r2)))
    return [
        "## Setup", "",
        f"- Data: {data}; seeds {', '.join(map(str, setup.seeds))}, paired (every arm of a seed shares its "
        + ("data, round-1 model and mined lists)." if not cfg.mining.teacher else "data, seed and mined lists)."),
        f"- Model: `{cfg.model.image_encoder}` image encoder, `{cfg.model.text_encoder}` text encoder, joint "
        f"space {cfg.model.embed_dim}; config `{setup.config}`"
        + (f" with `{' '.join(setup.overrides)}`" if setup.overrides else "") + ".",
        f"- Round 1 (the baseline): `{r1.loss}`, lr {r1.lr:g}, batch {r1.batch_size}.",
        *([f"- Round-1 arms ({', '.join(collected['methods'][a] for a in round1_arms)}): trained like the baseline, "
           f"from scratch and without mined negatives, with their own objective; GOAL with tau = {cfg.goal.tau:g}, "
           f"margin = {cfg.goal.margin}, multi-similarity a = {cfg.goal.ms_a:g}, b = {cfg.goal.ms_b:g}, "
           f"lambda = {cfg.goal.ms_lambda:g} ([goal.md](goal.md))."] if round1_arms else []),
        f"- Mining: top {cfg.mining.top_captions} captions per image, top {cfg.mining.top_images} images per "
        + ("caption, by the seed's own round-1 model." if not cfg.mining.teacher else
           f"caption, by a teacher from outside the runs (`{cfg.mining.teacher}`; the paper's setting for the "
           f"cross-attention models): {_teachers(setup.seeds, collected['seeds'])}."),
        f"- Round 2 (from scratch): lr {r2.lr:g}, batch {r2.batch_size}, {depth}, {r2.sampling} sampling, "
        f"g1 = {r2.margin_online:g}, g2 = {r2.margin_offline:g}, alpha = {r2.alpha:g}, beta = {r2.beta:g}.",
        f"- Budget ({stop}). Model selection: best dev rsum per run (never the test split). Single models. "
        f"{CAPPED} marks a method with runs the epoch cap stopped (they may not have converged; the budget "
        "table counts them).",
        f"- Evaluation: {cfg.eval.positives} positives ([evaluation.md](evaluation.md#positives-pair-or-text)); "
        "ties by expected rank under a random order of tied items ([evaluation.md](evaluation.md#ties)).",
        f"- Intervals: {interval_method(len(collected['seeds']))}.",
        f"- Compute: {_wall_minutes(collected):.0f} minutes of training and validation wall time over all seeds and "
        "methods (metrics logs; mining and evaluation not included).",
        "",
    ]


def _teachers(seed_numbers: tuple[int, ...], seeds: list[dict[str, Any]]) -> str:
    """Which teacher weights mined each seed's lists, in words (content hashes, 8 digits)."""
    by_hash: dict[str, list[str]] = {}
    for number, seed in zip(seed_numbers, seeds):
        by_hash.setdefault(seed["teacher"][:8], []).append(str(number))
    if len(by_hash) == 1:
        return f"the same weights for every seed (content hash {next(iter(by_hash))})"
    return ("one configuration, trained more than once (on another CPU, whose float kernels round differently, "
            "the same configuration gives other weights), so its weights differ between seeds as a retrained "
            "model's would (content hash: "
            + "; ".join(f"{h} for seed{'s' if len(n) > 1 else ''} {', '.join(n)}" for h, n in by_hash.items())
            + "); a seed's arms all train on its own lists")


def _schedule(optim: Any) -> str:
    """One round's learning-rate schedule and stopping rule, in words."""
    if optim.schedule == "plateau":
        return (f"lr x{optim.lr_decay_factor:g} when dev rsum has not improved for {optim.patience} epochs, stop at "
                f"plateau {optim.plateaus}, at most {optim.epochs} epochs")
    stop = f", early stop after {optim.patience} epochs without improvement" if optim.patience else ""
    return f"lr x{optim.lr_decay_factor:g} every {optim.lr_decay_epochs} epochs{stop}, at most {optim.epochs} epochs"


def _wall_minutes(collected: dict[str, Any]) -> float:
    return sum(h["train_time_s"] + h["val_time_s"] for s in collected["seeds"] for runs in s["history"].values()
               for h in runs) / 60


def _miner(cfg: ExperimentConfig) -> str:
    """Which model mined the lists, in words: the seed's round-1 model, or the teacher."""
    return "the teacher" if cfg.mining.teacher else "the round-1 model"


def _results_section(collected: dict[str, Any], pairs: tuple[tuple[str, str], ...], miner: str) -> list[str]:
    protocols = _protocols(collected)
    lines: list[str] = []
    for p in protocols:
        lines += [f"## {PROTOCOLS[p]}, mean ± std over seeds", "", results_table(collected, p), ""]
    lines += [f"rsum per seed ({PROTOCOLS[protocols[0]]}):", "", per_seed_rsum(collected, protocols[0]), ""]
    if pairs:
        lines += [f"## Paired comparisons between methods ({PROTOCOLS[protocols[0]]})", "",
                  "The mean per-seed difference of the first method minus the second, with the same paired "
                  "interval as above.", "", pairs_table(collected, pairs, protocols[0]), ""]
    labels = label_table(collected)
    if labels:
        where = PROTOCOLS[label_protocol(collected["seeds"][0]["results"]["baseline"])]
        lines += [f"## Label-wise retrieval ({where}), mean ± std over seeds", "",
                  "Relevance = the number of labels a query and a gallery item share; mAP@R and NDCG@k as defined "
                  "in [evaluation.md](evaluation.md#label-wise-evaluation), in percent, both directions.", "",
                  labels, ""]
    lines += [
              "## Hardness diagnostics and training budget per method", "",
              f"Diagnostics of the mined lists at {miner} (`mined/diagnostics.json`, "
              "[mining.md](mining.md#hardness-diagnostics)), means over seeds; a negative S_on − S_off means "
              "the offline negatives are the harder ones (the paper's premise). Budget: epochs run, the epoch "
              "of the best dev rsum, wall time of training plus validation (means over seeds), and how many "
              "runs the epoch cap stopped.", "",
              diagnostics_table(collected), ""]
    shares = [s["diagnostics"]["shares"] for s in collected["seeds"] if s["diagnostics"] and "shares" in s["diagnostics"]]
    if shares:
        near = [x["near_neighbours"] for x in shares if x["near_neighbours"] is not None]
        lines += [f"Within the depth round 2 samples from, mean over {seeds_count(len(shares))}: "
                  f"{100 * statistics.fmean(x['false_negatives'] for x in shares):.2f}% of the mined candidates are "
                  "false negatives (positives of their anchor under the evaluation's own rule, "
                  f"`eval.positives`), "
                  + (f"{100 * statistics.fmean(near):.2f}% near neighbours (true of the anchor by the data's broader "
                     "ground truth, negatives under that rule)" if near else "near neighbours unknown (no broader "
                     "ground truth)")
                  + ". The `identity` filter of `aoq mine` (the `aoq-fn-identity...` arms) drops identical texts "
                  "([method.md](method.md#false-negatives)).", ""]
    else:  # runs mined before the two kinds were counted: their identical-text count only
        certain = [s["diagnostics"]["certain_false_negatives"] for s in collected["seeds"]
                   if s["diagnostics"] and "certain_false_negatives" in s["diagnostics"]]
        if certain:
            lines += [f"Mined captions within h_t whose text is one of the anchor image's own captions (false negatives "
                      f"under the text rule), mean over seeds: "
                      f"{100 * statistics.fmean(c['pairs'] for c in certain):.2f}% of the (image, mined caption) pairs, "
                      f"{100 * statistics.fmean(c['images'] for c in certain):.1f}% of the images have at least one.", ""]
    for s in collected["seeds"]:
        for warning in (s["diagnostics"] or {}).get("warnings", []):
            lines += [f"**Warning ({Path(s['run_dir']).name}):** {warning}", ""]
    return lines


def _collapsed(run_dirs: list[Path], sweep: str) -> str | None:
    """The collapse message of the first run of a sweep point that the collapse guard stopped."""
    for run_dir in run_dirs:
        if collapsed_file(run_dir, sweep).is_file():
            return json.loads(collapsed_file(run_dir, sweep).read_text())["message"]
    return None


def sweeps_table(setup: ReportSetup) -> str:
    """One row per sweep point and arm: rsum of the point's baseline and arm, the paired
    difference (interval over the sweep seeds, n shown) and the mined lists' diagnostics."""
    lines = ["| sweep | overrides | method | baseline rsum | method rsum | Δ rsum [95% CI] | NDCG@10 baseline / "
             "method | h_t / h_i | S_on − S_off (img / cap) | premise held |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for sweep in setup.sweeps:
        point = sweep_setup(setup, sweep)
        run_dirs = [seed_config(point, s).run_dir for s in point.seeds]
        stopped = _collapsed(run_dirs, sweep.name)
        if stopped is not None:
            reason = stopped.split(":", 1)[-1].split(". ")[0].strip()
            lines.append(f"| {sweep.name} | `{' '.join(sweep.overrides) or '—'}` | "
                         f"{', '.join(point.methods[a] for a in sweep.arms)} | — | collapsed | {reason} | | | | |")
            continue
        collected = collect(run_dirs, point.methods)
        protocol = _protocols(collected)[0]
        base = mean_std([s["results"]["baseline"][protocol]["rsum"] for s in collected["seeds"]])[0]
        for arm in sweep.arms:
            value = mean_std([s["results"][arm][protocol]["rsum"] for s in collected["seeds"]])[0]
            depth, _, _, gap, held = diagnostic_cells(collected["seeds"], arm)
            mined = ["—"] * 3 if is_round1(arm) else [depth, gap, held]
            lines.append(f"| {sweep.name} | `{' '.join(sweep.overrides) or '—'}` | {method_label(collected, arm)}"
                         f"{f' (baseline {CAPPED})' if capped_runs(collected, 'baseline') else ''} | "
                         f"{base:.1f} | {value:.1f} | {format_difference(rsum_differences(collected, arm, protocol))} | "
                         f"{_mean_ndcg(collected, 'baseline')} / {_mean_ndcg(collected, arm)} | " + " | ".join(mined) + " |")
    return "\n".join(lines)


def _mean_ndcg(collected: dict[str, Any], arm: str) -> str:
    """Seed mean of an arm's NDCG@k (mean of both directions, on the protocol that has it), or a dash."""
    results = [s["results"][arm] for s in collected["seeds"]]
    protocols = [label_protocol(r) for r in results]
    if None in protocols:
        return "—"
    return f"{statistics.fmean(label_scores(r[p])['ndcg'] for r, p in zip(results, protocols)):.2f}"


def _sweeps_section(setup: ReportSetup) -> list[str]:
    if not setup.sweeps:
        return []
    return ["## Sweeps", "",
            f"One seed group each (seeds {', '.join(map(str, setup.sweep_seeds))}): every point retrains its "
            "own baseline, mines with it and trains the listed arms; rsum on the first protocol of the main "
            "table. A single seed has no interval: read these points as directions, not results.", "",
            sweeps_table(setup), ""]


def _cost_section(collected: dict[str, Any]) -> list[str]:
    lines = ["## Training cost per batch", "",
             "Mean wall time per training batch from the metrics logs (first epoch left out), same machine and run:",
             "", "| method | baseline s/batch | method s/batch | ratio (mean ± std over seeds) |",
             "|---|---:|---:|---:|"]
    for arm, (b, a, r, sd) in batch_time_ratios(collected).items():
        lines.append(f"| {collected['methods'][arm]} | {b:.3f} | {a:.3f} | "
                     f"{mean_spread(r, sd, len(collected['seeds']), 2)} |")
    return lines + ["", "Paper (VSRN on a GPU): 1.604 s / 1.096 s = 1.46x.", ""]


def _figures_section(collected: dict[str, Any], out: Path, figures: Path, miner: str) -> list[str]:
    curves_figure(collected, figures / "r1_curves.png")
    arms = [a for a in collected["methods"] if a != "baseline"]
    first = collected["seeds"][0]
    hists, seed = first["rank_histogram"], Path(first["run_dir"]).name
    histogram_figure(hists, figures / "rank_histogram.png", seed)

    def rel(p: Path) -> Path:
        return p.relative_to(out.parent) if p.is_relative_to(out.parent) else p

    return [
        "## Figures", "", f"![dev R@1 against epoch]({rel(figures / 'r1_curves.png')})", "",
        "Dev R@1 against epoch, mean over seeds (paper Fig. 4 style): the baseline's curve is round 1, "
        f"the others are round 2 (trained from scratch with the negatives {miner} mined)"
        + ("; the round-1 arms' curves are round 1 too (trained from scratch like the baseline)."
           if any(is_round1(a) for a in arms) else "."), "",
        f"![cross-retrieval rank histogram]({rel(figures / 'rank_histogram.png')})", "",
        "Cross-retrieval rank `max(5 r_i - 4, r_t)` of every positive test pair (supplement Fig. 1 style), "
        f"{seed}: "
        + "; ".join(f"{k}: " + ", ".join(f"{b} {c}" for b, c in v.items()) for k, v in hists.items()) + ".", "",
    ]


def _scene_section(collected: dict[str, Any], h_t: int) -> list[str]:
    """The synthetic benchmark's scene-based checks of the first seed's mined lists (when its
    set has scene records)."""
    first = collected["seeds"][0]
    diag = first["scene"]
    if diag is None:
        return []
    return [
        f"## Mining diagnostics from the scene records ({Path(first['run_dir']).name})", "",
        f"- Hardest mined caption of a training image describes a scene of the same one-change family: "
        f"{100 * diag['family_top1']:.1f}% of images.",
        f"- Hardest mined caption comes from a scene with exactly the same objects (shape and colour; only sizes "
        f"or positions differ): {100 * diag['same_objects_top1']:.1f}% of images; over all mined pairs within "
        f"depth h_t = {h_t}: {100 * diag['same_objects']:.1f}%. Such captions often describe the "
        "anchor too (they rarely mention sizes and positions): likely false negatives.",
        f"- Mined (image, caption) pairs within depth h_t = {h_t} whose caption text equals one of the "
        f"image's own captions (certain false negatives): {100 * diag['duplicate_text']:.2f}%.", "",
    ]


def _machines(collected: dict[str, Any]) -> str:
    """The CPUs the seeds ran on, with how many seeds each ran ("not noted" for older runs)."""
    counts = machine_counts(collected["seeds"])
    return ", ".join(f"{cpu} ({n} seed{'s' if n > 1 else ''})" for cpu, n in counts.items())


def write_report(setup: ReportSetup, seeds: list[dict[str, Any]], out: Path, figures: Path) -> str:
    """Write ``out`` (markdown) and its two PNG figures from the finished seeds' summaries
    (:func:`aoq_train.report.records.seed_summary`, in the setup's seed order); returns the text."""
    collected = {"seeds": seeds, "methods": setup.methods}
    cfg = seed_config(setup, setup.seeds[0])
    diag = seeds[0]["diagnostics"]
    h_t = diag["settings"]["h_t"] if diag else cfg.round2.h_t
    title = "the synthetic benchmark" if setup.synth else f"`{cfg.data.name}`"
    source = f"the run files under `{setup.runs_root}`" + (
        f" and the seed records in `{setup.records}`" if setup.records is not None else "")
    lines = [
        f"# Results on {title}", "",
        f"Generated by `aoq report` on {time.strftime('%Y-%m-%d')} from {source} ({seeds_count(len(seeds))}); "
        f"ran on: {_machines(collected)}. Regenerate with:", "",
        f"    {_command(setup, out, figures)}", "",
        "(`--run` runs or resumes the pipelines; without it the tables come from the finished runs"
        + (" and the records" if setup.records is not None else "") + ".)", "",
        *_setup_section(setup, cfg, collected),
        *_results_section(collected, setup.pairs, _miner(cfg)),
        *_family_section(collected),
        *_sweeps_section(setup),
        *_cost_section(collected),
        *_figures_section(collected, out, figures, _miner(cfg)),
        *_scene_section(collected, h_t),
        *false_negative_section(seeds, setup.methods),
    ]
    text = "\n".join(lines)
    notes = out.with_name(f"{out.stem}-notes.md")  # the hand-written part of the page: results-notes.md
    if notes.is_file():
        text += "\n" + notes.read_text()
    atomic_write_text(out, text)
    return text
