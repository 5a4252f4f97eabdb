"""``aoq train2``: round-2 training with offline hard negatives; resumable (re-run the same command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aoq_cli import add_config_flags, add_training_flags, print_training_result, train_on_this_process, training_config
from aoq.names import ROUND2_INITS, ROUND2_LOSSES, ROUND2_VARIANTS
from aoq_train.loop.guards import TrainingCollapsed

#: printed as one line by aoq_cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)

SHORTCUTS = {"loss": "round2.loss", "variant": "round2.variant", "init": "round2.init",
             "epochs": "round2.epochs", "seed": "round2.seed", "device": "round2.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, example="round2.h_t=200")
    parser.add_argument("--mined", help="mined-negatives folder from 'aoq mine' (default: <run dir>/mined)")
    parser.add_argument("--out", help="run folder (out_dir); round 2 writes to OUT/round2")
    parser.add_argument("--loss", choices=ROUND2_LOSSES, help="round2.loss (default adaptive_offline_quintuplet)")
    parser.add_argument("--variant", choices=ROUND2_VARIANTS, help="round2.variant: a paper ablation (default none)")
    parser.add_argument("--init", choices=ROUND2_INITS, help="round2.init (default scratch)")
    parser.add_argument("--init-from", help="round2.init_from: the checkpoint a finetune starts from")
    add_training_flags(parser, "round2")


def run(args: argparse.Namespace) -> int:
    from aoq_train.round2.train import train_round2

    cfg = training_config(args, SHORTCUTS)
    if args.init_from is not None:
        cfg.round2.init_from = args.init_from
    mined = Path(args.mined) if args.mined else cfg.run_dir / "mined"
    result = train_on_this_process(cfg.round2.device,
                                   lambda: train_round2(cfg, mined, progress_bar=not args.no_progress))
    if result is None:
        return 0
    r2 = cfg.round2
    print_training_result("round 2", result, f"loss {r2.loss}, variant {r2.variant}, init {r2.init}")
    return 0
