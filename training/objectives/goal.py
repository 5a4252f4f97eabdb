"""GOAL: training signals defined as gradients (Xuan & Chen, "Dissecting Deep Metric Learning
Losses for Image-Text Retrieval", WACV 2023).

For one anchor with positive score ``S_p`` and hardest in-batch negative score ``S_n`` the
triplet loss and its relatives all push the scores with a gradient of the form

    dS_n = w_tri(S_p, S_n) * w_n(S_n)          (push the negative away)
    dS_p = - w_tri(S_p, S_n) * w_p(S_p)        (pull the positive in)

where ``w_tri`` is a *triplet weight* (``con``, ``nca``, ``cir``) and ``(w_p, w_n)`` a *pair
weight* (``con``, ``lin``, ``sig``, ``lin_ms``, ``sig_ms``). GOAL picks one of each and uses the
product as the gradient directly, whether or not a loss integrates to it. Both retrieval
directions are used: an image anchor ``k`` with its caption ``k`` and its hardest caption, and a
caption anchor ``k`` with its image ``k`` and its hardest image (VSE++ max violation mining).

Conventions: score tensors as in :mod:`aoq_train.objectives.losses` (``scores[a, b] = S(image a, caption b)``,
positives on the diagonal); every weight function is pure, works element-wise on its score
tensors, keeps their dtype/device and carries no gradient (GOAL never differentiates a weight).

Inactive triplets. With the constant triplet weight the triplet loss
``[m - S_p + S_n]+`` has gradient ``I(m - S_p + S_n > 0)``: a triplet that already satisfies the
margin gets none. The paper's equivalence (its appendix Table 1 reproduces VSE++ and VSE-infinity
with the gradient form) needs that indicator, so here ``con`` is the hinge indicator whenever
``margin`` is a number. The authors' public code instead applies the weight 1 to every anchor,
margin or not; ``margin=None`` gives that behaviour. ``nca`` and ``cir`` are smooth weights of
margin-free losses and ignore ``margin``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aoq.names import GOAL_PAIRS, GOAL_TRIPLETS
from aoq_train.objectives.losses import _check_scores, online_hard_negative_indices



# --------------------------------------------------------------------------- triplet weights


def triplet_weight_con(positive: Tensor, negative: Tensor, margin: float | None = 0.2) -> Tensor:
    """Constant triplet weight (triplet loss): ``w_tri = I(m - S_p + S_n > 0)``, or 1 if margin is None.

    The indicator is the derivative of the hinge ``[m - S_p + S_n]+``; ``margin=None`` is the public
    code's variant that weights every anchor by 1.
    """
    if margin is None:
        return torch.ones_like(positive)
    return (margin - positive + negative > 0).to(positive.dtype)


def triplet_weight_nca(positive: Tensor, negative: Tensor, tau: float = 10.0) -> Tensor:
    """NCA / softmax triplet weight: ``w_tri = 1 / (1 + exp(tau * (S_p - S_n)))``.

    It is the derivative of ``softplus(tau * (S_n - S_p)) / tau``, the two-candidate softmax
    cross-entropy with inverse temperature ``tau``: hard triplets weigh up to 1, easy ones decay.
    """
    return torch.sigmoid(tau * (negative - positive))


def triplet_weight_cir(positive: Tensor, negative: Tensor, tau: float = 10.0) -> Tensor:
    """Circle-loss triplet weight: ``w_tri = 1 / (1 + exp(tau * (S_p (2 - S_p) - S_n^2 - 1/2)))``.

    ``S_p (2 - S_p) - S_n^2 - 1/2 = 1/2 - ((1 - S_p)^2 + S_n^2)``: the weight is 1/2 on the circle of
    radius ``sqrt(1/2)`` around the optimum ``(S_p, S_n) = (1, 0)``, grows outside it and decays
    inside it, the circular decision boundary of Circle loss.
    """
    return torch.sigmoid(tau * ((1.0 - positive) ** 2 + negative**2 - 0.5))


# --------------------------------------------------------------------------- pair weights


def pair_weight_con(positive: Tensor, negative: Tensor) -> tuple[Tensor, Tensor]:
    """Constant pair weight (triplet loss): ``w_p = w_n = 1``."""
    return torch.ones_like(positive), torch.ones_like(negative)


def pair_weight_lin(positive: Tensor, negative: Tensor) -> tuple[Tensor, Tensor]:
    """Linear pair weight (contrastive loss on cosine similarity): ``w_p = 1 - S_p``, ``w_n = S_n``.

    A positive far from 1 and a negative far above 0 get pushed harder.
    """
    return 1.0 - positive, negative


def pair_weight_sig(
    positive: Tensor, negative: Tensor, ms_a: float = 2.0, ms_b: float = 10.0, ms_lambda: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Sigmoid pair weight (the self-similarity part of Multi-Similarity loss).

    ``w_p = 1 / (1 + exp(a (S_p - lambda)))``, ``w_n = 1 / (1 + exp(-b (S_n - lambda)))``.
    """
    return torch.sigmoid(-ms_a * (positive - ms_lambda)), torch.sigmoid(ms_b * (negative - ms_lambda))


def pair_weight_lin_ms(
    positive: Tensor, negative: Tensor, pos_relative: Tensor, neg_relative: Tensor,
) -> tuple[Tensor, Tensor]:
    """Linear pair weight with Multi-Similarity relative terms.

    ``w_p = (1 - R_p) (1 - S_p)``, ``w_n = (1 + R_n) S_n`` with ``R_p``, ``R_n`` from
    :func:`relative_similarity` (``kind="lin"``).
    """
    return (1.0 - pos_relative) * (1.0 - positive), (1.0 + neg_relative) * negative


def pair_weight_sig_ms(
    positive: Tensor, negative: Tensor, pos_relative: Tensor, neg_relative: Tensor, ms_a: float = 2.0,
    ms_b: float = 10.0, ms_lambda: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Sigmoid pair weight with Multi-Similarity relative terms (the full MS weight's shape).

    ``w_p = 1 / (exp(a (S_p - lambda)) + R_p)``, ``w_n = 1 / (exp(-b (S_n - lambda)) + R_n)`` with
    ``R_p``, ``R_n`` from :func:`relative_similarity` (``kind="sig"``); ``R = 1`` gives ``sig``.
    """
    w_p = 1.0 / (torch.exp(ms_a * (positive - ms_lambda)) + pos_relative)
    w_n = 1.0 / (torch.exp(-ms_b * (negative - ms_lambda)) + neg_relative)
    return w_p, w_n


def relative_similarity(
    scores: Tensor, positive: Tensor, negative: Tensor, negative_index: Tensor, kind: str, ms_a: float = 2.0,
    ms_b: float = 10.0, epsilon: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """The relative terms ``(R_p, R_n)`` of the ``*_ms`` pair weights, one per anchor (row).

    ``scores`` holds the anchors in rows (pass ``scores.T`` for caption anchors), ``positive`` the
    (B,) positive scores, ``negative``/``negative_index`` each row's hardest negative.

    Sets, mined as Multi-Similarity does with margin ``epsilon``:

    * relative positives of anchor ``k``: the other pairs' positive scores ``S_p[j]``, ``j != k``,
      with ``S_p[j] <= S_n[k] + epsilon`` (positives that are not clearly above k's hardest negative);
    * relative negatives of anchor ``k``: the other negatives ``scores[k, c]``, ``c`` neither ``k``
      nor the hardest, with ``scores[k, c] >= min_j S_p[j] - epsilon``.

    Values averaged over each set (0 for an empty set):
    ``kind="lin"``: ``S_p[k] - S_p[j]`` and ``S_n[k] - scores[k, c]``;
    ``kind="sig"``: ``exp(a (S_p[k] - S_p[j]))`` and ``exp(-b (S_n[k] - scores[k, c]))``.
    """
    if kind not in ("lin", "sig"):
        raise ValueError(f"relative_similarity kind must be 'lin' or 'sig', got {kind!r}")
    batch = scores.shape[0]
    eye = torch.eye(batch, dtype=torch.bool, device=scores.device)
    pos_gap = positive[:, None] - positive[None, :]  # [k, j] = S_p[k] - S_p[j]
    neg_gap = negative[:, None] - scores  # [k, c] = S_n[k] - scores[k, c]
    pos_mask = (positive[None, :] <= negative[:, None] + epsilon) & ~eye
    neg_mask = (scores >= positive.min() - epsilon) & ~eye
    neg_mask[torch.arange(batch, device=scores.device), negative_index] = False
    if kind == "lin":
        pos_val, neg_val = pos_gap, neg_gap
    else:
        pos_val, neg_val = torch.exp(ms_a * pos_gap), torch.exp(-ms_b * neg_gap)

    def mean(values: Tensor, mask: Tensor) -> Tensor:
        count = mask.sum(dim=1)
        total = (values * mask).sum(dim=1)
        return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))

    return mean(pos_val, pos_mask), mean(neg_val, neg_mask)


# --------------------------------------------------------------------------- the objective


@dataclass(frozen=True)
class GoalSpec:
    """One GOAL objective: a triplet weight, a pair weight and their parameters (``goal:`` config).

    Attributes:
        triplet: ``con``, ``nca`` or ``cir``.
        pair: ``con``, ``lin``, ``sig``, ``lin_ms`` or ``sig_ms``.
        margin: the hinge of ``con`` (None: every anchor weighs 1, as the public code).
        tau: inverse temperature of ``nca`` and ``cir``.
        ms_a / ms_b / ms_lambda: Multi-Similarity's alpha, beta and lambda (``sig``, ``sig_ms``,
            ``ms_a``/``ms_b`` in the ``sig_ms`` relative terms).
        ms_epsilon: Multi-Similarity's mining margin for the relative sets of ``*_ms``.
    """

    triplet: str = "con"
    pair: str = "con"
    margin: float | None = 0.2
    tau: float = 10.0
    ms_a: float = 2.0
    ms_b: float = 10.0
    ms_lambda: float = 0.5
    ms_epsilon: float = 0.1

    def __post_init__(self) -> None:
        if self.triplet not in GOAL_TRIPLETS:
            raise ValueError(f"unknown GOAL triplet weight {self.triplet!r}; expected one of {GOAL_TRIPLETS}")
        if self.pair not in GOAL_PAIRS:
            raise ValueError(f"unknown GOAL pair weight {self.pair!r}; expected one of {GOAL_PAIRS}")

    @property
    def has_loss(self) -> bool:
        """Whether the gradient field integrates to a loss (see :func:`goal_potential`)."""
        if self.triplet == "con":
            return self.pair == "con" or (self.margin is None and self.pair in ("lin", "sig"))
        return self.triplet == "nca" and self.pair == "con"


def _triplet_weight(spec: GoalSpec, positive: Tensor, negative: Tensor) -> Tensor:
    if spec.triplet == "con":
        return triplet_weight_con(positive, negative, spec.margin)
    if spec.triplet == "nca":
        return triplet_weight_nca(positive, negative, spec.tau)
    return triplet_weight_cir(positive, negative, spec.tau)


def _pair_weight(
    spec: GoalSpec, anchors: Tensor, positive: Tensor, negative: Tensor, negative_index: Tensor,
) -> tuple[Tensor, Tensor]:
    if spec.pair == "con":
        return pair_weight_con(positive, negative)
    if spec.pair == "lin":
        return pair_weight_lin(positive, negative)
    if spec.pair == "sig":
        return pair_weight_sig(positive, negative, spec.ms_a, spec.ms_b, spec.ms_lambda)
    kind = spec.pair.removesuffix("_ms")
    pos_rel, neg_rel = relative_similarity(
        anchors, positive, negative, negative_index, kind, spec.ms_a, spec.ms_b, spec.ms_epsilon
    )
    if spec.pair == "lin_ms":
        return pair_weight_lin_ms(positive, negative, pos_rel, neg_rel)
    return pair_weight_sig_ms(positive, negative, pos_rel, neg_rel, spec.ms_a, spec.ms_b, spec.ms_lambda)


def goal_score_gradient(scores: Tensor, spec: GoalSpec) -> Tensor:
    """The GOAL gradient with respect to the (B, B) score matrix, both directions.

    Image anchor ``k`` (row ``k``, hardest caption ``t_on(k)``) and caption anchor ``k`` (column
    ``k``, hardest image ``i_on(k)``) each add

    ``G[k, t_on(k)] += w_tri * w_n``, ``G[k, k] -= w_tri * w_p`` and
    ``G[i_on(k), k] += w_tri * w_n``, ``G[k, k] -= w_tri * w_p`` with their own weights.

    The embedding gradients follow by the chain rule through ``scores = img @ cap.T``.
    """
    batch = _check_scores(scores)
    scores = scores.detach()
    t_on, i_on = online_hard_negative_indices(scores)
    rows = torch.arange(batch, device=scores.device)
    positive = scores.diagonal()
    grad = torch.zeros_like(scores)
    for caption_anchors, neg_index in ((False, t_on), (True, i_on)):
        # Caption anchors live in the columns: work on the transpose, then transpose back.
        anchors = scores.T if caption_anchors else scores
        negative = anchors[rows, neg_index]
        w_tri = _triplet_weight(spec, positive, negative)
        w_p, w_n = _pair_weight(spec, anchors, positive, negative, neg_index)
        push = torch.zeros_like(scores)
        push[rows, neg_index] = w_tri * w_n
        grad += push.T if caption_anchors else push
        grad[rows, rows] -= w_tri * w_p
    return grad


def goal_potential(scores: Tensor, spec: GoalSpec) -> Tensor:
    """The loss whose gradient is the GOAL gradient, for the combinations that have one.

    * (con, con), margin m: ``sum [m - S_p + S_n]+`` over both directions, i.e. Eq. 2 of AOQ
      (:func:`aoq_train.objectives.losses.triplet_max_violation`); margin None: ``sum (S_n - S_p)``.
    * (nca, con): ``sum softplus(tau (S_n - S_p)) / tau``.
    * (con, lin), margin None: ``sum (1 - S_p)^2 / 2 + S_n^2 / 2``.
    * (con, sig), margin None: ``sum softplus(-a (S_p - lambda)) / a + softplus(b (S_n - lambda)) / b``.

    The hardest negatives are chosen without gradient, as in the gradient itself.

    Raises:
        ValueError: the combination integrates to no loss (``spec.has_loss`` is False).
    """
    if not spec.has_loss:
        raise ValueError(f"GOAL ({spec.triplet}, {spec.pair}) with margin={spec.margin} integrates to no loss")
    batch = _check_scores(scores)
    t_on, i_on = online_hard_negative_indices(scores)
    rows = torch.arange(batch, device=scores.device)
    positive = scores.diagonal()
    total = scores.new_zeros(())
    for negative in (scores[rows, t_on], scores[i_on, rows]):
        if spec.triplet == "nca":
            total = total + (torch.nn.functional.softplus(spec.tau * (negative - positive)) / spec.tau).sum()
        elif spec.pair == "con":
            gap = negative - positive
            total = total + (gap if spec.margin is None else torch.relu(spec.margin + gap)).sum()
        elif spec.pair == "lin":
            total = total + ((1.0 - positive) ** 2 / 2 + negative**2 / 2).sum()
        else:
            softplus = torch.nn.functional.softplus
            total = total + (
                softplus(-spec.ms_a * (positive - spec.ms_lambda)) / spec.ms_a
                + softplus(spec.ms_b * (negative - spec.ms_lambda)) / spec.ms_b
            ).sum()
    return total


class GoalGradient(torch.autograd.Function):
    """Scalar whose backward sets the GOAL gradient on the image and caption embeddings.

    ``forward(img, cap, spec)`` with ``img``, ``cap`` of shape (B, d), row k of each a positive pair.
    Backward: ``d img = g * G @ cap`` and ``d cap = g * G.T @ img`` with ``G`` from
    :func:`goal_score_gradient` and ``g`` the incoming gradient.

    The value returned is the loss of :func:`goal_potential` where one exists (so finite
    differences check the backward); otherwise ``sum(G * scores)``, the objective that has the
    GOAL gradient when the weights are held fixed, a number to log and nothing more.
    """

    @staticmethod
    def forward(ctx, img: Tensor, cap: Tensor, spec: GoalSpec) -> Tensor:  # type: ignore[override]
        scores = img @ cap.T
        grad = goal_score_gradient(scores, spec)
        ctx.save_for_backward(img, cap, grad)
        return goal_potential(scores, spec) if spec.has_loss else (grad * scores).sum()

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        img, cap, grad = ctx.saved_tensors
        grad = grad * grad_output
        return grad @ cap, grad.T @ img, None


def goal_objective(img: Tensor, cap: Tensor, spec: GoalSpec) -> Tensor:
    """:class:`GoalGradient` applied to a batch of (B, d) image and caption embeddings."""
    if img.dim() != 2 or img.shape != cap.shape:
        raise ValueError(
            f"img and cap must be (B, d) matrices of the same shape, got {tuple(img.shape)} and {tuple(cap.shape)}"
        )
    return GoalGradient.apply(img, cap, spec)
