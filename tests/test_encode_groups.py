"""Stacked groups (round 2's positives, offline negatives and derived items) encoded apart where an
encoder normalises with its batch's statistics: in the model's own forward, so inside DDP too."""

from __future__ import annotations

import torch

from aoq.config import ModelConfig
from aoq.models.joint import build_model


def test_which_encoders_are_encoded_per_group() -> None:
    from torch import nn

    from aoq.models.image import ConvImageEncoder, VSEImageEncoder, VSRNImageEncoder
    from aoq.models.joint import uses_batch_statistics

    vsrn, cnn, vse = VSRNImageEncoder(12, 16, 1), ConvImageEncoder(16, 4), VSEImageEncoder(12, 16)
    assert uses_batch_statistics(vsrn.train()) and uses_batch_statistics(cnn.train())
    assert not uses_batch_statistics(vsrn.eval()) and not uses_batch_statistics(cnn.eval())
    assert not uses_batch_statistics(vse.train())
    assert uses_batch_statistics(nn.BatchNorm1d(4, track_running_stats=False).eval())


def test_forward_keeps_groups_apart_under_batch_statistics_also_inside_ddp(tmp_path) -> None:
    """The round-2 step makes one forward call (under torchrun DDP syncs gradients only through
    it): the model itself must encode each group of a BatchNorm encoder on its own."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = build_model(ModelConfig(image_encoder="vsrn", embed_dim=16, word_dim=8, gcn_layers=1), 20, 12).train()
    for module in model.modules():  # VSRN starts its residual BatchNorm at weight 0: give it a say
        if isinstance(module, torch.nn.BatchNorm1d):
            torch.nn.init.ones_(module.weight)
    images, tokens = torch.randn(9, 4, 12), torch.randint(4, 20, (9, 5))
    images[3:6] = 4 * images[3:6] + 2  # groups with other statistics, as negatives may have
    lengths = torch.full((9,), 5)
    alone = torch.cat([model.encode_images(images[g * 3:(g + 1) * 3]) for g in range(3)])
    mixed = model.encode_images(images)
    img, cap = model(images, tokens, lengths, groups=3)
    assert torch.allclose(img, alone, atol=1e-6) and not torch.allclose(img, mixed, atol=1e-3)
    assert torch.allclose(cap, model.encode_texts(tokens, lengths), atol=1e-6)  # the GRU has no batch statistics
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        wrapped, _ = DistributedDataParallel(model)(images, tokens, lengths, groups=3)
    finally:
        dist.destroy_process_group()
    assert torch.allclose(wrapped, alone, atol=1e-6)
