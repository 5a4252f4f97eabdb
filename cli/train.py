"""``aoq train``: round-1 training with an in-batch loss; resumable (re-run the same command)."""

from __future__ import annotations

import argparse

from aoq_cli import add_config_flags, add_training_flags, print_training_result, train_on_this_process, training_config
from aoq.names import ROUND1_LOSSES
from aoq_train.loop.guards import TrainingCollapsed

#: printed as one line by aoq_cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)

SHORTCUTS = {"loss": "train.loss", "epochs": "train.epochs", "seed": "train.seed", "device": "train.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--loss", choices=ROUND1_LOSSES,
                        help="round-1 loss (train.loss); goal: the gradient objective chosen by "
                             "--set goal.triplet=... --set goal.pair=... (docs/goal.md)")
    parser.add_argument("--out", help="run folder (out_dir); round 1 writes to OUT/round1")
    add_training_flags(parser, "train")


def run(args: argparse.Namespace) -> int:
    from aoq_train.round1 import train_round1

    cfg = training_config(args, SHORTCUTS)
    result = train_on_this_process(cfg.train.device, lambda: train_round1(cfg, progress_bar=not args.no_progress))
    if result is None:
        return 0
    loss = cfg.train.loss + (f" ({cfg.goal.triplet}, {cfg.goal.pair})" if cfg.train.loss == "goal" else "")
    print_training_result("round 1", result, f"loss {loss}")
    return 0
