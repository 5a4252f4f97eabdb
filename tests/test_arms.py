"""Arm names: round-2 arms, GOAL and label-term round-1 arms, their folders, labels and configs."""

from __future__ import annotations

import pytest

from aoq.config import load_config
from aoq_train.pipeline.arms import ROUND2_ARMS, arm_label, resolve_arm, resolve_arms


def test_round2_arms_keep_their_overrides_and_folders():
    assert resolve_arm("aoq").round == 2 and resolve_arm("aoq").folder == "round2"
    offtri = resolve_arm("offtri")
    assert offtri.folder == "round2-offtri" and offtri.overrides == {"loss": "offline_triplet"}
    assert set(ROUND2_ARMS) >= {"aoq", "offtri", "offquin", "finetune"}


def test_goal_and_lambda_names_are_round1_arms():
    goal = resolve_arm("goal-cir-lin_ms")
    assert (goal.round, goal.folder) == (1, "round1-goal-cir-lin_ms")
    assert goal.overrides == {"train.loss": "goal", "goal.triplet": "cir", "goal.pair": "lin_ms"}
    assert goal.label == "GOAL (cir x lin_ms)"
    lam = resolve_arm("lambda0.001")
    assert lam.overrides == {"train.label_lambda": 0.001} and lam.label == "label term, lambda = 0.001"
    assert resolve_arm("lambda10").overrides == {"train.label_lambda": 10.0}
    assert arm_label("baseline").startswith("Baseline")


@pytest.mark.parametrize("name", ["goal-xyz-con", "goal-con-xyz", "goal-con", "lambda", "lambda-1", "AOQ", ""])
def test_unknown_names_are_refused_with_the_choices(name):
    with pytest.raises(ValueError, match="choose from .*goal-<triplet>-<pair>"):
        resolve_arm(name)


def test_resolve_arms_refuses_repeats_and_nothing():
    with pytest.raises(ValueError, match="named twice: aoq"):
        resolve_arms(["aoq", "offtri", "aoq"])
    with pytest.raises(ValueError, match="no arm given"):
        resolve_arms([])


def test_arm_config_applies_only_its_section():
    cfg = load_config("configs/synthetic.yaml")
    goal = resolve_arm("goal-nca-sig").config(cfg)
    assert (goal.train.loss, goal.goal.triplet, goal.goal.pair) == ("goal", "nca", "sig")
    assert goal.round2 == cfg.round2 and goal.train.lr == cfg.train.lr
    offquin = resolve_arm("offquin").config(cfg)
    assert offquin.round2.loss == "offline_quintuplet" and offquin.train == cfg.train


def test_filtered_and_teacher_arms_mine_their_own_lists():
    fn = resolve_arm("aoq-fn-semantic0.85+identity")
    assert (fn.round, fn.folder) == (2, "round2-aoq-fn-semantic0.85+identity")
    assert fn.mining == {"filters": ["identity", "semantic"], "semantic_tau": 0.85}  # the fixed order
    assert fn.mined_folder == "mined-fn-identity+semantic0.85"
    assert resolve_arm("aoq-fn-identity+semantic0.85").mined_folder == fn.mined_folder  # the same lists
    assert fn.label == "AdapOffQuin, filters identity + semantic tau=0.85"
    cfg = load_config("configs/synthetic.yaml")
    arm_cfg = fn.config(cfg)
    assert arm_cfg.mining.filters == ["identity", "semantic"] and arm_cfg.mining.semantic_tau == 0.85
    assert arm_cfg.round2 == cfg.round2 and arm_cfg.mining.top_captions == cfg.mining.top_captions
    by = resolve_arm("aoq-fn-teacher0.9-by-goal-cir-con")
    assert (by.teacher, by.mining, by.mined_folder) == ("goal-cir-con", {"filters": ["teacher"], "teacher_rho": 0.9},
                                                        "mined-fn-teacher0.9-by-goal-cir-con")
    assert by.label == "AdapOffQuin, filters teacher rho=0.9, mined by GOAL (cir x con)"
    plain_by = resolve_arm("aoq-by-goal-nca-con")
    assert (plain_by.mining, plain_by.mined_folder) == ({}, "mined-by-goal-nca-con")
    assert resolve_arm("aoq").mined_folder == "mined"


@pytest.mark.parametrize("name, message", [
    ("aoq-fn-foo", "unknown filter 'foo'"), ("aoq-fn-identity+identity", "named twice"),
    ("aoq-by-offtri", "names a round-1 arm"), ("aoq-by-baseline", "names a round-1 arm"),
])
def test_bad_filtered_arms_are_refused(name, message):
    with pytest.raises(ValueError, match=message):
        resolve_arm(name)
