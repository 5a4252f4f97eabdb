"""The trainer's resumable state: weights, optimiser, RNGs and counters, saved in one
atomic file, and the configuration fingerprint that guards a resume against a changed config."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aoq.config import ConfigError, ExperimentConfig
from aoq.io import ArtefactError, atomic_open, atomic_write_json

STATE_KIND = "trainer-state"
STATE_FILE = "state.pt"
#: config keys that do not change what is computed; a run may be resumed with them changed
#: (``epochs`` too, so a finished run can be extended).
#: "epochs", "patience": how long to train, not what an epoch computes (a run may be extended);
#: "collapse_epochs": a check, not part of the computation.
_RUNTIME_KEYS = ("device", "num_workers", "save_every_steps", "epochs", "patience", "collapse_epochs")



def fingerprint(cfg: ExperimentConfig) -> dict:
    """The configuration minus keys that do not change the computation (name, paths, devices)."""
    tree = cfg.model_dump(mode="json")
    tree.pop("name", None)
    tree.pop("out_dir", None)
    for section in tree.values():
        if isinstance(section, dict):
            for key in _RUNTIME_KEYS:
                section.pop(key, None)
    return tree


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} -> {b!r}"]


def _rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    random.setstate(state["python"])


@dataclass
class Progress:
    """Counters that must survive a crash together with the weights."""

    epoch: int = 0  # epochs finished
    step_in_epoch: int = 0
    global_step: int = 0
    best_rsum: float = -math.inf
    best_epoch: int = 0
    history: list[dict] = field(default_factory=list)
    epoch_generator_state: Tensor | None = None  # the data generator at the start of `epoch`
    # running sums of the unfinished epoch
    loss_sum: float = 0.0
    stat_sums: dict[str, float] = field(default_factory=dict)
    batch_time_sum: float = 0.0
    pairs: int = 0


def save_state(state_dir: Path, fingerprint: dict, model, optimizer, progress: Progress) -> None:
    """Write ``state/state.pt`` in one atomic rename (a directory swap would leave a moment with
    no state at all), then the human- and test-readable ``state/progress.json``."""
    with atomic_open(state_dir / STATE_FILE) as fh:
        torch.save(
            {
                "kind": STATE_KIND,
                "config": fingerprint,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": _rng_state(),
                "progress": progress.__dict__,
            },
            fh,
        )
    atomic_write_json(state_dir / "progress.json", {
        "epoch": progress.epoch, "step_in_epoch": progress.step_in_epoch, "global_step": progress.global_step,
    })


def load_state(state_dir: Path, fingerprint: dict, model, optimizer) -> Progress:
    path = state_dir / STATE_FILE
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file; all mean "unreadable"
        raise ArtefactError(f"{path}: cannot read the trainer state ({exc}); delete {state_dir} to start over") from None
    if not isinstance(saved, dict) or saved.get("kind") != STATE_KIND:
        raise ArtefactError(f"{path}: not a trainer state file")
    changed = _differences(saved["config"], fingerprint)
    if changed:
        raise ConfigError(
            f"{path}: saved by a run with another configuration ({'; '.join(changed[:6])}); "
            "use another output folder, or delete it to start over"
        )
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    _set_rng_state(saved["rng"])
    return Progress(**saved["progress"])
