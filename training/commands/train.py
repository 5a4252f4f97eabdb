"""``aoq train``: round-1 training with an in-batch loss; resumable (re-run the same command)."""

from __future__ import annotations

import argparse

from training.commands import set_threads, shortcut_overrides
from training.config import load_config

HELP = "Round-1 training with an in-batch loss (max_violation, sum, smooth_ap, infonce) or GOAL."
LOSSES = ("max_violation", "sum", "smooth_ap", "infonce", "goal")


SHORTCUTS = {"loss": "train.loss", "epochs": "train.epochs", "seed": "train.seed", "device": "train.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. configs/synthetic.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. model.image_encoder=vsrn (repeatable)")
    parser.add_argument("--loss", choices=LOSSES,
                        help="round-1 loss (train.loss); goal: the gradient objective chosen by "
                             "--set goal.triplet=... --set goal.pair=... (docs/goal.md)")
    parser.add_argument("--out", help="run folder (out_dir); round 1 writes to OUT/round1")
    parser.add_argument("--epochs", type=int, help="train.epochs")
    parser.add_argument("--seed", type=int, help="train.seed")
    parser.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads (default: torch's choice; 1 is often faster for small "
                             "models on a busy machine, see docs/training.md)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from training.round1 import train_round1

    set_threads(args.threads)

    cfg = load_config(args.config, shortcut_overrides(args, SHORTCUTS))
    if args.out is not None:
        # Assigned, not parsed as YAML: a folder called "null" or "2024" stays a string.
        cfg.out_dir = args.out
    result = train_round1(cfg, progress_bar=not args.no_progress)
    status = "already finished" if result.already_finished else ("resumed and finished" if result.resumed else "finished")
    loss = cfg.train.loss + (f" ({cfg.goal.triplet}, {cfg.goal.pair})" if cfg.train.loss == "goal" else "")
    print(f"round 1 {status}: {result.epochs_done} epochs, loss {loss}, "
          f"best dev rsum {result.best_rsum:.2f} at epoch {result.best_epoch}")
    print(f"best checkpoint: {result.best_dir}")
    print(f"last checkpoint: {result.last_dir}")
    print(f"metrics log:     {result.run_dir / 'metrics.jsonl'}")
    return 0
