"""``aoq mine``: offline hard negatives of every training image and caption, from a checkpoint."""

from __future__ import annotations

import argparse
import json
import time
from typing import get_args
from pathlib import Path

from aoq_cli import add_config_flags, shortcut_overrides
from aoq.config import ExperimentConfig, MiningBackend, config_from_dict, load_config
from aoq.io import ArtefactError

SHORTCUTS = {"top_captions": "mining.top_captions", "top_images": "mining.top_images",
             "backend": "mining.backend", "device": "mining.device"}

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint that embeds the data (any model kind: a 'teacher' is fine)")
    add_config_flags(parser, required=False, example="mining.block_size=2048",
                     config_help="run config (data, mining, out_dir); default: the checkpoint's own")
    parser.add_argument("--out", help="artefact folder (default: <run dir>/mined)")
    parser.add_argument("--top-captions", type=int, help="mining.top_captions: captions kept per image")
    parser.add_argument("--top-images", type=int, help="mining.top_images: images kept per caption")
    parser.add_argument("--backend", choices=get_args(MiningBackend), help="mining.backend")
    parser.add_argument("--device", help="mining.device: auto, cpu, cuda, ...")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def resolve_config(args: argparse.Namespace) -> ExperimentConfig:
    """``--config`` (or the checkpoint's config.json), then ``--set``, then the shortcut flags."""
    overrides = shortcut_overrides(args, SHORTCUTS)
    if args.config:
        return load_config(args.config, overrides)
    path = Path(args.checkpoint) / "config.json"
    try:
        tree = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtefactError(f"{path}: cannot read the checkpoint's config ({exc}); pass --config") from None
    return config_from_dict(tree, overrides, source=str(path))


def run(args: argparse.Namespace) -> int:
    from aoq.mined import DIAGNOSTICS_FILE
    from aoq_train.mining import mine_with_checkpoint
    from aoq_train.mining.diagnostics import summary_line
    from aoq_train.mining.truth import shares_line
    from aoq_train.regimes.advice import advice_line, read_evidence

    cfg = resolve_config(args)
    out = Path(args.out) if args.out else cfg.run_dir / "mined"
    start = time.perf_counter()
    mined, skipped = mine_with_checkpoint(args.checkpoint, cfg, out, progress=not args.no_progress)
    what = "up to date" if skipped else f"mined in {time.perf_counter() - start:.1f} s"
    print(f"{out}: {what}")
    print(f"  {mined.img_top_caps.shape[0]} images x top {mined.top_captions} captions, "
          f"{mined.cap_top_imgs.shape[0]} captions x top {mined.top_images} images")
    print(f"  checkpoint {mined.manifest.get('checkpoint')} ({mined.manifest.get('teacher_model')}, "
          f"hash {str(mined.checkpoint_hash)[:12]}), backend {mined.manifest.get('backend')}")
    if mined.diagnostics is not None:
        print("  " + summary_line(mined.diagnostics))
        if "shares" in mined.diagnostics:
            print("  " + shares_line(mined.diagnostics["shares"]))
        print("  " + advice_line(mined.diagnostics, read_evidence()))
        print(f"  diagnostics: {out / DIAGNOSTICS_FILE}")
    return 0
