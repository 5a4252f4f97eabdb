"""``aoq pipeline``: round 1 -> mining -> round 2 -> published models -> comparison table."""

from __future__ import annotations

import argparse

from aoq_cli import add_config_flags, int_at_least, set_threads
from aoq.config import ConfigError, load_config
from aoq_train.loop.guards import TrainingCollapsed

#: printed as one line by aoq_cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aoq_train.pipeline.arms import ARM_CHOICES

    add_config_flags(parser, example="round2.epochs=5")
    parser.add_argument("--out", help="run folder (default: the config's out_dir)")
    parser.add_argument("--arms", default="aoq",
                        help=f"comma-separated arms to train beside the baseline, from: {ARM_CHOICES} "
                             "(default: %(default)s = the configured round-2 method)")
    parser.add_argument("--seed", type=int,
                        help="set train.seed and round2.seed to N and run in <run folder>/seed<N>")
    parser.add_argument("--workers", type=int_at_least(1), default=1,
                        help="processes: with N > 1 the arms train beside the main line on N - 1 other "
                             "processes as soon as what they read exists, every model on one torch "
                             "thread (docs/training.md; default: %(default)s, torch's threads)")
    parser.add_argument("--threads", type=int, help="torch CPU threads of this process (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args: argparse.Namespace) -> int:
    from aoq_train.pipeline.arms import resolve_arms
    from aoq_train.pipeline.run import (
        comparison_table,
        run_pipeline,
        seeded_config,
    )

    set_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    if args.out is not None:
        cfg.out_dir = args.out
    if args.seed is not None:
        cfg = seeded_config(cfg, args.seed)
    try:
        arms = resolve_arms([a.strip() for a in args.arms.split(",") if a.strip()])
    except ValueError as exc:
        raise ConfigError(f"--arms: {exc}") from None
    result = run_pipeline(cfg, arms, progress_bar=not args.no_progress, workers=args.workers)
    for stage, state in result.status.items():
        print(f"  {stage:<22} {state}")
    print(f"\nTest split, {cfg.data.name} ({result.run_dir}):\n")
    print(comparison_table(result.comparison))
    print("\nmodels for `aoq index --models-dir`: " + str(result.run_dir / "models"))
    return 0
