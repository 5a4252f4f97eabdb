"""Round-2 sampling depth: ``round2.depth`` resolved for a training split and checked against the
mined lists (docs/method.md, Sampling; the rule itself is :func:`aoq_train.round2.sampling.sampling_depths`)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from aoq.config import ConfigError, Round2Config
from aoq_train.round2.sampling import check_lists, sampling_depths

log = logging.getLogger(__name__)


def round2_depths(r2: Round2Config, n_images: int, n_captions: int) -> tuple[int, int]:
    """``(h_t, h_i)`` of ``round2`` for a training split of this size; a warning when a relative
    depth rounds below ``round2.min_depth`` and the floor is used instead."""
    raw = sampling_depths(r2.depth, r2.h_t, r2.h_i, r2.h_rel, n_images, n_captions, r2.batch_size)
    depths = sampling_depths(r2.depth, r2.h_t, r2.h_i, r2.h_rel, n_images, n_captions, r2.batch_size,
                             r2.min_depth)
    if depths != raw:
        log.warning("round2.depth=relative, h_rel=%g gives h_t=%d, h_i=%d on %d captions / %d images per batch "
                    "of %d: raised to the floor round2.min_depth=%d (h_t=%d, h_i=%d)", r2.h_rel, *raw, n_captions,
                    n_images, r2.batch_size, r2.min_depth, *depths)
    return depths


def checked_depths(
    img_top_caps: np.ndarray, cap_top_imgs: np.ndarray, r2: Round2Config, where: str | Path
) -> tuple[int, int]:
    """The resolved ``(h_t, h_i)``, checked against the lengths of the mined lists.

    Args:
        where: the mined artefact (or what it will be), named in the error.

    Raises:
        ConfigError: a depth deeper than the mined lists, naming the keys to change.
    """
    n_images, n_captions = img_top_caps.shape[0], cap_top_imgs.shape[0]
    h_t, h_i = round2_depths(r2, n_images, n_captions)
    try:
        check_lists(img_top_caps, cap_top_imgs, h_t, h_i)
    except ValueError as exc:
        how = (f" (round2.depth=relative, h_rel={r2.h_rel:g}: {n_captions} captions and {n_images} images "
               f"per batch of {r2.batch_size} give h_t={h_t}, h_i={h_i}; lower round2.h_rel or mine deeper)"
               if r2.depth == "relative" else "")
        raise ConfigError(f"{where}: {exc}{how}") from None
    return h_t, h_i
