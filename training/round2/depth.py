"""Round-2 sampling depth: ``round2.depth`` resolved once for a training split into
:class:`Depths`, and checked against the mined lists (docs/method.md, Sampling; the rule itself is
:func:`aoq_train.round2.sampling.sampling_depths`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np

from aoq.config import ConfigError, Round2Config
from aoq_train.round2.sampling import check_lists, sampling_depths

log = logging.getLogger(__name__)


class Depths(NamedTuple):
    """The depths of one round-2 run on one training split: its offline caption of an image is
    drawn from the first ``h_t`` of the image's list, its offline image from the first ``h_i`` of a
    caption's. Resolved once (:func:`round2_depths`) and passed to whatever samples at them."""

    h_t: int
    h_i: int


def round2_depths(r2: Round2Config, n_images: int, n_captions: int) -> Depths:
    """:class:`Depths` of ``round2`` for a training split of this size; a warning when a relative
    depth rounds below ``round2.min_depth`` and the floor is used instead."""
    raw = sampling_depths(r2.depth, r2.h_t, r2.h_i, r2.h_rel, n_images, n_captions, r2.batch_size)
    depths = Depths(*sampling_depths(r2.depth, r2.h_t, r2.h_i, r2.h_rel, n_images, n_captions, r2.batch_size,
                                     r2.min_depth))
    if depths != raw:
        log.warning("round2.depth=relative, h_rel=%g gives h_t=%d, h_i=%d on %d captions / %d images per batch "
                    "of %d: raised to the floor round2.min_depth=%d (h_t=%d, h_i=%d)", r2.h_rel, *raw, n_captions,
                    n_images, r2.batch_size, r2.min_depth, *depths)
    return depths


def check_depths(
    img_top_caps: np.ndarray, cap_top_imgs: np.ndarray, depths: Depths, r2: Round2Config, where: str | Path
) -> None:
    """Raise when ``depths`` (resolved from ``r2``) are deeper than the mined lists.

    Args:
        where: the mined artefact (or what it will be), named in the error.

    Raises:
        ConfigError: a depth deeper than the mined lists, naming the keys to change.
    """
    try:
        check_lists(img_top_caps, cap_top_imgs, depths.h_t, depths.h_i)
    except ValueError as exc:
        how = (f" (round2.depth=relative, h_rel={r2.h_rel:g}: {cap_top_imgs.shape[0]} captions and "
               f"{img_top_caps.shape[0]} images per batch of {r2.batch_size} give h_t={depths.h_t}, "
               f"h_i={depths.h_i}; lower round2.h_rel or mine deeper)" if r2.depth == "relative" else "")
        raise ConfigError(f"{where}: {exc}{how}") from None


def checked_depths(
    img_top_caps: np.ndarray, cap_top_imgs: np.ndarray, r2: Round2Config, where: str | Path
) -> Depths:
    """The :class:`Depths` of ``r2`` for the split of these mined lists, checked against them
    (:func:`check_depths`)."""
    depths = round2_depths(r2, img_top_caps.shape[0], cap_top_imgs.shape[0])
    check_depths(img_top_caps, cap_top_imgs, depths, r2, where)
    return depths
