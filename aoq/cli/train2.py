"""``aoq train2``: round-2 training with offline hard negatives; resumable (re-run the same command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aoq.cli import (
    add_config_flags,
    add_training_flags,
    print_training_result,
    set_threads,
    shortcut_overrides,
)
from aoq.config import load_config
from aoq.names import ROUND2_LOSSES
from training.guards import TrainingCollapsed

#: printed as one line by aoq.cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)

VARIANTS = ("none", "only_offline", "online_quin", "no_offline_adapt")


SHORTCUTS = {"loss": "round2.loss", "variant": "round2.variant", "init": "round2.init",
             "epochs": "round2.epochs", "seed": "round2.seed", "device": "round2.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, example="round2.h_t=200")
    parser.add_argument("--mined", help="mined-negatives folder from 'aoq mine' (default: <run dir>/mined)")
    parser.add_argument("--out", help="run folder (out_dir); round 2 writes to OUT/round2")
    parser.add_argument("--loss", choices=ROUND2_LOSSES, help="round2.loss (default adaptive_offline_quintuplet)")
    parser.add_argument("--variant", choices=VARIANTS, help="round2.variant: a paper ablation (default none)")
    parser.add_argument("--init", choices=("scratch", "finetune"), help="round2.init (default scratch)")
    parser.add_argument("--init-from", help="round2.init_from: the checkpoint a finetune starts from")
    add_training_flags(parser, "round2")


def run(args: argparse.Namespace) -> int:
    from training import distributed
    from training.round2 import train_round2

    set_threads(args.threads)
    cfg = load_config(args.config, shortcut_overrides(args, SHORTCUTS))
    if args.out is not None:
        cfg.out_dir = args.out  # assigned, not parsed as YAML (a folder called "null" stays a string)
    if args.init_from is not None:
        cfg.round2.init_from = args.init_from
    mined = Path(args.mined) if args.mined else cfg.run_dir / "mined"
    # Under torchrun: join the process group (one process per device; docs/gpu.md).
    shard = distributed.init_from_env(cfg.round2.device)
    try:
        result = train_round2(cfg, mined, progress_bar=not args.no_progress)
    finally:
        distributed.shutdown()
    if not shard.is_main:
        return 0
    r2 = cfg.round2
    print_training_result("round 2", result, f"loss {r2.loss}, variant {r2.variant}, init {r2.init}")
    return 0
