"""Device selection and seeding; the only place that decides where tensors live."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or None) picks CUDA when available, else the CPU; other names pass through.

    Raises:
        ValueError: a CUDA device was asked for on a machine without one.
    """
    if isinstance(name, torch.device):
        return name
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA) for a reproducible run."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The mixed-precision context of ``train.precision`` / ``round2.precision`` on ``device``.

    ``bf16``: ``torch.autocast`` with bfloat16 (CPU: AMX/AVX512-BF16 matrix units; CUDA: AMP,
    no loss scaling needed since bfloat16 has float32's exponent range). Callers wrap only the
    encoders and cast the embeddings back to float32, so scores, losses and metrics stay float32.
    ``fp32``: a no-op context.

    Raises:
        ValueError: an unknown precision name.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` cast back to float32 when autocast made it half or bfloat16; float32 and float64
    (the exactness tests) pass unchanged."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
