"""Packed (score, id) keys: one int64 whose order is "higher score, then lower id" (the miner's tie
rule; the scores the lists are ranked by are canonical ones, :mod:`aoq_train.mining.canonical`)."""

from __future__ import annotations

import numpy as np

ID_MASK = 0x7FFFFFFF  # ids are stored inverted in the low 32 bits: lower id = larger key
PAD = np.iinfo(np.int64).min  # below every real key
LOWEST = float(np.finfo(np.float32).min)  # a threshold every finite score passes; -inf fails it


def encode_keys(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pack float32 scores and ids in [0, 2**31) into int64 keys ordered by the tie rule."""
    bits = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.int32)  # -0.0 -> +0.0
    ordered = bits ^ ((bits >> 31) & ID_MASK)  # order-preserving float -> int map (an involution)
    return (ordered.astype(np.int64) << 32) | (ID_MASK - np.asarray(ids, dtype=np.int64))


def decode_ids(keys: np.ndarray) -> np.ndarray:
    """The ids packed by :func:`encode_keys` (int64)."""
    return ID_MASK - (keys & 0xFFFFFFFF)


def decode_scores(keys: np.ndarray) -> np.ndarray:
    """The float32 scores packed by :func:`encode_keys`."""
    high = (keys >> 32).astype(np.int32)
    return (high ^ ((high >> 31) & ID_MASK)).view(np.float32)

