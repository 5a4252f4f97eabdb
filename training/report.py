"""The experiment report ``docs/results.md``: several paired seeds of the pipeline on any dataset,
the baseline against round-2 arms (default OffTri, OffQuin, AdapOffQuin), from the run files only.

``aoq report --run`` first runs (or resumes, stage by stage) one pipeline per seed: the config's
own dataset, or with ``--synth`` a synthetic set generated for the report (by default with a
5,000-image test split, so that the full 5K and the COCO-style 5-fold 1K protocols both apply).
Seeds are paired: every arm of a seed shares that seed's data, round-1 model and mined lists.
Without ``--run`` it only reads finished runs. Every figure in the report is computed here from
``comparison/comparison.json``, ``metrics.jsonl``, ``mined/diagnostics.json`` and the checkpoints.
"""

from __future__ import annotations

import io
import json
import logging
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from aoq.config import ExperimentConfig, load_config
from aoq.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from training.guards import TrainingCollapsed

log = logging.getLogger(__name__)

#: pipeline arm (``models/<arm>``) -> display name; "baseline" is round 1.
LABELS: dict[str, str] = {
    "baseline": "Baseline (VSE++ max violation)",
    "offtri": "OffTri (Eq. 3)",
    "offquin": "OffQuin (Eq. 4)",
    "aoq": "AdapOffQuin (Eq. 5, AOQ)",
    "only_offline": "OnlyOffline (ablation)",
    "online_quin": "OnlineQuin (ablation)",
    "no_offline_adapt": "w/o OfflineAdap (ablation)",
    "finetune": "AdapOffQuin, finetuned from round 1",
}
ARMS = ("offtri", "offquin", "aoq")
#: protocol -> heading, in the order the report shows them.
PROTOCOLS = {
    "5k": "5K protocol (all 5,000 test images)",
    "1k5fold": "1K protocol (mean of 5 folds of 1,000 test images)",
    "full": "full test split",
}
KEYS = (("i2t", "r1"), ("i2t", "r5"), ("i2t", "r10"), ("t2i", "r1"), ("t2i", "r5"), ("t2i", "r10"))
BOOTSTRAP_SAMPLES = 10_000
#: written into a sweep run that the collapse guard stopped (the point is reported as collapsed)
COLLAPSED_FILE = "collapsed.json"


@dataclass(frozen=True)
class Sweep:
    """One sweep point: config overrides on top of the report's, run for the sweep seeds with
    ``arms`` (each compared with that point's own baseline), in ``<runs>/sweeps/<name>``."""

    name: str
    overrides: tuple[str, ...] = ()
    arms: tuple[str, ...] = ("aoq",)


def parse_sweep(text: str) -> Sweep:
    """``NAME[:KEY=VALUE,...][@ARM,...]``, e.g. ``depth10:round2.depth=absolute,round2.h_t=10@aoq``."""
    head, _, arms = text.partition("@")
    name, _, overrides = head.partition(":")
    if not name.strip() or "/" in name:
        raise ValueError(f"--sweep {text!r}: give NAME[:KEY=VALUE,...][@ARM,...]")
    items = tuple(o.strip() for o in overrides.split(",") if o.strip())
    if any("=" not in o for o in items):
        raise ValueError(f"--sweep {text!r}: overrides are KEY=VALUE, separated by commas")
    chosen = tuple(a.strip() for a in arms.split(",") if a.strip()) or ("aoq",)
    return Sweep(name.strip(), items, chosen)


@dataclass
class ReportSetup:
    """What the report runs: the config, seeds, arms, early stopping, the data and folders.

    ``synth``: generate a synthetic set of ``train``/``dev``/``test`` images under ``data_dir``
    and run on it; otherwise the config's own ``data`` section is used as is.
    """

    config: Path
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    arms: tuple[str, ...] = ARMS
    runs_root: Path = Path("runs/report")
    synth: bool = False
    data_dir: Path = Path("data/report")
    train: int = 4000
    dev: int = 500
    test: int = 5000
    overrides: tuple[str, ...] = ()
    #: early stopping on dev rsum for both rounds (``epochs`` caps it); None keeps the config's.
    patience: int | None = 3
    sweeps: tuple[Sweep, ...] = ()
    sweep_seeds: tuple[int, ...] = (0,)

    @property
    def methods(self) -> dict[str, str]:
        """arm -> label, baseline first."""
        return {arm: LABELS.get(arm, arm) for arm in ("baseline", *self.arms)}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0,2,5"`` -> (0, 2, 5); ranges and lists may mix."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, _, high = part.partition("-")
        try:
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
        except ValueError:
            raise ValueError(f"--seeds: cannot read {part!r}; use e.g. 0-4 or 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give distinct seeds, e.g. 0-4")
    return tuple(seeds)


def seed_config(setup: ReportSetup, seed: int) -> ExperimentConfig:
    """The config of one seed: the report's overrides and patience, seeded, in ``<runs>/seed<N>``."""
    from training.pipeline import seeded_config

    patience = [] if setup.patience is None else [f"train.patience={setup.patience}",
                                                  f"round2.patience={setup.patience}"]
    cfg = load_config(setup.config, [*patience, *setup.overrides])
    cfg.out_dir = str(setup.runs_root)
    if setup.synth:
        cfg.data = cfg.data.model_copy(update={"path": str(setup.data_dir / "precomp"), "format": "precomp"})
    return seeded_config(cfg, seed)


def sweep_setup(setup: ReportSetup, sweep: Sweep) -> ReportSetup:
    """The report setup of one sweep point: its overrides added, its arms, the sweep seeds."""
    return replace(setup, seeds=setup.sweep_seeds, arms=sweep.arms, overrides=(*setup.overrides, *sweep.overrides),
                   runs_root=setup.runs_root / "sweeps" / sweep.name, sweeps=())


def run_experiments(setup: ReportSetup, main: bool = True) -> list[Path]:
    """Generate the synthetic set if asked, then run (or resume) every seed's pipeline with all arms
    (unless ``main`` is False), then every sweep point. Finished stages are skipped, so several
    processes may share the work by sweep points."""
    from training.pipeline import KNOWN_ARMS, run_pipeline

    if setup.synth:
        from training.datasets.synth.writer import ensure_dataset

        ensure_dataset(setup.data_dir, {"train": setup.train, "dev": setup.dev, "test": setup.test})
    run_dirs = []
    jobs = [(setup, seed) for seed in setup.seeds] if main else []
    jobs += [(sweep_setup(setup, sw), seed) for sw in setup.sweeps for seed in setup.sweep_seeds]
    for job, seed in jobs:
        cfg = seed_config(job, seed)
        log.info("report: seed %d -> %s", seed, cfg.run_dir)
        try:
            run_pipeline(cfg, {arm: KNOWN_ARMS[arm] for arm in job.arms})
        except TrainingCollapsed as exc:
            if not job.runs_root.is_relative_to(setup.runs_root / "sweeps"):
                raise  # a main seed must finish: the tables compare every arm on every seed
            # A sweep point that collapses is a result: recorded, shown in the table, not retried.
            log.warning("report: sweep run %s collapsed: %s", cfg.run_dir, exc)
            atomic_write_json(cfg.run_dir / COLLAPSED_FILE, {"message": str(exc)})
        run_dirs.append(cfg.run_dir)
    return run_dirs[:len(setup.seeds)] if main else []


# --------------------------------------------------------------------------- collection


def _history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _round_dir(run_dir: Path, arm: str) -> Path:
    if arm == "baseline":
        return run_dir / "round1"
    return run_dir / ("round2" if arm == "aoq" else f"round2-{arm}")


def _diagnostics(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "mined" / "diagnostics.json"
    return json.loads(path.read_text()) if path.is_file() else None


def collect(run_dirs: list[Path], methods: dict[str, str]) -> dict[str, Any]:
    """Read every finished seed: results per protocol, training curves, mining diagnostics."""
    seeds = []
    for run_dir in run_dirs:
        comparison = json.loads((run_dir / "comparison" / "comparison.json").read_text())
        seeds.append({
            "run_dir": str(run_dir),
            "results": comparison,
            "history": {arm: _history(_round_dir(run_dir, arm) / "metrics.jsonl") for arm in methods},
            "diagnostics": _diagnostics(run_dir),
        })
    return {"seeds": seeds, "methods": methods}


# --------------------------------------------------------------------------- statistics


def _mean_std(values: list[float]) -> tuple[float, float]:
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


# --------------------------------------------------------------------------- tables


def results_table(collected: dict[str, Any], protocol: str) -> str:
    """Mean ± std over seeds of R@K and rsum per method, and rsum minus the baseline's with its
    paired bootstrap 95% interval."""
    header = "| method | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | rsum | Δ rsum vs baseline [95% CI] |"
    lines = [header, "|---|" + "---:|" * 8]
    for arm, label in collected["methods"].items():
        runs = [s["results"][arm][protocol] for s in collected["seeds"]]
        cells = [_mean_std([r[d][k] for r in runs]) for d, k in KEYS] + [_mean_std([r["rsum"] for r in runs])]
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


def _diagnostic_cells(seeds: list[dict[str, Any]]) -> list[str]:
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
        diag = ["—"] * 5 if arm == "baseline" else _diagnostic_cells(collected["seeds"])
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
        out[arm] = (statistics.fmean(base_t), statistics.fmean(arm_t), *_mean_std(ratios))
    return out


# --------------------------------------------------------------------------- figures


def curves_figure(collected: dict[str, Any], path: Path) -> None:
    """Dev R@1 against epoch (paper Fig. 4 style): baseline = round 1, the others = round 2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    for ax, direction, title in ((axes[0], "t2i", "image retrieval (t2i)"), (axes[1], "i2t", "sentence retrieval (i2t)")):
        for arm, label in collected["methods"].items():
            series = [[h[f"dev_{direction}_r1"] for h in s["history"][arm]] for s in collected["seeds"]]
            n = min(len(x) for x in series)  # early stopping may end seeds at different epochs
            mean = np.mean([x[:n] for x in series], axis=0)
            ax.plot(range(1, n + 1), mean, marker="o", markersize=3, label=label)
        ax.set_title(f"dev R@1, {title}")
        ax.set_xlabel("epoch (round 1 for the baseline, round 2 for the others)")
        ax.set_ylabel("R@1 (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def rank_histograms(run_dir: Path, arms: tuple[str, ...], split: str = "test") -> dict[str, dict[str, int]]:
    """Cross-retrieval rank histogram (supplement Fig. 1) of the given arms' models on ``split``."""
    from aoq.checkpoint import load_checkpoint
    from aoq.data.load import load_split
    from aoq.embed import encode_split
    from aoq.metrics import cross_retrieval_ranks, rank_histogram

    out = {}
    for arm in arms:
        ckpt = load_checkpoint(run_dir / "models" / arm)
        data = load_split(ckpt.config.data, split)
        img, cap = encode_split(ckpt.model, ckpt.vocab, data, image_size=ckpt.config.data.image_size)
        out[arm] = rank_histogram(cross_retrieval_ranks(img @ cap.T, data.captions_per_image))
    return out


def within_family_scores(run_dirs: list[Path], methods: tuple[str, ...], split: str = "test",
                         ) -> dict[str, list[dict[str, dict[str, float]]]] | None:
    """Within-family R@1 per change kind (training/family_metrics.py) of every method's model on
    ``split``, one dict per seed; None when the split has no family structure."""
    from aoq.checkpoint import load_checkpoint
    from aoq.data.load import load_split
    from aoq.embed import encode_split
    from training.family_metrics import within_family_of_split

    out: dict[str, list[dict[str, dict[str, float]]]] = {m: [] for m in methods}
    for run_dir in run_dirs:
        for method in methods:
            ckpt = load_checkpoint(run_dir / "models" / method)
            data = load_split(ckpt.config.data, split)
            img, cap = encode_split(ckpt.model, ckpt.vocab, data, image_size=ckpt.config.data.image_size)
            result = within_family_of_split(img @ cap.T, data)
            if result is None:
                return None
            out[method].append(result)
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
            mean, std = _mean_std(values)
            cells.append(f"{mean:.1f} ± {std:.1f}")
        if method == "baseline":
            delta = "—"
        else:
            diffs = [r["all"]["i2t_r1"] + r["all"]["t2i_r1"] - b for r, b in zip(per_seed, base)]
            mean, low, high = paired_bootstrap(diffs)
            delta = f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]"
        lines.append(f"| {names[method]} | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines)


def _family_section(collected: dict[str, Any], run_dirs: list[Path]) -> list[str]:
    """Within-family R@1 on the test split, when the data has families (the synthetic benchmark)."""
    scores = within_family_scores(run_dirs, tuple(collected["methods"]))
    if scores is None:
        return []
    sizes = next(iter(scores.values()))[0]
    return [
        "## Within-family R@1 (test split)", "",
        "R@1 of each query among the members of its own one-change family only (i2t + t2i, so 200 is "
        "perfect), per change kind of the query's image; ties count against the positive "
        f"([synthetic.md](synthetic.md)). Images in families: {int(sizes['all']['images'])}, mean family "
        f"size {sizes['all']['mean_family_size']:.2f}.", "",
        within_family_table(scores, collected["methods"]), "",
    ]


def histogram_figure(hists: dict[str, dict[str, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(next(iter(hists.values())))
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, (name, counts) in enumerate(hists.items()):
        total = sum(counts.values())
        ax.bar(x + (i - 0.5) * 0.4, [100 * counts[k] / total for k in labels], width=0.4, label=name)
    ax.set_xticks(x, labels)
    ax.set_xlabel("cross-retrieval rank of the positive pair")
    ax.set_ylabel("% of positive pairs")
    ax.set_title("cross-retrieval rank histogram, test split (seed 0)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: Path) -> None:
    """Write a figure as PNG atomically (no software tag, so reruns give the same bytes)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# --------------------------------------------------------------------------- scene diagnostics (synthetic)


def scene_diagnostics(run_dir: Path, data_dir: Path, h_t: int) -> dict[str, float]:
    """How hard and how clean the mined negatives are, from the generator's scene records.

    * ``family_top1``: share of training images whose hardest mined caption describes a scene of
      the same family (a one-change near-duplicate): the negatives AOQ is meant to find.
    * ``same_objects_top1`` / ``same_objects``: share of images whose hardest mined caption (and
      of all mined pairs within the sampled depth ``h_t``) comes from a scene with exactly the
      same objects by shape and colour. Captions that leave out sizes and positions, which many
      do, are then true descriptions of the anchor: likely false negatives.
    * ``duplicate_text``: share of the mined pairs within ``h_t`` whose text equals one of the
      image's own captions: certain false negatives.
    """
    from aoq.mined import load_mined

    mined = load_mined(run_dir / "mined")
    scenes = sorted((json.loads(line) for line in (data_dir / "scenes.jsonl").read_text().splitlines()
                     if '"split": "train"' in line), key=lambda s: s["index"])
    family = np.array([s["family"] for s in scenes])
    objects = [tuple(sorted((o["shape"], o["colour"]) for o in s["objects"])) for s in scenes]
    ids = {o: i for i, o in enumerate(dict.fromkeys(objects))}
    content = np.array([ids[o] for o in objects])
    captions = (data_dir / "precomp" / "train_caps.txt").read_text().splitlines()
    cpi = len(captions) // len(family)
    top = np.asarray(mined.img_top_caps[:, :h_t])
    owner = top // cpi
    own = [set(captions[k * cpi:(k + 1) * cpi]) for k in range(len(family))]
    dup = sum(captions[c] in own[k] for k in range(len(family)) for c in top[k])
    return {
        "family_top1": float(np.mean(family[owner[:, 0]] == family)),
        "same_objects_top1": float(np.mean(content[owner[:, 0]] == content)),
        "same_objects": float(np.mean(content[owner] == content[:, None])),
        "duplicate_text": dup / top.size,
    }


# --------------------------------------------------------------------------- the page


def _protocols(collected: dict[str, Any]) -> list[str]:
    """The protocols every seed was evaluated on: 5K and 1K when the test split allows, and full."""
    available = set.intersection(*(set(s["results"]["baseline"]) for s in collected["seeds"]))
    return [p for p in PROTOCOLS if p in available]


def _command(setup: ReportSetup) -> str:
    """The ``aoq report --run`` command line that regenerates this page."""
    parts = ["aoq report --run", f"--config {setup.config}", f"--seeds {','.join(map(str, setup.seeds))}",
             f"--arms {','.join(setup.arms)}", f"--runs {setup.runs_root}",
             f"--patience {setup.patience if setup.patience is not None else 0}"]
    if setup.synth:
        parts.append(f"--synth --data {setup.data_dir} --train {setup.train} --dev {setup.dev} --test {setup.test}")
    parts += [f"--set {o}" for o in setup.overrides]
    for sweep in setup.sweeps:
        parts.append(f"--sweep '{sweep.name}" + (f":{','.join(sweep.overrides)}" if sweep.overrides else "")
                     + f"@{','.join(sweep.arms)}'")
    if setup.sweeps:
        parts.append(f"--sweep-seeds {','.join(map(str, setup.sweep_seeds))}")
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
    stop = (f"early stopping on dev rsum with patience {r1.patience} (round 1) / {r2.patience} (round 2), "
            "`epochs` as the cap" if r1.patience or r2.patience else "every epoch of the schedule")
    return [
        "## Setup", "",
        f"- Data: {data}; seeds {', '.join(map(str, setup.seeds))}, paired (every arm of a seed shares its "
        "data, round-1 model and mined lists).",
        f"- Model: `{cfg.model.image_encoder}` image encoder, `{cfg.model.text_encoder}` text encoder, joint "
        f"space {cfg.model.embed_dim}; config `{setup.config}`"
        + (f" with `{' '.join(setup.overrides)}`" if setup.overrides else "") + ".",
        f"- Round 1 (the baseline): `{r1.loss}`, at most {r1.epochs} epochs, lr {r1.lr:g} x{r1.lr_decay_factor:g} "
        f"every {r1.lr_decay_epochs} epochs, batch {r1.batch_size}.",
        f"- Mining: top {cfg.mining.top_captions} captions per image, top {cfg.mining.top_images} images per "
        "caption, by the seed's own round-1 model.",
        f"- Round 2 (from scratch): at most {r2.epochs} epochs, lr {r2.lr:g} x{r2.lr_decay_factor:g} every "
        f"{r2.lr_decay_epochs} epochs, batch {r2.batch_size}, {depth}, {r2.sampling} sampling, "
        f"g1 = {r2.margin_online:g}, g2 = {r2.margin_offline:g}, alpha = {r2.alpha:g}, beta = {r2.beta:g}.",
        f"- Budget: {stop}. Model selection: best dev rsum per run (never the test split). Single models.",
        "- Intervals: paired bootstrap over seeds (10,000 resamples) of the mean rsum difference to the "
        "baseline, 95% percentile interval. Ties in the scores count against the positive "
        "([evaluation.md](evaluation.md#ties)).",
        "",
    ]


def _results_section(collected: dict[str, Any]) -> list[str]:
    protocols = _protocols(collected)
    lines: list[str] = []
    for p in protocols:
        lines += [f"## {PROTOCOLS[p]}, mean ± std over seeds", "", results_table(collected, p), ""]
    lines += [f"rsum per seed ({PROTOCOLS[protocols[0]]}):", "", per_seed_rsum(collected, protocols[0]), "",
              "## Hardness diagnostics and training budget per method", "",
              "Diagnostics of the mined lists at the round-1 model (`mined/diagnostics.json`, "
              "[mining.md](mining.md#hardness-diagnostics)), means over seeds; a negative S_on − S_off means "
              "the offline negatives are the harder ones (the paper's premise). Budget: epochs run, the epoch "
              "of the best dev rsum (epochs to plateau) and wall time of training plus validation.", "",
              diagnostics_table(collected), ""]
    certain = [s["diagnostics"]["certain_false_negatives"] for s in collected["seeds"]
               if s["diagnostics"] and "certain_false_negatives" in s["diagnostics"]]
    if certain:
        lines += [f"Certain false negatives in the mined lists (a mined caption within h_t whose text is one of the "
                  f"anchor image's own captions), mean over seeds: "
                  f"{100 * statistics.fmean(c['pairs'] for c in certain):.2f}% of the (image, mined caption) pairs, "
                  f"{100 * statistics.fmean(c['images'] for c in certain):.1f}% of the images have at least one. "
                  "`round2.false_negative_filter` drops them (and, where the data has structured facts, every "
                  "mined caption that is true of the anchor).", ""]
    for s in collected["seeds"]:
        for warning in (s["diagnostics"] or {}).get("warnings", []):
            lines += [f"**Warning ({Path(s['run_dir']).name}):** {warning}", ""]
    return lines


def _collapsed(run_dirs: list[Path]) -> str | None:
    """The collapse message of the first run of a sweep point that the collapse guard stopped."""
    for run_dir in run_dirs:
        if (run_dir / COLLAPSED_FILE).is_file():
            return json.loads((run_dir / COLLAPSED_FILE).read_text())["message"]
    return None


def sweeps_table(setup: ReportSetup) -> str:
    """One row per sweep point and arm: rsum of the point's baseline and arm, the paired
    difference (bootstrap interval over the sweep seeds) and the mined lists' diagnostics."""
    lines = ["| sweep | overrides | method | baseline rsum | method rsum | Δ rsum [95% CI] | h_t / h_i "
             "| S_on − S_off (img / cap) | premise held |", "|---|---|---|---:|---:|---:|---|---:|---:|"]
    for sweep in setup.sweeps:
        point = sweep_setup(setup, sweep)
        run_dirs = [seed_config(point, s).run_dir for s in point.seeds]
        stopped = _collapsed(run_dirs)
        if stopped is not None:
            reason = stopped.split(":", 1)[-1].split(". ")[0].strip()
            lines.append(f"| {sweep.name} | `{' '.join(sweep.overrides) or '—'}` | "
                         f"{', '.join(point.methods[a] for a in sweep.arms)} | — | collapsed | {reason} | | | |")
            continue
        collected = collect(run_dirs, point.methods)
        protocol = _protocols(collected)[0]
        depth, _, _, gap, held = _diagnostic_cells(collected["seeds"])
        base = _mean_std([s["results"]["baseline"][protocol]["rsum"] for s in collected["seeds"]])[0]
        for arm in sweep.arms:
            value = _mean_std([s["results"][arm][protocol]["rsum"] for s in collected["seeds"]])[0]
            mean, low, high = paired_bootstrap(rsum_differences(collected, arm, protocol))
            lines.append(f"| {sweep.name} | `{' '.join(sweep.overrides) or '—'}` | {point.methods[arm]} | "
                         f"{base:.1f} | {value:.1f} | {mean:+.1f} [{low:+.1f}, {high:+.1f}] | {depth} | {gap} "
                         f"| {held} |")
    return "\n".join(lines)


def _sweeps_section(setup: ReportSetup) -> list[str]:
    if not setup.sweeps:
        return []
    return ["## Sweeps", "",
            f"One seed group each (seeds {', '.join(map(str, setup.sweep_seeds))}): every point retrains its "
            "own baseline, mines with it and trains the listed arms; rsum on the first protocol of the main "
            "table. A single seed's interval is the point itself: read these as directions, not results.", "",
            sweeps_table(setup), ""]


def _cost_section(collected: dict[str, Any]) -> list[str]:
    lines = ["## Training cost per batch", "",
             "Mean wall time per training batch from the metrics logs (first epoch left out), same machine and run:",
             "", "| method | baseline s/batch | method s/batch | ratio (mean ± std over seeds) |",
             "|---|---:|---:|---:|"]
    for arm, (b, a, r, sd) in batch_time_ratios(collected).items():
        lines.append(f"| {collected['methods'][arm]} | {b:.3f} | {a:.3f} | {r:.2f} ± {sd:.2f} |")
    return lines + ["", "Paper (VSRN on a GPU): 1.604 s / 1.096 s = 1.46x.", ""]


def _figures_section(collected: dict[str, Any], run_dirs: list[Path], out: Path, figures: Path) -> list[str]:
    curves_figure(collected, figures / "r1_curves.png")
    arms = [a for a in collected["methods"] if a != "baseline"]
    hists = rank_histograms(run_dirs[0], ("baseline", "aoq" if "aoq" in arms else arms[0]))
    histogram_figure(hists, figures / "rank_histogram.png")

    def rel(p: Path) -> Path:
        return p.relative_to(out.parent) if p.is_relative_to(out.parent) else p

    return [
        "## Figures", "", f"![dev R@1 against epoch]({rel(figures / 'r1_curves.png')})", "",
        "Dev R@1 against epoch, mean over seeds (paper Fig. 4 style): the baseline's curve is round 1, "
        "the others are round 2 (trained from scratch with the baseline's mined negatives).", "",
        f"![cross-retrieval rank histogram]({rel(figures / 'rank_histogram.png')})", "",
        "Cross-retrieval rank `max(5 r_i - 4, r_t)` of every positive test pair (supplement Fig. 1 style), "
        f"{Path(run_dirs[0]).name}: "
        + "; ".join(f"{k}: " + ", ".join(f"{b} {c}" for b, c in v.items()) for k, v in hists.items()) + ".", "",
    ]


def _scene_section(setup: ReportSetup, run_dir: Path, h_t: int) -> list[str]:
    """The synthetic benchmark's scene-based checks of the mined lists (needs its scenes.jsonl)."""
    if not (setup.synth and (setup.data_dir / "scenes.jsonl").is_file()):
        return []
    diag = scene_diagnostics(run_dir, setup.data_dir, h_t)
    return [
        f"## Mining diagnostics from the scene records ({run_dir.name})", "",
        f"- Hardest mined caption of a training image describes a scene of the same one-change family: "
        f"{100 * diag['family_top1']:.1f}% of images.",
        f"- Hardest mined caption comes from a scene with exactly the same objects (shape and colour; only sizes "
        f"or positions differ): {100 * diag['same_objects_top1']:.1f}% of images; over all mined pairs within "
        f"depth h_t = {h_t}: {100 * diag['same_objects']:.1f}%. Such captions often describe the "
        "anchor too (they rarely mention sizes and positions): likely false negatives.",
        f"- Mined (image, caption) pairs within depth h_t = {h_t} whose caption text equals one of the "
        f"image's own captions (certain false negatives): {100 * diag['duplicate_text']:.2f}%.", "",
    ]


def write_report(setup: ReportSetup, run_dirs: list[Path], out: Path, figures: Path) -> str:
    """Write ``out`` (markdown) and its two PNG figures from finished runs; returns the text."""
    collected = collect(run_dirs, setup.methods)
    cfg = seed_config(setup, setup.seeds[0])
    diag = collected["seeds"][0]["diagnostics"]
    h_t = diag["settings"]["h_t"] if diag else cfg.round2.h_t
    title = "the synthetic benchmark" if setup.synth else f"`{cfg.data.name}`"
    lines = [
        f"# Results on {title}", "",
        f"Generated by `aoq report` on {time.strftime('%Y-%m-%d')} from the run files under `{setup.runs_root}` "
        f"({len(run_dirs)} seeds); machine: {platform.machine()}, {platform.system()}. Regenerate with:", "",
        f"    {_command(setup)}", "",
        "(`--run` runs or resumes the pipelines; without it the tables come from the finished runs.)", "",
        *_setup_section(setup, cfg, collected),
        *_results_section(collected),
        *_family_section(collected, run_dirs),
        *_sweeps_section(setup),
        *_cost_section(collected),
        *_figures_section(collected, run_dirs, out, figures),
        *_scene_section(setup, run_dirs[0], h_t),
    ]
    text = "\n".join(lines)
    notes = out.with_name(f"{out.stem}-notes.md")  # the hand-written part of the page: results-notes.md
    if notes.is_file():
        text += "\n" + notes.read_text()
    atomic_write_text(out, text)
    return text
