"""Tests of training/objectives/losses.py: hand-computed values and brute-force references (gradients, reduction
and validation: tests/test_loss_gradients.py)."""

from __future__ import annotations

import math

import pytest
import torch

from aoq_train.objectives import losses as L
from tests.loss_cases import S2, S3, args2, args3, random_case, t

G1, G2, ALPHA, BETA = 0.2, 0.0, 0.3, 1.5

# --------------------------------------------------------------------------- hand-computed cases


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
