"""The names of the losses, spelled once: the config, the CLI, the loss registry and the REST contract use these."""

from __future__ import annotations

from typing import Literal, get_args

#: round 1: the in-batch losses, and ``goal``, a gradient objective (docs/goal.md)
Round1Loss = Literal["max_violation", "sum", "smooth_ap", "infonce", "goal"]
Round2Loss = Literal["offline_triplet", "offline_quintuplet", "adaptive_offline_quintuplet"]
ROUND1_LOSSES: tuple[str, ...] = get_args(Round1Loss)
ROUND2_LOSSES: tuple[str, ...] = get_args(Round2Loss)
