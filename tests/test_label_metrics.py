"""Label-wise retrieval: mAP@R and NDCG@k by hand, tie averaging, labels in the readers, and
`aoq evaluate --protocol labels` on a labelled fixture."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from aoq_cli.main import main
from aoq.data.dataset import DataError, label_vocabulary, multi_hot
from aoq.data.karpathy import read_karpathy
from aoq.data.precomp import read_precomp
from aoq.label_metrics import label_metrics, label_metrics_folds, label_ranking_metrics, shared_label_counts
from tests.fixtures import fixture_labels, write_karpathy_fixture, write_precomp_fixture, write_tiny_config

LOG3 = math.log2(3)


def test_distinct_scores_by_hand():
    # Ranked gallery: rel 0, 2, 1. DCG@2 = 0/1 + 2/log2(3); ideal order 2, 1: IDCG@2 = 2/1 + 1/log2(3).
    # Binary relevance 0, 1, 1, R = 2: AP@R = (1/2) * (0 + 1 * (1/2)) = 0.25.
    out = label_ranking_metrics(np.array([[0.9, 0.8, 0.1]]), np.array([[0.0, 2.0, 1.0]]), k=2)
    assert out["ndcg_at_2"] == pytest.approx((2 / LOG3) / (2 + 1 / LOG3), abs=1e-15)
    assert out["map_at_r"] == pytest.approx(0.25, abs=1e-15)
    assert out["queries"] == 1


def test_partial_tie_is_averaged_over_both_orders():
    # Scores 0.9, 0.5, 0.5, 0.1 with rel 1, 0, 1, 0: the tied pair is (rel 0, rel 1) or (rel 1, rel 0).
    # AP@R (R = 2): order "0 then 1" -> (1 + 0)/2 = 0.5; "1 then 0" -> (1 + 1)/2 = 1; mean 0.75.
    # NDCG@2: expected gain at rank 2 is 1/2 -> (1 + 0.5/log2(3)) / (1 + 1/log2(3)).
    out = label_ranking_metrics(np.array([[0.9, 0.5, 0.5, 0.1]]), np.array([[1.0, 0.0, 1.0, 0.0]]), k=2)
    assert out["map_at_r"] == pytest.approx(0.75, abs=1e-15)
    assert out["ndcg_at_2"] == pytest.approx((1 + 0.5 / LOG3) / (1 + 1 / LOG3), abs=1e-15)


def test_constant_scores_give_the_chance_value_not_a_perfect_one():
    # 5 items, rel 2, 0, 1, 0, 0: R = 2 relevant of 5. Random order: P(rank 1 relevant) = 2/5 and
    # E[b_2 (b_1 + b_2)] = 2/5 + P(both relevant) = 2/5 + (2*1)/(5*4) = 0.5, so
    # AP@R = (1/2) (0.4/1 + 0.5/2) = 0.325. NDCG@3: mean gain 3/5 at every rank ->
    # 0.6 (1 + 1/log2 3 + 1/2) / (2 + 1/log2 3 + 0/2).
    rel = np.array([[2.0, 0.0, 1.0, 0.0, 0.0]])
    out = label_ranking_metrics(np.zeros((1, 5)), rel, k=3)
    assert out["map_at_r"] == pytest.approx(0.325, abs=1e-15)
    assert out["ndcg_at_3"] == pytest.approx(0.6 * (1.5 + 1 / LOG3) / (2 + 1 / LOG3), abs=1e-15)
    perfect = label_ranking_metrics(np.array([[5.0, 1.0, 4.0, 2.0, 3.0]]), rel, k=3)
    assert perfect["map_at_r"] == 1.0 and perfect["ndcg_at_3"] == pytest.approx(1.0, abs=1e-15)


def test_ties_equal_the_mean_over_every_tie_order():
    rel = np.array([[2.0, 0.0, 1.0, 1.0, 0.0, 3.0]])
    scores = np.array([[0.3, 0.3, 0.7, 0.3, 0.7, 0.1]])
    tied = label_ranking_metrics(scores, rel, k=4)
    # Break the ties every possible way with tiny offsets inside each tie group and average.
    groups = [[0, 1, 3], [2, 4]]
    results = []
    for low in itertools.permutations(groups[0]):
        for high in itertools.permutations(groups[1]):
            strict = scores.copy()
            for rank, item in enumerate(low + high):
                strict[0, item] -= 1e-6 * rank
            results.append(label_ranking_metrics(strict, rel, k=4))
    assert tied["map_at_r"] == pytest.approx(np.mean([r["map_at_r"] for r in results]), abs=1e-12)
    assert tied["ndcg_at_4"] == pytest.approx(np.mean([r["ndcg_at_4"] for r in results]), abs=1e-12)


def test_queries_without_relevant_items_are_left_out():
    out = label_ranking_metrics(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[1.0, 0.0], [0.0, 0.0]]))
    assert out["queries"] == 1 and out["map_at_r"] == 1.0
    none = label_ranking_metrics(np.zeros((1, 2)), np.zeros((1, 2)))
    assert none["queries"] == 0 and math.isnan(none["map_at_r"])


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="same shape"):
        label_ranking_metrics(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match=">= 0"):
        label_ranking_metrics(np.zeros((1, 2)), -np.ones((1, 2)))
    with pytest.raises(ValueError, match="k must be"):
        label_ranking_metrics(np.zeros((1, 2)), np.ones((1, 2)), k=0)


def test_label_metrics_both_directions_by_hand():
    # Image labels: 0 {a, b}, 1 {b}, 2 {c}; one caption per image, inheriting them.
    labels = [["a", "b"], ["b"], ["c"]]
    hot = multi_hot(labels, label_vocabulary(labels))
    rel = shared_label_counts(hot, hot)
    assert rel.tolist() == [[2, 1, 0], [1, 1, 0], [0, 0, 1]]
    img = np.eye(3)
    # Caption embeddings: caption 0 points at image 1, 1 at image 0, 2 at image 2.
    cap = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = label_metrics(img, cap, hot, captions_per_image=1, k=2)
    # i2t query image 0: captions ranked 1 (rel 1), then 0 and 2 tied at 0 (rel 2, 0).
    #   DCG@2 = 1 + mean(2, 0)/log2 3 = 1 + 1/log2 3; IDCG@2 = 2 + 1/log2 3.
    #   R = 2; E[b_1 (b_1)] = 1, E[b_2 (b_1 + b_2)] = p (1 + 1) = 1/2 * 2 = 1 -> AP = (1 + 1/2)/2 = 0.75.
    # image 1: caption 0 first (rel 1), then 1 and 2 tied (rel 1, 0): same numbers with rel 1 gains:
    #   DCG = 1 + 0.5/log2 3, IDCG = 1 + 1/log2 3; AP@R = 0.75.
    # image 2: caption 2 first (rel 1), R = 1: AP = 1, NDCG = 1.
    ndcg_i2t = [(1 + 1 / LOG3) / (2 + 1 / LOG3), (1 + 0.5 / LOG3) / (1 + 1 / LOG3), 1.0]
    assert out["i2t"]["map_at_r"] == pytest.approx((0.75 + 0.75 + 1.0) / 3, abs=1e-15)
    assert out["i2t"]["ndcg_at_2"] == pytest.approx(np.mean(ndcg_i2t), abs=1e-15)
    # t2i is the same relevance (symmetric here) and the transposed scores.
    assert out["t2i"] == label_ranking_metrics((img @ cap.T).T, rel.T, k=2)
    assert out["k"] == 2 and out["relevance"] == "shared_labels"


def test_label_metrics_over_folds_rank_each_fold_alone():
    # Two folds of one image with one caption each. Image 0 = [1, 0] scores caption 0 at 0.1 and
    # caption 1 at 0.9; image 1 = [0, 1] scores them 0 and 0.5.
    img = np.array([[1.0, 0.0], [0.0, 1.0]])
    cap = np.array([[0.1, 0.0], [0.9, 0.5]])
    # Both images labelled {a}: every caption is relevant to every image, all metrics are 1.
    hot = np.array([[1.0, 0.0], [1.0, 0.0]])
    folds = label_metrics_folds(img, cap, hot, captions_per_image=1, k=1, fold_images=1, n_folds=2)
    assert folds["i2t"] == {"map_at_r": 1.0, "ndcg_at_1": 1.0, "queries": 2}
    assert (folds["folds"], folds["fold_images"], folds["k"]) == (2, 1, 1)
    assert label_metrics(img, cap, hot, 1, k=1)["i2t"]["map_at_r"] == 1.0
    # Image 0 {a}, image 1 {b}. On the whole set image 0 ranks the irrelevant caption 1 first
    # (NDCG@1 = 0) and image 1 its own caption first (1): mean 0.5. Inside its fold each image sees
    # only its own caption: 1.0. So the folds really restrict the gallery.
    hot_b = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert label_metrics(img, cap, hot_b, 1, k=1)["i2t"]["ndcg_at_1"] == 0.5
    assert label_metrics_folds(img, cap, hot_b, 1, k=1, fold_images=1, n_folds=2)["i2t"]["ndcg_at_1"] == 1.0
    with pytest.raises(ValueError, match="2 folds of 1 images need 2 images"):
        label_metrics_folds(img[:1], cap[:1], hot[:1], 1, k=1, fold_images=1, n_folds=2)


# --------------------------------------------------------------------------- readers


def test_precomp_labels_file_is_read_and_checked(tmp_path):
    folder = write_precomp_fixture(tmp_path, {"train": 6}, labelled=True)
    assert read_precomp(folder, "train").labels == fixture_labels(6)
    assert read_precomp(folder, "train", max_images=4).labels == fixture_labels(4)
    (folder / "train_labels.json").write_text(json.dumps(fixture_labels(5)))
    with pytest.raises(DataError, match="5 label lists for 6 images"):
        read_precomp(folder, "train")
    (folder / "train_labels.json").write_text(json.dumps([["a"], "b"] + [[]] * 4))
    with pytest.raises(DataError, match="one list of label strings"):
        read_precomp(folder, "train")
    (folder / "train_labels.json").unlink()
    assert read_precomp(folder, "train").labels is None


def test_karpathy_labels_are_read_and_must_be_everywhere(tmp_path):
    path = write_karpathy_fixture(tmp_path, "flickr30k")
    assert read_karpathy(path).split("train").labels is None
    data = json.loads(path.read_text())
    for k, entry in enumerate(data["images"]):
        entry["labels"] = [f"group:{k % 2}"]
    path.write_text(json.dumps(data))
    dataset = read_karpathy(path)
    train_entries = [e for e in data["images"] if e["split"] == "train"]
    assert dataset.split("train").labels == [e["labels"] for e in train_entries]
    del data["images"][1]["labels"]
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r'images\[1\] has no "labels"'):
        read_karpathy(path)
    data["images"][1]["labels"] = "group:0"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="list of non-empty strings"):
        read_karpathy(path)


# --------------------------------------------------------------------------- aoq evaluate


@pytest.mark.slow
def test_evaluate_protocol_labels(tmp_path, capsys, one_thread):
    data = write_precomp_fixture(tmp_path / "data", {"train": 20, "dev": 6, "test": 9}, regions=3, dim=10,
                                 labelled=True)
    config = write_tiny_config(tmp_path / "tiny.yaml", data, train={"epochs": 1, "batch_size": 20})
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    ckpt = str(tmp_path / "run" / "round1" / "best")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ckpt, "--protocol", "labels", "--ndcg-k", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["protocol"] == "labels" and out["n_images"] == 9
    assert {"r1", "r5", "r10"} <= set(out["i2t"])
    labels = out["labels"]
    assert labels["n_labels"] == 5 and labels["k"] == 5  # group:0..2, parity:0..1
    for direction, queries in (("i2t", 9), ("t2i", 45)):
        assert labels[direction]["queries"] == queries
        assert 0 < labels[direction]["map_at_r"] <= 1 and 0 < labels[direction]["ndcg_at_5"] <= 1
    assert main(["evaluate", "--checkpoint", ckpt, "--protocol", "labels"]) == 0
    assert "mAP@R" in capsys.readouterr().out
    # The comparison's one-encoding evaluation gives the same figures (9 images: full only).
    from aoq_train.evaluate import compare_checkpoint

    both = compare_checkpoint(ckpt, "test", labels=True, ndcg_k=5)
    assert list(both) == ["full"] and both["full"]["labels"] == labels
    assert both["full"]["i2t"] == out["i2t"] and both["full"]["rsum"] == out["rsum"]
    (data / "test_labels.json").unlink()
    assert main(["evaluate", "--checkpoint", ckpt, "--protocol", "labels"]) == 2
    assert "has no labels" in capsys.readouterr().err


def test_service_report_has_labels_only_when_the_gallery_has_them():
    from aoq_serve.index.reports import model_report

    rng = np.random.default_rng(0)
    img, cap = rng.standard_normal((6, 4)), rng.standard_normal((12, 4))
    hot = multi_hot(fixture_labels(6), label_vocabulary(fixture_labels(6)))
    assert "labels" not in model_report(img, cap, 2, [])
    table = model_report(img, cap, 2, [], hot)["labels"]
    direct = label_metrics(img, cap, hot, 2, k=10)
    assert table["k"] == 10 and table["n_labels"] == 5
    for d in ("i2t", "t2i"):
        assert table[d] == {"map_at_r": direct[d]["map_at_r"], "ndcg": direct[d]["ndcg_at_10"]}

