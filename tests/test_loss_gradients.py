"""Tests of training/objectives/losses.py: gradients (Eq. 6 against autograd, gradcheck), sums not means,
clear errors on bad inputs, the dispatchers, devices."""

from __future__ import annotations


import pytest
import torch

from aoq_train.objectives import losses as L
from tests.loss_cases import S3, args3, random_case, t

G1, G2, ALPHA, BETA = 0.2, 0.0, 0.3, 1.5


# --------------------------------------------------------------------------- gradients


def kink_free_case(batch: int = 5):
    """A seeded random case whose hinges are all >= 1e-3 from 0 and whose hardest negatives are
    unique by >= 1e-3, with some hinges active, so finite differences see a smooth function."""
    for seed in range(1000):
        s, i2t_off, t2i_off, pair, tilde = random_case(batch, seed)
        pos = s.diagonal()
        i2t_on, t2i_on = L.online_hard_negatives(s)
        args = torch.cat([
            G1 - pos[:, None] + s, G1 - pos[None, :] + s,
            (G2 - pos + torch.stack([i2t_off, t2i_off, pair, tilde, i2t_on - G1 + G2, t2i_on - G1 + G2]))
        ], dim=0)
        masked = s.masked_fill(torch.eye(batch, dtype=torch.bool), -10)
        top2_rows = masked.topk(2, dim=1).values
        top2_cols = masked.topk(2, dim=0).values
        gaps = torch.cat([top2_rows[:, 0] - top2_rows[:, 1], top2_cols[0] - top2_cols[1]])
        active = (G2 - pos + torch.stack([i2t_off, t2i_off, pair, tilde]) > 0).sum()
        if args.abs().min() > 1e-3 and gaps.min() > 1e-3 and active >= 4 and (G1 - pos + i2t_on > 0).sum() >= 2:
            return s, i2t_off, t2i_off, pair, tilde
    raise AssertionError("no kink-free case found")


GRAD_CASES = {
    "triplet_sum": (lambda s, *o: L.triplet_sum(s), 1),
    "triplet_max_violation": (lambda s, *o: L.triplet_max_violation(s), 1),
    "offline_triplet": (lambda s, a, b, *o: L.offline_triplet(s, a, b), 3),
    "offline_quintuplet": (L.offline_quintuplet, 5),
    "adaptive_offline_quintuplet": (L.adaptive_offline_quintuplet, 5),
    "no_offline_adapt": (lambda *a: L.adaptive_offline_quintuplet(*a, adapt_from="positive"), 5),
    "only_offline": (L.only_offline, 5),
    "online_quin": (lambda s, a, b, *o: L.round2_loss(s, a, b, variant="online_quin"), 3),
    "smooth_ap": (lambda s, *o: L.smooth_ap(s, tau=0.05), 1),
    "infonce": (lambda s, *o: L.infonce(s), 1),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradcheck(name):
    fn, n_inputs = GRAD_CASES[name]
    inputs = tuple(x.clone().requires_grad_(True) for x in kink_free_case()[:n_inputs])
    assert fn(*inputs).item() > 0
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_eq6_gradients_match_autograd():
    """Paper Eq. 6 (image anchor) and its caption-anchor mirror, assembled into dL/dscores."""
    s, i2t_off, t2i_off, pair, tilde = (x.clone().requires_grad_(True) for x in kink_free_case(6))
    loss = L.adaptive_offline_quintuplet(s, i2t_off, t2i_off, pair, tilde, G1, G2, ALPHA, BETA)
    loss.backward()

    with torch.no_grad():
        t_on, i_on = L.online_hard_negative_indices(s)
        expected = torch.zeros_like(s)
        exp_i2t_off, exp_t2i_off = torch.zeros_like(i2t_off), torch.zeros_like(t2i_off)
        exp_pair, exp_tilde = torch.zeros_like(pair), torch.zeros_like(tilde)
        for k in range(s.shape[0]):
            p = s[k, k]
            # (anchor part, score of the online negative, offline negative, derived pair, where on sits)
            parts = [
                ("image", s[k, t_on[k]], i2t_off[k], pair[k], (k, t_on[k])),
                ("caption", s[i_on[k], k], t2i_off[k], tilde[k], (i_on[k], k)),
            ]
            for anchor, on, off, derived, on_at in parts:
                i1 = float(G1 - p + on > 0)
                i2 = float(G2 - p + off > 0)
                i3 = float(G2 - p + derived > 0)
                d_pos = ((off - on) / ALPHA - BETA) * i1 - i2 - i3
                d_off = ((p - on) / ALPHA - G1 / ALPHA) * i1 + i2
                d_on = ((2 * on - p - off) / ALPHA + BETA + G1 / ALPHA) * i1
                expected[k, k] += d_pos
                expected[on_at] += d_on
                if anchor == "image":
                    exp_i2t_off[k], exp_pair[k] = d_off, i3
                else:
                    exp_t2i_off[k], exp_tilde[k] = d_off, i3
    torch.testing.assert_close(s.grad, expected)
    torch.testing.assert_close(i2t_off.grad, exp_i2t_off)
    torch.testing.assert_close(t2i_off.grad, exp_t2i_off)
    torch.testing.assert_close(pair.grad, exp_pair)
    torch.testing.assert_close(tilde.grad, exp_tilde)
    assert (exp_i2t_off != 0).any() and (expected.diagonal() != 0).all()


def test_adaptive_weight_is_not_detached():
    # Offline hinges switched off (margin -1): the only path from S(i, t_off) to the loss is the
    # adaptive weight, whose gradient is -[g1 - S(i,t) + S(i,t_on)]+ / alpha.
    s, i2t_off, t2i_off, pair, tilde = (x.clone().requires_grad_(True) for x in args3())
    L.adaptive_offline_quintuplet(s, i2t_off, t2i_off, pair, tilde, margin_offline=-1.0).backward()
    assert i2t_off.grad.tolist() == pytest.approx([-0.1 / ALPHA, -0.3 / ALPHA, -0.05 / ALPHA])
    assert t2i_off.grad.tolist() == pytest.approx([-0.15 / ALPHA, -0.4 / ALPHA, 0.0])
    assert pair.grad.abs().sum() == 0 and tilde.grad.abs().sum() == 0


# --------------------------------------------------------------------------- reduction, validation, devices


def block_diagonal(a: torch.Tensor, b: torch.Tensor, fill: float = -10.0) -> torch.Tensor:
    n, m = a.shape[0], b.shape[0]
    out = torch.full((n + m, n + m), fill, dtype=a.dtype)
    out[:n, :n], out[n:, n:] = a, b
    return out


@pytest.mark.parametrize(
    "fn",
    [L.triplet_sum, L.triplet_max_violation, lambda s: L.smooth_ap(s, 0.05), lambda s: L.infonce(s, 0.5)],
    ids=["sum", "max_violation", "smooth_ap", "infonce"],
)
def test_losses_are_summed_not_averaged(fn):
    # Off-block negatives at -10 never contribute, so the joint batch is the sum of the two.
    a, b = random_case(4, 3)[0], random_case(3, 4)[0]
    assert fn(block_diagonal(a, b)).item() == pytest.approx(fn(a).item() + fn(b).item(), rel=1e-9)


def test_round2_losses_are_sums_of_per_pair_losses():
    s, *off = random_case(6, 5)
    full = L.adaptive_offline_quintuplet(s, *off)
    i2t_on, t2i_on = L.online_hard_negatives(s)
    per_pair = [
        L.adaptive_offline_quintuplet(
            # a 2x2 stand-in whose single negatives are pair k's hardest ones
            torch.tensor([[s[k, k], i2t_on[k]], [t2i_on[k], 5.0]], dtype=s.dtype),
            *(torch.stack([v[k], torch.tensor(-5.0, dtype=s.dtype)]) for v in off),
        )
        for k in range(6)
    ]
    assert full.item() == pytest.approx(sum(p.item() for p in per_pair), rel=1e-12)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: L.triplet_sum(torch.zeros(2, 3)), "square"),
        (lambda: L.triplet_max_violation(torch.zeros(3)), "square"),
        (lambda: L.smooth_ap(torch.zeros(1, 1)), "at least 2"),
        (lambda: L.infonce(torch.zeros(2, 2, dtype=torch.long)), "floating"),
        (lambda: L.triplet_sum([[0.0, 1.0], [1.0, 0.0]]), "torch.Tensor"),
        (lambda: L.offline_triplet(torch.zeros(3, 3), torch.zeros(2), torch.zeros(3)), r"i2t_off must have shape \(3,\)"),
        (lambda: L.offline_quintuplet(torch.zeros(3, 3), *[torch.zeros(3)] * 3, torch.zeros(3, 1)), "off_pair_tilde"),
        (lambda: L.adaptive_offline_quintuplet(torch.zeros(3, 3), *[torch.zeros(3)] * 4, alpha=0.0), "alpha"),
        (lambda: L.adaptive_offline_quintuplet(torch.zeros(3, 3), *[torch.zeros(3)] * 4, adapt_from="x"), "adapt_from"),
        (lambda: L.smooth_ap(torch.zeros(3, 3), tau=0.0), "tau"),
        (lambda: L.infonce(torch.zeros(3, 3), tau=-1.0), "tau"),
        (lambda: L.only_offline(torch.zeros(3, 3), *[torch.zeros(3)] * 3), "both"),
        (lambda: L.online_derived_pairs(torch.zeros(2, 2)), "at least 3"),
        (lambda: L.round1_loss("triplet", torch.zeros(3, 3)), "unknown round-1 loss"),
        (lambda: L.round2_loss(torch.zeros(3, 3), torch.zeros(3), torch.zeros(3), loss="x"), "unknown round-2 loss"),
        (lambda: L.round2_loss(torch.zeros(3, 3), torch.zeros(3), torch.zeros(3), variant="x"), "unknown round-2 variant"),
        (lambda: L.round2_loss(torch.zeros(3, 3), torch.zeros(3), torch.zeros(3)), "needs off_pair"),
        (
            lambda: L.round2_loss(torch.zeros(3, 3), torch.zeros(3), torch.zeros(3), loss="offline_triplet", variant="online_quin"),
            "offline_triplet has none",
        ),
        (
            lambda: L.round2_loss(torch.zeros(3, 3), *[torch.zeros(3)] * 4, loss="offline_quintuplet", variant="no_offline_adapt"),
            "only applies",
        ),
    ],
)
def test_invalid_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_round1_dispatch():
    s = t(S3)
    assert L.round1_loss("max_violation", s, margin=0.1).item() == L.triplet_max_violation(s, 0.1).item()
    assert L.round1_loss("sum", s).item() == L.triplet_sum(s).item()
    assert L.round1_loss("smooth_ap", s).item() == L.smooth_ap(s, 0.01).item()
    assert L.round1_loss("infonce", s, tau=0.2).item() == L.infonce(s, 0.2).item()


def test_round2_dispatch_matches_direct_calls():
    s, a, b, p, q = args3()
    kw = dict(margin_online=0.25, margin_offline=0.05, alpha=0.4, beta=1.2)
    direct = {
        ("offline_triplet", "none"): L.offline_triplet(s, a, b, 0.25, 0.05),
        ("offline_triplet", "only_offline"): L.only_offline(s, a, b, margin_offline=0.05),
        ("offline_quintuplet", "none"): L.offline_quintuplet(s, a, b, p, q, 0.25, 0.05),
        ("offline_quintuplet", "only_offline"): L.only_offline(s, a, b, p, q, 0.05),
        ("offline_quintuplet", "online_quin"): L.offline_quintuplet(s, a, b, *L.online_derived_pairs(s), 0.25, 0.05),
        ("adaptive_offline_quintuplet", "none"): L.adaptive_offline_quintuplet(s, a, b, p, q, 0.25, 0.05, 0.4, 1.2),
        ("adaptive_offline_quintuplet", "only_offline"): L.only_offline(s, a, b, p, q, 0.05),
        ("adaptive_offline_quintuplet", "online_quin"): L.adaptive_offline_quintuplet(
            s, a, b, *L.online_derived_pairs(s), 0.25, 0.05, 0.4, 1.2
        ),
        ("adaptive_offline_quintuplet", "no_offline_adapt"): L.adaptive_offline_quintuplet(
            s, a, b, p, q, 0.25, 0.05, 0.4, 1.2, adapt_from="positive"
        ),
    }
    for (loss, variant), value in direct.items():
        got = L.round2_loss(s, a, b, p, q, loss=loss, variant=variant, **kw)
        assert got.item() == pytest.approx(value.item()), (loss, variant)
    # online_quin ignores the derived offline pairs, so they may be left out
    assert L.round2_loss(s, a, b, variant="online_quin").item() == pytest.approx(
        L.adaptive_offline_quintuplet(s, a, b, *L.online_derived_pairs(s)).item()
    )


def test_smooth_ap_tends_to_exact_one_minus_ap():
    s = random_case(6, 7)[0]
    pos = s.diagonal()
    eye = torch.eye(6, dtype=torch.bool)
    gaps = torch.cat([(s - pos[:, None])[~eye], (s - pos[None, :])[~eye]]).abs()
    assert gaps.min() > 0.005  # no near-ties, so the sigmoid becomes a step
    # with one positive per query, AP = 1 / rank, rank = 1 + number of negatives scored above
    rank_rows = 1 + ((s > pos[:, None]) & ~eye).sum(1)
    rank_cols = 1 + ((s > pos[None, :]) & ~eye).sum(0)
    exact = (1 - 1 / rank_rows.double()).sum() + (1 - 1 / rank_cols.double()).sum()
    assert exact > 0.5
    errors = [abs(L.smooth_ap(s, tau).item() - exact.item()) for tau in (0.1, 0.01, 1e-3, 1e-5)]
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[3] < 1e-9


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_losses_on_cuda_match_cpu():
    cpu = random_case(8, 11, torch.float32)
    gpu = [x.cuda() for x in cpu]  # test-only placement; the library never calls .cuda()
    for name, (fn, n) in GRAD_CASES.items():
        got = fn(*gpu[:n])
        assert got.device.type == "cuda", name
        assert got.item() == pytest.approx(fn(*cpu[:n]).item(), rel=1e-5, abs=1e-5), name
