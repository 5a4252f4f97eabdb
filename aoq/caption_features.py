"""What a frozen MiniLM makes of a split's captions, computed in batches of similar lengths: the
pooled sentence vectors of the embedding models and the token states of the cross-attention
models' words (cached per split by :mod:`aoq.backbone_cache`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.data.loaders import pad_tokens
from aoq.models.pretrained import MiniLMTextEncoder, MiniLMWordEncoder, WordPieceVocab


@torch.inference_mode()
def caption_backbone_features(encoder: MiniLMTextEncoder, vocab: WordPieceVocab, captions: Sequence[str],
                              batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM vectors of captions, (len(captions), 384) float32."""
    device = next(encoder.parameters()).device
    # Each distinct caption once: real datasets repeat them (the emoji set gives both vendors'
    # pictures of an emoji the same five, halving the work).
    distinct, row_of = np.unique(np.asarray(list(captions), dtype=object), return_inverse=True)
    ids = [torch.tensor(vocab.encode(str(c)), dtype=torch.long) for c in distinct]
    # Batches of similar lengths waste little time on padding; rows go back to caption order.
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    out = np.zeros((len(ids), encoder.feature_dim), np.float32)
    for start in tqdm(range(0, len(order), batch_size), desc="MiniLM features", disable=not progress, leave=False):
        rows = order[start:start + batch_size]
        tokens, lengths = pad_tokens([ids[k] for k in rows])
        out[rows] = encoder.backbone_features(tokens.to(device), lengths).float().cpu().numpy()
    return out[row_of.reshape(-1)]


def token_spans(vocab: WordPieceVocab, captions: Sequence[str]) -> tuple[np.ndarray, list[torch.Tensor], np.ndarray]:
    """Where each caption's token states lie in the flat array :func:`caption_token_states`
    makes: (n, 2) [start, stop) rows per caption (identical captions share theirs), the distinct
    captions' token ids, and each distinct caption's first row."""
    distinct, row_of = np.unique(np.asarray(list(captions), dtype=object), return_inverse=True)
    ids = [torch.tensor(vocab.encode(str(c)), dtype=torch.long) for c in distinct]
    starts = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    row_of = row_of.reshape(-1)
    return np.stack([starts[row_of], starts[row_of + 1]], axis=1), ids, starts


@torch.inference_mode()
def caption_token_states(encoder: MiniLMWordEncoder, vocab: WordPieceVocab, captions: Sequence[str],
                         batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """The frozen MiniLM's last hidden state of every token of every distinct caption
    (``[CLS]`` and ``[SEP]`` included), (rows, 384) float32 in :func:`token_spans`' layout: the
    inputs of :class:`MiniLMWordEncoder`'s projection, computed once instead of every batch."""
    device = next(encoder.parameters()).device
    _, ids, starts = token_spans(vocab, captions)
    out = np.zeros((int(starts[-1]), encoder.feature_dim), np.float32)
    order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    for start in tqdm(range(0, len(order), batch_size), desc="MiniLM token states", disable=not progress, leave=False):
        rows = order[start:start + batch_size]
        tokens, lengths = pad_tokens([ids[k] for k in rows])
        hidden, _ = encoder.token_states(tokens.to(device), lengths)
        hidden = hidden.float().cpu().numpy()
        for j, k in enumerate(rows):
            out[starts[k]:starts[k + 1]] = hidden[j, : len(ids[k])]
    return out
