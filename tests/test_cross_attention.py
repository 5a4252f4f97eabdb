"""SCAN and BFAN scores against brute-force per-pair references written from the papers' equations
(loops over pairs, words and regions; explicit attended vectors), in float64 to 1e-10."""

from __future__ import annotations

import math

import pytest
import torch

from aoq.models.bfan import bfan_scores, ensemble_scores
from aoq.models.scan import SCAN_PRESETS, ScanSettings, scan_scores

EPS = 1e-8
TOL = 1e-10
B, R, C, L, D = 3, 5, 4, 6, 8
REGIONS = torch.tensor([5, 3, 4])
LENGTHS = torch.tensor([6, 1, 3, 4])  # one one-word caption


# --------------------------------------------------------------------------- references


def _leaky(x: float) -> float:
    return x if x > 0 else 0.1 * x


def _cos(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x @ y) / max(math.sqrt(float(x @ x)) * math.sqrt(float(y @ y)), EPS)


def _first_norm(s: list[list[float]], norm: str) -> list[list[float]]:
    """s[j][i]: query j, context i; the norm runs over the queries j for each context i."""
    out = [[0.0] * len(s[0]) for _ in s]
    for i in range(len(s[0])):
        if norm == "clipped_l2norm":
            col = [_leaky(s[j][i]) for j in range(len(s))]
            den = math.sqrt(sum(c * c for c in col)) + EPS
            for j in range(len(s)):
                out[j][i] = col[j] / den
        else:
            den = sum(math.exp(s[j][i]) for j in range(len(s)))
            for j in range(len(s)):
                out[j][i] = math.exp(s[j][i]) / den
    return out


def _attention(queries: torch.Tensor, context: torch.Tensor, norm: str, lam: float) -> list[list[float]]:
    s = [[float(q @ x) for x in context] for q in queries]
    first = _first_norm(s, norm)
    alpha = []
    for j in range(len(queries)):
        den = sum(math.exp(lam * first[j][i]) for i in range(len(context)))
        alpha.append([math.exp(lam * first[j][i]) / den for i in range(len(context))])
    return alpha


def _attended(weights: list[float], context: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(context.shape[1], dtype=torch.float64)
    for w, x in zip(weights, context):
        a = a + w * x
    return a


def _scan_pair(v: torch.Tensor, e: torch.Tensor, st: ScanSettings) -> float:
    queries, context = (e, v) if st.direction == "t2i" else (v, e)
    alpha = _attention(queries, context, st.norm, st.lambda_softmax)
    r = [_cos(q, _attended(alpha[j], context)) for j, q in enumerate(queries)]
    if st.agg == "Mean":
        return sum(r) / len(r)
    return math.log(sum(math.exp(st.lambda_lse * x) for x in r)) / st.lambda_lse


def _focal(alpha: list[float], focal: str) -> list[float]:
    g = (lambda x: 1.0) if focal == "equal" else math.sqrt
    h = []
    for a_j in alpha:
        f = sum((a_j - a_k) * g(a_k) for a_k in alpha)
        h.append(1.0 if f > 0 else 0.0)
    total = sum(hj * aj for hj, aj in zip(h, alpha))
    if total == 0:  # the defined behaviour where the public code divides 0 by 0
        return list(alpha)
    return [hj * aj / total for hj, aj in zip(h, alpha)]


def _bfan_direction(queries: torch.Tensor, context: torch.Tensor, focal: str) -> float:
    alpha = _attention(queries, context, "clipped_l2norm", 20.0)
    r = [_cos(q, _attended(_focal(alpha[j], focal), context)) for j, q in enumerate(queries)]
    return sum(r) / len(r)


def _bfan_pair(v: torch.Tensor, e: torch.Tensor, focal: str) -> float:
    return _bfan_direction(e, v, focal) + _bfan_direction(v, e, focal)


def _reference(images, captions, pair) -> torch.Tensor:
    out = torch.zeros(images.shape[0], captions.shape[0], dtype=torch.float64)
    for b in range(images.shape[0]):
        for c in range(captions.shape[0]):
            out[b, c] = pair(images[b, : REGIONS[b]], captions[c, : LENGTHS[c]])
    return out


# --------------------------------------------------------------------------- inputs


def _inputs(normalised: bool, junk: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(B, R, D, generator=g, dtype=torch.float64)
    captions = torch.randn(C, L, D, generator=g, dtype=torch.float64)
    if normalised:
        images, captions = images / images.norm(dim=-1, keepdim=True), captions / captions.norm(dim=-1, keepdim=True)
    for b in range(B):
        images[b, REGIONS[b]:] = junk
    for c in range(C):
        captions[c, LENGTHS[c]:] = junk
    return images, captions


SCAN_CASES = [*SCAN_PRESETS.values(), ScanSettings("t2i", "softmax", "LogSumExp", 9.0, 6.0),
              ScanSettings("i2t", "softmax", "Mean", 4.0)]


@pytest.mark.parametrize("normalised", [False, True])
@pytest.mark.parametrize("settings", SCAN_CASES, ids=lambda s: f"{s.direction}-{s.norm}-{s.agg}-{s.lambda_lse}")
def test_scan_equals_reference(settings, normalised):
    images, captions = _inputs(normalised, float("nan"))
    got = scan_scores(images, REGIONS, captions, LENGTHS, settings)
    clean_i, clean_c = _inputs(normalised, 0.0)
    want = _reference(clean_i, clean_c, lambda v, e: _scan_pair(v, e, settings))
    assert got.shape == (B, C)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("normalised", [False, True])
@pytest.mark.parametrize("focal", ["equal", "prob"])
def test_bfan_equals_reference(focal, normalised):
    images, captions = _inputs(normalised, float("nan"))
    got = bfan_scores(images, REGIONS, captions, LENGTHS, focal)
    clean_i, clean_c = _inputs(normalised, 0.0)
    want = _reference(clean_i, clean_c, lambda v, e: _bfan_pair(v, e, focal))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("junk", [float("nan"), 1e30, -float("inf")])
def test_padding_never_read(junk):
    clean = _inputs(False, 0.0)
    dirty = _inputs(False, junk)
    for score in (lambda i, c: scan_scores(i, REGIONS, c, LENGTHS, SCAN_PRESETS["t2i_lse"]),
                  lambda i, c: scan_scores(i, REGIONS, c, LENGTHS, SCAN_PRESETS["i2t_avg"]),
                  lambda i, c: bfan_scores(i, REGIONS, c, LENGTHS, "prob")):
        assert torch.equal(score(*clean), score(*dirty))


@pytest.mark.parametrize("score", [
    lambda i, c: bfan_scores(i, REGIONS, c, LENGTHS, "equal"),
    lambda i, c: bfan_scores(i, REGIONS, c, LENGTHS, "prob"),
    lambda i, c: scan_scores(i, REGIONS, c, LENGTHS, SCAN_PRESETS["t2i_lse"]),
    lambda i, c: scan_scores(i, REGIONS, c, LENGTHS, ScanSettings("i2t", "softmax", "Mean", 4.0)),
])
def test_padding_gets_no_gradient_and_no_nan(score):
    images, captions = _inputs(False, float("nan"))
    images.requires_grad_(True)
    captions.requires_grad_(True)
    score(images, captions).sum().backward()
    assert torch.isfinite(images.grad).all() and torch.isfinite(captions.grad).all()
    assert (captions.grad[1, 1:] == 0).all() and (images.grad[1, 3:] == 0).all()


def test_one_word_caption_defined():
    """SCAN t2i of a one-word caption is that word's cosine with its attended region vector under
    both pools; BFAN's i2t direction has one word to attend to (no 0/0): every region's cosine
    with that word."""
    images, captions = _inputs(False, 0.0)
    one = captions[1:2, :1]
    lse = scan_scores(images, REGIONS, one, torch.tensor([1]), SCAN_PRESETS["t2i_lse"])
    avg = scan_scores(images, REGIONS, one, torch.tensor([1]), ScanSettings("t2i", agg="Mean"))
    torch.testing.assert_close(lse, avg, atol=TOL, rtol=0)
    got = bfan_scores(images, REGIONS, one, torch.tensor([1]), "equal")
    assert torch.isfinite(got).all()
    for b in range(B):
        v = images[b, : REGIONS[b]]
        i2t = sum(_cos(x, one[0, 0]) for x in v) / len(v)
        assert abs(float(got[b, 0]) - (_bfan_direction(one[0], v, "equal") + i2t)) < TOL


def test_all_equal_attention_keeps_the_attention():
    """Identical regions: every weight is 1/R, no fragment passes the strict threshold, and each
    word attends to the mean region (the public code returns NaN)."""
    e = torch.randn(1, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = torch.randn(1, 1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).expand(1, R, D)
    got = bfan_scores(v.contiguous(), None, e, torch.tensor([3]), "equal")
    assert torch.isfinite(got).all()


def test_ensemble_is_the_mean():
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.equal(ensemble_scores([a, b]), (a + b) / 2)
    with pytest.raises(ValueError):
        ensemble_scores([a, torch.randn(3, 2)])


@pytest.mark.parametrize("bad", [torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, L + 1])])
def test_bad_lengths_refused(bad):
    images, captions = _inputs(False, 0.0)
    with pytest.raises(ValueError, match="1..6"):
        scan_scores(images, REGIONS, captions, bad, SCAN_PRESETS["t2i_lse"])


def test_unknown_settings_refused():
    with pytest.raises(ValueError):
        ScanSettings("t2i", "l1norm")
    with pytest.raises(ValueError):
        bfan_scores(*_inputs(False, 0.0)[:1], REGIONS, _inputs(False, 0.0)[1], LENGTHS, "max")


@pytest.mark.parametrize("score", [
    lambda i, r, c, n, aligned: scan_scores(i, r, c, n, SCAN_PRESETS["t2i_lse"], aligned=aligned),
    lambda i, r, c, n, aligned: scan_scores(i, r, c, n, ScanSettings("i2t", "softmax", "Mean", 4.0), aligned=aligned),
    lambda i, r, c, n, aligned: bfan_scores(i, r, c, n, "prob", aligned=aligned),
])
def test_aligned_pairs_are_the_diagonal(score):
    images, captions = _inputs(False, float("nan"))
    images, regions = torch.cat([images, images[:1]]), torch.cat([REGIONS, REGIONS[:1]])  # B = C = 4
    full = score(images, regions, captions, LENGTHS, False)
    torch.testing.assert_close(score(images, regions, captions, LENGTHS, True), full.diagonal(), atol=1e-12, rtol=0)
