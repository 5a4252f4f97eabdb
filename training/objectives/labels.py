"""The label-prediction term of ``train.label_lambda`` (the label vocabulary and multi-hot
targets are in :mod:`aoq.data.dataset`).

Datasets may carry a list of labels per image (``SplitData.labels``; captions inherit their
image's labels). The optional training term of ``train.label_lambda`` (docs/training.md) puts one
linear classifier on the joint space and asks it to predict the image's labels from the image
embedding and from each caption embedding (multi-label binary cross-entropy), after the
label-prediction term of label-wise cross-modal retrieval.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


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

