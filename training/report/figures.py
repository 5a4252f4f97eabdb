"""The figures of ``aoq report`` (R@1 curves, cross-retrieval rank histogram) and the test-split
evaluations they and the within-family table need; PNGs written atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from aoq.io import atomic_write_bytes


def curves_figure(collected: dict[str, Any], path: Path) -> None:
    """Dev R@1 against epoch (paper Fig. 4 style): baseline = round 1, the others = round 2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def split_scores(model_dir: Path, split: str = "test") -> tuple[np.ndarray, Any]:
    """The (images, captions) score matrix of a published model on ``split`` and the split: an
    embedding model's dot products, a cross-attention model's pair scores (bounded-memory blocks)."""
    import torch

    from aoq.checkpoint import load_checkpoint
    from aoq.data.load import load_split
    from aoq.embed import encode_fragments, encode_split
    from aoq.pair_scores import score_matrix

    ckpt = load_checkpoint(model_dir)
    data = load_split(ckpt.config.data, split)
    if ckpt.model.pairwise:
        fragments = encode_fragments(ckpt.model, ckpt.vocab, data)
        return score_matrix(ckpt.model.pair_scores, fragments, torch.device("cpu"))[0], data
    img, cap = encode_split(ckpt.model, ckpt.vocab, data, image_size=ckpt.config.data.image_size)
    return img @ cap.T, data


def seed_test_figures(run_dir: Path, methods: tuple[str, ...], histogram_arms: tuple[str, ...],
                      split: str = "test") -> dict[str, Any]:
    """What the page reads from one seed's models on ``split``: the cross-retrieval rank histogram
    (supplement Fig. 1) of ``histogram_arms`` (``rank_histogram``) and every method's
    within-family R@1 per change kind (``family``: training/report/family.py; None when the split
    has no family structure). Each model's score matrix is computed once."""
    from aoq.metrics import cross_retrieval_ranks, rank_histogram
    from aoq_train.report.family import within_family_of_split

    hists: dict[str, dict[str, int]] = {}
    family: dict[str, dict[str, dict[str, float]]] | None = {}
    for method in dict.fromkeys((*histogram_arms, *methods)):
        if family is None and method not in histogram_arms:
            continue
        sims, data = split_scores(run_dir / "models" / method, split)
        if method in histogram_arms:
            hists[method] = rank_histogram(cross_retrieval_ranks(sims, data.captions_per_image))
        if family is not None and method in methods:
            result = within_family_of_split(sims, data)
            family = None if result is None else {**family, method: result}
    return {"rank_histogram": hists, "family": family}


def histogram_figure(hists: dict[str, dict[str, int]], path: Path, seed: str) -> None:
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
    ax.set_title(f"cross-retrieval rank histogram, test split ({seed})")
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
