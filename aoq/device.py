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


#: the CPU flags that decide which kernels run (and so the speed of every benchmark), in this order
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
               "amx_int8", "asimd", "sve")


def _cpuinfo_fields(cpuinfo: str | None) -> dict[str, str]:
    """The first CPU's ``key: value`` lines of ``/proc/cpuinfo`` (read when ``cpuinfo`` is None;
    empty where there is none, as elsewhere than Linux)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    return first


def _model_name(first: dict[str, str]) -> str:
    import platform

    return first.get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name with its family and model, ``AMD EPYC (family 26 model 2)``: the vendors'
    names alone do not tell one generation from the next. ``cpuinfo`` as in :func:`cpu_description`."""
    first = _cpuinfo_fields(cpuinfo)
    return f'{_model_name(first)} (family {first.get("cpu family", "?")} model {first.get("model", "?")})'


def cpu_description(cpuinfo: str | None = None) -> str:
    """One line naming the CPU and the flags of :data:`SPEED_FLAGS` it has, for benchmark output:
    ``cpu="<model name>" family=<f> model=<m> cores=<n> flags=<a,b,...> torch_threads=<t>``.

    ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when None; elsewhere than Linux the model
    comes from :mod:`platform` and no flags are listed)."""
    import os

    first = _cpuinfo_fields(cpuinfo)
    flags = set((first.get("flags") or first.get("Features") or "").split())
    have = ",".join(f for f in SPEED_FLAGS if f in flags) or "none"
    return (f'cpu="{_model_name(first)}" family={first.get("cpu family", "?")} model={first.get("model", "?")} '
            f"cores={os.cpu_count()} flags={have} torch_threads={torch.get_num_threads()}")
