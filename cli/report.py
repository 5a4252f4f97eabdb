"""``aoq report``: run (or resume) paired seeds of the pipeline on a config's dataset (or a
generated synthetic set) and write docs/results.md from the run files."""

from __future__ import annotations

import argparse
from pathlib import Path

from aoq.config import ConfigError
from aoq_cli import int_at_least, set_threads
from aoq_train.loop.guards import TrainingCollapsed

#: printed as one line by aoq_cli.main: a collapsed run stops with what to try.
STOPS = (TrainingCollapsed,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aoq_train.pipeline.arms import ARM_CHOICES
    from aoq_train.report.runs import ARMS
    from aoq_train.report.page import DEFAULT_FIGURES, DEFAULT_OUT

    parser.add_argument("--config", type=Path, default=Path("configs/synthetic.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for every seed (repeatable)")
    parser.add_argument("--seeds", default="0-4", help="seeds, e.g. 0-4 or 0,1,2 (default: %(default)s)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"arms compared with the baseline, from: {ARM_CHOICES} "
                             "(default: %(default)s)")
    parser.add_argument("--patience", type=int, default=None,
                        help="patience in epochs for both rounds (the plateau of schedule: plateau, the early "
                             "stop of schedule: step; docs/training.md, Budgets); default: the config's")
    parser.add_argument("--runs", type=Path, default=Path("runs/report"), help="one run folder per seed")
    parser.add_argument("--synth", action="store_true",
                        help="generate a synthetic set (--data, --train/--dev/--test) and run on it")
    parser.add_argument("--data", type=Path, default=Path("data/report"), help="--synth: where the set goes")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=500)
    parser.add_argument("--test", type=int, default=5000)
    parser.add_argument("--run", action=argparse.BooleanOptionalAction, default=False,
                        help="run or resume the pipelines first (default: only read finished runs)")
    parser.add_argument("--sweep", dest="sweeps", action="append", default=[], metavar="NAME[:K=V,...][@ARM,...]",
                        help="a sweep point run on --sweep-seeds with its own baseline, e.g. "
                             "'depth30:round2.depth=absolute,round2.h_t=30,round2.h_i=6@aoq' (repeatable)")
    parser.add_argument("--sweep-seeds", default="0", help="seeds of every sweep point (default: %(default)s)")
    parser.add_argument("--sweeps-only", action="store_true",
                        help="with --run: run only the sweep points, and write nothing (to share the work "
                             "between processes; a last call without it writes the page)")
    parser.add_argument("--pairs", default="", metavar="ARM:REFERENCE,...",
                        help="also compare these methods with each other, paired by seed, e.g. "
                             "'aoq-fn-identity+semantic0.9:aoq' (each side an arm of --arms, or baseline)")
    parser.add_argument("--workers", type=int_at_least(1), default=1,
                        help="processes per seed's pipeline (aoq pipeline --workers; every model then trains on one "
                             "thread): in the teacher setting an arm trains beside round 1 (default: %(default)s)")
    parser.add_argument("--threads", type=int, help="torch CPU threads of this process (default: torch's choice)")
    parser.add_argument("--records", type=Path, default=None, metavar="DIR",
                        help="keep each finished seed as a small record in DIR (docs/training.md, Reports over "
                             "several sittings): a recorded seed needs no run folder, so a report may be finished "
                             "over several sittings")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--figures", type=Path, default=DEFAULT_FIGURES)


def run(args: argparse.Namespace) -> int:
    from aoq_train.pipeline.arms import resolve_arms
    from aoq_train.report.runs import (
        ReportSetup,
        parse_seeds,
        parse_sweep,
        run_experiments,
    )
    from aoq_train.report.page import write_report
    from aoq_train.report.records import report_seeds

    try:
        seeds, sweep_seeds = parse_seeds(args.seeds), parse_seeds(args.sweep_seeds)
        sweeps = tuple(parse_sweep(s) for s in args.sweeps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    try:
        resolve_arms(arms)
    except ValueError as exc:
        raise ConfigError(f"--arms: {exc}") from None
    for sweep in sweeps:
        try:
            resolve_arms(sweep.arms)
        except ValueError as exc:
            raise ConfigError(f"--sweep {sweep.name}: {exc}") from None
    pairs = tuple(tuple(p.split(":")) for p in args.pairs.split(",") if p.strip())
    unknown = [p for p in pairs if len(p) != 2 or not set(p) <= {"baseline", *arms}]
    if unknown:
        raise ConfigError(f"--pairs: {', '.join(':'.join(p) for p in unknown)}: each pair is ARM:REFERENCE, both "
                          "from --arms or baseline")
    setup = ReportSetup(args.config, seeds, arms, args.runs, args.synth, args.data, args.train, args.dev,
                        args.test, tuple(args.overrides), args.patience, sweeps, sweep_seeds, pairs, args.records,
                        args.workers, args.threads)
    if args.run and args.sweeps_only:
        run_experiments(setup, main=False)
        print(f"ran {len(sweeps)} sweep point(s); write the page with a call without --sweeps-only")
        return 0
    set_threads(args.threads)
    if args.run:
        run_experiments(setup)
    try:
        summaries = report_seeds(setup)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None
    write_report(setup, summaries, args.out, args.figures)
    print(f"wrote {args.out} and figures under {args.figures}")
    return 0
