"""Matplotlib figures for the metrics tab, built from ``/metrics/{model}`` answers.

Figures are made with ``matplotlib.figure.Figure`` rather than ``pyplot`` so that none is kept
in pyplot's global registry: a long-running UI would otherwise leak one figure per click.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from aoq_serve.schemas import CurvePoint, MetricsOut

ROUND_MARKERS = {1: "o", 2: "s"}


def curve_positions(points: Sequence[CurvePoint]) -> list[tuple[int, CurvePoint]]:
    """Points ordered by (round, epoch), each at its epoch within its own round.

    A model's log holds the rounds it trained (the baseline round 1; AOQ round 2, from scratch),
    so every curve starts at epoch 1; the marker tells the rounds apart.
    """
    return [(p.epoch, p) for p in sorted(points, key=lambda p: (p.round, p.epoch))]


def recall_curves_figure(all_metrics: Sequence[MetricsOut]) -> Figure:
    """R@1 against training epoch on the dev split, one panel per direction, one colour per model."""
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    axes = fig.subplots(1, 2, sharex=True)
    split = next((m.curves_measured.split for m in all_metrics if m.curves_measured), "dev")
    for ax, field, title in ((axes[0], "i2t_r1", "image \u2192 text R@1"), (axes[1], "t2i_r1", "text \u2192 image R@1")):
        for index, metrics in enumerate(all_metrics):
            colour = f"C{index}"
            placed = curve_positions(metrics.curves)
            for rnd in sorted({p.round for _, p in placed}):
                xy = [(x, getattr(p, field)) for x, p in placed if p.round == rnd and getattr(p, field) is not None]
                if xy:
                    xs, ys = zip(*xy)
                    ax.plot(xs, ys, color=colour, marker=ROUND_MARKERS.get(rnd, "^"), markersize=4,
                            label=f"{metrics.model} (round {rnd})")
        ax.set_title(f"{title}, {split} split")
        ax.set_xlabel("epoch of the model's own training round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("R@1 (%)")
        ax.grid(alpha=0.3)
    drawn = [ax for ax in axes if ax.get_lines()]
    if drawn:
        drawn[-1].legend(fontsize="small")
    else:
        axes[0].text(0.5, 0.5, "no training curves recorded", ha="center", va="center", transform=axes[0].transAxes)
    return fig


def histogram_table(all_metrics: Sequence[MetricsOut]) -> tuple[list[str], dict[str, list[float]]]:
    """Bins (in first-seen order over models) and, per model, the percentage of pairs in each bin."""
    bins: list[str] = []
    for metrics in all_metrics:
        if metrics.rank_histogram is not None:
            bins += [b for b in metrics.rank_histogram.bins if b not in bins]
    shares: dict[str, list[float]] = {}
    for metrics in all_metrics:
        hist = metrics.rank_histogram
        if hist is None:
            continue
        counts = dict(zip(hist.bins, hist.counts))
        total = sum(hist.counts) or 1
        shares[metrics.model] = [100.0 * counts.get(b, 0) / total for b in bins]
    return bins, shares


def rank_histogram_figure(all_metrics: Sequence[MetricsOut]) -> Figure:
    """Grouped bars: share of positive pairs per cross-retrieval rank interval, per model."""
    fig = Figure(figsize=(9, 3.4), layout="constrained")
    ax = fig.subplots()
    bins, shares = histogram_table(all_metrics)
    width = 0.8 / max(len(shares), 1)
    for index, (model, values) in enumerate(shares.items()):
        xs = [i + (index - (len(shares) - 1) / 2) * width for i in range(len(bins))]
        ax.bar(xs, values, width=width, color=f"C{index}", label=model)
    ax.set_xticks(range(len(bins)), bins)
    ax.set_xlabel("cross-retrieval rank of the positive pair")
    ax.set_ylabel("pairs (%)")
    split = next((m.measured.split for m in all_metrics if m.measured), "test")
    ax.set_title(f"Cross-retrieval rank histogram ({split} split, pair rule)")
    ax.grid(axis="y", alpha=0.3)
    if shares:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no rank histogram recorded", ha="center", va="center", transform=ax.transAxes)
    return fig
