"""The GPU path in one short, prepared run: tests, training speed, mining, two rounds, serving.

Run by ``scripts/gpu-check.sh`` (``make gpu-check``). Writes ``summary.json`` and ``check.log``
to ``--out`` (default ``$GPU_CHECK_OUT`` or ``artifacts/gpu-check``). Parts, in order:

1. ``tests``: the tests that skip without CUDA (tests/test_gpu.py, and the ``cuda`` tests of
   tests/test_losses.py and tests/test_mining.py): device placement, bf16 AMP, faiss-gpu,
   checkpoints saved on the GPU and loaded on the CPU and back.
2. ``training_speed``: per-batch time of round 1 (max violation) and round 2 (AdapOffQuin),
   batch 128, COCO shapes (36 regions x 2048 features), vse and vsrn, fp32 and bf16 AMP; the
   AOQ / baseline ratio beside the paper's 1.46x.
   ``cross_attention``: the same for SCAN (t2i LSE) and BFAN (equal), and their chunked score
   matrix (``aoq.pair_scores.score_matrix``) on one COCO 1K fold of random fragments, with the
   accelerator's block bounds and with the CPU's, projected to COCO 1K (5 folds) and 5K.
3. ``mining``: synthetic unit embeddings at COCO scale (113,287 images x 5 captions, d = 1024,
   top 2,000 / 400) mined on the GPU; seconds beside the paper's 3,400 s.
4. ``serving``: the flat inner-product search behind ``/search/text`` (one query, top 10) on a
   1M x d gallery, faiss-gpu against the CPU index (the index search alone, not the HTTP path),
   beside an exact product + top-k in torch on the same device (a reference, not the service).
5. ``torchrun``: ``aoq train`` on the GPU as one plain process and under torchrun (one process,
   the NCCL group and DistributedDataParallel): the two loss curves side by side.
6. ``two_rounds``: the synthetic benchmark at ``--synth-images`` training images: round 1,
   mining, round 2 (ONE seed, no paired comparison), cut by what is left of ``--total-s``.

Without CUDA every part is skipped with a line saying so, and the summary is still written.
``--tiny`` runs every part on the CPU at toy sizes instead (code-path check for ``make test``;
its figures mean nothing). Each part is isolated: an exception is recorded as that part's
``error`` and the run goes on. The summary is rewritten after every part, so a run stopped by
its time limit keeps the figures of the parts it finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aoq.device import cpu_description, seed_everything  # noqa: E402
from aoq.config import ModelConfig, Round2Config, TrainConfig  # noqa: E402
from aoq.io import atomic_write_json  # noqa: E402
import aoq.pair_scores as pair_scores  # noqa: E402
from aoq.embed import EncodedFragments  # noqa: E402
from aoq.metrics import FOLD_IMAGES  # noqa: E402
from aoq.models.bfan import bfan_scores  # noqa: E402
from aoq.models.joint import build_model  # noqa: E402
from aoq.models.scan import SCAN_PRESETS, scan_scores  # noqa: E402
from aoq.pair_scores import COCO_5K, PairScoreFn  # noqa: E402
from aoq_train.round1 import round1_step  # noqa: E402
from aoq_train.round2.train import round2_step  # noqa: E402
from aoq_train.loop.trainer import optimise_step  # noqa: E402

log = logging.getLogger("gpu_check")
PAPER_AOQ_OVER_BASELINE = 1.46  # AOQ paper: round-2 time per batch / round-1 time per batch
PAPER_MINING_S = 3400.0  # AOQ paper: offline mining of MS-COCO on one GPU
PARTS = ("tests", "training_speed", "cross_attention", "mining", "serving", "torchrun", "two_rounds")
TORCHRUN_RTOL = 1e-4  # one process under torchrun computes what a plain process computes (tests/test_distributed.py)


class Sizes:
    """Full sizes on a GPU; toy sizes with ``--tiny`` (CPU code-path check)."""

    def __init__(self, tiny: bool) -> None:
        self.batch = 8 if tiny else 128
        self.regions, self.features = (4, 32) if tiny else (36, 2048)
        self.embed, self.word, self.vocab = (32, 16, 100) if tiny else (1024, 300, 10000)
        self.steps, self.warmup = (2, 1) if tiny else (20, 3)
        self.mine_images, self.mine_dim, self.top = (400, 32, (50, 10)) if tiny else (113_287, 1024, (2000, 400))
        self.synth_images = 120 if tiny else 50_000
        # cross-attention scoring: one COCO 1K fold's images (x 5 captions); the CPU-sized blocks on fewer
        self.score_images, self.score_images_small_blocks = (12, 6) if tiny else (1000, 100)
        self.gallery, self.gallery_dim = (20_000, 32) if tiny else (1_000_000, 1024)
        # a CPU search of one query reads the whole 4 GB gallery (73 ms p50 on the H100's 16-core host): fewer
        # timed queries there
        self.queries = {"cpu": 20 if tiny else 30, "gpu": 200, "torch": 200}


def _batch(sizes: Sizes, groups: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    n = sizes.batch * groups
    lengths = torch.randint(8, 19, (n,), generator=generator)
    batch = {
        "images": torch.rand(n, sizes.regions, sizes.features, generator=generator),
        "tokens": torch.randint(4, sizes.vocab, (n, int(lengths.max())), generator=generator),
        "lengths": lengths,
    }
    if groups > 1:
        batch["caption_ids"] = torch.arange(sizes.batch)
        batch["image_ids"] = torch.arange(sizes.batch)
    return batch


def time_step(encoder: str, round_: int, precision: str, sizes: Sizes, device: torch.device) -> float:
    """Median seconds of one optimisation step (forward, loss, backward, clip, Adam)."""
    seed_everything(0)
    model = build_model(ModelConfig(image_encoder=encoder, embed_dim=sizes.embed, word_dim=sizes.word),
                        sizes.vocab, sizes.features).to(device).train()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=2e-4)
    if round_ == 1:
        step, groups = round1_step(TrainConfig(precision=precision)), 1
    else:
        step, groups = round2_step(Round2Config(precision=precision)), 3
    generator = torch.Generator().manual_seed(0)
    batches = [_batch(sizes, groups, generator) for _ in range(2)]
    times = []
    for k in range(sizes.warmup + sizes.steps):
        _sync(device)
        start = time.perf_counter()
        optimise_step(step, model, batches[k % 2], optimizer, params, 2.0)
        _sync(device)
        if k >= sizes.warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def part_tests(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    xml = out / "tests.xml"
    selection = ["tests/test_gpu.py", "tests/test_losses.py", "tests/test_mining.py", "tests/test_models.py",
                 "-k", "gpu or cuda or resnet"]  # resnet: the torchvision encoder, where torchvision is installed
    if tiny:  # the code path only: one quick file (everything in it skips without CUDA)
        selection = ["tests/test_gpu.py"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                           *selection], cwd=REPO, capture_output=True, text=True, timeout=300)
    log.info("pytest %s\n%s", " ".join(selection), done.stdout[-4000:])
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"selection": selection, "returncode": done.returncode, **counts}


def part_training_speed(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"batch": sizes.batch, "regions": sizes.regions, "features": sizes.features,
                              "embed_dim": sizes.embed, "paper_aoq_over_baseline": PAPER_AOQ_OVER_BASELINE}
    for encoder in ("vse", "vsrn"):
        for precision in ("fp32", "bf16"):
            r1 = time_step(encoder, 1, precision, sizes, device)
            r2 = time_step(encoder, 2, precision, sizes, device)
            result[f"{encoder}_{precision}"] = {"round1_ms": 1000 * r1, "round2_ms": 1000 * r2,
                                                "aoq_over_baseline": r2 / r1}
            log.info("%s %s: round 1 %.1f ms/batch, round 2 %.1f ms/batch, ratio %.2f (paper %.2f)",
                     encoder, precision, 1000 * r1, 1000 * r2, r2 / r1, PAPER_AOQ_OVER_BASELINE)
    return result


def _fragments(n_images: int, sizes: Sizes) -> EncodedFragments:
    """Random unit fragments: ``n_images`` x regions x embed, 5 captions each of 8-18 words."""
    rng = np.random.default_rng(0)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(8, 19, n_images * 5))]).astype(np.int64)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    return EncodedFragments(unit(rng.standard_normal((n_images, sizes.regions, sizes.embed))),
                            unit(rng.standard_normal((int(offsets[-1]), sizes.embed))), offsets)


def _pairs_per_second(score: PairScoreFn, n_images: int, sizes: Sizes, device: torch.device,
                      block: tuple[int, int] | None = None) -> float:
    """Pairs per second of ``score_matrix`` over ``n_images`` images' fragments (after a warm-up
    block), with the device's block bounds or ``block``."""
    frags = _fragments(n_images, sizes)
    saved = pair_scores.ACCELERATOR_BLOCK
    if block is not None:
        pair_scores.ACCELERATOR_BLOCK = block
    try:
        pair_scores.score_matrix(score, frags, device, images=range(min(2, n_images)))
        _sync(device)
        _, timing = pair_scores.score_matrix(score, frags, device)
    finally:
        pair_scores.ACCELERATOR_BLOCK = saved
    return timing.pairs / timing.seconds


def part_cross_attention(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    """SCAN (t2i LSE) and BFAN (equal): ms per training step of both rounds at COCO shapes, and
    the chunked test scoring's rate with the accelerator's block bounds and with the CPU's, each
    projected to COCO's 1K protocol (five fold blocks) and the 5K matrix."""
    result: dict[str, Any] = {"batch": sizes.batch, "regions": sizes.regions, "features": sizes.features,
                              "embed_dim": sizes.embed, "paper_aoq_over_baseline": PAPER_AOQ_OVER_BASELINE}
    coco_1k, coco_5k = 5 * FOLD_IMAGES * FOLD_IMAGES * 5, COCO_5K[0] * COCO_5K[1]
    scores = {"scan": lambda r, w, n: scan_scores(r, None, w, n, SCAN_PRESETS["t2i_lse"]),
              "bfan": lambda r, w, n: bfan_scores(r, None, w, n, "equal")}
    for kind, score in scores.items():
        row: dict[str, Any] = {}
        for precision in ("fp32", "bf16"):
            r1 = time_step(kind, 1, precision, sizes, device)
            r2 = time_step(kind, 2, precision, sizes, device)
            row[precision] = {"round1_ms": 1000 * r1, "round2_ms": 1000 * r2, "aoq_over_baseline": r2 / r1}
            log.info("%s %s: round 1 %.1f ms/batch, round 2 %.1f ms/batch, ratio %.2f (paper %.2f)",
                     kind, precision, 1000 * r1, 1000 * r2, r2 / r1, PAPER_AOQ_OVER_BASELINE)
        rate = _pairs_per_second(score, sizes.score_images, sizes, device)
        small = _pairs_per_second(score, sizes.score_images_small_blocks, sizes, device,
                                  (pair_scores.BLOCK_ELEMENTS, pair_scores.CAPTION_BLOCK))
        row["scoring"] = {"images": sizes.score_images, "pairs_per_s": rate, "cpu_blocks_pairs_per_s": small,
                          "projected_coco1k_s": coco_1k / rate, "projected_coco5k_s": coco_5k / rate}
        log.info("%s scoring on %s: %.3g pairs/s (CPU-sized blocks: %.3g); projected COCO 1K (5 folds) %.1f s, "
                 "5K %.1f s", kind, device, rate, small, coco_1k / rate, coco_5k / rate)
        result[kind] = row
    return result


def _unit(n: int, d: int, generator: torch.Generator, device: torch.device) -> np.ndarray:
    out = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 65536):
        x = torch.randn(min(65536, n - s), d, generator=generator).to(device)
        out[s : s + len(x)] = torch.nn.functional.normalize(x, dim=1).cpu().numpy()
    return out


def part_mining(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    from aoq_train.mining import mine_offline_negatives

    generator = torch.Generator().manual_seed(0)
    img = _unit(sizes.mine_images, sizes.mine_dim, generator, device)
    cap = _unit(sizes.mine_images * 5, sizes.mine_dim, generator, device)
    result: dict[str, Any] = {"images": len(img), "captions": len(cap), "dim": sizes.mine_dim,
                              "top": list(sizes.top), "paper_seconds": PAPER_MINING_S}
    # fp32 (the default, exact) and, on CUDA, fp16 products; each checked against float32 products
    # on a slice of rows (the share of identical lists and of shared ids)
    slice_rows = np.random.default_rng(0).choice(len(img), min(256, len(img)), replace=False)
    for precision in ("fp32", "fp16") if device.type == "cuda" else ("fp32",):
        _sync(device)
        start = time.perf_counter()
        caps, imgs = mine_offline_negatives(img, cap, 5, *sizes.top, device=device, precision=precision,
                                            progress=False)
        _sync(device)
        seconds = time.perf_counter() - start
        agreement = {
            "img_top_caps": _fp32_agreement(img, cap, caps, slice_rows, slice_rows[:, None] * 5 + np.arange(5),
                                            device),
            "cap_top_imgs": _fp32_agreement(cap, img, imgs, slice_rows * 5, slice_rows[:, None], device),
        }
        log.info("mining %d x %d, d=%d, H=%s on %s, %s: %.1f s (paper %.0f s); against float32 on %d rows: %s",
                 len(img), len(cap), sizes.mine_dim, sizes.top, device, precision, seconds, PAPER_MINING_S,
                 len(slice_rows), agreement)
        result[precision] = {"seconds": seconds, "shapes": [list(caps.shape), list(imgs.shape)],
                             "fp32_agreement": agreement}
    return result


def _fp32_agreement(queries: np.ndarray, gallery: np.ndarray, mined: np.ndarray, rows: np.ndarray,
                    own: np.ndarray, device: torch.device) -> dict[str, float]:
    """Mined lists of ``rows`` against float32 products (TF32 off): the share of rows whose list
    is identical, and the share of list entries both hold (order aside)."""
    k = mined.shape[1]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        scores = torch.from_numpy(queries[rows]).to(device) @ torch.from_numpy(gallery).to(device).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    scores[torch.arange(len(rows), device=device)[:, None], torch.from_numpy(own).to(device)] = float("-inf")
    exact = torch.topk(scores, k, dim=1).indices.cpu().numpy()  # random data: ties are vanishingly rare
    got = mined[rows]
    shared = np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(got, exact)])
    return {"rows_identical": float((got == exact).all(axis=1).mean()), "same_ids": float(shared)}


def _cli(args: list[str], timeout: float, launcher: list[str] | None = None) -> float:
    """Run one ``aoq`` command (through ``python -m <launcher>`` if given); its seconds. Raises
    TimeoutError past ``timeout``."""
    start = time.perf_counter()
    command = [sys.executable, "-m", *(launcher or []), "aoq_cli.main", *args]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"aoq {args[0]} cut by the time budget") from None
    log.info("aoq %s (%.1f s)\n%s", " ".join(args), time.perf_counter() - start, done.stdout[-2000:] + done.stderr[-2000:])
    if done.returncode:
        raise RuntimeError(f"aoq {args[0]} failed ({done.returncode}): {done.stderr[-500:]}")
    return time.perf_counter() - start


def part_two_rounds(sizes: Sizes, device: torch.device, out: Path, tiny: bool, budget_s: float,
                    images: int | None) -> dict[str, Any]:
    n = images or sizes.synth_images
    deadline = time.perf_counter() + budget_s
    result: dict[str, Any] = {"train_images": n, "seeds": 1, "note": "one seed, no paired comparison",
                              "budget_s": budget_s, "stages": {}}
    epochs = "1" if tiny else "3"
    common = ["--config", "configs/synthetic.yaml", "--no-progress", "--set", f"train.epochs={epochs}",
              "--set", f"round2.epochs={epochs}", "--set", "train.lr_decay_epochs=2", "--set", "round2.lr_decay_epochs=2"]
    with tempfile.TemporaryDirectory() as tmp:
        data, run = Path(tmp) / "synth", Path(tmp) / "run"
        where = ["--set", f"data.path={data}/precomp", "--out", str(run)]
        stages = [
            ("synth", ["synth", "--out", str(data), "--train", str(n), "--dev", "200" if tiny else "1000",
                       "--test", "200" if tiny else "1000", "--no-progress"]),
            ("round1", ["train", *common, *where, "--device", device.type]),
            ("mine", ["mine", "--checkpoint", str(run / "round1" / "best"), "--config", "configs/synthetic.yaml",
                      "--set", f"data.path={data}/precomp", "--out", str(run / "mined"), "--device", device.type,
                      "--no-progress"]),
            ("round2", ["train2", *common, *where, "--mined", str(run / "mined"), "--device", device.type]),
        ]
        for name, args in stages:
            try:
                result["stages"][name] = _cli(args, deadline - time.perf_counter())
            except TimeoutError as exc:
                result["cut"] = str(exc)
                break
        for round_ in ("round1", "round2"):
            metrics = run / round_ / "metrics.jsonl"
            if metrics.is_file():
                history = [json.loads(line) for line in metrics.read_text().splitlines()]
                result[f"{round_}_dev_rsum"] = [r["dev_rsum"] for r in history]
                result[f"{round_}_s_per_epoch"] = [r["train_time_s"] for r in history]
    return result


def part_serving(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    import faiss

    generator = torch.Generator().manual_seed(0)
    gallery = _unit(sizes.gallery, sizes.gallery_dim, generator, device)
    queries = _unit(200, sizes.gallery_dim, generator, device)
    cpu = faiss.IndexFlatIP(sizes.gallery_dim)
    cpu.add(gallery)
    result: dict[str, Any] = {"gallery": sizes.gallery, "dim": sizes.gallery_dim, "k": 10,
                              "what": "faiss IndexFlatIP.search of one query, the core of /search/text"}
    searches: dict[str, Callable[[np.ndarray], Any]] = {"cpu": lambda q: cpu.search(q, 10)}
    if hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
        searches["gpu"] = faiss.index_cpu_to_all_gpus(cpu).search
    else:
        result["gpu"] = "skipped: this faiss build has no GPU support (pip install faiss-gpu-cu12)"
    # The same exact search as one product and a top-k in torch, on the check's device: what a flat
    # GPU scan costs where faiss-gpu cannot be installed (not a path of the service).
    gallery_t = torch.from_numpy(gallery).to(device)
    searches["torch"] = lambda q: torch.topk(gallery_t @ torch.from_numpy(q).to(device)[0], 10).indices.cpu()
    result["torch_what"] = f"torch product + topk on {device} (reference, not a path of the service)"
    for name, search in searches.items():
        for q in queries[:5]:
            search(q[None])  # warm-up
        times = []
        for q in queries[: sizes.queries[name]]:
            start = time.perf_counter()
            search(q[None])  # the result comes back to the host in each, so no extra sync is needed
            times.append(time.perf_counter() - start)
        result[f"{name}_queries"] = len(times)
        result[f"{name}_ms_p50"] = 1000 * float(np.percentile(times, 50))
        result[f"{name}_ms_p95"] = 1000 * float(np.percentile(times, 95))
        log.info("serving %s: p50 %.2f ms, p95 %.2f ms per query on %d x %d (%d queries)", name,
                 result[f"{name}_ms_p50"], result[f"{name}_ms_p95"], sizes.gallery, sizes.gallery_dim, len(times))
    return result


def part_torchrun(sizes: Sizes, device: torch.device, out: Path, tiny: bool) -> dict[str, Any]:
    """``aoq train`` as one plain process and under torchrun with one process (the NCCL group
    and DistributedDataParallel on CUDA, gloo on the CPU): the loss curves must agree."""
    result: dict[str, Any] = {"what": "aoq train, plain vs torchrun --nproc_per_node=1, same seed"}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "synth"
        _cli(["synth", "--out", str(data), "--train", "256", "--dev", "64", "--test", "64", "--no-progress"], 120)
        curves = {}
        for name, launcher in (("plain", []), ("torchrun", ["torch.distributed.run", "--standalone", "--nnodes=1",
                                                            "--nproc_per_node=1", "-m"])):
            run = Path(tmp) / name
            _cli(["train", "--config", "configs/synthetic.yaml", "--no-progress", "--set", "train.epochs=2",
                  "--set", f"data.path={data}/precomp", "--out", str(run), "--device", device.type], 180,
                 launcher=launcher)
            history = [json.loads(line) for line in (run / "round1" / "metrics.jsonl").read_text().splitlines()]
            curves[name] = [r["train_loss"] for r in history]
            result[f"{name}_train_loss"] = curves[name]
    result["max_rel_diff"] = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(curves["plain"], curves["torchrun"]))
    result["agree"] = result["max_rel_diff"] <= TORCHRUN_RTOL
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT", "artifacts/gpu-check"))
    p.add_argument("--tiny", action="store_true", help="every part on the CPU at toy sizes (code-path check)")
    p.add_argument("--total-s", type=float, default=float(os.environ.get("GPU_CHECK_TIMEOUT_S", 450)),
                   help="the whole check's time limit: the two-round run (last) gets what is left of it, "
                        "less a margin for writing the summary")
    p.add_argument("--synth-images", type=int, default=None, help="training images of the two-round run")
    p.add_argument("--parts", default=",".join(PARTS))
    args = p.parse_args(argv)
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.FileHandler(out / "check.log", mode="w"), logging.StreamHandler()])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sizes = Sizes(args.tiny)
    summary: dict[str, Any] = {
        "cuda": cuda, "tiny": args.tiny, "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "host_cpu": cpu_description(), "torch": torch.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "parts": {},
    }
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "tests": lambda: part_tests(sizes, device, out, args.tiny),
        "training_speed": lambda: part_training_speed(sizes, device, out, args.tiny),
        "cross_attention": lambda: part_cross_attention(sizes, device, out, args.tiny),
        "mining": lambda: part_mining(sizes, device, out, args.tiny),
        "serving": lambda: part_serving(sizes, device, out, args.tiny),
        "torchrun": lambda: part_torchrun(sizes, device, out, args.tiny),
        "two_rounds": lambda: part_two_rounds(sizes, device, out, args.tiny,
                                              args.total_s - 20 - (time.perf_counter() - start), args.synth_images),
    }
    start = time.perf_counter()
    for name in args.parts.split(","):
        part_start = time.perf_counter()
        if not cuda and not args.tiny:
            log.info("SKIP %s: no CUDA device on this machine (run on a GPU, or --tiny for a CPU code-path check)", name)
            summary["parts"][name] = {"skipped": "no CUDA device"}
        else:
            try:
                summary["parts"][name] = parts[name]()
            except Exception as exc:  # one broken part must not hide the others' figures
                log.error("part %s failed: %s\n%s", name, exc, traceback.format_exc())
                summary["parts"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        summary["parts"][name]["wall_s"] = time.perf_counter() - part_start
        summary["wall_s"] = time.perf_counter() - start
        atomic_write_json(out / "summary.json", summary)  # after each part: a killed run keeps these
    log.info("summary: %s", out / "summary.json")
    failed = [n for n, r in summary["parts"].items()
              if "error" in r or r.get("failures") or r.get("errors") or r.get("agree") is False]
    print(f"RESULT gpu_check cuda={cuda} tiny={args.tiny} parts={len(summary['parts'])} failed={len(failed)} "
          f"wall_s={summary['wall_s']:.0f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
