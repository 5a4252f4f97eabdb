"""The bf16 filter's guarantee (training/mining/bf16.py): the error bound holds and is tight, the
filter levels are the right bfloat16 values, and the premise check catches products that break it."""

from __future__ import annotations

import numpy as np
import torch

from aoq_train.mining import bf16
from aoq_train.mining.bf16 import error_bound, filter_levels, tile_within_bound
from aoq_train.mining.keys import LOWEST


def _errors(q: torch.Tensor, g: torch.Tensor) -> np.ndarray:
    """|bf16 product's float32 accumulator - float32 product| for every pair (float64)."""
    approx = (q.bfloat16().double() @ g.bfloat16().double().T)  # exact sums of exact bf16 x bf16 products
    return (approx - (q.double() @ g.double().T)).abs().numpy()


def test_error_bound_holds_on_random_vectors_and_is_reached_where_rounding_errors_align() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(300, 512, generator=gen), dim=1)
    g = torch.nn.functional.normalize(torch.randn(400, 512, generator=gen), dim=1)
    bound = error_bound(q, g)
    assert _errors(q, g).max() <= bound
    assert _errors(q, g).max() < bound / 2  # random rounding errors mostly cancel
    # entries +-(1 + 3 * 2**-10) / 32, which bf16 rounds to +-1/32, and g = bf16(q): e_q is
    # parallel to g, so |e_q . g| = |e_q| |g|, the bound's main term
    aligned = torch.full((1, 512), (1 + 3 * 2**-10) / 32) * torch.tensor([1.0, -1.0]).repeat(256)
    rounded = aligned.bfloat16().float()
    assert (rounded.abs() == 1 / 32).all()
    bound = error_bound(aligned, rounded)
    assert 0.97 * bound <= _errors(aligned, rounded).max() <= bound


def test_tile_within_bound_catches_products_accumulated_in_bfloat16() -> None:
    """The bound assumes float32 accumulation: a tile whose products were summed in bf16 (each
    partial sum rounded) lies outside it and is refused; the honest tile passes."""
    gen = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(64, 256, generator=gen), dim=1)
    g = torch.nn.functional.normalize(torch.randn(96, 256, generator=gen), dim=1)
    exact, margin = (q @ g.T).numpy(), error_bound(q, g)
    honest = (q.bfloat16() @ g.bfloat16().T).float().numpy()
    assert tile_within_bound(honest, exact, margin)
    products = q.bfloat16()[:, None, :].float() * g.bfloat16()[None, :, :].float()
    partial = torch.zeros(64, 96, dtype=torch.bfloat16)
    for i in range(256):
        partial = (partial.float() + products[:, :, i]).bfloat16()
    assert not tile_within_bound(partial.float().numpy(), exact, margin)


def test_bf16_pays_is_measured_once_per_process(monkeypatch) -> None:
    first = bf16.bf16_pays()
    assert isinstance(first, bool)
    monkeypatch.setattr(bf16.torch, "mm", None)  # a second measurement would fail
    assert bf16.bf16_pays() is first


def test_filter_levels_are_the_largest_bfloat16_values_at_or_below_level_minus_margin() -> None:
    """Against every finite bfloat16 value: random levels, levels on and just above bfloat16
    values, zeros, subnormals and ``LOWEST`` (floored to the most negative finite bfloat16, so
    that -inf still fails), with and without a margin."""
    rng = np.random.default_rng(12)
    everything = (np.arange(0x10000, dtype=np.uint32) << 16).view(np.float32)
    finite = np.unique(everything[np.isfinite(everything)].astype(np.float64))
    some = everything[np.isfinite(everything)][::97]
    levels = np.concatenate([rng.standard_normal(2000).astype(np.float32), some,
                             np.nextafter(some, np.float32(np.inf)),
                             np.array([LOWEST, 0.0, -0.0, 1e-40, -1e-40], np.float32)]).astype(np.float32)
    for margin in (0.0, 0.0039, 1e-30):
        got = filter_levels(levels, margin).astype(np.float64)
        below = np.searchsorted(finite, levels.astype(np.float64) - margin, side="right") - 1
        np.testing.assert_array_equal(got, finite[np.maximum(below, 0)])
