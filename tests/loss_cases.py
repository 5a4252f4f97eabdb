"""Hand-made and random score cases shared by the loss tests."""

from __future__ import annotations

import torch

# 3x3: positives 0.8, 0.5, 0.9 on the diagonal.
S3 = [[0.8, 0.7, 0.65], [0.2, 0.5, 0.6], [0.75, 0.25, 0.9]]
I2T_OFF3 = [0.85, 0.4, 0.8]
T2I_OFF3 = [0.7, 0.55, 0.95]
PAIR3 = [0.9, 0.3, 0.92]
TILDE3 = [0.6, 0.52, 0.1]

# 2x2: positives 0.6, 0.4.
S2 = [[0.6, 0.5], [0.7, 0.4]]
I2T_OFF2 = [0.65, 0.3]
T2I_OFF2 = [0.5, 0.45]
PAIR2 = [0.7, 0.1]
TILDE2 = [0.2, 0.5]


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def args3(dtype=torch.float64):
    return t(S3, dtype), t(I2T_OFF3, dtype), t(T2I_OFF3, dtype), t(PAIR3, dtype), t(TILDE3, dtype)


def args2(dtype=torch.float64):
    return t(S2, dtype), t(I2T_OFF2, dtype), t(T2I_OFF2, dtype), t(PAIR2, dtype), t(TILDE2, dtype)


def random_case(batch: int, seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(batch, batch, generator=gen, dtype=torch.float64) * 0.8 - 0.2
    scores += torch.eye(batch, dtype=torch.float64) * 0.25
    near = scores.diagonal() + (torch.rand(4, batch, generator=gen, dtype=torch.float64) - 0.6) * 0.3
    return [scores.to(dtype)] + [v.to(dtype) for v in near]
