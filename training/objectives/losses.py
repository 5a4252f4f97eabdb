"""Every loss of the paper (and the round-1 alternatives) as pure functions on score tensors.

Conventions shared by all functions (docs/method.md, Notation; equations numbered as there):

* ``scores`` is the (B, B) tensor ``scores[a, b] = S(image a, caption b)`` of one mini-batch
  of B positive pairs ``(i_k, t_k)``, so the positives sit on the diagonal. Caption ``b``
  belongs to image ``b``; a batch holding two captions of the same image would turn a true
  match into an off-diagonal "negative", exactly as in VSE++ and the public AOQ code.
* The offline scores are per-pair vectors of shape (B,):
  ``i2t_off[k] = S(i_k, t_off_k)``, ``t2i_off[k] = S(i_off_k, t_k)``,
  ``off_pair[k] = S(i_off_k, t_off_k)`` and ``off_pair_tilde[k] = S(i~_off_k, t~_off_k)``
  where ``i~_off`` is the image ``t_off`` belongs to and ``t~_off`` a caption of ``i_off``.
* ``[x]+ = relu(x)``, whose derivative is the indicator ``I(x > 0)`` used in the paper's Eq. 6.
* Every loss returns a scalar tensor **summed** over the batch (the paper and its public code
  sum, they do not average), keeps the dtype and device of ``scores`` and is differentiable.
* Margins: ``margin_online`` is the paper's gamma_1 (0.2), ``margin_offline`` its gamma_2 (0).

Round-2 ablations of the paper (Table 3) are available as building blocks and through
:func:`round2_loss`: ``only_offline`` (:func:`only_offline`), ``no_offline_adapt``
(``adapt_from="positive"`` of :func:`adaptive_offline_quintuplet`) and ``online_quin``
(:func:`online_derived_pairs` fed into the quintuplet functions in place of the offline pairs).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from aoq.names import ROUND1_LOSSES, ROUND2_LOSSES, ROUND2_VARIANTS

#: default temperatures of the round-1 alternatives (Smooth-AP paper; usual NT-Xent value).
DEFAULT_TAU = {"smooth_ap": 0.01, "infonce": 0.05}


# --------------------------------------------------------------------------- validation


def _check_scores(scores: Tensor, min_batch: int = 2) -> int:
    """Return B after checking that ``scores`` is a floating (B, B) tensor with B >= min_batch."""
    if not isinstance(scores, Tensor):
        raise ValueError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError(
            f"scores must be a square (B, B) matrix S(image a, caption b), got shape {tuple(scores.shape)}"
        )
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a floating-point tensor, got dtype {scores.dtype}")
    batch = scores.shape[0]
    if batch < min_batch:
        raise ValueError(f"scores is {batch}x{batch}: this loss needs a batch of at least {min_batch} pairs")
    return batch


def _check_pair_scores(batch: int, **vectors: Tensor) -> None:
    """Every per-pair score vector must have shape (B,)."""
    for name, vec in vectors.items():
        if not isinstance(vec, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(vec).__name__}")
        if tuple(vec.shape) != (batch,):
            raise ValueError(
                f"{name} must have shape ({batch},) to match scores of shape ({batch}, {batch}), "
                f"got {tuple(vec.shape)}"
            )


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def _eye(scores: Tensor) -> Tensor:
    return torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)


# --------------------------------------------------------------------------- building blocks


def online_hard_negative_indices(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Batch indices of the hardest in-batch negatives (the diagonal is excluded).

    Returns:
        ``(t_on, i_on)``, two LongTensors of shape (B,): ``t_on[k] = argmax_{b != k} scores[k, b]``
        (hardest caption of image k) and ``i_on[k] = argmax_{a != k} scores[a, k]`` (hardest
        image of caption k). Ties go to the lowest index.
    """
    _check_scores(scores)
    # Indices carry no gradient; the scores are gathered from the original tensor afterwards.
    masked = scores.detach().masked_fill(_eye(scores), float("-inf"))
    return masked.argmax(dim=1), masked.argmax(dim=0)


def online_hard_negatives(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Scores of the hardest in-batch negatives, differentiable.

    Returns:
        ``(i2t_on, t2i_on)`` of shape (B,): ``i2t_on[k] = S(i_k, t_on(i_k))`` (max over row k
        without the diagonal) and ``t2i_on[k] = S(i_on(t_k), t_k)`` (max over column k without
        the diagonal).
    """
    t_on, i_on = online_hard_negative_indices(scores)
    rows = torch.arange(scores.shape[0], device=scores.device)
    return scores[rows, t_on], scores[i_on, rows]


def online_derived_pairs(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Scores of the two derived negative pairs built from ONLINE negatives (ablation "OnlineQuin").

    The paper's Table 3 replaces ``S(i_off, t_off)`` and ``S(i~_off, t~_off)`` of Eq. 4 by
    ``S(i_on, t_on)`` and ``S(i~_on, t~_on)``. Within a batch, caption b belongs to image b, so for
    pair k with ``t_on = t_on(i_k)`` and ``i_on = i_on(t_k)``:

    * ``on_pair[k] = scores[i_on, t_on]`` = S(i_on, t_on);
    * ``on_pair_tilde[k] = scores[t_on, i_on]`` = S(image of t_on, caption of i_on).

    Pass them as ``off_pair`` / ``off_pair_tilde`` to :func:`offline_quintuplet` or
    :func:`adaptive_offline_quintuplet` (the online and single-negative offline terms keep
    their usual arguments). When ``i_on`` and ``t_on`` are the same batch index both derived
    pairs would be a positive pair; as the paper re-samples offline negatives that belong
    together, ``t_on`` is then replaced by the hardest caption of image k other than k and
    ``i_on`` (so B >= 3 is required).

    Returns:
        ``(on_pair, on_pair_tilde)``, each of shape (B,), differentiable.
    """
    _check_scores(scores, min_batch=3)
    t_on, i_on = online_hard_negative_indices(scores)
    rows = torch.arange(scores.shape[0], device=scores.device)
    masked = scores.detach().masked_fill(_eye(scores), float("-inf"))
    masked[rows, i_on] = float("-inf")
    t_next = masked.argmax(dim=1)
    t_derived = torch.where(t_on == i_on, t_next, t_on)
    return scores[i_on, t_derived], scores[t_derived, i_on]


def _offline_triplet_terms(positive: Tensor, i2t_off: Tensor, t2i_off: Tensor, margin: float) -> Tensor:
    return (F.relu(margin - positive + i2t_off) + F.relu(margin - positive + t2i_off)).sum()


def _derived_pair_terms(positive: Tensor, off_pair: Tensor, off_pair_tilde: Tensor, margin: float) -> Tensor:
    return (F.relu(margin - positive + off_pair) + F.relu(margin - positive + off_pair_tilde)).sum()


# --------------------------------------------------------------------------- round-1 losses


def triplet_sum(scores: Tensor, margin: float = 0.2) -> Tensor:
    """Eq. 1, the standard triplet loss over all in-batch negatives ("sum", VSE0).

    ``sum_k sum_{b != k} [m - S(i_k,t_k) + S(i_k,t_b)]+ + sum_k sum_{a != k} [m - S(i_k,t_k) + S(i_a,t_k)]+``
    """
    _check_scores(scores)
    positive = scores.diagonal()
    eye = _eye(scores)
    cost_captions = F.relu(margin - positive[:, None] + scores).masked_fill(eye, 0.0)
    cost_images = F.relu(margin - positive[None, :] + scores).masked_fill(eye, 0.0)
    return cost_captions.sum() + cost_images.sum()


def triplet_max_violation(scores: Tensor, margin: float = 0.2) -> Tensor:
    """Eq. 2, the online triplet loss with the hardest in-batch negative (VSE++ "max violation").

    ``sum_k [m - S(i_k,t_k) + S(i_k,t_on)]+ + [m - S(i_k,t_k) + S(i_on,t_k)]+``
    """
    i2t_on, t2i_on = online_hard_negatives(scores)
    positive = scores.diagonal()
    return (F.relu(margin - positive + i2t_on) + F.relu(margin - positive + t2i_on)).sum()


def smooth_ap(scores: Tensor, tau: float = 0.01) -> Tensor:
    """Smooth-AP (Brown et al. 2020) in both directions, summed over the 2B queries.

    Each image row is a query whose only positive in the batch is its own caption, and each
    caption column a query whose only positive is its own image. With one positive, Smooth-AP's
    AP is ``1 / R`` with the sigmoid-smoothed rank
    ``R = 1 + sum_{negatives n} sigmoid((S(q, n) - S(q, positive)) / tau)``.

    Reduction: ``sum over image queries of (1 - AP) + sum over caption queries of (1 - AP)``,
    i.e. ``2B * (1 - mean AP)``; it is 0 for a perfect batch and tends to the exact
    ``sum (1 - 1/rank)`` as tau -> 0.
    """
    _check_scores(scores)
    _check_positive(tau=tau)
    positive = scores.diagonal()
    eye = _eye(scores)
    above_caption = torch.sigmoid((scores - positive[:, None]) / tau).masked_fill(eye, 0.0)
    above_image = torch.sigmoid((scores - positive[None, :]) / tau).masked_fill(eye, 0.0)
    ap_images = 1.0 / (1.0 + above_caption.sum(dim=1))
    ap_captions = 1.0 / (1.0 + above_image.sum(dim=0))
    return (1.0 - ap_images).sum() + (1.0 - ap_captions).sum()


def infonce(scores: Tensor, tau: float = DEFAULT_TAU["infonce"]) -> Tensor:
    """NT-Xent / InfoNCE: symmetric cross-entropy over ``scores / tau`` (default tau = 0.05).

    Reduction: the cross-entropy of every image row (target: its caption) plus that of every
    caption column (target: its image), summed over the 2B queries.
    """
    batch = _check_scores(scores)
    _check_positive(tau=tau)
    logits = scores / tau
    targets = torch.arange(batch, device=scores.device)
    return F.cross_entropy(logits, targets, reduction="sum") + F.cross_entropy(
        logits.t(), targets, reduction="sum"
    )


# --------------------------------------------------------------------------- round-2 losses


def offline_triplet(
    scores: Tensor, i2t_off: Tensor, t2i_off: Tensor, margin_online: float = 0.2, margin_offline: float = 0.0,
) -> Tensor:
    """Eq. 3, OffTri: Eq. 2 plus one offline hard negative per anchor.

    ``Eq.2(g1) + sum_k [g2 - S(i,t) + S(i,t_off)]+ + [g2 - S(i,t) + S(i_off,t)]+``
    """
    batch = _check_scores(scores)
    _check_pair_scores(batch, i2t_off=i2t_off, t2i_off=t2i_off)
    positive = scores.diagonal()
    return triplet_max_violation(scores, margin_online) + _offline_triplet_terms(
        positive, i2t_off, t2i_off, margin_offline
    )


def offline_quintuplet(
    scores: Tensor, i2t_off: Tensor, t2i_off: Tensor, off_pair: Tensor, off_pair_tilde: Tensor,
    margin_online: float = 0.2, margin_offline: float = 0.0,
) -> Tensor:
    """Eq. 4, OffQuin: Eq. 3 plus the two derived offline pairs that share nothing with (i, t).

    ``Eq.3 + sum_k [g2 - S(i,t) + S(i_off,t_off)]+ + [g2 - S(i,t) + S(i~_off,t~_off)]+``

    For the "OnlineQuin" ablation pass :func:`online_derived_pairs` as ``off_pair`` /
    ``off_pair_tilde``.
    """
    batch = _check_scores(scores)
    _check_pair_scores(batch, off_pair=off_pair, off_pair_tilde=off_pair_tilde)
    positive = scores.diagonal()
    return offline_triplet(scores, i2t_off, t2i_off, margin_online, margin_offline) + _derived_pair_terms(
        positive, off_pair, off_pair_tilde, margin_offline
    )


def adaptive_weights(
    i2t_ref: Tensor, i2t_on: Tensor, t2i_ref: Tensor, t2i_on: Tensor, alpha: float = 0.3, beta: float = 1.5,
) -> tuple[Tensor, Tensor]:
    """The adaptive weights of Eq. 5, ``(w_i, w_t)``, each of shape (B,), differentiable.

    ``w_i = beta - (S(i,t_off) - S(i,t_on)) / alpha`` and ``w_t = beta - (S(i_off,t) - S(i_on,t)) / alpha``,
    with ``i2t_ref = S(i,t_off)`` and ``t2i_ref = S(i_off,t)`` (S(i,t) for the "w/o OfflineAdap" ablation).
    """
    _check_positive(alpha=alpha)
    return beta - (i2t_ref - i2t_on) / alpha, beta - (t2i_ref - t2i_on) / alpha


def adaptive_offline_quintuplet(
    scores: Tensor, i2t_off: Tensor, t2i_off: Tensor, off_pair: Tensor, off_pair_tilde: Tensor,
    margin_online: float = 0.2, margin_offline: float = 0.0, alpha: float = 0.3, beta: float = 1.5, *,
    adapt_from: Literal["offline", "positive"] = "offline",
) -> Tensor:
    """Eq. 5, AdapOffQuin (the full AOQ loss): Eq. 4 with adaptively weighted online terms.

    ``sum_k (beta - (S(i,t_off) - S(i,t_on)) / alpha) * [g1 - S(i,t) + S(i,t_on)]+``
    ``    + (beta - (S(i_off,t) - S(i_on,t)) / alpha) * [g1 - S(i,t) + S(i_on,t)]+``
    ``    + the four offline terms of Eq. 4.``

    The weights are NOT detached: their gradient is part of the method (paper Eq. 6). They are
    not clipped either, so a weight can become negative when an offline negative scores more
    than ``alpha * beta`` above the online one, as in the paper's formula.

    Args:
        adapt_from: ``"offline"`` (the method) or ``"positive"`` for the ablation
            "w/o OfflineAdap", where the weights use S(i,t) in place of the offline scores:
            ``beta - (S(i,t) - S(i,t_on)) / alpha`` and ``beta - (S(i,t) - S(i_on,t)) / alpha``.
    """
    batch = _check_scores(scores)
    _check_pair_scores(
        batch, i2t_off=i2t_off, t2i_off=t2i_off, off_pair=off_pair, off_pair_tilde=off_pair_tilde
    )
    _check_positive(alpha=alpha)
    if adapt_from not in ("offline", "positive"):
        raise ValueError(f"adapt_from must be 'offline' or 'positive', got {adapt_from!r}")
    positive = scores.diagonal()
    i2t_on, t2i_on = online_hard_negatives(scores)
    i2t_ref, t2i_ref = (i2t_off, t2i_off) if adapt_from == "offline" else (positive, positive)
    weight_image, weight_caption = adaptive_weights(i2t_ref, i2t_on, t2i_ref, t2i_on, alpha, beta)
    online = (
        weight_image * F.relu(margin_online - positive + i2t_on)
        + weight_caption * F.relu(margin_online - positive + t2i_on)
    ).sum()
    return (
        online
        + _offline_triplet_terms(positive, i2t_off, t2i_off, margin_offline)
        + _derived_pair_terms(positive, off_pair, off_pair_tilde, margin_offline)
    )


def only_offline(
    scores: Tensor, i2t_off: Tensor, t2i_off: Tensor, off_pair: Tensor | None = None,
    off_pair_tilde: Tensor | None = None, margin_offline: float = 0.0,
) -> Tensor:
    """Ablation "OnlyOffline" (paper Table 3): the offline terms of Eq. 3/4 without any online term.

    With ``off_pair``/``off_pair_tilde`` it is Eq. 4 (and Eq. 5, whose weights only touch the
    online terms) minus its online terms; without them it is Eq. 3 minus its online terms.
    """
    batch = _check_scores(scores)
    _check_pair_scores(batch, i2t_off=i2t_off, t2i_off=t2i_off)
    positive = scores.diagonal()
    loss = _offline_triplet_terms(positive, i2t_off, t2i_off, margin_offline)
    if (off_pair is None) != (off_pair_tilde is None):
        raise ValueError("only_offline: give both off_pair and off_pair_tilde, or neither")
    if off_pair is not None:
        _check_pair_scores(batch, off_pair=off_pair, off_pair_tilde=off_pair_tilde)
        loss = loss + _derived_pair_terms(positive, off_pair, off_pair_tilde, margin_offline)
    return loss


# --------------------------------------------------------------------------- dispatch by name


def round1_loss(name: str, scores: Tensor, *, margin: float = 0.2, tau: float | None = None) -> Tensor:
    """The round-1 loss called ``name`` (``TrainConfig.loss``); ``tau=None`` takes :data:`DEFAULT_TAU`."""
    if name == "max_violation":
        return triplet_max_violation(scores, margin)
    if name == "sum":
        return triplet_sum(scores, margin)
    if name in DEFAULT_TAU:
        fn = smooth_ap if name == "smooth_ap" else infonce
        return fn(scores, DEFAULT_TAU[name] if tau is None else tau)
    raise ValueError(f"unknown round-1 loss {name!r}; expected one of {ROUND1_LOSSES}")


def round2_loss(
    scores: Tensor, i2t_off: Tensor, t2i_off: Tensor, off_pair: Tensor | None = None,
    off_pair_tilde: Tensor | None = None, *, loss: str = "adaptive_offline_quintuplet", variant: str = "none",
    margin_online: float = 0.2, margin_offline: float = 0.0, alpha: float = 0.3, beta: float = 1.5,
) -> Tensor:
    """The round-2 loss and ablation named by ``Round2Config.loss`` / ``Round2Config.variant``.

    * ``none``: the loss itself (Eq. 3, 4 or 5).
    * ``only_offline``: :func:`only_offline` (derived pairs included unless ``loss`` is Eq. 3).
    * ``online_quin``: Eq. 4/5 with :func:`online_derived_pairs` replacing the derived offline
      pairs (``off_pair``/``off_pair_tilde`` are then ignored and may be None).
    * ``no_offline_adapt``: Eq. 5 with ``adapt_from="positive"``.

    Raises:
        ValueError: unknown name, or a variant that does not apply to ``loss``.
    """
    if loss not in ROUND2_LOSSES:
        raise ValueError(f"unknown round-2 loss {loss!r}; expected one of {ROUND2_LOSSES}")
    if variant not in ROUND2_VARIANTS:
        raise ValueError(f"unknown round-2 variant {variant!r}; expected one of {ROUND2_VARIANTS}")
    quintuplet = loss != "offline_triplet"
    if variant == "online_quin":
        if not quintuplet:
            raise ValueError("variant 'online_quin' changes the derived pairs of Eq. 4/5; offline_triplet has none")
        off_pair, off_pair_tilde = online_derived_pairs(scores)
    if variant == "no_offline_adapt" and loss != "adaptive_offline_quintuplet":
        raise ValueError("variant 'no_offline_adapt' only applies to adaptive_offline_quintuplet")
    if quintuplet and (off_pair is None or off_pair_tilde is None):
        raise ValueError(f"{loss} needs off_pair and off_pair_tilde")

    if variant == "only_offline":
        derived = (off_pair, off_pair_tilde) if quintuplet else (None, None)
        return only_offline(scores, i2t_off, t2i_off, *derived, margin_offline=margin_offline)
    if loss == "offline_triplet":
        return offline_triplet(scores, i2t_off, t2i_off, margin_online, margin_offline)
    if loss == "offline_quintuplet":
        return offline_quintuplet(scores, i2t_off, t2i_off, off_pair, off_pair_tilde, margin_online, margin_offline)
    return adaptive_offline_quintuplet(
        scores,
        i2t_off,
        t2i_off,
        off_pair,
        off_pair_tilde,
        margin_online,
        margin_offline,
        alpha,
        beta,
        adapt_from="positive" if variant == "no_offline_adapt" else "offline",
    )
