"""The label-prediction term (train.label_lambda): BCE by hand, lambda = 0 changes nothing, lambda > 0
adds exactly lambda times the classifier path's gradient, and a labelled run trains end to end."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from aoq.checkpoint import load_checkpoint
from aoq_cli.main import main
from aoq.config import GoalConfig, ModelConfig, TrainConfig
from aoq.data.dataset import label_vocabulary, multi_hot
from aoq.models.joint import build_model
from tests.fixtures import write_precomp_fixture
from aoq_train.objectives.labels import label_prediction_loss
from aoq_train.round1 import round1_step


def test_vocabulary_and_multi_hot():
    labels = [["b", "a"], [], ["c", "a"]]
    vocab = label_vocabulary(labels)
    assert vocab == ["a", "b", "c"]
    assert multi_hot(labels, vocab).tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 1]]
    with pytest.raises(ValueError, match="'z'"):
        multi_hot([["z"]], vocab)


def test_label_prediction_loss_by_hand():
    # One item, two labels, targets (1, 0). Logit 0 -> BCE log 2 for either target;
    # logit log 3 with target 1 -> -log(3/4) = log(4/3). Image (0, 0): mean log 2;
    # caption (log 3, 0): mean (log(4/3) + log 2) / 2.
    image = torch.tensor([[0.0, 0.0]])
    caption = torch.tensor([[math.log(3.0), 0.0]])
    targets = torch.tensor([[1.0, 0.0]])
    expected = math.log(2) + (math.log(4 / 3) + math.log(2)) / 2
    assert label_prediction_loss(image, caption, targets).item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="do not match"):
        label_prediction_loss(image, caption, torch.zeros(1, 3))


def _setup(label_lambda: float, n_labels: int | None, loss: str = "max_violation"):
    torch.manual_seed(0)
    model = build_model(ModelConfig(embed_dim=8, word_dim=8), 10, 6, n_labels=n_labels).double()
    batch = {"images": torch.randn(4, 2, 6, dtype=torch.float64), "tokens": torch.randint(1, 10, (4, 5)),
             "lengths": torch.tensor([5, 3, 4, 2]), "image_ids": torch.tensor([0, 2, 1, 3])}
    targets = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.float64)
    step = round1_step(TrainConfig(loss=loss, label_lambda=label_lambda), GoalConfig(triplet="nca"),
                       targets if label_lambda > 0 else None)
    return model, batch, targets, step


def _encoder_grads(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()
            if not name.startswith("label_head") and p.grad is not None}


@pytest.mark.parametrize("loss", ["max_violation", "goal"])
def test_lambda_zero_gives_the_same_gradients_as_no_term(loss):
    model, batch, _, step = _setup(0.0, None, loss)
    plain = _encoder_grads(model, step(model, batch)[0])
    # Same weights plus a classifier, lambda 0: the classifier is never used.
    model_head, _, _, _ = _setup(0.0, 3, loss)
    zero = _encoder_grads(model_head, step(model_head, batch)[0])
    assert plain.keys() == zero.keys()
    for name in plain:
        assert torch.equal(plain[name], zero[name]), name


@pytest.mark.parametrize("loss", ["max_violation", "goal"])
def test_lambda_adds_exactly_the_classifier_path(loss):
    lam = 0.3
    model, batch, targets, step = _setup(lam, 3, loss)
    total, stats = step(model, batch)
    assert "label_bce" in stats
    with_term = _encoder_grads(model, total)
    ranking = _encoder_grads(model, round1_step(TrainConfig(loss=loss), GoalConfig(triplet="nca"))(model, batch)[0])
    img = model.encode_images(batch["images"])
    cap = model.encode_texts(batch["tokens"], batch["lengths"])
    term = label_prediction_loss(model.label_head(img), model.label_head(cap), targets[batch["image_ids"]])
    classifier = _encoder_grads(model, term)
    for name in with_term:
        torch.testing.assert_close(with_term[name], ranking[name] + lam * classifier[name], rtol=0, atol=1e-12)
    assert any(not torch.equal(with_term[n], ranking[n]) for n in with_term)


def test_label_lambda_needs_targets():
    with pytest.raises(ValueError, match="label targets"):
        round1_step(TrainConfig(label_lambda=0.1))


@pytest.mark.slow
def test_train_with_label_term_end_to_end(tmp_path, capsys, one_thread):
    data = write_precomp_fixture(tmp_path / "data", {"train": 20, "dev": 6, "test": 6}, regions=3, dim=10,
                                 labelled=True)
    tree = {
        "name": "tiny",
        "data": {"path": str(data), "vocab_threshold": 1},
        "model": {"embed_dim": 16, "word_dim": 8},
        "train": {"epochs": 1, "batch_size": 20, "lr": 0.002, "label_lambda": 0.1},
    }
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tree))
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(run), "--loss", "goal", "--no-progress"]) == 0
    ckpt = load_checkpoint(run / "round1" / "best")
    assert ckpt.model.n_labels == 5 and ckpt.extra["labels"][0] == "group:0"
    assert "train_label_bce" in (run / "round1" / "metrics.jsonl").read_text()
    (data / "train_labels.json").unlink()
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "other"), "--no-progress"]) == 2
    assert "needs labels" in capsys.readouterr().err
