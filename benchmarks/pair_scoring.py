"""Cross-attention scoring speed: ``aoq.pair_scores.score_matrix`` with its cache-sized blocks on
one-thread workers vs one large block on torch's intra-op threads (the previous schedule).

Random L2-normalised fragments (``--images`` images x 5 captions of 8-16 words each, float32),
SCAN t2i LSE and BFAN equal, at two fragment shapes (49 regions x 256-d: a 7x7 grid; 36 x 1024-d:
precomp regions with the public code's embedding size). The two schedules run alternately
``--repeats`` times in this process, on the same inputs (their matrices must agree to 1e-4); the
machine may be shared, so the ratios and the load average are printed with the rates.
Last line: ``RESULT emoji_scan_s=<s> emoji_bfan_s=<s> speedup_scan=<x> speedup_bfan=<x>``, the
projected time of the emoji test split (924 x 4,620 pairs) at the blocked schedule's median rate
for the 49 x 256 shape, and the median ratios of the rates at that shape.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aoq.pair_scores as pair_scores  # noqa: E402
from aoq.device import cpu_description  # noqa: E402
from aoq.embed import EncodedFragments  # noqa: E402
from aoq.models.bfan import bfan_scores  # noqa: E402
from aoq.models.scan import SCAN_PRESETS, scan_scores  # noqa: E402

EMOJI_TEST_PAIRS = 924 * 4620
CPU = torch.device("cpu")


def fragments(n_images: int, regions: int, dim: int) -> EncodedFragments:
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 17, n_images * 5)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    return EncodedFragments(unit(rng.standard_normal((n_images, regions, dim))),
                            unit(rng.standard_normal((offsets[-1], dim))), offsets)


@contextmanager
def _one_pool_of_one():
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


def rate(score: Callable, frags: EncodedFragments, schedule: str) -> tuple[float, np.ndarray]:
    """Pairs per second of one ``score_matrix`` under ``schedule`` (``blocks`` or ``one-block``)."""
    saved = pair_scores.BLOCK_ELEMENTS, pair_scores.CAPTION_BLOCK, pair_scores._one_thread_per_block
    if schedule == "one-block":
        pair_scores.BLOCK_ELEMENTS, pair_scores.CAPTION_BLOCK = 1 << 22, 128
        pair_scores._one_thread_per_block = lambda device: _one_pool_of_one()
    try:
        sims, timing = pair_scores.score_matrix(score, frags, CPU)
    finally:
        pair_scores.BLOCK_ELEMENTS, pair_scores.CAPTION_BLOCK, pair_scores._one_thread_per_block = saved
    return timing.pairs / timing.seconds, sims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(cpu_description())
    models = {"SCAN t2i LSE": lambda r, w, n: scan_scores(r, None, w, n, SCAN_PRESETS["t2i_lse"]),
              "BFAN equal": lambda r, w, n: bfan_scores(r, None, w, n, "equal")}
    emoji: dict[str, tuple[float, float]] = {}
    for regions, dim in ((49, 256), (36, 1024)):
        frags = fragments(args.images, regions, dim)
        for name, score in models.items():
            rates: dict[str, list[float]] = {"blocks": [], "one-block": []}
            loads = []
            for _ in range(args.repeats):
                matrices = []
                for schedule in rates:
                    loads.append(os.getloadavg()[0])
                    r, sims = rate(score, frags, schedule)
                    rates[schedule].append(r)
                    matrices.append(sims)
                if np.abs(matrices[0] - matrices[1]).max() > 1e-4:
                    raise SystemExit(f"{name}: the schedules disagree")
            ratio = float(np.median(np.array(rates["blocks"]) / np.array(rates["one-block"])))
            blocks = float(np.median(rates["blocks"]))
            print(f"{regions}x{dim} {name}: pairs/s blocks {blocks:,.0f}, one block "
                  f"{np.median(rates['one-block']):,.0f}; ratio per repeat "
                  f"{[round(a / b, 1) for a, b in zip(rates['blocks'], rates['one-block'])]}, median {ratio:.1f}x; "
                  f"emoji test projected {EMOJI_TEST_PAIRS / blocks:.0f} s; 1-min load {min(loads):.1f}-{max(loads):.1f}",
                  flush=True)
            if regions == 49:
                emoji[name.split()[0].lower()] = (EMOJI_TEST_PAIRS / blocks, ratio)
    print(f"RESULT emoji_scan_s={emoji['scan'][0]:.0f} emoji_bfan_s={emoji['bfan'][0]:.0f} "
          f"speedup_scan={emoji['scan'][1]:.2f} speedup_bfan={emoji['bfan'][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
