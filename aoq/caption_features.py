"""What a frozen MiniLM makes of a split's captions, computed in batches of similar lengths: the
pooled sentence vectors of the embedding models and the token states of the cross-attention
models' words (cached per split by :mod:`aoq.backbone_cache`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.data.loaders import pad_tokens
from aoq.models.pretrained import MiniLMTextEncoder, MiniLMWordEncoder, WordPieceVocab


def _distinct_ids(vocab: WordPieceVocab, captions: Sequence[str]) -> tuple[list[torch.Tensor], np.ndarray]:
    """The token ids of each distinct caption and, per caption, its distinct caption's index. Real
    datasets repeat captions (the emoji set gives both vendors' pictures of an emoji the same five,
    halving the work)."""
    distinct, row_of = np.unique(np.asarray(list(captions), dtype=object), return_inverse=True)
    return [torch.tensor(vocab.encode(str(c)), dtype=torch.long) for c in distinct], row_of.reshape(-1)


def _length_batches(ids: list[torch.Tensor], batch_size: int, desc: str, progress: bool,
                    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Batches of similar lengths (little time spent on padding): the ids' indices, padded tokens
    and lengths."""
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        rows = order[start:start + batch_size]
        yield (rows, *pad_tokens([ids[k] for k in rows]))


@torch.inference_mode()
def caption_backbone_features(encoder: MiniLMTextEncoder, vocab: WordPieceVocab, captions: Sequence[str],
                              batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM vectors of captions, (len(captions), 384) float32."""
    device = next(encoder.parameters()).device
    ids, row_of = _distinct_ids(vocab, captions)
    out = np.zeros((len(ids), encoder.feature_dim), np.float32)
    for rows, tokens, lengths in _length_batches(ids, batch_size, "MiniLM features", progress):
        out[rows] = encoder.backbone_features(tokens.to(device), lengths).float().cpu().numpy()
    return out[row_of]


def token_spans(vocab: WordPieceVocab, captions: Sequence[str]) -> tuple[np.ndarray, list[torch.Tensor], np.ndarray]:
    """Where each caption's token states lie in the flat array :func:`caption_token_states`
    makes: (n, 2) [start, stop) rows per caption (identical captions share theirs), the distinct
    captions' token ids, and the distinct captions' row bounds (len + 1)."""
    ids, row_of = _distinct_ids(vocab, captions)
    starts = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    return np.stack([starts[row_of], starts[row_of + 1]], axis=1), ids, starts


@torch.inference_mode()
def caption_token_states(encoder: MiniLMWordEncoder, ids: list[torch.Tensor], starts: np.ndarray,
                         batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The frozen MiniLM's last hidden state of every token of the distinct captions' ``ids``
    (``[CLS]`` and ``[SEP]`` included), (rows, 384) float32 in :func:`token_spans`' layout
    (``ids`` and ``starts`` from it): the inputs of :class:`MiniLMWordEncoder`'s projection,
    computed once instead of every batch."""
    device = next(encoder.parameters()).device
    out = np.zeros((int(starts[-1]), encoder.feature_dim), np.float32)
    for rows, tokens, lengths in _length_batches(ids, batch_size, "MiniLM token states", progress):
        hidden = encoder.token_states(tokens.to(device), lengths)[0].float().cpu().numpy()
        for j, k in enumerate(rows):
            out[starts[k]:starts[k + 1]] = hidden[j, : len(ids[k])]
    return out
