"""Evaluation speed: the vectorised protocol of ``aoq.metrics`` vs per-query Python loops.

Measured in one run on one random float32 score matrix (default 5,000 images x 25,000
captions, the COCO 5K size):

(a) ``aoq.metrics.evaluate_sims``: i2t and t2i ranks, recalls, medr, meanr, rsum;
(b) a per-query loop with the same tie rule (for each query, the negatives scoring above its
    best positive, plus the tied ones over the tied positives + 1: the expected rank under a random
    order of tied items); its ranks must equal (a)'s exactly;
(c) the VSE++/SCAN/VSRN evaluation loop: one ``argsort`` per query, rank = position of the
    positive. It agrees with (a) except where a score ties the positive (see the tie rule in
    ``aoq/metrics.py``); the share of equal ranks is printed.

Each timing is the best of ``--repeats`` runs for (a); the loops run once.
Last line: ``RESULT vectorised_s=<a> loop_s=<b> argsort_loop_s=<c> speedup_vs_loop=<b/a>
speedup_vs_argsort=<c/a> equal=<bool>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.device import cpu_description  # noqa: E402
from aoq.metrics import evaluate_sims, i2t_ranks, t2i_ranks  # noqa: E402


def loop_ranks(sims: np.ndarray, cpi: int) -> tuple[np.ndarray, np.ndarray]:
    """(b): one query at a time, expected ranks under a random order of tied items."""
    n_images, n_captions = sims.shape
    forward = np.empty(n_images, dtype=np.float64)
    for k in range(n_images):
        own = sims[k, cpi * k : cpi * k + cpi]
        best = own.max()
        peers = (own == best).sum()
        forward[k] = (sims[k] > best).sum() + ((sims[k] == best).sum() - peers) / (peers + 1)
    by_caption = np.ascontiguousarray(sims.T)  # a fair loop reads contiguous columns
    backward = np.array([(by_caption[c] > by_caption[c, c // cpi]).sum()
                         + ((by_caption[c] == by_caption[c, c // cpi]).sum() - 1) / 2 for c in range(n_captions)])
    return forward, backward


def argsort_loop_ranks(sims: np.ndarray, cpi: int) -> tuple[np.ndarray, np.ndarray]:
    """(c): the public VSE++ evaluation code's loops."""
    n_images, n_captions = sims.shape
    forward = np.empty(n_images, dtype=np.int64)
    for k in range(n_images):
        order = np.argsort(sims[k])[::-1]
        forward[k] = min(np.where(order == c)[0][0] for c in range(cpi * k, cpi * k + cpi))
    by_caption = np.ascontiguousarray(sims.T)
    backward = np.empty(n_captions, dtype=np.int64)
    for c in range(n_captions):
        order = np.argsort(by_caption[c])[::-1]
        backward[c] = np.where(order == c // cpi)[0][0]
    return forward, backward


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1,000 images (a few seconds)")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    n_images = 1000 if args.quick else args.images
    cpi = args.captions_per_image

    rng = np.random.default_rng(args.seed)
    sims = rng.standard_normal((n_images, n_images * cpi), dtype=np.float32)
    print(f"scores: {n_images} images x {n_images * cpi} captions, float32, seed {args.seed}")

    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = evaluate_sims(sims, cpi)
        times.append(time.perf_counter() - start)
    vectorised = min(times)
    print(f"(a) vectorised evaluate_sims: {vectorised:.3f} s (best of {args.repeats}); rsum={result['rsum']:.3f}")

    start = time.perf_counter()
    loop_forward, loop_backward = loop_ranks(sims, cpi)
    loop = time.perf_counter() - start
    forward, backward = i2t_ranks(sims, cpi), t2i_ranks(sims, cpi)
    equal = bool(np.array_equal(forward, loop_forward) and np.array_equal(backward, loop_backward))
    print(f"(b) per-query loop, same tie rule: {loop:.3f} s; ranks equal to (a): {equal}")

    start = time.perf_counter()
    arg_forward, arg_backward = argsort_loop_ranks(sims, cpi)
    argsort_loop = time.perf_counter() - start
    agree = np.concatenate([arg_forward == forward, arg_backward == backward]).mean()
    print(f"(c) per-query argsort loop (VSE++ code): {argsort_loop:.3f} s; ranks equal to (a): {100 * agree:.4f}%")

    print(
        f"RESULT vectorised_s={vectorised:.3f} loop_s={loop:.3f} argsort_loop_s={argsort_loop:.3f} "
        f"speedup_vs_loop={loop / vectorised:.1f} speedup_vs_argsort={argsort_loop / vectorised:.1f} equal={equal}"
    )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
