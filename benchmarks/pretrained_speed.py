"""Speed of the pretrained encoders on one CPU thread: backbone featurisation per image
(EfficientNet-Lite0, 224x224, from PNG files) and per caption (all-MiniLM-L6-v2), and one
round-1 training epoch on cached features (projection heads only).

The featurisation timings use the cache's own functions (``image_backbone_features``,
``caption_backbone_features``: file decoding, resizing and tokenising included) on ``--images``
synthetic-benchmark PNGs of 72x72 pixels and their ``5 * --images`` captions. The epoch runs the trainer's
data path and step (``PairDataset`` over cached feature arrays, ``collate_pairs``, the round-1
max_violation step, backward, clipping, Adam) over ``--epoch-images`` images x 5 captions,
batch 128, with random features of the right shapes: the heads do not care what the numbers are.
Wall time and process CPU time are both reported (the machine may be shared).

Last line: ``RESULT threads=1 effnet_ms_per_image=<t> minilm_ms_per_caption=<t>
epoch_s=<t> epoch_images=<n>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoq.device import cpu_description  # noqa: E402
from aoq.backbone_cache import caption_backbone_features, image_backbone_features  # noqa: E402
from aoq.config import config_from_dict  # noqa: E402
from aoq.data.dataset import SplitData  # noqa: E402
from aoq.data.load import load_split  # noqa: E402
from aoq.data.loaders import PairDataset, collate_pairs  # noqa: E402
from aoq.models.joint import build_model, text_vocabulary  # noqa: E402
from aoq_train.datasets.synth.scenes import SceneParams  # noqa: E402
from aoq_train.datasets.synth.writer import write_dataset  # noqa: E402
from aoq_train.loop.batches import epoch_loader  # noqa: E402
from aoq_train.loop.trainer import optimise_step  # noqa: E402
from aoq_train.round1 import round1_step  # noqa: E402


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--epoch-images", type=int, default=5000)
    args = parser.parse_args()
    print(cpu_description(), flush=True)  # the machine every figure below comes from
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "synth"
        write_dataset(root, {"train": args.images, "dev": 1, "test": 1}, params=SceneParams(image_size=72), workers=1,
                      progress=False)
        js = root / "dataset_synth.json"
        cfg = config_from_dict({"data": {"format": "karpathy", "path": str(js), "image_size": 224},
                                "model": {"image_encoder": "effnet_lite0", "text_encoder": "minilm"}})
        split = load_split(cfg.data, "train")
        vocab = text_vocabulary(cfg.model, [], 1)
        model = build_model(cfg.model, 0, None)
        _, wall_i, cpu_i = _timed(lambda: image_backbone_features(model.image_encoder, split.image_paths))
        _, wall_t, cpu_t = _timed(lambda: caption_backbone_features(model.text_encoder, vocab, split.captions))
    n_img, n_cap = split.n_images, split.n_captions
    print(f"EfficientNet-Lite0: {1000 * wall_i / n_img:.1f} ms/image wall, {1000 * cpu_i / n_img:.1f} ms CPU "
          f"({n_img} images)")
    print(f"MiniLM: {1000 * wall_t / n_cap:.2f} ms/caption wall, {1000 * cpu_t / n_cap:.2f} ms CPU ({n_cap} captions)")

    n = args.epoch_images
    rng = np.random.default_rng(0)
    cached = SplitData("train", ["x"] * (5 * n), 5, [str(i) for i in range(n)],
                       features=rng.random((n, 1280), dtype=np.float32),
                       caption_features=rng.standard_normal((5 * n, 384), dtype=np.float32))
    dataset = PairDataset(cached, vocab, image_mode="features", text_mode="features")
    step = round1_step(cfg.train)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.train.lr)
    model.train()

    def epoch():
        for batch in epoch_loader(dataset, 128, collate_pairs, torch.Generator().manual_seed(0)):
            optimise_step(step, model, batch, optimizer, params, cfg.train.grad_clip)

    _, wall_e, cpu_e = _timed(epoch)
    print(f"epoch on cached features: {wall_e:.1f} s wall, {cpu_e:.1f} s CPU ({n} images x 5 captions, batch 128)")
    print(f"RESULT threads=1 effnet_ms_per_image={1000 * wall_i / n_img:.1f} "
          f"minilm_ms_per_caption={1000 * wall_t / n_cap:.2f} epoch_s={wall_e:.1f} epoch_images={n}")


if __name__ == "__main__":
    main()
