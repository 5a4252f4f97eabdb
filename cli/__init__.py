"""Command modules of the `aoq` CLI (see cli/main.py), and what several of them share."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from aoq.config import ConfigError, ExperimentConfig, load_config


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


def add_config_flags(parser: argparse.ArgumentParser, *, required: bool = True, config_help: str | None = None,
                     example: str = "model.image_encoder=vsrn") -> None:
    """``--config`` (the run's YAML) and repeatable ``--set KEY=VALUE`` overrides."""
    parser.add_argument("--config", required=required,
                        help=config_help or "experiment YAML, e.g. configs/synthetic.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config value, e.g. {example} (repeatable)")


def add_training_flags(parser: argparse.ArgumentParser, section: str) -> None:
    """The run flags of ``aoq train`` / ``aoq train2``: shortcuts for ``<section>.epochs|seed|device``,
    torch threads and the progress bar."""
    parser.add_argument("--epochs", type=int, help=f"{section}.epochs")
    parser.add_argument("--seed", type=int, help=f"{section}.seed")
    parser.add_argument("--device", help=f"{section}.device: auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def training_config(args: argparse.Namespace, shortcuts: dict[str, str]) -> ExperimentConfig:
    """The run config of ``aoq train`` / ``aoq train2``: ``--threads`` applied, ``--config`` with
    its overrides and shortcut flags, ``--out`` as the run folder."""
    set_threads(args.threads)
    cfg = load_config(args.config, shortcut_overrides(args, shortcuts))
    if args.out is not None:
        # Assigned, not parsed as YAML: a folder called "null" or "2024" stays a string.
        cfg.out_dir = args.out
    return cfg


def train_on_this_process(device: str, train: Callable[[], Any]) -> Any | None:
    """``train()`` in this process's shard: under torchrun the process joins the group first (one
    process per device; docs/gpu.md) and leaves it after. The result on the main process, else None."""
    from aoq_train.loop import distributed

    shard = distributed.init_from_env(device)
    try:
        result = train()
    finally:
        distributed.shutdown()
    return result if shard.is_main else None


def print_training_result(round_name: str, result: Any, settings: str) -> None:
    """The closing lines of ``aoq train`` / ``aoq train2``: status, best epoch and where the files are.

    ``result`` is the trainer's ``TrainResult``; ``settings`` describes the loss (and variant)."""
    status = ("already finished" if result.already_finished
              else "resumed and finished" if result.resumed else "finished")
    print(f"{round_name} {status}: {result.epochs_done} epochs, {settings}, "
          f"best dev rsum {result.best_rsum:.2f} at epoch {result.best_epoch}")
    print(f"best checkpoint: {result.best_dir}")
    print(f"last checkpoint: {result.last_dir}")
    print(f"metrics log:     {result.run_dir / 'metrics.jsonl'}")


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``low``, with a one-line error otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse
