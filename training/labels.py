"""Per-image labels: the label vocabulary, multi-hot targets and the label-prediction term.

Datasets may carry a list of labels per image (``SplitData.labels``; captions inherit their
image's labels). The optional training term of ``train.label_lambda`` (docs/training.md) puts one
linear classifier on the joint space and asks it to predict the image's labels from the image
embedding and from each caption embedding (multi-label binary cross-entropy), after the
label-prediction term of label-wise cross-modal retrieval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def label_vocabulary(*label_lists: Sequence[Sequence[str]]) -> list[str]:
    """The sorted set of every label in the given per-item label lists."""
    return sorted({label for labels in label_lists for item in labels for label in item})


def multi_hot(labels: Sequence[Sequence[str]], vocabulary: Sequence[str]) -> np.ndarray:
    """``(n_items, len(vocabulary))`` float32 matrix, 1 where item i carries label j.

    Raises:
        ValueError: an item carries a label that is not in ``vocabulary``.
    """
    index = {label: j for j, label in enumerate(vocabulary)}
    out = np.zeros((len(labels), len(vocabulary)), dtype=np.float32)
    for i, item in enumerate(labels):
        for label in item:
            if label not in index:
                raise ValueError(f"label {label!r} of item {i} is not in the label vocabulary")
            out[i, index[label]] = 1.0
    return out


def label_prediction_loss(image_logits: Tensor, caption_logits: Tensor, targets: Tensor) -> Tensor:
    """Multi-label BCE of both modalities: ``sum_k mean_j BCE(l_img[k, j], y[k, j]) + BCE(l_cap[k, j], y[k, j])``.

    Args:
        image_logits / caption_logits: (B, L) classifier outputs on the image and caption
            embeddings of the B pairs of a batch.
        targets: (B, L) multi-hot labels of pair k's image.

    Returns:
        A scalar summed over the batch (like the ranking losses) and averaged over the L labels
        (so ``label_lambda`` means the same whatever the vocabulary size).
    """
    if image_logits.shape != targets.shape or caption_logits.shape != targets.shape:
        raise ValueError(
            f"logits {tuple(image_logits.shape)} / {tuple(caption_logits.shape)} do not match targets {tuple(targets.shape)}"
        )
    targets = targets.to(image_logits.dtype)
    per_item = F.binary_cross_entropy_with_logits(image_logits, targets, reduction="none").mean(dim=1)
    per_item = per_item + F.binary_cross_entropy_with_logits(caption_logits, targets, reduction="none").mean(dim=1)
    return per_item.sum()

