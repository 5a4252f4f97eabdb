"""Command modules of the `aoq` CLI (see training/cli.py), and what several of them share."""

from __future__ import annotations

import argparse

from training.config import ConfigError


def shortcut_overrides(args: argparse.Namespace, flags: dict[str, str]) -> list[str]:
    """``--set`` values followed by the shortcut flags (``flag -> section.key``), which therefore win."""
    out = list(args.overrides)
    for flag, key in flags.items():
        value = getattr(args, flag)
        if value is not None:
            out.append(f"{key}={value}")
    return out


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` to torch's CPU thread pool (None keeps torch's choice)."""
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)
