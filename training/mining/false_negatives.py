"""The false-negative step of ``aoq mine`` (``mining.filters``; docs/method.md, False negatives):
mine deeper than the lists must be, flag every candidate with every filter, keep the first
candidates no enabled filter flags, and count what each filter removed.

All three filters are evaluated for every candidate (each on its own: one bit per filter), so the
artefact can show which filters flag what, and the report can score each filter as a
false-negative detector, whichever of them made the lists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aoq.data.dataset import SplitData
from aoq_train.mining.filters import ORDER, FilterInputs, compact, first_flag, flag_bits, short_rows, text_ids

log = logging.getLogger(__name__)

#: the first raw depth, as a multiple of the lists' depth; doubled while a row keeps too few
DEPTH_FACTOR = 2
#: ``mine(top_captions, top_images) -> (img_top_caps, cap_top_imgs)``
Mine = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def sentence_vectors(captions: Sequence[str], progress: bool = False) -> np.ndarray:
    """Unit all-MiniLM-L6-v2 sentence vectors of the captions (mean pooled, the model card's),
    from the backbone feature cache: computed once per caption set, shared with every model that
    trains on the same captions with the MiniLM encoder."""
    from aoq.backbone_cache import cache_root, caption_backbone_features, caption_key_inputs, cached_features
    from aoq.models.pretrained import MiniLMTextEncoder, WordPieceVocab

    encoder = MiniLMTextEncoder(embed_dim=1).eval()  # only the frozen backbone is used
    inputs = caption_key_inputs(encoder.identity.to_dict(), captions)
    entry = cached_features(cache_root(), inputs,
                            lambda: caption_backbone_features(encoder, WordPieceVocab(), captions, progress=progress),
                            len(captions))
    vectors = np.asarray(entry.features, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def filter_inputs(split: SplitData, img_emb: np.ndarray, cap_emb: np.ndarray, progress: bool = False) -> FilterInputs:
    """What the filters read for a training split mined with these embeddings."""
    return FilterInputs(split.captions_per_image, text_ids(split.captions), sentence_vectors(split.captions, progress),
                        np.asarray(img_emb, dtype=np.float32), np.asarray(cap_emb, dtype=np.float32))


def filtered_lists(mine: Mine, top_captions: int, top_images: int, n_images: int, cpi: int, inputs: FilterInputs,
                   filters: Sequence[str], tau: float, rho: float
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The lists round 2 samples from, ``top_captions`` / ``top_images`` candidates per row that no
    enabled filter flags, and the raw lists with every filter's flags (``aoq.mined.FILTER_FILES``
    keys). Mined ``DEPTH_FACTOR`` times deeper first, then twice as deep again while a row keeps
    too few, up to the whole gallery.

    Raises:
        ValueError: even the whole gallery leaves a row too few candidates.
    """
    max_t, max_i = cpi * (n_images - 1), n_images - 1  # every candidate but the own positives
    depth_t, depth_i = min(max_t, DEPTH_FACTOR * top_captions), min(max_i, DEPTH_FACTOR * top_images)
    while True:
        img_raw, cap_raw = mine(depth_t, depth_i)
        img_bits = flag_bits(img_raw, inputs, ORDER, tau, rho, image_anchors=True)
        cap_bits = flag_bits(cap_raw, inputs, ORDER, tau, rho, image_anchors=False)
        img_codes, cap_codes = first_flag(img_bits, filters), first_flag(cap_bits, filters)
        img_top, cap_top = compact(img_raw, img_codes, top_captions), compact(cap_raw, cap_codes, top_images)
        if img_top is not None and cap_top is not None:
            return img_top, cap_top, {"img_raw": img_raw, "img_flags": img_bits, "cap_raw": cap_raw,
                                      "cap_flags": cap_bits}
        short = (short_rows(img_codes, top_captions), short_rows(cap_codes, top_images))
        if (depth_t, depth_i) == (max_t, max_i):
            raise ValueError(f"the filters {list(filters)} leave {short[0]} image and {short[1]} caption lists with "
                             f"fewer than {top_captions} / {top_images} candidates even over the whole gallery: "
                             "lower mining.top_captions / top_images or loosen the filters")
        log.info("filters %s: %d image and %d caption lists keep too few candidates at depth %d / %d; mining deeper",
                 list(filters), *short, depth_t, depth_i)
        depth_t, depth_i = min(max_t, 2 * depth_t), min(max_i, 2 * depth_i)


def filter_stats(filtered: dict[str, np.ndarray], filters: Sequence[str], top_captions: int,
                 top_images: int) -> dict[str, Any]:
    """What the filters flagged within the unfiltered lists' depth (the first ``top_captions`` /
    ``top_images`` raw candidates, what round 2 would otherwise sample from), per direction: for
    each filter on its own and for the enabled ones together, the share of candidates flagged
    and the share of lists with at least one."""
    out: dict[str, Any] = {"filters": list(filters)}
    for side, depth in (("img", top_captions), ("cap", top_images)):
        bits = np.asarray(filtered[f"{side}_flags"])[:, :depth]
        masks = {name: (bits >> k & 1).astype(bool) for k, name in enumerate(ORDER)}
        masks["enabled"] = first_flag(bits, filters) > 0
        out["image_lists" if side == "img" else "caption_lists"] = {
            name: {"candidates": float(mask.mean()), "lists": float(mask.any(axis=1).mean())}
            for name, mask in masks.items()}
    return out
