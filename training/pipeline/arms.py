"""The models a pipeline trains beside its baseline ("arms"), by name.

Two kinds share one namespace, so that ``aoq pipeline --arms`` and ``aoq report --arms`` can put
them in one comparison:

* **round-2 arms** (``aoq``, ``offtri``, ...): trained from scratch (or fine-tuned) with the
  offline negatives mined by the baseline; their overrides apply to the ``round2`` section.
  ``aoq-fn-<filters>`` trains AOQ on lists mined with false-negative filters, ``<filters>`` being
  ``+``-joined ``identity``, ``semantic<tau>``, ``teacher<rho>`` (e.g. ``aoq-fn-identity+semantic0.9``);
  ``-by-<round-1 arm>`` mines with that arm's model instead of the baseline (e.g.
  ``aoq-by-goal-cir-con``, ``aoq-fn-identity-by-goal-cir-con``). Such an arm has its own mined
  lists (``mined-<spec>``), shared by the arms that ask for the same ones.
* **round-1 arms**: trained like the baseline, from scratch and without mined negatives, with
  other ``train``/``goal`` settings: ``goal-<triplet>-<pair>`` (a GOAL objective, docs/goal.md)
  and ``lambda<x>`` (the label-prediction term with weight x, docs/training.md). Their
  overrides are dotted config keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

from aoq.config import ExperimentConfig, GoalConfig, MiningConfig, Round2Config, config_from_dict
from aoq.names import FALSE_NEGATIVE_FILTERS

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
ARM_CHOICES = (f"{', '.join(ROUND2_ARMS)}, aoq-fn-<filters>[-by-<round-1 arm>] with filters identity, "
               "semantic<tau>, teacher<rho> joined by +, aoq-by-<round-1 arm> (round 2); goal-<triplet>-<pair> "
               f"with triplet in {'/'.join(GOAL_TRIPLETS)} and pair in {'/'.join(GOAL_PAIRS)}; lambda<weight>, e.g. "
               "lambda0.01 (round 1)")

_NUMBER = r"\d+(?:\.\d+)?(?:e-?\d+)?"
_GOAL = re.compile(r"goal-([a-z]+)-([a-z_]+)")
_LAMBDA = re.compile(rf"lambda({_NUMBER})")
_MINED = re.compile(r"aoq(?:-fn-([a-z0-9.+]+))?(?:-by-(.+))?")
_FILTER = re.compile(rf"(identity)|(semantic)({_NUMBER})|(teacher)({_NUMBER})")


@dataclass(frozen=True)
class Arm:
    """One arm: its name (also its folder and published model name), its round and overrides."""

    name: str
    round: int
    #: round 2: ``round2`` section keys; round 1: dotted config keys (``train.loss``).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: round 2: ``mining`` section keys of the arm's own mined lists (false-negative filters)
    mining: dict[str, Any] = field(default_factory=dict)
    #: round 2: the round-1 arm whose model mines the arm's lists (None: the baseline)
    teacher: str | None = None

    @property
    def mined_folder(self) -> str:
        """The folder of the mined lists the arm trains on: the baseline's ``mined``, or one named
        by the filters (in their fixed order) and the mining model, shared by arms that ask for
        the same lists."""
        if not self.mining and self.teacher is None:
            return "mined"
        params = {"semantic": self.mining.get("semantic_tau"), "teacher": self.mining.get("teacher_rho")}
        spec = "+".join(f"{f}{params.get(f) or ''}" for f in self.mining.get("filters", []))
        return "mined" + (f"-fn-{spec}" if spec else "") + (f"-by-{self.teacher}" if self.teacher else "")

    @property
    def label(self) -> str:
        """The name tables show."""
        if self.name in LABELS:
            return LABELS[self.name]
        if self.name.startswith("goal-"):
            return f"GOAL ({self.overrides['goal.triplet']} x {self.overrides['goal.pair']})"
        if self.round == 2:
            parts = [_filter_label(self.mining)] if self.mining else []
            parts += [f"mined by {arm_label(self.teacher)}"] if self.teacher else []
            return f"AdapOffQuin, {', '.join(parts)}"
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
            mining = MiningConfig.model_validate({**cfg.mining.model_dump(), **self.mining})
            return cfg.model_copy(update={"round2": r2, "mining": mining})
        return config_from_dict(cfg.model_dump(mode="json"), [f"{k}={v}" for k, v in self.overrides.items()],
                                source=f"arm {self.name}")


def resolve_arm(name: str) -> Arm:
    """The arm called ``name``.

    Raises:
        ValueError: an unknown name (the message lists what is accepted).
    """
    if name in ROUND2_ARMS:
        return Arm(name, 2, dict(ROUND2_ARMS[name]))
    mined = _MINED.fullmatch(name)
    if mined and (mined[1] or mined[2]):
        teacher = mined[2]
        if teacher is not None and (teacher == "baseline" or resolve_arm(teacher).round != 1):
            raise ValueError(f"arm {name!r}: -by- names a round-1 arm (e.g. goal-cir-con), not {teacher!r}")
        return Arm(name, 2, {}, _filters(name, mined[1]) if mined[1] else {}, teacher)
    goal = _GOAL.fullmatch(name)
    if goal and goal[1] in GOAL_TRIPLETS and goal[2] in GOAL_PAIRS:
        return Arm(name, 1, {"train.loss": "goal", "goal.triplet": goal[1], "goal.pair": goal[2]})
    weight = _LAMBDA.fullmatch(name)
    if weight:
        return Arm(name, 1, {"train.label_lambda": float(weight[1])})
    raise ValueError(f"unknown arm {name!r}; choose from {ARM_CHOICES}")


def _filters(name: str, spec: str) -> dict[str, Any]:
    """The ``mining`` keys of ``identity+semantic0.9+teacher0.95``, filters in the fixed order."""
    keys: dict[str, Any] = {"filters": []}
    for item in spec.split("+"):
        match = _FILTER.fullmatch(item)
        if match is None:
            raise ValueError(f"arm {name!r}: unknown filter {item!r}; use identity, semantic<tau> or teacher<rho>")
        filter_name = match[1] or match[2] or match[4]
        if filter_name in keys["filters"]:
            raise ValueError(f"arm {name!r}: filter {filter_name} named twice")
        keys["filters"].append(filter_name)
        if match[2]:
            keys["semantic_tau"] = float(match[3])
        if match[4]:
            keys["teacher_rho"] = float(match[5])
    keys["filters"] = [f for f in FALSE_NEGATIVE_FILTERS if f in keys["filters"]]
    return keys


def _filter_label(mining: dict[str, Any]) -> str:
    shown = {"identity": "identity", "semantic": f"semantic tau={mining.get('semantic_tau', '')}",
             "teacher": f"teacher rho={mining.get('teacher_rho', '')}"}
    return "filters " + " + ".join(shown[f] for f in mining["filters"])


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
