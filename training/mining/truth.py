"""Which mined candidates are positives, by two rules (docs/method.md, False negatives).

* **False negative**: the candidate is a positive of its anchor under the rule the evaluation
  scores with (``eval.positives``, :meth:`aoq.ranks.Positives.holds`): with the ``text`` rule an
  identical caption text (a twin drawing's copy of it, a repeated caption); with the ``pair``
  rule no mined candidate is one (the lists hold other images' captions only).
* **Near neighbour**: a negative under that rule which a broader ground truth calls true of the
  anchor: the synthetic benchmark's facts (every fact the caption states holds of the scene), or
  on the emoji set the same base emoji (another skin tone, gender form or vendor). Unknown when
  the data carries neither.

The shares are counted over the candidates round 2 samples from (the first ``h_t`` / ``h_i`` of
each list, both directions), and each filter of ``mining.filters`` is scored as a detector of
either kind: precision = flagged and of the kind / flagged, recall = flagged and of the kind /
of the kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aoq.data.dataset import SplitData
from aoq.data.karpathy import SPLIT_NAMES
from aoq.metrics import positives_of
from aoq.names import FALSE_NEGATIVE_FILTERS

#: ``f(caption_ids, image_ids) -> bool array``: caption k is true of image k.
TrueOf = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: the two kinds, in the order pages show them
KINDS = ("false_negatives", "near_neighbours")


@dataclass(frozen=True)
class Truth:
    """The evaluation's rule (``positive``) and, where the data has one, a broader rule
    (``broad``) whose extra matches are the near neighbours."""

    positive_rule: str
    positive: TrueOf
    broad_rule: str | None = None
    broad: TrueOf | None = None

    def kinds(self, captions: np.ndarray, images: np.ndarray) -> dict[str, np.ndarray | None]:
        """Per (caption, image) pair: is it a false negative, a near neighbour (None: unknown)."""
        fn = self.positive(captions, images)
        near = None if self.broad is None else self.broad(captions, images) & ~fn
        return {"false_negatives": fn, "near_neighbours": near}


def split_truth(split: SplitData, data_path: str | Path, data_format: str, positives: str) -> Truth:
    """The truth of a training split (module docstring); ``positives``: ``eval.positives``."""
    cpi = split.captions_per_image
    rule = positives_of(split.n_images, cpi, split.captions if positives == "text" else None)
    name = "identical caption text (the evaluation's text rule)" if positives == "text" else \
        "a caption of the anchor's own image (the evaluation's pair rule)"
    if split.facts is not None:
        return Truth(name, rule.holds, "the synthetic benchmark's facts", split.facts.caption_true_of)
    bases = _bases(Path(data_path)) if data_format == "karpathy" else None
    if bases is None or len(bases) != split.n_images:
        return Truth(name, rule.holds)

    def same_base(captions: np.ndarray, images: np.ndarray) -> np.ndarray:
        captions, images = np.asarray(captions).reshape(-1), np.asarray(images).reshape(-1)
        return bases[captions // cpi] == bases[images]

    return Truth(name, rule.holds, "the same base emoji (skin tone, gender form or vendor)", same_base)


def _bases(json_path: Path) -> np.ndarray | None:
    """The ``base`` of every training image of a Karpathy JSON (in the reader's order), or None
    when the entries do not name one."""
    entries = [e for e in json.loads(json_path.read_text())["images"] if SPLIT_NAMES.get(e.get("split")) == "train"]
    if not entries or not all(isinstance(e.get("base"), str) for e in entries):
        return None
    ids = {b: k for k, b in enumerate(dict.fromkeys(e["base"] for e in entries))}
    return np.array([ids[e["base"]] for e in entries], dtype=np.int64)


def _pairs(img_lists: np.ndarray, cap_lists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(caption ids, image ids) of every candidate of both directions' lists, images first."""
    img_rows = np.repeat(np.arange(img_lists.shape[0]), img_lists.shape[1])
    cap_rows = np.repeat(np.arange(cap_lists.shape[0]), cap_lists.shape[1])
    return (np.concatenate([img_lists.reshape(-1), cap_rows]),
            np.concatenate([img_rows, cap_lists.reshape(-1)]))


def list_shares(img_top_caps: np.ndarray, cap_top_imgs: np.ndarray, truth: Truth, h_t: int,
                h_i: int) -> dict[str, float | None]:
    """The share of each kind among the candidates round 2 samples from (None: unknown)."""
    kinds = truth.kinds(*_pairs(np.asarray(img_top_caps)[:, :h_t], np.asarray(cap_top_imgs)[:, :h_i]))
    return {k: None if v is None else float(v.mean()) for k, v in kinds.items()}


def detector_scores(filtered: dict[str, np.ndarray], filters: list[str], truth: Truth, top_captions: int,
                    top_images: int) -> dict[str, Any]:
    """Per enabled filter (each on its own, and together): the share it flags and its precision
    and recall as a detector of each kind, over the unfiltered top of both directions' raw lists;
    and the share of each kind there."""
    img_raw, cap_raw = np.asarray(filtered["img_raw"])[:, :top_captions], np.asarray(filtered["cap_raw"])[:, :top_images]
    kinds = truth.kinds(*_pairs(img_raw, cap_raw))
    bits = np.concatenate([np.asarray(filtered["img_flags"])[:, :top_captions].reshape(-1),
                           np.asarray(filtered["cap_flags"])[:, :top_images].reshape(-1)])
    flags = {name: (bits >> k & 1).astype(bool) for k, name in enumerate(FALSE_NEGATIVE_FILTERS)
             if name in filters}  # the mining evaluates only the enabled filters
    flags["enabled"] = np.any([flags[name] for name in filters], axis=0)
    out: dict[str, Any] = {k: None if v is None else float(v.mean()) for k, v in kinds.items()}
    for name, flag in flags.items():
        out[name] = {"flagged": float(flag.mean()),
                     **{k: None if v is None else _scores(flag, v) for k, v in kinds.items()}}
    return out


def _scores(flagged: np.ndarray, true: np.ndarray) -> dict[str, float]:
    hits = float(np.count_nonzero(flagged & true))
    return {"precision": hits / np.count_nonzero(flagged) if flagged.any() else float("nan"),
            "recall": hits / np.count_nonzero(true) if true.any() else float("nan")}


def shares_line(shares: dict[str, float | None]) -> str:
    """``false negatives x%, near neighbours y%`` of :func:`list_shares` (for ``aoq mine``)."""
    near = shares["near_neighbours"]
    return (f"false negatives {100 * shares['false_negatives']:.1f}% of the sampled candidates, near neighbours "
            + ("unknown (no broader ground truth)" if near is None else f"{100 * near:.1f}%"))
