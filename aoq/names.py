"""The names of the losses and their options, spelled once: the config, the CLI, the loss registry and the
REST contract use these."""

from __future__ import annotations

from typing import Literal, get_args

#: round 1: the in-batch losses, and ``goal``, a gradient objective (docs/goal.md)
Round1Loss = Literal["max_violation", "sum", "smooth_ap", "infonce", "goal"]
Round2Loss = Literal["offline_triplet", "offline_quintuplet", "adaptive_offline_quintuplet"]
#: round 2: the paper's ablations (Table 3): drop the online terms, derived pairs from online
#: negatives, the adaptive weight from S(i,t) instead of the offline score
Round2Variant = Literal["none", "only_offline", "online_quin", "no_offline_adapt"]
#: round 2 starts from fresh weights (the paper) or from the round-1 model (Table 3 "Finetune")
Round2Init = Literal["scratch", "finetune"]
#: GOAL's triplet weight and pair weight (docs/goal.md)
GoalTriplet = Literal["con", "nca", "cir"]
GoalPair = Literal["con", "lin", "sig", "lin_ms", "sig_ms"]
#: the false-negative filters of the mined lists, in the order they apply (docs/method.md, False negatives)
FalseNegativeFilter = Literal["identity", "semantic", "teacher"]
#: which (image, caption) pairs count as matches in evaluation: each caption's own image (the
#: published protocol), or also every image with a caption of the same text (docs/evaluation.md)
PositiveRule = Literal["pair", "text"]
#: query-time hubness correction of a search or an evaluation (docs/serving.md, Hubness correction):
#: raw scores, QB-Norm's dynamic inverted softmax, or the inverted softmax on every query
Normalisation = Literal["none", "qbnorm", "invsoftmax"]
#: the ``model.image_encoder`` values of the cross-attention models (no embedding; scored per pair)
CROSS_ATTENTION_ENCODERS = ("scan", "bfan")
ROUND1_LOSSES: tuple[str, ...] = get_args(Round1Loss)
ROUND2_LOSSES: tuple[str, ...] = get_args(Round2Loss)
ROUND2_VARIANTS: tuple[str, ...] = get_args(Round2Variant)
ROUND2_INITS: tuple[str, ...] = get_args(Round2Init)
GOAL_TRIPLETS: tuple[str, ...] = get_args(GoalTriplet)
GOAL_PAIRS: tuple[str, ...] = get_args(GoalPair)
POSITIVE_RULES: tuple[str, ...] = get_args(PositiveRule)
NORMALISATIONS: tuple[str, ...] = get_args(Normalisation)
FALSE_NEGATIVE_FILTERS: tuple[str, ...] = get_args(FalseNegativeFilter)
