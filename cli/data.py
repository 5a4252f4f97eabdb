"""``aoq data emoji``: build a real image-caption dataset from packaged sources."""

from __future__ import annotations

import argparse
import os

from aoq_cli import int_at_least
from aoq_train.datasets.emoji.builder import SPLIT_BY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    emoji = sub.add_parser("emoji", help="Noto Color Emoji + Twemoji pictures, CLDR/Unicode captions (docs/emoji.md)")
    emoji.add_argument("--out", default="data/emoji", help="output folder (default: %(default)s)")
    emoji.add_argument("--split-by", choices=SPLIT_BY, default="base",
                       help="keep all variants of a base emoji in one split, or split picture by picture "
                            "(default: %(default)s)")
    emoji.add_argument("--limit", type=int_at_least(1), default=None,
                       help="at most this many emoji, chosen as whole base emoji (default: all)")
    emoji.add_argument("--seed", type=int_at_least(0), default=0, help="seeds the split and --limit (default: %(default)s)")
    sources = emoji.add_argument_group("sources (default: the installed packages; see scripts/data-deps.sh)")
    sources.add_argument("--noto-font", default=None, help="NotoColorEmoji.ttf (env AOQ_NOTO_FONT)")
    sources.add_argument("--cldr-dir", default=None, help="CLDR 'common' folder (env AOQ_CLDR_DIR)")
    sources.add_argument("--unicode-dir", default=None,
                         help="folder with UnicodeData.txt and emoji/emoji-test.txt (env AOQ_UNICODE_DIR)")
    sources.add_argument("--twemoji-dir", default=None,
                         help="npm prefix or folder of @twemoji/svg (env AOQ_TWEMOJI_DIR; default .cache/twemoji)")
    emoji.add_argument("--workers", type=int_at_least(1), default=os.cpu_count() or 1,
                       help="processes that render the pictures; the files are the same for any number "
                            "(default: the CPU count, %(default)s)")
    emoji.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # Imported here so that `aoq data --help` stays instant.
    from aoq_train.datasets.emoji.builder import build_emoji_dataset
    from aoq_train.datasets.emoji.sources import locate_sources

    sources = locate_sources(args.noto_font, args.cldr_dir, args.unicode_dir, args.twemoji_dir)
    manifest = build_emoji_dataset(
        args.out, split_by=args.split_by, limit=args.limit, seed=args.seed, sources=sources,
        progress=not args.no_progress, workers=args.workers,
    )
    stats = manifest["stats"]
    sizes = "/".join(str(stats["splits"][s]["images"]) for s in ("train", "dev", "test"))
    dropped = ", ".join(f"{v} {sum(r.values())}" for v, r in stats["dropped"].items())
    print(f"wrote {sum(stats['images'].values())} images of {stats['emoji']} emoji "
          f"(train/dev/test {sizes}, split by {args.split_by}; dropped: {dropped}) to {args.out} "
          f"[content {manifest['content_hash'][:12]}]")
    return 0
