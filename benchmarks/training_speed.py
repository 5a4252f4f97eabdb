"""Training speed: time per batch of round 1 (the baseline) and round 2 (AOQ), for vse and vsrn.

Each measured step is the trainer's own ``optimise_step``: forward of both encoders, the loss,
backward, gradient clipping and an Adam update, on synthetic-shaped batches (``N_REGIONS`` x
``FEATURE_DIM`` region features from ``aoq.features``, or ``--regions`` x ``--feature-dim``, e.g.
49 x 1280 for the emoji cross-attention configs' EfficientNet grid), captions of 8-18 tokens, the model sizes
of ``--config``). Round 1 runs ``train.loss`` (max_violation, the baseline) on B pairs; round 2
runs ``round2.loss`` (AdapOffQuin) on B pairs plus their offline items (3B images and 3B
captions, the layout of ``aoq_train.round2.train.collate_round2``). The two steps alternate, one of
each per iteration, so a change of load on a shared machine hits both alike. Data loading is
not included (the trainer's ``metrics.jsonl`` records the per-batch time with loading).

Timings are the median wall time over ``--steps`` steps after ``--warmup`` steps, and the mean
CPU time of the process per step (on a busy shared machine the wall time includes waiting for
a core; with one thread the CPU time is what an idle machine would take), for each torch
intra-op thread count in ``--threads``. The demo estimate is one epoch of the demo-size
synthetic train split (4,000 images x 5 captions). Round 2 encodes 3B rows per modality with
gradients where round 1 encodes B, whatever the model has learnt, so random models give the
ratio of a whole run (docs/training.md, Speed).

Last line: ``RESULT device=<d> batch=<B> <enc>_ms_per_batch=<t> <enc>_pairs_per_s=<p> ...
<enc>_round2_ms_per_batch=<t> <enc>_round2_cpu_ratio=<r> ... <enc>_threads=<n> ...
round2_loss=<loss> encoder=<enc> wall_ratio_to_baseline=<r> ratio_to_baseline=<r>``, where the
last ratio is round 2's CPU time per batch over round 1's, for the config's image encoder (or
the first one measured), at its fastest thread count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.device import cpu_description, resolve_device, seed_everything  # noqa: E402
from aoq.config import load_config  # noqa: E402
from aoq.features import FEATURE_DIM, N_REGIONS  # noqa: E402
from aoq.models.joint import build_model  # noqa: E402
from aoq.models.pretrained import MiniLMWordEncoder  # noqa: E402
from aoq_train.round1 import round1_step  # noqa: E402
from aoq_train.round2.train import round2_step, uses_derived_pairs  # noqa: E402
from aoq_train.loop.trainer import optimise_step  # noqa: E402

DEMO_PAIRS = 4000 * 5
ROUNDS = ("round1", "round2")


@dataclass
class Timing:
    """One arm's figures: median wall seconds and mean CPU seconds per step."""

    wall: float
    cpu: float


def make_batch(batch: int, vocab_size: int, generator: torch.Generator, groups: int = 1,
               shape: tuple[int, int] = (N_REGIONS, FEATURE_DIM), cached_text: int | None = None,
               ) -> dict[str, torch.Tensor]:
    """Random (regions, dim) features and random token ids of caption-like lengths, for
    ``groups`` x ``batch`` rows (the positives first), and the ids of the ``batch`` pairs. With
    ``cached_text`` (a frozen pretrained text backbone's width), what training feeds such a
    model instead of ids (aoq.backbone_cache): random token states (rows, length, width)."""
    rows = groups * batch
    lengths = torch.randint(8, 19, (rows,), generator=generator)
    width = int(lengths.max())
    tokens = (torch.randint(4, vocab_size, (rows, width), generator=generator) if cached_text is None
              else torch.randn(rows, width, cached_text, generator=generator))
    return {
        "images": torch.rand(rows, *shape, generator=generator),
        "tokens": tokens,
        "lengths": lengths,
        "caption_ids": torch.arange(batch),
        "image_ids": torch.arange(batch),
    }


def time_encoder(cfg, encoder: str, batch: int, steps: int, warmup: int, device: torch.device,
                 vocab_size: int, precision: str = "fp32", shape: tuple[int, int] = (N_REGIONS, FEATURE_DIM),
                 ) -> dict[str, Timing]:
    """Round 1 and round 2 of ``encoder``, stepped alternately: a :class:`Timing` per round
    (``precision``: train.precision / round2.precision, fp32 or bf16 autocast; ``shape``: regions
    and feature dimension of an image)."""
    model_cfg = cfg.model.model_copy(update={"image_encoder": encoder})
    groups = 3 if uses_derived_pairs(cfg.round2) else 2
    arms = {}
    train = cfg.train.model_copy(update={"precision": precision})
    round2 = cfg.round2.model_copy(update={"precision": precision})
    for name, step, optim, k in (("round1", round1_step(train), train, 1),
                                 ("round2", round2_step(round2), round2, groups)):
        seed_everything(0)
        model = build_model(model_cfg, vocab_size, shape[1]).to(device).train()
        params = list(model.parameters())
        generator = torch.Generator().manual_seed(0)
        # frozen MiniLM words train from their cached token states, as aoq train feeds them
        words = model.text_encoder
        cached = words.feature_dim if isinstance(words, MiniLMWordEncoder) and words.is_frozen else None
        arms[name] = (step, model, params, torch.optim.Adam(params, lr=optim.lr), optim.grad_clip,
                      [make_batch(batch, vocab_size, generator, k, shape, cached) for _ in range(4)])
    times = {name: [] for name in ROUNDS}
    cpu = dict.fromkeys(ROUNDS, 0.0)
    for it in range(warmup + steps):
        for name in ROUNDS:
            step, model, params, optimizer, clip, batches = arms[name]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            optimise_step(step, model, batches[it % len(batches)], optimizer, params, clip)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if it >= warmup:
                times[name].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - cpu_start
    return {name: Timing(statistics.median(times[name]), cpu[name] / steps) for name in ROUNDS}


def precision_speedup(cfg, args, device: torch.device) -> str:
    """``--bf16``: round-1 steps of each encoder in fp32 and under bf16 autocast (train.precision),
    interleaved fp32/bf16 ``--repeats`` times so a change of load hits both; median of the runs."""
    fields = [f"device={device.type}", f"batch={args.batch_size}", f"threads={torch.get_num_threads()}"]
    for encoder in args.encoders.split(","):
        runs: dict[str, list[Timing]] = {"fp32": [], "bf16": []}
        for _ in range(args.repeats):
            for precision in runs:
                runs[precision].append(time_encoder(cfg, encoder, args.batch_size, args.steps, args.warmup, device,
                                                    args.vocab_size, precision,
                                                    (args.regions, args.feature_dim))["round1"])
        wall = {p: statistics.median(t.wall for t in r) for p, r in runs.items()}
        cpu = {p: statistics.median(t.cpu for t in r) for p, r in runs.items()}
        print(f"{encoder:5s} fp32 {1000 * wall['fp32']:.1f} ms/batch (CPU {1000 * cpu['fp32']:.1f}), bf16 "
              f"{1000 * wall['bf16']:.1f} ms/batch (CPU {1000 * cpu['bf16']:.1f}): speed-up "
              f"{wall['fp32'] / wall['bf16']:.2f}x wall, {cpu['fp32'] / cpu['bf16']:.2f}x CPU")
        fields += [f"{encoder}_fp32_ms={1000 * wall['fp32']:.1f}", f"{encoder}_bf16_ms={1000 * wall['bf16']:.1f}",
                   f"{encoder}_bf16_speedup={wall['fp32'] / wall['bf16']:.2f}",
                   f"{encoder}_bf16_cpu_speedup={cpu['fp32'] / cpu['bf16']:.2f}"]
    return "RESULT " + " ".join(fields)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/synthetic.yaml", help="model sizes and losses from here")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts (CPU only)")
    parser.add_argument("--encoders", default="vse,vsrn")
    parser.add_argument("--regions", type=int, default=N_REGIONS, help="regions per image (%(default)s)")
    parser.add_argument("--feature-dim", type=int, default=FEATURE_DIM, help="dimension of a region (%(default)s)")
    parser.add_argument("--vocab-size", type=int, default=200, help="about the synthetic vocabulary's size")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true",
                        help="8 steps after 2 warm-ups (each of the 4 batches twice), one thread count")
    parser.add_argument("--bf16", action="store_true",
                        help="compare train.precision fp32 and bf16 (autocast) instead, at torch's thread count")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved fp32/bf16 runs with --bf16")
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    if args.quick:
        args.steps, args.warmup = 8, 2
        args.threads = str(torch.get_num_threads())

    cfg = load_config(args.config)
    device = resolve_device(args.device)
    if args.bf16:
        print(precision_speedup(cfg, args, device))
        return 0
    thread_counts = [int(t) for t in args.threads.split(",")] if device.type == "cpu" else [torch.get_num_threads()]
    encoders = args.encoders.split(",")
    b = args.batch_size
    print(f"device {device}; batch {b}; embed_dim {cfg.model.embed_dim}, word_dim {cfg.model.word_dim}, "
          f"gcn_layers {cfg.model.gcn_layers}; round 1 {cfg.train.loss}, round 2 {cfg.round2.loss}; "
          f"features {args.regions} x {args.feature_dim}; median of {args.steps} steps after {args.warmup}")
    best: dict[str, tuple[dict[str, Timing], int]] = {}
    original = torch.get_num_threads()
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for encoder in encoders:
                arms = time_encoder(cfg, encoder, b, args.steps, args.warmup, device, args.vocab_size,
                                    shape=(args.regions, args.feature_dim))
                for name in ROUNDS:
                    t = arms[name]
                    print(f"{encoder:5s} threads={threads} {name}: {1000 * t.wall:8.1f} ms/batch (CPU "
                          f"{1000 * t.cpu:7.1f} ms), {b / t.wall:8.0f} pairs/s, demo epoch ({DEMO_PAIRS // b} "
                          f"batches) {DEMO_PAIRS // b * t.wall:6.1f} s")
                print(f"{encoder:5s} threads={threads} round2 / round1: CPU {arms['round2'].cpu / arms['round1'].cpu:.2f}x, "
                      f"wall {arms['round2'].wall / arms['round1'].wall:.2f}x")
                if encoder not in best or arms["round1"].wall < best[encoder][0]["round1"].wall:
                    best[encoder] = (arms, threads)
    finally:
        torch.set_num_threads(original)
    fields = [f"device={device.type}", f"batch={b}", f"features={args.regions}x{args.feature_dim}"]
    for encoder, (arms, _) in best.items():
        r1, r2 = arms["round1"], arms["round2"]
        fields += [f"{encoder}_ms_per_batch={1000 * r1.wall:.1f}", f"{encoder}_pairs_per_s={b / r1.wall:.0f}",
                   f"{encoder}_round2_ms_per_batch={1000 * r2.wall:.1f}", f"{encoder}_round2_cpu_ratio={r2.cpu / r1.cpu:.2f}"]
    fields += [f"{encoder}_threads={threads}" for encoder, (_, threads) in best.items()]
    main_encoder = cfg.model.image_encoder if cfg.model.image_encoder in best else encoders[0]
    r1, r2 = best[main_encoder][0]["round1"], best[main_encoder][0]["round2"]
    fields += [f"round2_loss={cfg.round2.loss}", f"encoder={main_encoder}",
               f"wall_ratio_to_baseline={r2.wall / r1.wall:.2f}", f"ratio_to_baseline={r2.cpu / r1.cpu:.2f}"]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
