"""Encoding a round-2 batch: its groups kept apart under batch statistics, and what it costs.

A round-2 batch stacks k groups of B rows per modality (``aoq_train.round2.train.collate_round2``):
the positives, the offline negatives and, for the quintuplet losses, the derived ``~`` items.

**Groups stay independent.** A layer that normalises with the statistics of the batch it is
given (BatchNorm in train mode: ``vsrn``'s graph convolutions, the ``cnn`` backbone, a
fine-tuned EfficientNet) would mix positives and negatives if all kB rows went through one call,
so an encoder with such a layer gets one call per group, as the public AOQ code runs one pass
per group (each call also updates the running statistics once). An encoder without one gets a
single call over its groups: every row's embedding is then the same as in separate calls.

**Every row is encoded once, with gradients.** The cost of a step is the rows encoded
(docs/training.md, Speed). A ``~`` row whose derived-pair hinge is inactive has no gradient,
so the ``~`` group could be encoded without gradients and only its active rows again with them
(also exact). Measured with the caption GRU of :mod:`aoq.models.packed_gru` (CPU, one thread,
synthetic config, each comparison in one run): at random init, where about half of the hinges
are active, that costs 2.50x and 2.17x a round-1 step against 2.05x and 1.70x for one call over
all the rows; with (almost) no hinge active, as late in a run (the share fell from 0.46 to
0.07 over a 10-epoch synthetic round 2), the two were within this shared machine's noise
(-10% to +12% over four runs). So the simpler one call stays: the pass without gradients costs
about a third of a row's forward and backward, and the second call a loop over the time steps
of its own. Rows with gradients through the online hinges (positives, offline negatives) have
none to spare: with a margin of 0.2 the hardest in-batch negative nearly always violates it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

#: rows of the stacked batch -> their (n, d) embeddings.
Encode = Callable[[slice], Tensor]


def uses_batch_statistics(module: nn.Module) -> bool:
    """Whether a BatchNorm layer of ``module`` normalises with the statistics of its input batch
    in the current mode (train mode, or a layer without running statistics), as torch decides."""
    return any(
        isinstance(m, _BatchNorm) and (m.training or (m.running_mean is None and m.running_var is None))
        for m in module.modules()
    )


def encode_groups(module: nn.Module, encode: Encode, batch: int, groups: int) -> Tensor:
    """The (groups x batch, d) embeddings of the stacked groups, with gradients: one ``encode``
    call per group when ``module`` (the encoder behind ``encode``) uses batch statistics in its
    current mode, one call over all the rows otherwise."""
    if uses_batch_statistics(module):
        return torch.cat([encode(slice(g * batch, (g + 1) * batch)) for g in range(groups)])
    return encode(slice(0, groups * batch))
