"""torch datasets over a :class:`SplitData`: caption-image pairs for training, images and
captions alone for embedding a gallery or a query set.

Images come either as region/global features (float32 ``(R, D)`` or ``(D,)``, copied out of the
memory map one row at a time) or as pixels for raw-image models (``(3, H, W)`` float32 in
[-1, 1], loaded with Pillow and resized to a square). Captions come as token ids, padded with
``<pad>`` (id 0) and returned with their lengths, unsorted (the GRU text encoders pack them with
``enforce_sorted=False``), or -- text mode ``features``, for a frozen pretrained text backbone --
as the split's cached ``caption_features`` rows, stacked, with length 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from aoq.data.dataset import DataError, SplitData
from aoq.data.vocab import PAD_ID, Vocabulary

ImageMode = Literal["features", "pixels"]
TextMode = Literal["tokens", "features"]
Pair = tuple[torch.Tensor, torch.Tensor, int, int]


def load_pixels(image: str | Path | Image.Image, image_size: int = 64) -> torch.Tensor:
    """An image file or PIL image as a ``(3, image_size, image_size)`` float32 tensor in [-1, 1].

    The image is converted to RGB and resized (bilinear, aspect ratio not kept) so that every
    item of a batch has the same shape; the service uses this for uploaded images too.

    Raises:
        DataError: the file is missing or not an image Pillow can read.
    """
    if isinstance(image, Image.Image):
        return _to_tensor(image, image_size)
    path = Path(image)
    try:
        with Image.open(path) as img:
            return _to_tensor(img, image_size)
    except FileNotFoundError:
        raise DataError(f"{path}: image file not found") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from None


def _to_tensor(img: Image.Image, size: int) -> torch.Tensor:
    rgb = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    array = np.asarray(rgb, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


class _ImageSource:
    """Image ``i`` of a split as a tensor, in the requested mode (checked once, up front)."""

    def __init__(self, split: SplitData, mode: ImageMode, image_size: int) -> None:
        if mode not in ("features", "pixels"):
            raise ValueError(f"image_mode must be 'features' or 'pixels', got {mode!r}")
        if mode == "features" and split.features is None:
            raise DataError(f"{split.source}: split has no features; use image_mode='pixels'")
        if mode == "pixels" and split.image_paths is None:
            raise DataError(f"{split.source}: split has no image files; use image_mode='features'")
        self.split, self.mode, self.image_size = split, mode, image_size

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.mode == "features":
            # np.array copies the row out of the read-only memory map (torch wants writable memory).
            return torch.from_numpy(np.array(self.split.features[i], dtype=np.float32))
        return load_pixels(self.split.image_paths[i], self.image_size)


class _TextSource:
    """Caption ``c`` of a split as token ids (``vocab.encode``) or as its cached feature row."""

    def __init__(self, split: SplitData, vocab: Vocabulary, mode: TextMode) -> None:
        if mode not in ("tokens", "features"):
            raise ValueError(f"text_mode must be 'tokens' or 'features', got {mode!r}")
        if mode == "features" and split.caption_features is None:
            raise DataError(f"{split.source}: split has no caption features; use text_mode='tokens'")
        self.split, self.vocab, self.mode = split, vocab, mode

    def __getitem__(self, c: int) -> torch.Tensor:
        if self.mode == "features":
            spans = self.split.caption_spans
            rows = self.split.caption_features[c] if spans is None else self.split.caption_features[spans[c, 0]:spans[c, 1]]
            return torch.from_numpy(np.array(rows, dtype=np.float32))
        return torch.tensor(self.vocab.encode(self.split.captions[c]), dtype=torch.long)


class PairDataset(Dataset):
    """One item per caption ``c``: (image ``c // cpi``, token ids, caption index, image index)."""

    def __init__(
        self, split: SplitData, vocab: Vocabulary, image_mode: ImageMode = "features", image_size: int = 64,
        text_mode: TextMode = "tokens",
    ) -> None:
        self.split, self.vocab = split, vocab
        self.images = _ImageSource(split, image_mode, image_size)
        self.texts = _TextSource(split, vocab, text_mode)

    def __len__(self) -> int:
        return self.split.n_captions

    def __getitem__(self, c: int) -> Pair:
        i = c // self.split.captions_per_image
        return self.images[i], self.texts[c], c, i


class ImageDataset(Dataset):
    """One item per image: (image tensor, image index); for embedding a gallery."""

    def __init__(self, split: SplitData, image_mode: ImageMode = "features", image_size: int = 64) -> None:
        self.split = split
        self.images = _ImageSource(split, image_mode, image_size)

    def __len__(self) -> int:
        return self.split.n_images

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], i


class CaptionDataset(Dataset):
    """One item per caption: (token ids or cached features, caption index); for embedding queries."""

    def __init__(self, split: SplitData, vocab: Vocabulary, text_mode: TextMode = "tokens") -> None:
        self.split, self.vocab = split, vocab
        self.texts = _TextSource(split, vocab, text_mode)

    def __len__(self) -> int:
        return self.split.n_captions

    def __getitem__(self, c: int) -> tuple[torch.Tensor, int]:
        return self.texts[c], c


def pad_tokens(sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D LongTensors with ``<pad>``: ``(B, L_max)`` tokens and ``(B,)`` lengths.

    Float rows (cached caption features, text mode ``features``) are stacked as they are, each
    with length 1; float (T, D) token states are right-padded with zeros to ``(B, T_max, D)``,
    their lengths the T's.
    """
    if sequences and sequences[0].is_floating_point():
        if sequences[0].ndim == 1:
            return torch.stack(sequences), torch.ones(len(sequences), dtype=torch.long)
        return (torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True),
                torch.tensor([len(s) for s in sequences], dtype=torch.long))
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    tokens = torch.full((len(sequences), int(lengths.max())), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = seq
    return tokens, lengths


def collate_pairs(batch: list[Pair]) -> dict[str, torch.Tensor]:
    """Batch of :class:`PairDataset` items: ``images`` (B, ...), ``tokens`` (B, L) padded with 0,
    ``lengths`` (B,), ``caption_ids`` (B,), ``image_ids`` (B,) (all LongTensors but images)."""
    images, sequences, caption_ids, image_ids = zip(*batch)
    tokens, lengths = pad_tokens(list(sequences))
    return {
        "images": torch.stack(images),
        "tokens": tokens,
        "lengths": lengths,
        "caption_ids": torch.tensor(caption_ids, dtype=torch.long),
        "image_ids": torch.tensor(image_ids, dtype=torch.long),
    }


def collate_images(batch: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    """Batch of :class:`ImageDataset` items: ``images`` (B, ...) and ``image_ids`` (B,)."""
    images, image_ids = zip(*batch)
    return {"images": torch.stack(images), "image_ids": torch.tensor(image_ids, dtype=torch.long)}


def collate_captions(batch: list[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    """Batch of :class:`CaptionDataset` items: ``tokens`` (B, L), ``lengths``, ``caption_ids``."""
    sequences, caption_ids = zip(*batch)
    tokens, lengths = pad_tokens(list(sequences))
    return {"tokens": tokens, "lengths": lengths, "caption_ids": torch.tensor(caption_ids, dtype=torch.long)}
