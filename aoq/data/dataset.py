"""The one in-memory description of an image-text dataset, shared by every reader.

A split holds ``n_images`` images and exactly ``captions_per_image`` captions per image, stored
image by image: captions ``k*cpi .. k*cpi + cpi - 1`` belong to image ``k`` (the convention of
VSE++/SCAN/VSRN and of :mod:`aoq.metrics`). Images come as precomputed region features
(precomp), as image files (Karpathy JSON), or both (the synthetic benchmark).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from aoq.data.facts import SplitFacts


class DataError(ValueError):
    """Bad dataset input; the message names the file and the problem."""


@dataclass
class SplitData:
    """One split of a dataset.

    Attributes:
        name: split name as the user asked for it (``train``, ``dev``, ``test``, ...).
        captions: raw caption strings, ``n_images * captions_per_image`` of them.
        captions_per_image: captions per image (5 for COCO/Flickr30K).
        image_ids: a stable string id per image (file name, COCO id, or row index).
        image_paths: image files (Karpathy / synthetic), or None for feature-only data.
        features: region features ``(N, R, D)`` or global features ``(N, D)``; usually a
            read-only memory map, so huge splits never have to fit in RAM. None for image-only data.
        caption_features: ``(n_captions, D)`` features of the captions from a frozen pretrained
            text backbone (``aoq.backbone_cache``), or None; with ``caption_spans``, the backbone's
            token states of the captions, one row per token.
        caption_spans: ``(n_captions, 2)`` [start, stop) rows of ``caption_features`` holding
            caption c's token states (identical captions share their rows), or None when
            ``caption_features`` has one row per caption.
        labels: optional labels per image (e.g. object classes, emoji groups), a list of
            strings per image; captions inherit their image's labels. None when the dataset
            has none (label-wise metrics and the label term need them).
        facts: optional structured facts of the images and captions, with family ids and
            change kinds of near-duplicates (:mod:`aoq.data.facts`); None when the dataset has
            none (the round-2 false-negative filter and the within-family metric need them).
    """

    name: str
    captions: list[str]
    captions_per_image: int
    image_ids: list[str]
    image_paths: list[Path] | None = None
    features: np.ndarray | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)
    caption_features: np.ndarray | None = None
    labels: list[list[str]] | None = None
    facts: "SplitFacts | None" = None
    caption_spans: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.image_ids)
        if self.image_paths is not None and len(self.image_paths) != n:
            raise DataError(f"{self.source}: {len(self.image_paths)} image paths for {n} images")
        if self.features is not None and self.features.shape[0] != n:
            raise DataError(f"{self.source}: {self.features.shape[0]} feature rows for {n} images")
        if self.caption_spans is not None:
            if self.caption_features is None or self.caption_spans.shape != (len(self.captions), 2):
                raise DataError(f"{self.source}: caption spans need token states and one (start, stop) per caption")
        elif self.caption_features is not None and self.caption_features.shape[0] != len(self.captions):
            raise DataError(f"{self.source}: {self.caption_features.shape[0]} caption feature rows for "
                            f"{len(self.captions)} captions")
        if self.labels is not None and len(self.labels) != n:
            raise DataError(f"{self.source}: {len(self.labels)} label lists for {n} images")
        if len(self.captions) != n * self.captions_per_image:
            raise DataError(
                f"{self.source}: {len(self.captions)} captions for {n} images x "
                f"{self.captions_per_image} captions per image"
            )

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def caption_to_image(self) -> np.ndarray:
        """``caption_to_image[c]`` is the index of the image caption ``c`` describes."""
        return np.arange(self.n_captions) // self.captions_per_image

    def image_captions(self, image: int) -> range:
        """Caption indices of image ``image``."""
        cpi = self.captions_per_image
        return range(image * cpi, (image + 1) * cpi)

    def subset(self, n_images: int) -> "SplitData":
        """The first ``n_images`` images and their captions (e.g. the COCO dev cut, 1K folds)."""
        n = min(n_images, self.n_images)
        cpi = self.captions_per_image
        return SplitData(
            name=self.name,
            captions=self.captions[: n * cpi],
            captions_per_image=cpi,
            image_ids=self.image_ids[:n],
            image_paths=None if self.image_paths is None else self.image_paths[:n],
            features=None if self.features is None else self.features[:n],
            source=self.source,
            extra=dict(self.extra),
            # token states (spans) stay whole: the first captions' spans point into them
            caption_features=(None if self.caption_features is None else self.caption_features
                              if self.caption_spans is not None else self.caption_features[: n * cpi]),
            caption_spans=None if self.caption_spans is None else self.caption_spans[: n * cpi],
            labels=None if self.labels is None else self.labels[:n],
            facts=None if self.facts is None else self.facts.subset(n, cpi),
        )

    @property
    def feature_dim(self) -> int | None:
        return None if self.features is None else int(self.features.shape[-1])


@dataclass
class DatasetDescription:
    """A dataset: its name, format, root and the splits that were read."""

    name: str
    format: str
    root: Path
    splits: dict[str, SplitData]

    def split(self, name: str) -> SplitData:
        if name not in self.splits:
            raise DataError(
                f"{self.root}: unknown split {name!r}; available: {', '.join(sorted(self.splits))}"
            )
        return self.splits[name]


def split_targets(split: SplitData) -> np.ndarray:
    """The multi-hot labels of a labelled split's images, over the split's own label vocabulary.

    Raises:
        DataError: the split has no labels.
    """
    if split.labels is None:
        raise DataError(f"{split.source}: has no labels, so label-wise metrics do not apply")
    return multi_hot(split.labels, label_vocabulary(split.labels))


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
