"""Tests of training/losses.py: hand-computed values, brute-force references, gradients (Eq. 6)."""

from __future__ import annotations

import math

import pytest
import torch

from training import losses as L

G1, G2, ALPHA, BETA = 0.2, 0.0, 0.3, 1.5

# --------------------------------------------------------------------------- hand-computed cases

# 3x3: positives 0.8, 0.5, 0.9 on the diagonal.
S3 = [[0.8, 0.7, 0.65], [0.2, 0.5, 0.6], [0.75, 0.25, 0.9]]
I2T_OFF3 = [0.85, 0.4, 0.8]
T2I_OFF3 = [0.7, 0.55, 0.95]
PAIR3 = [0.9, 0.3, 0.92]
TILDE3 = [0.6, 0.52, 0.1]

# 2x2: positives 0.6, 0.4.
S2 = [[0.6, 0.5], [0.7, 0.4]]
I2T_OFF2 = [0.65, 0.3]
T2I_OFF2 = [0.5, 0.45]
PAIR2 = [0.7, 0.1]
TILDE2 = [0.2, 0.5]


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def args3(dtype=torch.float64):
    return t(S3, dtype), t(I2T_OFF3, dtype), t(T2I_OFF3, dtype), t(PAIR3, dtype), t(TILDE3, dtype)


def args2(dtype=torch.float64):
    return t(S2, dtype), t(I2T_OFF2, dtype), t(T2I_OFF2, dtype), t(PAIR2, dtype), t(TILDE2, dtype)


def test_online_hard_negatives_by_hand():
    s = t(S3)
    t_on, i_on = L.online_hard_negative_indices(s)
    assert t_on.tolist() == [1, 2, 0]  # row maxima without the diagonal: 0.7, 0.6, 0.75
    assert i_on.tolist() == [2, 0, 0]  # column maxima without the diagonal: 0.75, 0.7, 0.65
    i2t_on, t2i_on = L.online_hard_negatives(s)
    assert i2t_on.tolist() == pytest.approx([0.7, 0.6, 0.75])
    assert t2i_on.tolist() == pytest.approx([0.75, 0.7, 0.65])


def test_triplet_sum_by_hand():
    # 3x3, image rows: [.2-.8+.7]=.1, [.2-.8+.65]=.05, row 1: .3 (0.6), row 2: .05 (0.75)
    # caption columns: col 0: .15 (0.75), col 1: .4 (0.7); everything else is <= 0.
    assert L.triplet_sum(t(S3)).item() == pytest.approx(0.1 + 0.05 + 0.3 + 0.05 + 0.15 + 0.4)
    # 2x2: rows .1 and .5, columns .3 and .3.
    assert L.triplet_sum(t(S2)).item() == pytest.approx(1.2)


def test_triplet_max_violation_by_hand():
    # Only the hardest negative counts: row 0 keeps .1 (0.7) and drops .05 (0.65); column 2 is 0.
    assert L.triplet_max_violation(t(S3)).item() == pytest.approx(0.1 + 0.3 + 0.05 + 0.15 + 0.4)
    assert L.triplet_max_violation(t(S2)).item() == pytest.approx(1.2)
    # margin 0: rows [.7-.8]<0, [.6-.5]=.1, [.75-.9]<0; columns [.75-.8]<0, [.7-.5]=.2, [.65-.9]<0
    assert L.triplet_max_violation(t(S3), margin=0.0).item() == pytest.approx(0.3)


def test_offline_triplet_by_hand():
    s, i2t_off, t2i_off, _, _ = args3()
    # offline terms with g2 = 0: [.85-.8]=.05, [.55-.5]=.05, [.95-.9]=.05
    assert L.offline_triplet(s, i2t_off, t2i_off).item() == pytest.approx(1.0 + 0.15)
    s, i2t_off, t2i_off, _, _ = args2()
    assert L.offline_triplet(s, i2t_off, t2i_off).item() == pytest.approx(1.2 + 0.05 + 0.05)


def test_offline_quintuplet_by_hand():
    # derived pairs: [.9-.8]=.1, [.92-.9]=.02, tilde [.52-.5]=.02
    assert L.offline_quintuplet(*args3()).item() == pytest.approx(1.15 + 0.1 + 0.02 + 0.02)
    assert L.offline_quintuplet(*args2()).item() == pytest.approx(1.3 + 0.1 + 0.1)


def test_adaptive_offline_quintuplet_by_hand():
    # image anchor weights 1.5 - (off - on)/.3:  1.0, 2.1667, 1.3333 times hinges .1, .3, .05
    # caption anchor weights: 1.6667, 2.0, (0.5) times hinges .15, .4, 0
    online = 1.0 * 0.1 + (1.5 + 0.2 / 0.3) * 0.3 + (1.5 - 0.05 / 0.3) * 0.05
    online += (1.5 + 0.05 / 0.3) * 0.15 + 2.0 * 0.4
    assert online == pytest.approx(112 / 60)
    assert L.adaptive_offline_quintuplet(*args3()).item() == pytest.approx(112 / 60 + 0.29)
    # 2x2: weights 1.0, 2.8333 (rows) and 2.1667, 1.6667 (columns); hinges .1, .5, .3, .3.
    expected2 = 0.1 + (1.5 + 0.4 / 0.3) * 0.5 + (1.5 + 0.2 / 0.3) * 0.3 + (1.5 + 0.05 / 0.3) * 0.3 + 0.1 + 0.2
    assert L.adaptive_offline_quintuplet(*args2()).item() == pytest.approx(expected2)
    assert expected2 == pytest.approx(2.9666666666)


def test_no_offline_adapt_by_hand():
    # weights 1.5 - (S(i,t) - on)/.3: rows 1.1667, 1.8333, 1.0; columns 1.3333, 2.1667, (1.0)
    online = (1.5 - 0.1 / 0.3) * 0.1 + (1.5 + 0.1 / 0.3) * 0.3 + 1.0 * 0.05
    online += (1.5 - 0.05 / 0.3) * 0.15 + (1.5 + 0.2 / 0.3) * 0.4
    got = L.adaptive_offline_quintuplet(*args3(), adapt_from="positive")
    assert got.item() == pytest.approx(online + 0.29)
    assert got.item() == pytest.approx(2.0733333333)


def test_only_offline_by_hand():
    s, i2t_off, t2i_off, pair, tilde = args3()
    assert L.only_offline(s, i2t_off, t2i_off, pair, tilde).item() == pytest.approx(0.29)
    assert L.only_offline(s, i2t_off, t2i_off).item() == pytest.approx(0.15)


def test_online_derived_pairs_by_hand():
    # t_on = [1, 2, 0], i_on = [2, 0, 0]. Pair 2 has i_on == t_on == 0, so its caption is
    # replaced by the hardest one other than 2 and 0, caption 1.
    on_pair, on_tilde = L.online_derived_pairs(t(S3))
    assert on_pair.tolist() == pytest.approx([S3[2][1], S3[0][2], S3[0][1]])
    assert on_tilde.tolist() == pytest.approx([S3[1][2], S3[2][0], S3[1][0]])


def test_smooth_ap_by_hand():
    def sig(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    # 2x2, tau = .1: one negative per query, 1 - AP = g / (1 + g) with g = sigmoid((neg - pos)/tau)
    gs = [sig((0.5 - 0.6) / 0.1), sig((0.7 - 0.4) / 0.1), sig((0.7 - 0.6) / 0.1), sig((0.5 - 0.4) / 0.1)]
    expected = sum(g / (1 + g) for g in gs)
    assert expected == pytest.approx(1.5444347, abs=1e-7)
    assert L.smooth_ap(t(S2), tau=0.1).item() == pytest.approx(expected)
    # 3x3, tau = .05: row 0 has negatives .7 and .65 against .8, etc.
    tau = 0.05
    queries = [
        (0.8, [0.7, 0.65]), (0.5, [0.2, 0.6]), (0.9, [0.75, 0.25]),  # image rows
        (0.8, [0.2, 0.75]), (0.5, [0.7, 0.25]), (0.9, [0.65, 0.6]),  # caption columns
    ]
    expected = sum(1 - 1 / (1 + sum(sig((n - p) / tau) for n in negs)) for p, negs in queries)
    assert L.smooth_ap(t(S3), tau=tau).item() == pytest.approx(expected)


def test_infonce_by_hand():
    # 2x2, tau = .1: logits [[6, 5], [7, 4]]; CE(row 0) = log(1 + e^-1), row 1 = log(1 + e^3),
    # column 0 = log(1 + e^1), column 1 = log(1 + e^1).
    expected = math.log1p(math.exp(-1)) + math.log1p(math.exp(3)) + 2 * math.log1p(math.exp(1))
    assert expected == pytest.approx(5.988373, abs=1e-6)
    assert L.infonce(t(S2), tau=0.1).item() == pytest.approx(expected)


def test_infonce_default_tau_is_005():
    s = t(S3)
    assert L.infonce(s).item() == pytest.approx(L.infonce(s, tau=0.05).item())
    assert L.DEFAULT_TAU == {"smooth_ap": 0.01, "infonce": 0.05}


# --------------------------------------------------------------------------- brute-force references


def _hinge(x: float) -> float:
    return max(x, 0.0)


def brute_sum(s, m):
    b = len(s)
    total = 0.0
    for k in range(b):
        for j in range(b):
            if j != k:
                total += _hinge(m - s[k][k] + s[k][j])  # (i_k, t_k, t_j)
                total += _hinge(m - s[k][k] + s[j][k])  # (t_k, i_k, i_j)
    return total


def brute_hardest(s, k):
    b = len(s)
    row = max((s[k][j], j) for j in range(b) if j != k)[0]
    col = max((s[j][k], j) for j in range(b) if j != k)[0]
    return row, col


def brute_max(s, m):
    total = 0.0
    for k in range(len(s)):
        row, col = brute_hardest(s, k)
        total += _hinge(m - s[k][k] + row) + _hinge(m - s[k][k] + col)
    return total


def brute_aoq(s, i2t_off, t2i_off, pair, tilde, g1, g2, alpha, beta, adaptive, quin, online=True):
    total = 0.0
    for k in range(len(s)):
        p = s[k][k]
        row, col = brute_hardest(s, k)
        w_i = beta - (i2t_off[k] - row) / alpha if adaptive else 1.0
        w_t = beta - (t2i_off[k] - col) / alpha if adaptive else 1.0
        if online:
            total += w_i * _hinge(g1 - p + row) + w_t * _hinge(g1 - p + col)
        total += _hinge(g2 - p + i2t_off[k]) + _hinge(g2 - p + t2i_off[k])
        if quin:
            total += _hinge(g2 - p + pair[k]) + _hinge(g2 - p + tilde[k])
    return total


def brute_smooth_ap(s, tau):
    b = len(s)
    total = 0.0
    for k in range(b):
        for negs in ([s[k][j] for j in range(b) if j != k], [s[j][k] for j in range(b) if j != k]):
            rank = 1.0 + sum(1.0 / (1.0 + math.exp(-(n - s[k][k]) / tau)) for n in negs)
            total += 1.0 - 1.0 / rank
    return total


def brute_infonce(s, tau):
    b = len(s)
    total = 0.0
    for k in range(b):
        for logits in ([s[k][j] / tau for j in range(b)], [s[j][k] / tau for j in range(b)]):
            top = max(logits)
            total += -(logits[k] - top - math.log(sum(math.exp(x - top) for x in logits)))
    return total


def random_case(batch: int, seed: int, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(batch, batch, generator=gen, dtype=torch.float64) * 0.8 - 0.2
    scores += torch.eye(batch, dtype=torch.float64) * 0.25
    near = scores.diagonal() + (torch.rand(4, batch, generator=gen, dtype=torch.float64) - 0.6) * 0.3
    return [scores.to(dtype)] + [v.to(dtype) for v in near]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_brute_force(dtype, seed):
    s, i2t_off, t2i_off, pair, tilde = random_case(7, seed, dtype)
    sl, il, tl, pl, tdl = (x.double().tolist() for x in (s, i2t_off, t2i_off, pair, tilde))
    tol = dict(rel=1e-5, abs=1e-5) if dtype == torch.float32 else dict(rel=1e-12, abs=1e-12)
    assert L.triplet_sum(s, 0.2).item() == pytest.approx(brute_sum(sl, 0.2), **tol)
    assert L.triplet_max_violation(s, 0.2).item() == pytest.approx(brute_max(sl, 0.2), **tol)
    off = (il, tl, pl, tdl)
    assert L.offline_triplet(s, i2t_off, t2i_off, 0.2, 0.05).item() == pytest.approx(
        brute_aoq(sl, *off, 0.2, 0.05, ALPHA, BETA, adaptive=False, quin=False), **tol
    )
    assert L.offline_quintuplet(s, i2t_off, t2i_off, pair, tilde, 0.2, 0.05).item() == pytest.approx(
        brute_aoq(sl, *off, 0.2, 0.05, ALPHA, BETA, adaptive=False, quin=True), **tol
    )
    got = L.adaptive_offline_quintuplet(s, i2t_off, t2i_off, pair, tilde, 0.2, 0.05, 0.4, 1.2)
    assert got.item() == pytest.approx(brute_aoq(sl, *off, 0.2, 0.05, 0.4, 1.2, adaptive=True, quin=True), **tol)
    assert L.only_offline(s, i2t_off, t2i_off, pair, tilde, 0.05).item() == pytest.approx(
        brute_aoq(sl, *off, 0.2, 0.05, ALPHA, BETA, adaptive=False, quin=True, online=False), **tol
    )
    assert L.smooth_ap(s, 0.05).item() == pytest.approx(brute_smooth_ap(sl, 0.05), **tol)
    assert L.infonce(s, 0.1).item() == pytest.approx(brute_infonce(sl, 0.1), **tol)
    # the result keeps the input dtype
    assert L.adaptive_offline_quintuplet(s, i2t_off, t2i_off, pair, tilde).dtype == dtype


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
