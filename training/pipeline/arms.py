"""The models a pipeline trains beside its baseline ("arms"), by name.

Two kinds share one namespace, so that ``aoq pipeline --arms`` and ``aoq report --arms`` can put
them in one comparison:

* **round-2 arms** (``aoq``, ``offtri``, ...): trained from scratch (or fine-tuned) with the
  offline negatives mined by the baseline; their overrides apply to the ``round2`` section.
* **round-1 arms**: trained like the baseline, from scratch and without mined negatives, with
  other ``train``/``goal`` settings: ``goal-<triplet>-<pair>`` (a GOAL objective, docs/goal.md)
  and ``lambda<x>`` (the label-prediction term with weight x, docs/training.md). Their
  overrides are dotted config keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

from aoq.config import ExperimentConfig, GoalConfig, Round2Config, config_from_dict

#: round-2 arm name -> overrides of the ``round2`` section; "aoq" is the configured method, the
#: others are the paper's comparisons (Table 2) and ablations (Table 3).
ROUND2_ARMS: dict[str, dict[str, Any]] = {
    "aoq": {},
    "offtri": {"loss": "offline_triplet"},
    "offquin": {"loss": "offline_quintuplet"},
    "only_offline": {"loss": "adaptive_offline_quintuplet", "variant": "only_offline"},
    "online_quin": {"loss": "offline_quintuplet", "variant": "online_quin"},
    "no_offline_adapt": {"loss": "adaptive_offline_quintuplet", "variant": "no_offline_adapt"},
    "finetune": {"loss": "adaptive_offline_quintuplet", "init": "finetune"},
}
#: arm -> display name; "baseline" is round 1 with the config's own ``train`` section.
LABELS: dict[str, str] = {
    "baseline": "Baseline (VSE++ max violation)",
    "offtri": "OffTri (Eq. 3)",
    "offquin": "OffQuin (Eq. 4)",
    "aoq": "AdapOffQuin (Eq. 5, AOQ)",
    "only_offline": "OnlyOffline (ablation)",
    "online_quin": "OnlineQuin (ablation)",
    "no_offline_adapt": "w/o OfflineAdap (ablation)",
    "finetune": "AdapOffQuin, finetuned from round 1",
}


GOAL_TRIPLETS: tuple[str, ...] = get_args(GoalConfig.model_fields["triplet"].annotation)
GOAL_PAIRS: tuple[str, ...] = get_args(GoalConfig.model_fields["pair"].annotation)
#: what ``--arms`` accepts, for help texts and error messages.
ARM_CHOICES = (f"{', '.join(ROUND2_ARMS)} (round 2); goal-<triplet>-<pair> with triplet in "
               f"{'/'.join(GOAL_TRIPLETS)} and pair in {'/'.join(GOAL_PAIRS)}; lambda<weight>, e.g. "
               "lambda0.01 (round 1)")

_GOAL = re.compile(r"goal-([a-z]+)-([a-z_]+)")
_LAMBDA = re.compile(r"lambda(\d+(?:\.\d+)?(?:e-?\d+)?)")


@dataclass(frozen=True)
class Arm:
    """One arm: its name (also its folder and published model name), its round and overrides."""

    name: str
    round: int
    #: round 2: ``round2`` section keys; round 1: dotted config keys (``train.loss``).
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The name tables show."""
        if self.name in LABELS:
            return LABELS[self.name]
        if self.name.startswith("goal-"):
            return f"GOAL ({self.overrides['goal.triplet']} x {self.overrides['goal.pair']})"
        return f"label term, lambda = {self.overrides['train.label_lambda']:g}"

    @property
    def folder(self) -> str:
        """Its training folder under the run folder."""
        if self.round == 1:
            return f"round1-{self.name}"
        return "round2" if self.name == "aoq" else f"round2-{self.name}"

    def config(self, cfg: ExperimentConfig) -> ExperimentConfig:
        """The run config with this arm's overrides applied (validated)."""
        if self.round == 2:
            r2 = Round2Config.model_validate({**cfg.round2.model_dump(), **self.overrides})
            return cfg.model_copy(update={"round2": r2})
        return config_from_dict(cfg.model_dump(mode="json"), [f"{k}={v}" for k, v in self.overrides.items()],
                                source=f"arm {self.name}")


def resolve_arm(name: str) -> Arm:
    """The arm called ``name``.

    Raises:
        ValueError: an unknown name (the message lists what is accepted).
    """
    if name in ROUND2_ARMS:
        return Arm(name, 2, dict(ROUND2_ARMS[name]))
    goal = _GOAL.fullmatch(name)
    if goal and goal[1] in GOAL_TRIPLETS and goal[2] in GOAL_PAIRS:
        return Arm(name, 1, {"train.loss": "goal", "goal.triplet": goal[1], "goal.pair": goal[2]})
    weight = _LAMBDA.fullmatch(name)
    if weight:
        return Arm(name, 1, {"train.label_lambda": float(weight[1])})
    raise ValueError(f"unknown arm {name!r}; choose from {ARM_CHOICES}")


def resolve_arms(names: list[str] | tuple[str, ...]) -> list[Arm]:
    """Every named arm, in order.

    Raises:
        ValueError: no name, a repeated name or an unknown one.
    """
    if not names:
        raise ValueError(f"no arm given; choose from {ARM_CHOICES}")
    if len(set(names)) != len(names):
        raise ValueError(f"arm(s) named twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    return [resolve_arm(n) for n in names]


def arm_label(name: str) -> str:
    """The display name of an arm or of ``baseline``."""
    return LABELS["baseline"] if name == "baseline" else resolve_arm(name).label
