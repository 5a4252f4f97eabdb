"""Encoding a round-2 batch: independent groups under batch statistics, and the derived group's cost.

A round-2 batch stacks k groups of B rows per modality (``training.round2.collate_round2``):
the positives, the offline negatives and, for the quintuplet losses, the derived ``~`` items.

**Groups stay independent.** A layer that normalises with the statistics of the batch it is
given (BatchNorm in train mode: ``vsrn``'s graph convolutions, the ``cnn`` backbone, a
fine-tuned EfficientNet) would mix positives and negatives if all kB rows went through one call,
so an encoder with such a layer gets one call per group, as the public AOQ code runs one pass
per group (each call also updates the running statistics once). An encoder without one gets a
single call over its groups: every row's embedding is then the same as in separate calls.

**The derived group costs what its active hinges need.** ``S(i~_off, t~_off)`` enters the loss
only through the derived-pair hinge ``[g2 - S(i, t) + S(i~_off, t~_off)]+`` (Eq. 4), so a row
whose hinge is inactive has no gradient. For an encoder whose rows are independent (no batch
statistics, no active dropout), the ``~`` rows are encoded without gradients, the loss is
computed on those values, and only the rows with a non-zero gradient are encoded again with
gradients. A term ``sum g_k (s_k - detach(s_k))`` over them, which adds exactly 0 to the value,
gives the parameters the gradient ``sum g_k ds_k/dtheta`` of the full computation. An encoder
with batch statistics keeps its ``~`` group as a call with gradients: re-encoding a subset
would change the statistics, and even with the group's statistics reused the gradient that
flows through them to every row would be lost, so the saving would not be exact there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

Rows = slice | Tensor
#: rows of the stacked batch (a slice or a LongTensor of indices) -> their (n, d) embeddings.
Encode = Callable[[Rows], Tensor]


def uses_batch_statistics(module: nn.Module) -> bool:
    """Whether a BatchNorm layer of ``module`` normalises with the statistics of its input batch
    in the current mode (train mode, or a layer without running statistics), as torch decides."""
    return any(
        isinstance(m, _BatchNorm) and (m.training or (m.running_mean is None and m.running_var is None))
        for m in module.modules()
    )


def _draws_at_random(module: nn.Module) -> bool:
    """Active dropout: a dropout layer, or a recurrent layer's dropout, in train mode with p > 0."""
    return any(
        m.training and ((isinstance(m, _DropoutNd) and m.p > 0) or (isinstance(m, nn.RNNBase) and m.dropout > 0))
        for m in module.modules()
    )


def rows_independent(module: nn.Module) -> bool:
    """Whether encoding any subset of a batch's rows gives those rows' embeddings of the whole
    call (up to float rounding), in the current mode: no batch statistics and no active dropout."""
    return not uses_batch_statistics(module) and not _draws_at_random(module)


@dataclass(frozen=True)
class GroupEncoder:
    """One modality's encoder over the stacked groups of a round-2 batch.

    Attributes:
        encode: rows -> embeddings (called with gradients unless stated).
        batch: B, the rows of one group.
        per_group: one call per group (the encoder uses batch statistics).
        cheap_derived: the ``~`` group is encoded without gradients and its active rows again
            with them (the encoder's rows are independent).
    """

    encode: Encode
    batch: int
    per_group: bool
    cheap_derived: bool

    @classmethod
    def of(cls, module: nn.Module, encode: Encode, batch: int) -> GroupEncoder:
        """The policy that is exact for ``module`` in its current mode."""
        return cls(encode, batch, uses_batch_statistics(module), rows_independent(module))

    def groups(self, first: int, count: int) -> Tensor:
        """Embeddings of groups ``first .. first + count - 1``, with gradients."""
        b = self.batch
        if self.per_group:
            return torch.cat([self.encode(slice(g * b, (g + 1) * b)) for g in range(first, first + count)])
        return self.encode(slice(first * b, (first + count) * b))


@dataclass
class Round2Embeddings:
    """The embeddings a round-2 loss reads, and how to finish the derived group's gradient.

    Attributes:
        images / captions: (2B, d) embeddings of [positives | offline negatives], with gradients.
        derived_images / derived_captions: (B, d) embeddings of the ``~`` group (None without
            it); detached where the encoder's :attr:`GroupEncoder.cheap_derived` holds.
    """

    images: Tensor
    captions: Tensor
    derived_images: Tensor | None
    derived_captions: Tensor | None
    image_encoder: GroupEncoder
    caption_encoder: GroupEncoder

    def derived_rows(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """``rows`` (indices into the ``~`` group) of both modalities, with gradients: encoded
        again where the group was encoded without them, read off the group otherwise."""
        if self.derived_images is None or self.derived_captions is None:
            raise ValueError("this round-2 batch has no derived (~) group")
        pair = []
        for enc, emb in ((self.image_encoder, self.derived_images), (self.caption_encoder, self.derived_captions)):
            pair.append(enc.encode(2 * enc.batch + rows) if enc.cheap_derived else emb[rows])
        return pair[0], pair[1]


def encode_round2(images: GroupEncoder, captions: GroupEncoder, groups: int) -> Round2Embeddings:
    """Encode the ``groups`` (2 or 3) groups of both modalities with the exact policy of each."""
    derived: list[Tensor | None] = []
    main: list[Tensor] = []
    for enc in (images, captions):
        if groups == 3 and enc.cheap_derived:
            main.append(enc.groups(0, 2))
            with torch.no_grad():
                derived.append(enc.encode(slice(2 * enc.batch, 3 * enc.batch)))
        elif groups == 3:
            emb = enc.groups(0, 3)
            main.append(emb[: 2 * enc.batch])
            derived.append(emb[2 * enc.batch:])
        else:
            main.append(enc.groups(0, 2))
            derived.append(None)
    return Round2Embeddings(main[0], main[1], derived[0], derived[1], images, captions)


def loss_with_derived_pairs(
    emb: Round2Embeddings, loss_of: Callable[[Tensor], Tensor]
) -> tuple[Tensor, Tensor]:
    """The loss, given ``off_pair_tilde``, with the derived rows' gradient only where it is non-zero.

    Args:
        emb: embeddings with a ``~`` group.
        loss_of: ``off_pair_tilde`` (B,) -> the scalar loss (every other score already inside).

    Returns:
        The loss (its value that of ``loss_of`` on the ``~`` embeddings, its gradient that of the
        full computation) and the indices of the rows that carry gradient (the active hinges).
    """
    if emb.derived_images is None or emb.derived_captions is None:
        raise ValueError("this round-2 batch has no derived (~) group")
    tilde = (emb.derived_images * emb.derived_captions).sum(dim=1).detach().requires_grad_()
    loss = loss_of(tilde)
    # Only the loss's own few operations lie between it and ``tilde``: cheap, and exact.
    (grad,) = torch.autograd.grad(loss, tilde, retain_graph=True)
    rows = grad.nonzero().squeeze(1)
    if rows.numel():
        img, cap = emb.derived_rows(rows)
        pair = (img * cap).sum(dim=1)
        loss = loss + (grad[rows] * (pair - pair.detach())).sum()
    return loss, rows
