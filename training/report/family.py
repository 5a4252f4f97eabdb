"""Within-family retrieval: R@1 of each query among the members of its own family only.

On the synthetic benchmark a family is a base scene and its one-change variants
(docs/synthetic.md). Ranking only the family's images and captions asks the question the
offline hard negatives are about: can the model tell near-duplicates apart? The figure is
reported per change kind (``colour``, ``shape``, ..., ``base``), next to the 1K / 5K recalls.

Ties follow :mod:`aoq.ranks`: a hit is the probability that the best positive comes first under a
random order of the tied items, so constant scores give the chance level (1 / family size for a
caption query), never 100.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from aoq.data.dataset import SplitData
from aoq.ranks import Positives, array_fn, i2t_stats, t2i_stats


def within_family(
    sims: np.ndarray, family: np.ndarray, change: list[str] | np.ndarray, captions_per_image: int = 5
) -> dict[str, dict[str, float]]:
    """R@1 (%) of image and caption queries among their family members, per change kind.

    Args:
        sims: (N images, N * captions_per_image captions) scores, captions image by image.
        family: (N,) family id per image; images in a family of one are left out (nothing
            to tell them from).
        change: (N,) change kind per image (``"base"``, ``"colour"``, ...); a caption query
            counts under its image's kind.
        captions_per_image: captions per image.

    Returns:
        ``{kind: {"i2t_r1", "t2i_r1", "images", "mean_family_size"}}`` with an ``"all"`` entry
        over every kind; empty when no family has two images.

    Raises:
        ValueError: shapes that do not fit together.
    """
    sims = np.asarray(sims)
    family = np.asarray(family).reshape(-1)
    change = np.asarray(change).reshape(-1)
    n, cpi = sims.shape[0], captions_per_image
    if sims.shape != (n, n * cpi) or family.shape != (n,) or change.shape != (n,):
        raise ValueError(f"need sims (N, N*{cpi}) and N family ids and kinds, got {sims.shape}, "
                         f"{family.shape}, {change.shape}")
    hits: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"i2t": [], "t2i": [], "size": []})
    _, inverse = np.unique(family, return_inverse=True)
    for group in np.unique(inverse):
        members = np.flatnonzero(inverse == group)
        m = members.size
        if m < 2:
            continue
        captions = (members[:, None] * cpi + np.arange(cpi)).reshape(-1)
        sub = sims[np.ix_(members, captions)]  # (m, m * cpi)
        positives = Positives.pairs(m, cpi)
        i2t = i2t_stats(array_fn(sub), positives).hit_probability(1)
        t2i = t2i_stats(array_fn(sub), positives).hit_probability(1)
        for k, image in enumerate(members):
            for key in (str(change[image]), "all"):
                hits[key]["i2t"].append(float(i2t[k]))
                hits[key]["t2i"].extend(t2i[k * cpi:(k + 1) * cpi].tolist())
                hits[key]["size"].append(float(m))
    return {
        kind: {
            "i2t_r1": 100.0 * float(np.mean(h["i2t"])),
            "t2i_r1": 100.0 * float(np.mean(h["t2i"])),
            "images": float(len(h["i2t"])),
            "mean_family_size": float(np.mean(h["size"])),
        }
        for kind, h in sorted(hits.items())
    }


def within_family_of_split(sims: np.ndarray, split: SplitData) -> dict[str, dict[str, float]] | None:
    """:func:`within_family` for a split's scores, None when the split has no family structure
    (no facts file, or one without ``family`` and ``change``): the hook ``aoq report`` calls."""
    facts = split.facts
    if facts is None or facts.family is None or facts.change is None:
        return None
    return within_family(sims, facts.family, facts.change, split.captions_per_image)
