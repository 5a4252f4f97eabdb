"""GOAL gradient objectives: weight functions by hand, the triplet equivalence, finite differences,
the gradient assembly, and `aoq train --loss goal` end to end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aoq.checkpoint import load_checkpoint
from aoq.names import GOAL_PAIRS, GOAL_TRIPLETS
from aoq_cli.main import main
from tests.fixtures import write_precomp_fixture, write_tiny_config
from aoq_train.objectives import goal as G
from aoq_train.objectives.losses import triplet_max_violation


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _embeddings(batch: int = 6, dim: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    cap = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    return img.requires_grad_(), cap.requires_grad_()


def _grads(fn, img: torch.Tensor, cap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = img.detach().clone().requires_grad_(), cap.detach().clone().requires_grad_()
    fn(a, b).backward()
    return a.grad, b.grad


# --------------------------------------------------------------------------- weights by hand


def test_triplet_weight_con_is_the_hinge_indicator_or_one():
    # m - S_p + S_n: 0.2 - 0.5 + 0.4 = 0.1 > 0 (active); 0.2 - 0.8 + 0.4 = -0.2 (inactive)
    assert G.triplet_weight_con(_t(0.5, 0.8), _t(0.4, 0.4), margin=0.2).tolist() == [1.0, 0.0]
    assert G.triplet_weight_con(_t(0.5, 0.8), _t(0.4, 0.4), margin=None).tolist() == [1.0, 1.0]


def test_triplet_weight_nca():
    # 1 / (1 + exp(10 * (0.5 - 0.4))) = 1 / (1 + e)
    out = G.triplet_weight_nca(_t(0.5, 0.3), _t(0.4, 0.3), tau=10.0)
    assert out.tolist() == pytest.approx([1 / (1 + math.e), 0.5], abs=1e-15)


def test_triplet_weight_cir():
    # (S_p, S_n) = (1, 0): 1/(1 + exp(10 * (1*1 - 0 - 0.5))) = 1/(1 + e^5);
    # (0.5, 0.5): 0.5*1.5 - 0.25 - 0.5 = 0 -> 1/2;  (0.2, 0.6): 0.2*1.8 - 0.36 - 0.5 = -0.5 -> 1/(1 + e^-5)
    out = G.triplet_weight_cir(_t(1.0, 0.5, 0.2), _t(0.0, 0.5, 0.6), tau=10.0)
    assert out.tolist() == pytest.approx([1 / (1 + math.exp(5)), 0.5, 1 / (1 + math.exp(-5))], abs=1e-12)


def test_pair_weights_con_lin_sig():
    w_p, w_n = G.pair_weight_con(_t(0.7), _t(0.3))
    assert (w_p.item(), w_n.item()) == (1.0, 1.0)
    w_p, w_n = G.pair_weight_lin(_t(0.7, -0.2), _t(0.3, 0.9))
    assert w_p.tolist() == pytest.approx([0.3, 1.2]) and w_n.tolist() == pytest.approx([0.3, 0.9])
    # a=2, b=10, lambda=0.5: S_p=1 -> 1/(1+e^(2*0.5)) = 1/(1+e); S_n=0.6 -> 1/(1+e^(-10*0.1)) = 1/(1+1/e)
    w_p, w_n = G.pair_weight_sig(_t(1.0, 0.5), _t(0.6, 0.5), ms_a=2.0, ms_b=10.0, ms_lambda=0.5)
    assert w_p.tolist() == pytest.approx([1 / (1 + math.e), 0.5], abs=1e-15)
    assert w_n.tolist() == pytest.approx([1 / (1 + 1 / math.e), 0.5], abs=1e-15)


def test_pair_weights_with_relative_terms():
    # lin_ms: (1 - 0.1) * (1 - 0.7) = 0.27 and (1 + 0.2) * 0.3 = 0.36
    w_p, w_n = G.pair_weight_lin_ms(_t(0.7), _t(0.3), _t(0.1), _t(0.2))
    assert (w_p.item(), w_n.item()) == pytest.approx((0.27, 0.36))
    # sig_ms at S = lambda: exp(0) = 1, so w = 1 / (1 + R): R=1 -> 1/2 (= sig), R=3 -> 1/4, R=0 -> 1
    w_p, w_n = G.pair_weight_sig_ms(_t(0.5, 0.5), _t(0.5, 0.5), _t(1.0, 3.0), _t(0.0, 1.0))
    assert w_p.tolist() == [0.5, 0.25] and w_n.tolist() == [1.0, 0.5]


#: rows = image anchors; positives 0.9, 0.8, 0.7, 0.75 on the diagonal.
_S = _t(0.9, 0.7, 0.6, 0.1, 0.2, 0.8, 0.3, 0.65, 0.4, 0.1, 0.7, 0.0, 0.5, 0.58, 0.2, 0.75).reshape(4, 4)


def test_relative_similarity_sets_by_hand():
    # Hardest negatives per row: 0.7 (col 1), 0.65 (col 3), 0.4 (col 0), 0.58 (col 1). epsilon = 0.15.
    # Relative positives of k: S_p[j], j != k, with S_p[j] <= S_n[k] + 0.15:
    #   k=0 (<= 0.85): 0.8, 0.7, 0.75 -> gaps 0.1, 0.2, 0.15 -> mean 0.15
    #   k=1 (<= 0.80): 0.7, 0.75      -> gaps 0.1, 0.05      -> mean 0.075
    #   k=2 (<= 0.55): none -> 0;  k=3 (<= 0.73): 0.7 -> gap 0.05
    # Relative negatives of k: scores[k, c], c not k nor the hardest, >= min S_p - 0.15 = 0.55:
    #   k=0: 0.6 -> gap 0.7 - 0.6 = 0.1; the other rows have none -> 0
    positive = _S.diagonal()
    neg_index = torch.tensor([1, 3, 0, 1])
    negative = _S[torch.arange(4), neg_index]
    pos_rel, neg_rel = G.relative_similarity(_S, positive, negative, neg_index, "lin", epsilon=0.15)
    assert pos_rel.tolist() == pytest.approx([0.15, 0.075, 0.0, 0.05], abs=1e-12)
    assert neg_rel.tolist() == pytest.approx([0.1, 0.0, 0.0, 0.0], abs=1e-12)
    pos_rel, neg_rel = G.relative_similarity(_S, positive, negative, neg_index, "sig", 2.0, 10.0, 0.15)
    e = math.exp
    expected_pos = [(e(0.2) + e(0.4) + e(0.3)) / 3, (e(0.2) + e(0.1)) / 2, 0.0, e(0.1)]
    assert pos_rel.tolist() == pytest.approx(expected_pos, abs=1e-12)
    assert neg_rel.tolist() == pytest.approx([e(-1.0), 0.0, 0.0, 0.0], abs=1e-12)


def test_spec_rejects_unknown_names():
    with pytest.raises(ValueError, match="triplet weight"):
        G.GoalSpec(triplet="ms")
    with pytest.raises(ValueError, match="pair weight"):
        G.GoalSpec(pair="cosine")
    with pytest.raises(ValueError, match="no loss"):
        G.goal_potential(_S, G.GoalSpec("cir", "con"))


# --------------------------------------------------------------------------- the triplet equivalence


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_con_con_equals_max_violation_when_every_hinge_is_active(seed):
    img, cap = _embeddings(seed=seed)
    # Unit vectors: S_p - S_n <= 2 < 2.5, so every hinge of both directions is active.
    margin = 2.5
    goal = _grads(lambda a, b: G.goal_objective(a, b, G.GoalSpec(margin=margin)), img, cap)
    ref = _grads(lambda a, b: triplet_max_violation(a @ b.T, margin), img, cap)
    torch.testing.assert_close(goal, ref, rtol=0, atol=1e-15)
    value = G.goal_objective(img, cap, G.GoalSpec(margin=margin))
    assert value.item() == pytest.approx(triplet_max_violation(img @ cap.T, margin).item(), abs=1e-12)
    # The public code's variant (weight 1 for every anchor) agrees when all hinges are active.
    public = _grads(lambda a, b: G.goal_objective(a, b, G.GoalSpec(margin=None)), img, cap)
    torch.testing.assert_close(public, ref, rtol=0, atol=1e-15)


def test_inactive_triplets_get_no_gradient_with_a_margin_and_full_weight_without():
    img, cap = _embeddings(batch=8, dim=16, seed=4)
    with torch.no_grad():
        # Captions 0-3 close to their images (satisfied hinges), 4-7 random (active hinges).
        cap[:4] = F.normalize(img[:4] + 0.3 * cap[:4], dim=1)
        scores = img @ cap.T
        eye = torch.eye(8, dtype=torch.bool)
        hardest = scores.masked_fill(eye, -2).amax(dim=1)
        active = 0.2 - scores.diagonal() + hardest > 0
    assert 0 < int(active.sum()) < 8, "the batch must mix active and inactive image-anchored hinges"
    ref = _grads(lambda a, b: triplet_max_violation(a @ b.T, 0.2), img, cap)
    gated = _grads(lambda a, b: G.goal_objective(a, b, G.GoalSpec(margin=0.2)), img, cap)
    torch.testing.assert_close(gated, ref, rtol=0, atol=1e-15)
    public = _grads(lambda a, b: G.goal_objective(a, b, G.GoalSpec(margin=None)), img, cap)
    assert not torch.allclose(public[0], ref[0])
    # Without the gate every anchor counts: the gradient of sum (S_n - S_p), both directions.
    ref_all = _grads(lambda a, b: triplet_max_violation(a @ b.T, 10.0), img, cap)
    torch.testing.assert_close(public, ref_all, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- finite differences


@pytest.mark.parametrize(
    "spec",
    [
        G.GoalSpec("con", "con", margin=0.2),
        G.GoalSpec("con", "con", margin=None),
        G.GoalSpec("nca", "con", tau=5.0),
        G.GoalSpec("con", "lin", margin=None),
        G.GoalSpec("con", "sig", margin=None, ms_a=2.0, ms_b=10.0),
    ],
    ids=lambda s: f"{s.triplet}-{s.pair}-m{s.margin}",
)
def test_gradcheck_where_a_loss_exists(spec):
    assert spec.has_loss
    img, cap = _embeddings(batch=5, dim=4, seed=7)
    assert torch.autograd.gradcheck(lambda a, b: G.goal_objective(a, b, spec), (img, cap))


def test_non_integrable_combinations_have_no_loss():
    for triplet in GOAL_TRIPLETS:
        for pair in GOAL_PAIRS:
            spec = G.GoalSpec(triplet, pair)
            assert spec.has_loss == ((triplet, pair) in {("con", "con"), ("nca", "con")})


# --------------------------------------------------------------------------- gradient assembly


def _reference_gradient(img: torch.Tensor, cap: torch.Tensor, spec: G.GoalSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-anchor loops: each triplet moves anchor, positive and negative embeddings."""
    img, cap = img.detach(), cap.detach()
    scores = img @ cap.T
    batch = scores.shape[0]
    g_img, g_cap = torch.zeros_like(img), torch.zeros_like(cap)
    for direction, anchors in (("i2t", scores), ("t2i", scores.T)):
        masked = anchors.clone()
        masked.fill_diagonal_(-float("inf"))
        neg_index = masked.argmax(dim=1)
        positive = scores.diagonal()
        negative = anchors[torch.arange(batch), neg_index]
        w_tri = G._triplet_weight(spec, positive, negative)
        w_p, w_n = G._pair_weight(spec, anchors, positive, negative, neg_index)
        for k in range(batch):
            n = int(neg_index[k])
            if direction == "i2t":  # anchor img k, positive cap k, negative cap n
                g_img[k] += w_tri[k] * (w_n[k] * cap[n] - w_p[k] * cap[k])
                g_cap[k] -= w_tri[k] * w_p[k] * img[k]
                g_cap[n] += w_tri[k] * w_n[k] * img[k]
            else:  # anchor cap k, positive img k, negative img n
                g_cap[k] += w_tri[k] * (w_n[k] * img[n] - w_p[k] * img[k])
                g_img[k] -= w_tri[k] * w_p[k] * cap[k]
                g_img[n] += w_tri[k] * w_n[k] * cap[k]
    return g_img, g_cap


@pytest.mark.parametrize("triplet", GOAL_TRIPLETS)
@pytest.mark.parametrize("pair", GOAL_PAIRS)
def test_backward_matches_per_triplet_loops(triplet, pair):
    spec = G.GoalSpec(triplet, pair, tau=3.0)
    img, cap = _embeddings(batch=7, dim=6, seed=11)
    got = _grads(lambda a, b: 2.0 * G.goal_objective(a, b, spec), img, cap)
    want = _reference_gradient(img, cap, spec)
    torch.testing.assert_close(got, (2.0 * want[0], 2.0 * want[1]), rtol=0, atol=1e-13)
    assert all(torch.isfinite(g).all() for g in got)


def test_objective_checks_shapes():
    with pytest.raises(ValueError, match="same shape"):
        G.goal_objective(torch.zeros(3, 4), torch.zeros(3, 5), G.GoalSpec())


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_aoq_train_goal_end_to_end_and_mining(tmp_path, one_thread):
    data = write_precomp_fixture(tmp_path / "data", {"train": 30, "dev": 8, "test": 8}, regions=3, dim=10)
    config = write_tiny_config(tmp_path / "tiny.yaml", data, mining={"top_captions": 20, "top_images": 10, "device": "cpu"},
                               round2={"h_t": 10, "h_i": 5})
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run), "--loss", "goal",
                 "--set", "goal.triplet=nca", "--set", "goal.pair=sig", "--no-progress"]) == 0
    ckpt = load_checkpoint(run / "round1" / "best")
    assert ckpt.config.train.loss == "goal"
    assert (ckpt.config.goal.triplet, ckpt.config.goal.pair) == ("nca", "sig")
    assert ckpt.extra["loss"] == "goal"
    # The GOAL model is a round-1 model like any other: AOQ mines with it.
    assert main(["mine", "--config", str(config), "--checkpoint", str(run / "round1" / "best"),
                 "--out", str(tmp_path / "mined"), "--no-progress"]) == 0
    assert (tmp_path / "mined").is_dir()
