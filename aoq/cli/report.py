"""``aoq report``: run (or resume) the seeds of the synthetic experiment and write docs/results.md."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=Path("configs/synthetic.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for every seed (repeatable)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: %(default)s)")
    parser.add_argument("--runs", type=Path, default=Path("runs/report"), help="one run folder per seed")
    parser.add_argument("--data", type=Path, default=Path("data/report"), help="the report's synthetic dataset")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--test", type=int, default=5000)
    parser.add_argument("--run", action="store_true",
                        help="run or resume the pipelines first (baseline, offtri, offquin, aoq per seed)")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--figures", type=Path, default=Path("docs/figures"))


def run(args: argparse.Namespace) -> int:
    from training.report import ReportSetup, run_experiments, seed_config, write_report

    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    setup = ReportSetup(args.config, seeds, args.runs, args.data, args.train, args.dev, args.test,
                        tuple(args.overrides))
    if args.run:
        run_dirs = run_experiments(setup)
    else:
        run_dirs = [seed_config(setup, s).run_dir for s in seeds]
    write_report(setup, run_dirs, args.out, args.figures)
    print(f"wrote {args.out} and figures under {args.figures}")
    return 0
