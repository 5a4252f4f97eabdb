"""Round-1 training speed: time per batch and throughput (pairs/s) of vse and vsrn.

Each measured step is the trainer's own ``optimise_step`` with the round-1 ``step``: forward
of both encoders, the configured loss (default max_violation), backward, gradient clipping at
2.0 and an Adam update, on synthetic-shaped batches (``N_REGIONS`` x ``FEATURE_DIM`` region
features from ``aoq.features``, captions of 8-18 tokens, the model sizes of
``--config``). Data loading is not included (the benchmark isolates the model; the trainer's
``metrics.jsonl`` records the per-batch time with loading). Timings are the median over
``--steps`` steps after ``--warmup`` steps, for each torch intra-op thread count in
``--threads``, with the CPU time of the process per step beside it (on a busy shared machine
the wall time includes waiting for a core; with one thread the CPU time is what an idle machine
would take). The demo estimate is one epoch of the demo-size synthetic train split (4,000
images x 5 captions).

Last line: ``RESULT device=<d> batch=<B> vse_ms_per_batch=<t> vse_pairs_per_s=<p>
vsrn_ms_per_batch=<t> vsrn_pairs_per_s=<p> vse_threads=<n> vsrn_threads=<n>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.config import load_config  # noqa: E402
from aoq.device import resolve_device, seed_everything  # noqa: E402
from aoq.features import FEATURE_DIM, N_REGIONS  # noqa: E402
from aoq.models.joint import build_model  # noqa: E402
from training.round1 import round1_step  # noqa: E402
from training.trainer import optimise_step  # noqa: E402

DEMO_PAIRS = 4000 * 5


def make_batch(batch: int, vocab_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random features of the synthetic shape and random token ids of caption-like lengths."""
    lengths = torch.randint(8, 19, (batch,), generator=generator)
    return {
        "images": torch.rand(batch, N_REGIONS, FEATURE_DIM, generator=generator),
        "tokens": torch.randint(4, vocab_size, (batch, int(lengths.max())), generator=generator),
        "lengths": lengths,
    }


def time_encoder(cfg, encoder: str, batch: int, steps: int, warmup: int, device: torch.device,
                 vocab_size: int, precision: str = "fp32") -> tuple[float, float]:
    """Median wall-clock seconds per optimisation step, and mean CPU seconds of this process per
    step (on a shared machine the CPU time, not the wall time, says what an idle one would do)."""
    seed_everything(0)
    model_cfg = cfg.model.model_copy(update={"image_encoder": encoder})
    model = build_model(model_cfg, vocab_size, FEATURE_DIM).to(device).train()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=cfg.train.lr)
    step = round1_step(cfg.train.model_copy(update={"precision": precision}))
    generator = torch.Generator().manual_seed(0)
    batches = [make_batch(batch, vocab_size, generator) for _ in range(4)]
    times, cpu = [], 0.0
    for k in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        optimise_step(step, model, batches[k % len(batches)], optimizer, params, cfg.train.grad_clip)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if k >= warmup:
            times.append(time.perf_counter() - start)
            cpu += time.process_time() - cpu_start
    return statistics.median(times), cpu / steps


def precision_speedup(cfg, args, device: torch.device) -> str:
    """``--bf16``: round-1 steps of each encoder in fp32 and under bf16 autocast (train.precision),
    interleaved fp32/bf16 ``--repeats`` times so a change of load hits both; median of the runs."""
    fields = [f"device={device.type}", f"batch={args.batch_size}", f"threads={torch.get_num_threads()}"]
    for encoder in args.encoders.split(","):
        runs: dict[str, list[tuple[float, float]]] = {"fp32": [], "bf16": []}
        for _ in range(args.repeats):
            for precision in runs:
                runs[precision].append(time_encoder(cfg, encoder, args.batch_size, args.steps, args.warmup, device,
                                                    args.vocab_size, precision))
        wall = {p: statistics.median(t for t, _ in r) for p, r in runs.items()}
        cpu = {p: statistics.median(c for _, c in r) for p, r in runs.items()}
        print(f"{encoder:5s} fp32 {1000 * wall['fp32']:.1f} ms/batch (CPU {1000 * cpu['fp32']:.1f}), bf16 "
              f"{1000 * wall['bf16']:.1f} ms/batch (CPU {1000 * cpu['bf16']:.1f}): speed-up "
              f"{wall['fp32'] / wall['bf16']:.2f}x wall, {cpu['fp32'] / cpu['bf16']:.2f}x CPU")
        fields += [f"{encoder}_fp32_ms={1000 * wall['fp32']:.1f}", f"{encoder}_bf16_ms={1000 * wall['bf16']:.1f}",
                   f"{encoder}_bf16_speedup={wall['fp32'] / wall['bf16']:.2f}",
                   f"{encoder}_bf16_cpu_speedup={cpu['fp32'] / cpu['bf16']:.2f}"]
    return "RESULT " + " ".join(fields)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/synthetic.yaml", help="model sizes and loss from here")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", default="1,2", help="comma-separated intra-op thread counts (CPU only)")
    parser.add_argument("--encoders", default="vse,vsrn")
    parser.add_argument("--vocab-size", type=int, default=200, help="about the synthetic vocabulary's size")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--quick", action="store_true", help="5 steps after 1 warm-up, one thread count")
    parser.add_argument("--bf16", action="store_true",
                        help="compare train.precision fp32 and bf16 (autocast) instead, at torch's thread count")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved fp32/bf16 runs with --bf16")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 5, 1
        args.threads = str(torch.get_num_threads())

    cfg = load_config(args.config)
    device = resolve_device(args.device)
    if args.bf16:
        print(precision_speedup(cfg, args, device))
        return 0
    thread_counts = [int(t) for t in args.threads.split(",")] if device.type == "cpu" else [torch.get_num_threads()]
    encoders = args.encoders.split(",")
    print(f"device {device}; batch {args.batch_size}; embed_dim {cfg.model.embed_dim}, word_dim "
          f"{cfg.model.word_dim}, gcn_layers {cfg.model.gcn_layers}; loss {cfg.train.loss}; "
          f"features {N_REGIONS} x {FEATURE_DIM}; median of {args.steps} steps after {args.warmup}")
    best: dict[str, tuple[float, int]] = {}
    original = torch.get_num_threads()
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for encoder in encoders:
                seconds, cpu = time_encoder(cfg, encoder, args.batch_size, args.steps, args.warmup, device,
                                            args.vocab_size)
                print(f"{encoder:5s} threads={threads}: {1000 * seconds:8.1f} ms/batch (CPU {1000 * cpu:7.1f} ms), "
                      f"{args.batch_size / seconds:8.0f} pairs/s, demo epoch "
                      f"({DEMO_PAIRS // args.batch_size} batches) {DEMO_PAIRS // args.batch_size * seconds:6.1f} s")
                if encoder not in best or seconds < best[encoder][0]:
                    best[encoder] = (seconds, threads)
    finally:
        torch.set_num_threads(original)
    fields = [f"device={device.type}", f"batch={args.batch_size}"]
    for encoder, (seconds, _) in best.items():
        fields += [f"{encoder}_ms_per_batch={1000 * seconds:.1f}", f"{encoder}_pairs_per_s={args.batch_size / seconds:.0f}"]
    fields += [f"{encoder}_threads={threads}" for encoder, (_, threads) in best.items()]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
