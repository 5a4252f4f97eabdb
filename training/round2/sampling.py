"""Round-2 offline negative sampling (docs/method.md, Sampling: the public AOQ data loader, vectorised).

For a training caption ``c`` of image ``i = c // cpi`` (cpi captions per image):

1. draw a rank ``n`` in ``{0, ..., h_t - 1}`` (``sampling="uniform"``, the paper's choice; or
   ``"normal"``, see below);
2. ``t_off = img_top_caps[i][n]``: an offline hard negative caption of the positive image;
3. ``i_off = cap_top_imgs[c][n * h_i // h_t]``: an offline hard negative image of the positive
   caption, at the same relative depth of its (shorter) list. The public code writes ``n // 5``
   with ``h_i = h_t / 5``; ``n * h_i // h_t`` is the same there and stays inside ``[0, h_i)``
   for any ``h_i``;
4. ``t~_off = i_off * cpi + u``, ``u`` uniform in ``{0, ..., cpi - 1}``: a caption of ``i_off``;
5. ``i~_off = t_off // cpi``: the image ``t_off`` belongs to.

Collisions: when ``t_off`` belongs to ``i_off`` the derived pair ``(i_off, t_off)`` would be a
positive pair (and ``i~_off == i_off``), so the anchor draws again, up to ``max_tries`` draws in
all. Fallback for captions still colliding after that (only possible when nearly every candidate
collides): keep ``t_off`` and take as ``i_off`` the best-ranked image among the first ``h_i`` of
``cap_top_imgs[c]`` that is not ``t_off``'s image. The list holds distinct images, so one exists
whenever ``h_i >= 2``; with ``h_i = 1`` the collision is kept and counted in
:attr:`OfflineNegatives.collisions`.

``sampling="normal"``: ``n = floor(|x|)``, ``x ~ Normal(center * h_t, scale * h_t)`` conditioned on
``|x| < h_t``, drawn exactly by inverting the distribution over the ranks (:func:`normal_rank_pmf`).
With the defaults ``center=0.5``, ``scale=0.25`` the top ranks are rarer than under uniform
sampling (rank 0 0.44x as likely at h_t = 300, 0.58x at h_t = 5), the paper's intent (its
supplement tried a normal distribution so that the very top ranks, which may be false negatives,
are drawn less often). A wide ``scale`` undoes that: at ``scale=0.5`` rank 0 is *more* likely
than uniform (1.15x), and ``center=0`` makes rank 0 the most likely rank of all (1.67x at
h_t = 300; 33% of the draws at h_t = 5). docs/method.md tabulates these.

False-negative filter (optional, **not in the paper**): given ``caption_true_of(captions, images)``
(e.g. :meth:`aoq.data.facts.SplitFacts.caption_true_of`), a draw is also redrawn when ``t_off``
is true of the anchor image ``i``, the anchor caption ``c`` is true of ``i_off``, or either derived
pair is a match (``t_off`` true of ``i_off``, ``t~_off`` true of ``i~_off``): such an "offline
negative" is a second positive. The redraw shares the collision loop, so it is bounded by
``max_tries`` draws in all; rejected draws are counted in :attr:`OfflineNegatives.filtered`, and
rows that still hold a false negative after the last draw in
:attr:`OfflineNegatives.false_negatives`. Without the callable nothing changes, draw for draw.

**Every draw is local.** Each random number is a hash of ``(seed, epoch, anchor caption, attempt,
stream)`` (:class:`DrawKey`, a counter-based generator): an anchor's negatives depend on its own
lists only, so a near-tie that swaps two entries of one mined list changes the draws of the
captions that read that list and of no other (a shared sequential generator shifts every later
draw instead), and an epoch's negatives are a pure function of the seed and the lists.

Depth (:func:`sampling_depths`): ``round2.depth: absolute`` uses ``h_t``/``h_i`` as given (the
paper's 300 / 60 on COCO); ``relative`` scales them with the data, ``h_t = round(h_rel * captions
/ B)`` and ``h_i = round(h_rel * images / B)``, B the round-2 batch size, never below
``min_depth``. A batch of B captions sees ``B / captions`` of the split, so its hardest caption
sits, on average, around rank ``captions / B`` of the image's list; ``h_rel`` is the offline depth
in those units.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Sampling = Literal["uniform", "normal"]
#: ``f(caption_ids, image_ids) -> bool array``: caption k is true of image k (a false negative).
CaptionTrueOf = Callable[[np.ndarray, np.ndarray], np.ndarray]

#: the streams of one attempt: the rank, and the caption of ``i_off`` taken as ``t~_off``
RANK, TILDE = 0, 1
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 whose output bits all depend on every input bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class DrawKey:
    """The random numbers of one epoch's sampling, as a pure function of
    ``(seed, epoch, anchor, attempt, stream)``: no state, no order (module docstring)."""

    seed: int
    epoch: int

    def uniform(self, anchors: np.ndarray, attempt: int, stream: int) -> np.ndarray:
        """One float64 in [0, 1) per anchor."""
        base = _mix(np.array([self.seed & _MASK], dtype=np.uint64))
        base = _mix(base ^ np.uint64(self.epoch & _MASK))
        counter = (np.uint64(attempt) << np.uint64(8)) | np.uint64(stream)
        with np.errstate(over="ignore"):
            bits = _mix(_mix(base ^ np.asarray(anchors, dtype=np.uint64)) ^ counter)
        return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def integers(self, anchors: np.ndarray, attempt: int, stream: int, high: int) -> np.ndarray:
        """One integer in ``[0, high)`` per anchor."""
        return np.minimum((self.uniform(anchors, attempt, stream) * high).astype(np.int64), high - 1)


@dataclass(frozen=True)
class OfflineNegatives:
    """The four offline items of each positive pair, aligned with the captions asked for.

    Attributes:
        t_off: caption ids, offline hard negatives of the positive image.
        i_off: image ids, offline hard negatives of the positive caption.
        t_off_tilde: a caption id of ``i_off``.
        i_off_tilde: the image id of ``t_off``.
        rank: the rank ``n`` drawn in the image's caption list.
        collisions: captions whose ``(i_off, t_off)`` still belong together (h_i = 1 only).
        filtered: draws rejected because ``t_off`` or ``i_off`` was a false negative (filter on).
        false_negatives: captions that still hold a false negative after ``max_tries`` draws.
    """

    t_off: np.ndarray
    i_off: np.ndarray
    t_off_tilde: np.ndarray
    i_off_tilde: np.ndarray
    rank: np.ndarray
    collisions: int = 0
    filtered: int = 0
    false_negatives: int = 0


def normal_rank_pmf(h_t: int, center: float, scale: float) -> np.ndarray:
    """P(n = r) for r in ``[0, h_t)`` of ``n = floor(|x|)``, ``x ~ Normal(center h_t, scale h_t)``
    conditioned on ``|x| < h_t``."""
    if not scale > 0:
        raise ValueError(f"normal sampling needs scale > 0, got {scale}")
    mu, sigma = center * h_t, scale * h_t
    edges = np.arange(h_t + 1, dtype=np.float64)
    phi = np.vectorize(lambda z: 0.5 * math.erfc(-z / math.sqrt(2)))
    folded = phi((edges - mu) / sigma) - phi((-edges - mu) / sigma)  # P(|x| < edge)
    mass = np.diff(folded)
    return mass / mass.sum()


def draw_ranks(
    draws: DrawKey, anchors: np.ndarray, attempt: int, h_t: int, sampling: Sampling = "uniform",
    center: float = 0.5, scale: float = 0.25,
) -> np.ndarray:
    """One rank in ``[0, h_t)`` per anchor: uniform, or the conditioned folded normal of the
    module docstring (drawn by inverting its distribution over the ranks)."""
    if sampling == "uniform":
        return draws.integers(anchors, attempt, RANK, h_t)
    if sampling != "normal":
        raise ValueError(f"sampling must be 'uniform' or 'normal', got {sampling!r}")
    cdf = np.cumsum(normal_rank_pmf(h_t, center, scale))
    return np.minimum(np.searchsorted(cdf, draws.uniform(anchors, attempt, RANK), side="right"), h_t - 1)


def sampling_depths(
    depth: Literal["absolute", "relative"], h_t: int, h_i: int, h_rel: float | None,
    n_images: int, n_captions: int, batch_size: int, min_depth: int = 1,
) -> tuple[int, int]:
    """The ``(h_t, h_i)`` that round 2 samples from (module docstring, Depth); a relative depth
    is never below ``min_depth``.

    Raises:
        ValueError: ``depth="relative"`` without ``h_rel``, or an unknown mode.
    """
    if depth == "absolute":
        return h_t, h_i
    if depth != "relative":
        raise ValueError(f"round2.depth must be 'absolute' or 'relative', got {depth!r}")
    if h_rel is None:
        raise ValueError("round2.depth=relative needs round2.h_rel")
    scale = h_rel / batch_size
    return max(min_depth, round(scale * n_captions)), max(min_depth, round(scale * n_images))


def check_lists(img_top_caps: np.ndarray, cap_top_imgs: np.ndarray, h_t: int, h_i: int) -> int:
    """Check the mined lists against ``h_t``/``h_i``; returns the captions per image.

    Raises:
        ValueError: ``h_t``/``h_i`` exceed what was mined, or the two lists do not fit together.
    """
    if img_top_caps.ndim != 2 or cap_top_imgs.ndim != 2:
        raise ValueError("mined lists must be 2-D (rows x top-H ids)")
    n_img, n_cap = img_top_caps.shape[0], cap_top_imgs.shape[0]
    if n_img == 0 or n_cap % n_img:
        raise ValueError(f"{n_cap} caption rows do not divide into {n_img} image rows")
    if not 1 <= h_t <= img_top_caps.shape[1]:
        raise ValueError(
            f"h_t={h_t} exceeds the mined top_captions={img_top_caps.shape[1]}: mine deeper "
            f"(aoq mine --top-captions {h_t}) or lower round2.h_t"
        )
    if not 1 <= h_i <= cap_top_imgs.shape[1]:
        raise ValueError(
            f"h_i={h_i} exceeds the mined top_images={cap_top_imgs.shape[1]}: mine deeper "
            f"(aoq mine --top-images {h_i}) or lower round2.h_i"
        )
    return n_cap // n_img


def sample_offline_negatives(
    captions: np.ndarray,
    img_top_caps: np.ndarray,
    cap_top_imgs: np.ndarray,
    h_t: int,
    h_i: int,
    draws: DrawKey,
    sampling: Sampling = "uniform",
    *,
    center: float = 0.5,
    scale: float = 0.25,
    max_tries: int = 10,
    caption_true_of: CaptionTrueOf | None = None,
) -> OfflineNegatives:
    """Sample ``(t_off, i_off, t~_off, i~_off)`` for each caption id in ``captions``.

    Args:
        captions: training caption ids (any shape is flattened; order is kept).
        img_top_caps: (N_i, >= h_t) mined caption ids per image, best first.
        cap_top_imgs: (N_c, >= h_i) mined image ids per caption, best first.
        h_t, h_i: depths of the lists sampled from (paper: 300 and 60).
        draws: the only source of randomness, keyed by anchor (:class:`DrawKey`).
        sampling, center, scale: rank distribution (module docstring).
        max_tries: draws of ``n`` per caption before the collision fallback.
        caption_true_of: the optional false-negative filter (module docstring); None = off.

    Raises:
        ValueError: bad depths (see :func:`check_lists`), caption ids out of range.
    """
    cpi = check_lists(img_top_caps, cap_top_imgs, h_t, h_i)
    c = np.asarray(captions, dtype=np.int64).reshape(-1)
    if c.size and (c.min() < 0 or c.max() >= cap_top_imgs.shape[0]):
        raise ValueError(f"caption ids must lie in [0, {cap_top_imgs.shape[0]})")
    image = c // cpi
    n, t_off, i_off, t_tilde = (np.empty(c.size, dtype=np.int64) for _ in range(4))
    todo = np.arange(c.size)
    filtered = 0
    for attempt in range(max_tries):
        if not todo.size:
            break
        n[todo] = draw_ranks(draws, c[todo], attempt, h_t, sampling, center, scale)
        t_off[todo] = img_top_caps[image[todo], n[todo]]
        i_off[todo] = cap_top_imgs[c[todo], n[todo] * h_i // h_t]
        t_tilde[todo] = i_off[todo] * cpi + draws.integers(c[todo], attempt, TILDE, cpi)
        redraw = t_off[todo] // cpi == i_off[todo]
        if caption_true_of is not None:
            false_negative = _false_negatives(caption_true_of, c[todo], image[todo], t_off[todo], i_off[todo],
                                              t_tilde[todo], cpi)
            filtered += int(false_negative.sum())
            redraw |= false_negative
        todo = todo[redraw]
    collisions = 0
    if todo.size:
        todo = todo[t_off[todo] // cpi == i_off[todo]]  # the fallback is for collisions only
        top = np.asarray(cap_top_imgs[c[todo], :h_i], dtype=np.int64)  # (m, h_i)
        free = top != (t_off[todo] // cpi)[:, None]
        has_free = free.any(axis=1)
        moved = todo[has_free]
        i_off[moved] = top[has_free, free[has_free].argmax(axis=1)]
        t_tilde[moved] = i_off[moved] * cpi + t_tilde[moved] % cpi
        collisions = int((~has_free).sum())
    false_negatives = 0
    if caption_true_of is not None:
        false_negatives = int(_false_negatives(caption_true_of, c, image, t_off, i_off, t_tilde, cpi).sum())
    return OfflineNegatives(t_off, i_off, t_tilde, t_off // cpi, n, collisions, filtered, false_negatives)


def _false_negatives(
    caption_true_of: CaptionTrueOf, c: np.ndarray, image: np.ndarray, t_off: np.ndarray, i_off: np.ndarray,
    t_tilde: np.ndarray, cpi: int,
) -> np.ndarray:
    """Rows where an offline item matches: ``t_off`` true of the anchor image, the anchor caption
    true of ``i_off``, or a derived pair that is a match (``t_off`` of ``i_off``, ``t~_off`` of
    ``i~_off``)."""
    def true_of(captions: np.ndarray, images: np.ndarray) -> np.ndarray:
        return np.asarray(caption_true_of(captions, images), dtype=bool)

    return true_of(t_off, image) | true_of(c, i_off) | true_of(t_off, i_off) | true_of(t_tilde, t_off // cpi)
