"""``aoq synth``: generate the synthetic benchmark (PNG + Karpathy JSON, precomp features)."""

from __future__ import annotations

import argparse
import os

from aoq_cli import int_at_least
from aoq.config import ConfigError
from aoq_train.datasets.synth.scenes import SceneParams


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SceneParams()
    parser.add_argument("--out", default="data/synth", help="output folder (default: %(default)s)")
    parser.add_argument("--train", type=int_at_least(1), default=4000, help="train images (default: %(default)s)")
    parser.add_argument("--dev", type=int_at_least(1), default=500, help="dev/val images (default: %(default)s)")
    parser.add_argument("--test", type=int_at_least(1), default=1000, help="test images (default: %(default)s)")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--workers", type=int_at_least(1), default=None, help="processes (default: all cores; same output)"
    )
    parser.add_argument(
        "--image-size",
        type=int_at_least(16),
        default=defaults.image_size,
        help="PNG side in pixels; features are always computed at 64 px (default: %(default)s)",
    )
    knobs = parser.add_argument_group("difficulty")
    knobs.add_argument(
        "--family-share", type=_float, default=defaults.family_share,
        help="expected share of images that are a family base or one-change variant (default: %(default)s)",
    )
    knobs.add_argument("--max-variants", type=int_at_least(1), default=defaults.max_variants,
                       help="variants per family, at most (default: %(default)s)")
    knobs.add_argument("--shapes", type=int_at_least(2), default=defaults.n_shapes,
                       help="number of shape kinds, 2..8 (default: %(default)s)")
    knobs.add_argument("--colours", type=int_at_least(2), default=defaults.n_colours,
                       help="number of colours, 2..9 (default: %(default)s)")
    knobs.add_argument("--noise", type=_float, default=defaults.noise,
                       help="texture / colour / size jitter scale, 0..2 (default: %(default)s)")
    knobs.add_argument("--caption-detail", type=_float, default=defaults.caption_detail,
                       help="probability of each optional extra fact in a caption, 0..1 (default: %(default)s)")
    knobs.add_argument("--contrast-captions", type=int_at_least(0), default=defaults.contrast_captions,
                       help="captions per family member (0..5) that state what tells it apart from a sibling, "
                            "checked false for that sibling (default: %(default)s)")
    knobs.add_argument("--min-objects", type=int_at_least(1), default=defaults.min_objects,
                       help="objects per scene, at least (default: %(default)s)")
    knobs.add_argument("--max-objects", type=int_at_least(1), default=defaults.max_objects,
                       help="objects per scene, at most (<= 4) (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    # Imported here so that `aoq synth --help` stays instant.
    from aoq_train.datasets.synth.writer import write_dataset

    try:
        params = SceneParams(
            image_size=args.image_size,
            family_share=args.family_share,
            n_shapes=args.shapes,
            n_colours=args.colours,
            noise=args.noise,
            min_objects=args.min_objects,
            max_objects=args.max_objects,
            max_variants=args.max_variants,
            caption_detail=args.caption_detail,
            contrast_captions=args.contrast_captions,
        )
    except ValueError as exc:
        raise ConfigError(f"aoq synth arguments: {exc}") from exc
    workers = args.workers or os.cpu_count() or 1
    manifest = write_dataset(
        args.out,
        {"train": args.train, "dev": args.dev, "test": args.test},
        seed=args.seed,
        params=params,
        workers=workers,
        progress=not args.no_progress,
    )
    total = args.train + args.dev + args.test
    print(f"wrote {total} images ({args.train}/{args.dev}/{args.test}) to {args.out} "
          f"[content {manifest['content_hash'][:12]}]")
    return 0
