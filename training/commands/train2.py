"""``aoq train2``: round-2 training with offline hard negatives; resumable (re-run the same command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.commands import set_threads, shortcut_overrides
from training.config import load_config

HELP = "Round-2 training with offline hard negatives (OffTri, OffQuin, AdapOffQuin, ablations)."
LOSSES = ("offline_triplet", "offline_quintuplet", "adaptive_offline_quintuplet")
VARIANTS = ("none", "only_offline", "online_quin", "no_offline_adapt")


SHORTCUTS = {"loss": "round2.loss", "variant": "round2.variant", "init": "round2.init",
             "epochs": "round2.epochs", "seed": "round2.seed", "device": "round2.device"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. configs/synthetic.yaml")
    parser.add_argument("--mined", help="mined-negatives folder from 'aoq mine' (default: <run dir>/mined)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. round2.h_t=200 (repeatable)")
    parser.add_argument("--out", help="run folder (out_dir); round 2 writes to OUT/round2")
    parser.add_argument("--loss", choices=LOSSES, help="round2.loss (default adaptive_offline_quintuplet)")
    parser.add_argument("--variant", choices=VARIANTS, help="round2.variant: a paper ablation (default none)")
    parser.add_argument("--init", choices=("scratch", "finetune"), help="round2.init (default scratch)")
    parser.add_argument("--init-from", help="round2.init_from: the checkpoint a finetune starts from")
    parser.add_argument("--epochs", type=int, help="round2.epochs")
    parser.add_argument("--seed", type=int, help="round2.seed")
    parser.add_argument("--device", help="round2.device: auto, cpu, cuda, ...")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    from training.round2 import train_round2

    set_threads(args.threads)
    cfg = load_config(args.config, shortcut_overrides(args, SHORTCUTS))
    if args.out is not None:
        cfg.out_dir = args.out  # assigned, not parsed as YAML (a folder called "null" stays a string)
    if args.init_from is not None:
        cfg.round2.init_from = args.init_from
    mined = Path(args.mined) if args.mined else cfg.run_dir / "mined"
    result = train_round2(cfg, mined, progress_bar=not args.no_progress)
    r2 = cfg.round2
    status = "already finished" if result.already_finished else ("resumed and finished" if result.resumed else "finished")
    print(f"round 2 {status}: {result.epochs_done} epochs, loss {r2.loss}, variant {r2.variant}, init {r2.init}, "
          f"best dev rsum {result.best_rsum:.2f} at epoch {result.best_epoch}")
    print(f"best checkpoint: {result.best_dir}")
    print(f"last checkpoint: {result.last_dir}")
    print(f"metrics log:     {result.run_dir / 'metrics.jsonl'}")
    return 0
