"""The CUDA path: encoders, the round-1 step, training, checkpoints and embedding on a GPU.

Every test is skipped, with the reason, on a machine without CUDA (CI has none); run this file
on a GPU machine to check the device handling (no ``.cuda()`` anywhere: devices come from
``aoq.device.resolve_device``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aoq.checkpoint import load_checkpoint
from aoq.config import ModelConfig, TrainConfig, config_from_dict
from aoq.data.load import load_split
from aoq.device import resolve_device
from aoq.embed import encode_split
from aoq.models.joint import build_model
from tests.fixtures import write_precomp_fixture
from aoq_train.round1 import round1_step, train_round1
from aoq_train.loop.trainer import optimise_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")


@pytest.fixture
def cuda() -> torch.device:
    return resolve_device("cuda")


@pytest.mark.parametrize("kind", ["vse", "vsrn", "cnn"])
def test_forward_backward_on_cuda(cuda, kind):
    torch.manual_seed(0)
    model = build_model(ModelConfig(image_encoder=kind, embed_dim=32, word_dim=16, cnn_width=4), 40, 24).to(cuda)
    images = torch.randn(6, 5, 24) if kind != "cnn" else torch.rand(6, 3, 64, 64)
    batch = {"images": images, "tokens": torch.randint(4, 40, (6, 9)), "lengths": torch.tensor([9, 4, 6, 2, 7, 5])}
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    loss, stats = optimise_step(round1_step(TrainConfig()), model, batch, optimizer, params, 2.0)
    assert np.isfinite(loss) and set(stats) == {"pos", "hardest_neg"}
    assert all(p.device.type == "cuda" for p in params)
    assert all(p.grad is not None and p.grad.device.type == "cuda" for p in params)
    with torch.no_grad():
        img = model.encode_images(images.to(cuda))
        cap = model.encode_texts(batch["tokens"].to(cuda), batch["lengths"])
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(6, device=cuda), atol=1e-4, rtol=0)
    torch.testing.assert_close(cap.norm(dim=-1), torch.ones(6, device=cuda), atol=1e-4, rtol=0)


def test_train_on_cuda_then_load_and_embed_on_cpu(cuda, tmp_path):
    data = write_precomp_fixture(tmp_path / "data", {"train": 30, "dev": 8, "test": 8}, regions=3, dim=10)
    cfg = config_from_dict({
        "name": "gpu", "out_dir": str(tmp_path / "run"),
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"embed_dim": 16, "word_dim": 8},
        "train": {"epochs": 1, "batch_size": 30, "device": "cuda"},
    })
    result = train_round1(cfg, progress_bar=False)
    assert result.epochs_done == 1
    on_gpu = load_checkpoint(result.best_dir, device=cuda)
    on_cpu = load_checkpoint(result.best_dir, device="cpu")
    assert next(on_gpu.model.parameters()).device.type == "cuda"
    split = load_split(cfg.data, "test")
    gpu_img, gpu_cap = encode_split(on_gpu.model, on_gpu.vocab, split)
    cpu_img, cpu_cap = encode_split(on_cpu.model, on_cpu.vocab, split)
    np.testing.assert_allclose(gpu_img, cpu_img, atol=1e-4)
    np.testing.assert_allclose(gpu_cap, cpu_cap, atol=1e-4)


@pytest.mark.parametrize("round_", [1, 2])
def test_bf16_autocast_steps_on_cuda(cuda, round_):
    """AMP (bf16 autocast) around the encoders: the loss and the gradients come back float32."""
    from aoq.config import Round2Config
    from aoq_train.round2.train import round2_step

    torch.manual_seed(0)
    model = build_model(ModelConfig(image_encoder="vsrn", embed_dim=32, word_dim=16), 40, 24).to(cuda)
    groups = 1 if round_ == 1 else 3
    batch = {"images": torch.randn(6 * groups, 5, 24), "tokens": torch.randint(4, 40, (6 * groups, 9)),
             "lengths": torch.full((6 * groups,), 9), "caption_ids": torch.arange(6), "image_ids": torch.arange(6)}
    step = round1_step(TrainConfig(precision="bf16")) if round_ == 1 else round2_step(Round2Config(precision="bf16"))
    loss, _ = step(model, batch)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)


def test_checkpoint_saved_on_cpu_loads_on_cuda_and_back(cuda, tmp_path):
    from aoq.checkpoint import save_checkpoint
    from aoq.data.vocab import Vocabulary

    cfg = config_from_dict({"name": "x", "data": {"path": str(tmp_path)}, "model": {"embed_dim": 16, "word_dim": 8}})
    vocab = Vocabulary.build(["a b c"], threshold=1)
    torch.manual_seed(0)
    model = build_model(cfg.model, len(vocab), 10)  # the loader checks the embedding against the vocabulary
    save_checkpoint(tmp_path / "cpu", model, cfg, vocab, {"rsum": 0.0}, {})
    on_gpu = load_checkpoint(tmp_path / "cpu", device=cuda)
    save_checkpoint(tmp_path / "gpu", on_gpu.model, cfg, vocab, {"rsum": 0.0}, {})
    back = load_checkpoint(tmp_path / "gpu", device="cpu")
    for key, value in model.state_dict().items():
        torch.testing.assert_close(back.model.state_dict()[key], value)


def test_faiss_gpu_search_equals_cpu():
    faiss = pytest.importorskip("faiss")
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        pytest.skip("faiss without GPU support (pip install faiss-gpu-cu12)")
    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((5000, 64)).astype(np.float32)
    queries = rng.standard_normal((20, 64)).astype(np.float32)
    cpu = faiss.IndexFlatIP(64)
    cpu.add(gallery)
    gpu = faiss.index_cpu_to_all_gpus(cpu)
    scores_cpu, ids_cpu = cpu.search(queries, 10)
    scores_gpu, ids_gpu = gpu.search(queries, 10)
    np.testing.assert_allclose(scores_gpu, scores_cpu, atol=1e-3)
    assert (ids_gpu == ids_cpu).mean() > 0.99  # float32 near-ties may swap
