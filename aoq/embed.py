"""Turn images and captions into joint-space embeddings (float32 numpy, one row per item).

Every function runs the model in eval mode without gradients and puts it back in the mode it
was in, so the trainer can call them for validation in the middle of an epoch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from aoq.backbone_cache import input_modes, with_backbone_features
from aoq.data.dataset import SplitData
from aoq.data.loaders import (
    CaptionDataset,
    ImageDataset,
    collate_captions,
    collate_images,
    pad_tokens,
)
from aoq.data.vocab import Vocabulary
from aoq.models.joint import JointModel


@contextlib.contextmanager
def _inference(model: JointModel) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _device(model: JointModel, device: str | torch.device | None) -> torch.device:
    return next(model.parameters()).device if device is None else torch.device(device)


def _numpy(x: Tensor) -> np.ndarray:
    return x.float().cpu().numpy()


def encode_image_inputs(model: JointModel, inputs: Tensor, device: str | torch.device | None = None) -> np.ndarray:
    """Embed a batch of image inputs (features or pixels, as ``model.image_input`` says).

    Args:
        inputs: (B, R, D) / (B, D) features or (B, 3, H, W) pixels.
        device: where to run; default the model's device (the model must already be there).

    Returns:
        (B, d) float32 array of unit-norm rows.
    """
    with _inference(model):
        return _numpy(model.encode_images(inputs.to(_device(model, device))))


def encode_caption_inputs(model: JointModel, inputs: Tensor, lengths: Tensor,
                          device: str | torch.device | None = None) -> np.ndarray:
    """Embed a batch of caption inputs: (B, T) padded token ids, or (B, D) cached backbone
    features of a frozen pretrained text encoder (``aoq.backbone_cache``), with (B,) lengths.

    Returns:
        (B, d) float32 array of unit-norm rows.
    """
    with _inference(model):
        return _numpy(model.encode_texts(inputs.to(_device(model, device)), lengths))


def sentence_words(model: JointModel, vocab: Vocabulary, text: str) -> np.ndarray:
    """(L, d) float32 word states of one sentence by a cross-attention model's text encoder."""
    tokens = torch.tensor(vocab.encode(text), dtype=torch.long)
    return encode_caption_inputs(model, tokens[None], torch.tensor([len(tokens)]))[0]


def encode_texts(
    model: JointModel, vocab: Vocabulary, texts: list[str], device: str | torch.device | None = None,
    batch_size: int = 256,
) -> np.ndarray:
    """Embed raw caption strings (tokenised with ``vocab``, the model's own: for minilm the
    WordPiece tokenizer, so any word works); (len(texts), d) float32."""
    dev = _device(model, device)
    out = []
    with _inference(model):
        for start in range(0, len(texts), batch_size):
            seqs = [torch.tensor(vocab.encode(t), dtype=torch.long) for t in texts[start : start + batch_size]]
            tokens, lengths = pad_tokens(seqs)
            out.append(_numpy(model.encode_texts(tokens.to(dev), lengths)))
    if not out:
        return np.zeros((0, _embed_dim(model)), dtype=np.float32)
    return np.concatenate(out)


def encode_split(
    model: JointModel,
    vocab: Vocabulary,
    split: SplitData,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    image_size: int = 64,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Embed every image and every caption of a split.

    Frozen pretrained backbones read their cached features (``aoq.backbone_cache``; computed
    and stored on the first call for a split), so only the projection heads run.

    Args:
        image_size: side of the square images for pixel models (the training value,
            ``data.image_size``); ignored for feature models.
        progress: show tqdm bars.

    Returns:
        ``(img_emb (n_images, d), cap_emb (n_captions, d))`` float32, in the split's order.
    """
    dev = _device(model, device)
    split = with_backbone_features(model, split, vocab, progress=progress)
    image_mode, text_mode = input_modes(model)
    images = DataLoader(ImageDataset(split, image_mode, image_size), batch_size=batch_size,
                        collate_fn=collate_images)
    captions = DataLoader(CaptionDataset(split, vocab, text_mode), batch_size=batch_size,
                          collate_fn=collate_captions)
    img_out, cap_out = [], []
    with _inference(model):
        for batch in tqdm(images, desc=f"embed {split.name} images", disable=not progress, leave=False):
            img_out.append(_numpy(model.encode_images(batch["images"].to(dev))))
        for batch in tqdm(captions, desc=f"embed {split.name} captions", disable=not progress, leave=False):
            cap_out.append(_numpy(model.encode_texts(batch["tokens"].to(dev), batch["lengths"])))
    d = _embed_dim(model)
    img = np.concatenate(img_out) if img_out else np.zeros((0, d), np.float32)
    cap = np.concatenate(cap_out) if cap_out else np.zeros((0, d), np.float32)
    return img, cap


def _embed_dim(model: JointModel) -> int:
    return model.embed_dim


@dataclass(frozen=True)
class EncodedFragments:
    """A split encoded by a cross-attention model (:class:`aoq.models.cross.CrossAttentionModel`).

    Attributes:
        regions: (n_images, R, d) float32 region vectors.
        words: (total words, d) float32 word vectors, the captions' words one after another.
        offsets: (n_captions + 1,) int64: caption c's words are ``words[offsets[c]:offsets[c + 1]]``
            (held packed: padding every caption to the longest one would multiply the memory).
    """

    regions: np.ndarray
    words: np.ndarray
    offsets: np.ndarray

    @property
    def n_images(self) -> int:
        return self.regions.shape[0]

    @property
    def n_captions(self) -> int:
        return self.offsets.shape[0] - 1

    def captions(self, ids: np.ndarray | range) -> tuple[Tensor, Tensor]:
        """(C, L, d) zero-padded word vectors of captions ``ids`` (L: their longest) and (C,) lengths."""
        ids = np.asarray(ids)
        lengths = self.offsets[ids + 1] - self.offsets[ids]
        out = np.zeros((len(ids), int(lengths.max()), self.words.shape[1]), dtype=self.words.dtype)
        for row, (c, n) in enumerate(zip(ids, lengths)):
            out[row, :n] = self.words[self.offsets[c] : self.offsets[c] + n]
        return torch.from_numpy(out), torch.from_numpy(lengths)


def encode_fragments(model: JointModel, vocab: Vocabulary, split: SplitData, batch_size: int = 256,
                     device: str | torch.device | None = None, progress: bool = False) -> EncodedFragments:
    """Every image's regions and every caption's words of a split, by a cross-attention model
    (from the split's cached token states when :func:`with_backbone_features` gave it the
    model's, else from the caption strings)."""
    dev = _device(model, device)
    images = DataLoader(ImageDataset(split, "features"), batch_size=batch_size, collate_fn=collate_images)
    cached = input_modes(model)[1] == "features" and split.caption_spans is not None
    captions = DataLoader(CaptionDataset(split, vocab, "features" if cached else "tokens"), batch_size=batch_size,
                          collate_fn=collate_captions)
    regions, words, counts = [], [], []
    with _inference(model):
        for batch in tqdm(images, desc=f"encode {split.name} regions", disable=not progress, leave=False):
            regions.append(_numpy(model.encode_images(batch["images"].to(dev))))
        for batch in tqdm(captions, desc=f"encode {split.name} words", disable=not progress, leave=False):
            states = _numpy(model.encode_texts(batch["tokens"].to(dev), batch["lengths"]))
            lengths = batch["lengths"].numpy()
            words.extend(states[row, :n] for row, n in enumerate(lengths))
            counts.append(lengths)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]).astype(np.int64)
    return EncodedFragments(np.concatenate(regions), np.concatenate(words), offsets)
