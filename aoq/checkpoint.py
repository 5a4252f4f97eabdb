"""Model checkpoints: one directory, written atomically, checked when read.

Layout::

    <ckpt>/model.safetensors   the weights (no pickle)
    <ckpt>/config.json         the whole ExperimentConfig of the run
    <ckpt>/vocab.json          the vocabulary the text encoder was trained with
    <ckpt>/metrics.json        e.g. the dev metrics the checkpoint was selected on
    <ckpt>/extra.json          img_dim, image_input, resnet_arch, backbones (package, version and
                               weights SHA-256 of each pretrained backbone), plus caller fields
                               (role, epoch, ...)
    <ckpt>/manifest.json       kind "checkpoint", per-file SHA-256 and the content hash

Frozen pretrained backbone weights are not saved (``JointModel.state_dict`` leaves them out):
they are read from their packages at load time, after checking the recorded identity.

The content hash identifies the checkpoint: later stages (mining, indexes) key their caches on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aoq.config import ExperimentConfig
from aoq.data.vocab import Vocabulary
from aoq.device import resolve_device
from aoq.io import ArtefactError, atomic_dir, parse_json, read_manifest, write_manifest
from aoq.models.joint import JointModel, build_model, vocabulary_from_dict
from aoq.models.packages import PretrainedPackageError

KIND = "checkpoint"
WEIGHTS = "model.safetensors"


class CheckpointError(ArtefactError):
    """A checkpoint is missing, corrupted, truncated, of the wrong kind or does not fit its config."""


@dataclass
class Checkpoint:
    """A loaded checkpoint; ``model`` is on the requested device, in eval mode."""

    model: JointModel
    config: ExperimentConfig
    vocab: Vocabulary
    metrics: dict
    extra: dict
    content_hash: str
    path: Path


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_checkpoint(
    path: str | Path,
    model: JointModel,
    config: ExperimentConfig,
    vocab: Vocabulary,
    metrics: dict,
    extra: dict | None = None,
) -> str:
    """Write a checkpoint directory atomically (an existing one is replaced as a whole).

    Returns:
        The content hash recorded in the manifest.
    """
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    info = {
        "img_dim": model.img_dim,
        "image_input": model.image_input,
        "resnet_arch": model.resnet_arch,
        "backbones": model.backbone_identities(),
        "n_labels": model.n_labels,
        **(extra or {}),
    }
    config_tree = config.model_dump(mode="json")
    with atomic_dir(path) as tmp:
        save_file(state, str(tmp / WEIGHTS))
        _write_json(tmp / "config.json", config_tree)
        _write_json(tmp / "vocab.json", vocab.to_dict())
        _write_json(tmp / "metrics.json", metrics)
        _write_json(tmp / "extra.json", info)
        manifest = write_manifest(tmp, KIND, config_tree)
    return manifest["content_hash"]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the checkpoint")
    return parse_json(path, CheckpointError)


def _check_fits(model: JointModel, state: dict[str, torch.Tensor], weights: Path) -> None:
    """Raise a readable error when the saved tensors do not match the model the config builds."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k].shape
    )
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}")
    if wrong:
        problems.append(f"shape mismatch {'; '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}")
    if problems:
        raise CheckpointError(
            f"{weights}: weights do not fit the model described by config.json ({'; '.join(problems)})"
        )


def _check_backbones(model: JointModel, recorded: dict, source: Path) -> None:
    """The installed pretrained weights must be the ones the checkpoint was trained on."""
    from aoq.models.pretrained import backbone_mismatch

    installed = model.backbone_identities()
    for name in sorted(set(recorded) | set(installed)):
        if recorded.get(name) != installed.get(name):
            raise CheckpointError(backbone_mismatch(f"{source} ({name} backbone)", recorded.get(name) or {},
                                                    installed.get(name) or {}))


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """Verify and load a checkpoint directory.

    Raises:
        CheckpointError: naming the file that is missing, corrupted, truncated, of the wrong
            artefact kind, or whose weights do not fit the model its config describes.
    """
    path = Path(path)
    try:
        manifest = read_manifest(path, kind=KIND)
    except ArtefactError as exc:
        raise CheckpointError(str(exc)) from None
    config_path = path / "config.json"
    try:
        config = ExperimentConfig.model_validate(_read_json(config_path))
    except ValidationError as exc:
        raise CheckpointError(f"{config_path}: not a valid run configuration ({exc.error_count()} problems)") from None
    vocab_path = path / "vocab.json"
    try:
        vocab = vocabulary_from_dict(_read_json(vocab_path), source=str(vocab_path))
    except CheckpointError:
        raise
    except (ArtefactError, PretrainedPackageError) as exc:
        raise CheckpointError(str(exc)) from None
    metrics = _read_json(path / "metrics.json")
    extra = _read_json(path / "extra.json")
    weights = path / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing from the checkpoint")
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights}: cannot read the weights ({exc})") from None
    try:
        model = build_model(
            config.model,
            len(vocab),
            extra.get("img_dim"),
            resnet_arch=extra.get("resnet_arch"),
            n_labels=extra.get("n_labels"),
        )
    except (ValueError, ImportError, ArtefactError) as exc:
        raise CheckpointError(f"{path / 'extra.json'}: cannot rebuild the model ({exc})") from None
    _check_backbones(model, extra.get("backbones") or {}, path / "extra.json")
    _check_fits(model, state, weights)
    model.load_state_dict(state)
    model.to(resolve_device(device)).eval()
    return Checkpoint(
        model=model,
        config=config,
        vocab=vocab,
        metrics=metrics,
        extra=extra,
        content_hash=manifest["content_hash"],
        path=path,
    )
