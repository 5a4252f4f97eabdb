"""Encoders: output shapes, unit norms, variable-length captions, model construction."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from aoq.config import ModelConfig
from aoq.models.image import (
    ConvImageEncoder,
    RegionRelationGCN,
    VSEImageEncoder,
    VSRNImageEncoder,
)
from aoq.models.joint import build_model
from aoq.models.text import TextEncoder

D, R, B, E = 24, 5, 6, 16


def _unit(x: torch.Tensor) -> None:
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(x.shape[0]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "max"])
@pytest.mark.parametrize("shape", [(B, R, D), (B, D)])
def test_vse_encoder_shapes_and_norms(pooling, shape):
    torch.manual_seed(0)
    out = VSEImageEncoder(D, E, pooling)(torch.randn(*shape))
    assert out.shape == (B, E)
    _unit(out)


def test_vse_pooling_is_over_regions():
    torch.manual_seed(0)
    enc = VSEImageEncoder(D, E, "mean")
    x = torch.randn(2, R, D)
    # Region order must not matter for a pooled encoder.
    torch.testing.assert_close(enc(x), enc(x[:, torch.randperm(R)]), atol=1e-6, rtol=0)
    # Mean pooling of an affine layer == the layer applied to the mean feature.
    torch.testing.assert_close(enc(x), enc(x.mean(dim=1)), atol=1e-6, rtol=0)


def test_vse_mean_pooling_equals_the_fc_per_region_then_the_mean():
    # the encoder takes the mean first; the values and gradients of the per-region form stay
    torch.manual_seed(0)
    enc = VSEImageEncoder(D, E, "mean").double()
    x = torch.randn(B, R, D, dtype=torch.double, requires_grad=True)
    weights = torch.randn(B, E, dtype=torch.double)
    (enc(x) * weights).sum().backward()
    fast = [t.grad.clone() for t in (x, enc.fc.weight, enc.fc.bias)]
    for t in (x, enc.fc.weight, enc.fc.bias):
        t.grad = None
    per_region = torch.nn.functional.normalize(enc.fc(x).mean(dim=1), dim=-1)
    torch.testing.assert_close(enc(x), per_region, atol=1e-12, rtol=0)
    (per_region * weights).sum().backward()
    for got, want in zip(fast, (x.grad, enc.fc.weight.grad, enc.fc.bias.grad)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_vse_rejects_bad_rank():
    with pytest.raises(ValueError, match="must be \\(B, D\\) or \\(B, R, D\\)"):
        VSEImageEncoder(D, E)(torch.randn(2, 3, 4, D))


@pytest.mark.parametrize("train", [True, False])
def test_vsrn_encoder_shapes_and_norms(train):
    torch.manual_seed(0)
    enc = VSRNImageEncoder(D, E, gcn_layers=4)
    enc.train(train)
    out = enc(torch.randn(B, R, D))
    assert out.shape == (B, E)
    _unit(out)
    assert len(enc.gcn) == 4


def test_gcn_layer_starts_as_identity_and_learns():
    torch.manual_seed(0)
    layer = RegionRelationGCN(E)
    x = torch.randn(B, R, E)
    # The zero-initialised batch-norm scale makes a fresh layer the identity (VSRN's init).
    torch.testing.assert_close(layer(x), x)
    layer(x).square().sum().backward()
    assert layer.norm.weight.grad is not None and layer.norm.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("size", [64, 96])
def test_cnn_encoder_shapes_and_norms(size):
    torch.manual_seed(0)
    out = ConvImageEncoder(E, width=4)(torch.rand(3, 3, size, size))
    assert out.shape == (3, E)
    _unit(out)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_text_encoder_shapes_norms_and_padding_invariance(bidirectional):
    torch.manual_seed(0)
    enc = TextEncoder(50, 12, E, num_layers=2, bidirectional=bidirectional).eval()
    short = torch.tensor([[1, 7, 9, 2]])
    alone = enc(short, torch.tensor([4]))
    _unit(alone)
    # The same caption padded to 9 inside a batch with a longer one (and out of length order).
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, :4] = short[0]
    batch[1] = torch.tensor([1, 5, 6, 7, 8, 9, 10, 11, 2])
    # Non-zero garbage after the end must be ignored too.
    batch[0, 4:] = 13
    both = enc(batch, torch.tensor([4, 9]))
    assert both.shape == (2, E)
    _unit(both)
    torch.testing.assert_close(both[0], alone[0], atol=1e-6, rtol=0)
    assert not torch.allclose(both[0], both[1])


def test_bidirectional_averages_both_directions():
    torch.manual_seed(0)
    enc = TextEncoder(20, 8, E, bidirectional=True).eval()
    tokens, lengths = torch.tensor([[1, 4, 5, 2]]), torch.tensor([4])
    out, _ = enc.rnn(enc.embed(tokens))
    forward_last = out[0, -1, :E]
    backward_first = out[0, 0, E:]  # the backward pass ends at the first token
    expected = torch.nn.functional.normalize((forward_last + backward_first) / 2, dim=-1)
    torch.testing.assert_close(enc(tokens, lengths)[0], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind,inp", [("vse", "features"), ("vsrn", "features"), ("cnn", "pixels")])
def test_build_model_and_gradients(kind, inp):
    torch.manual_seed(0)
    cfg = ModelConfig(image_encoder=kind, embed_dim=E, word_dim=8, cnn_width=4, gcn_layers=2)
    model = build_model(cfg, vocab_size=30, img_dim=D)
    assert model.image_input == inp
    images = torch.randn(4, R, D) if inp == "features" else torch.rand(4, 3, 32, 32)
    tokens = torch.randint(4, 30, (4, 7))
    lengths = torch.tensor([7, 3, 5, 2])
    img, cap = model(images, tokens, lengths)
    assert img.shape == cap.shape == (4, E)
    _unit(img)
    _unit(cap)
    (img @ cap.T).diagonal().sum().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None]
    # Every parameter tensor takes part in the forward pass, so backward reaches all of them.
    assert no_grad == []


def test_feature_model_needs_img_dim():
    with pytest.raises(ValueError, match="needs precomputed features"):
        build_model(ModelConfig(image_encoder="vsrn"), 10, None)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_resnet_without_torchvision_is_a_clear_error(tmp_path):
    cfg = ModelConfig(image_encoder="cnn", resnet_weights=str(tmp_path / "r18.pth"))
    with pytest.raises(ImportError, match="needs torchvision, which is not installed"):
        build_model(cfg, 10, None)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision is not installed")
def test_resnet_missing_weights_is_a_clear_error(tmp_path):
    cfg = ModelConfig(image_encoder="cnn", resnet_weights=str(tmp_path / "r18.pth"))
    with pytest.raises(FileNotFoundError, match="r18.pth: ResNet weights file not found"):
        build_model(cfg, 10, None)


@pytest.mark.parametrize(("layers", "bidirectional"), [(1, False), (1, True), (2, False), (2, True)])
@pytest.mark.parametrize("train", [True, False])
def test_text_encoder_equals_nn_gru_over_the_packed_embeddings(layers, bidirectional, train):
    """The CPU recurrence (aoq.models.packed_gru) gives nn.GRU's embeddings and parameter
    gradients (float64), with repeated tokens, lengths out of order and a one-token caption."""
    torch.manual_seed(0)
    enc = TextEncoder(30, 8, E, num_layers=layers, bidirectional=bidirectional).double().train(train)
    tokens = torch.randint(0, 30, (7, 9))
    lengths = torch.tensor([9, 3, 5, 1, 9, 4, 2])
    weights = torch.randn(7, E, dtype=torch.float64)

    def reference() -> torch.Tensor:
        packed = pack_padded_sequence(enc.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, h_n = enc.rnn(packed)
        return torch.nn.functional.normalize((h_n[-2] + h_n[-1]) / 2 if bidirectional else h_n[-1], dim=-1)

    results = []
    for encode in (reference, lambda: enc(tokens, lengths)):
        enc.zero_grad(set_to_none=True)
        out = encode()
        (out * weights).sum().backward()
        results.append((out.detach(), {n: p.grad for n, p in enc.named_parameters()}))
    (expected, expected_grads), (got, got_grads) = results
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)
