"""Round 1: train a matching model with an in-batch loss (the baseline of every AOQ experiment).

A batch holds B positive pairs (image, caption), one item per training caption, so
``scores = img_emb @ cap_emb.T`` has the positives on its diagonal and the loss is
``train.loss`` (max_violation = VSE++, sum, smooth_ap, infonce) from :mod:`aoq_train.objectives.losses`, or
``goal``, the gradient objective of the ``goal`` section (:mod:`aoq_train.objectives.goal`). With
``train.label_lambda > 0`` the label-prediction term of :mod:`aoq_train.objectives.labels` is added.

With 5 captions per image a batch may hold two captions of the same image; the off-diagonal
entry between them is then a true match treated as a negative. VSE++ and the public AOQ code
ignore this (with 113K COCO images and B=128 it is rare), and so does this module.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from aoq.backbone_cache import input_modes, with_backbone_features
from aoq.config import ConfigError, ExperimentConfig, GoalConfig, TrainConfig
from aoq.data.dataset import label_vocabulary, multi_hot
from aoq.data.load import load_split
from aoq.data.loaders import PairDataset, collate_pairs
from aoq.device import autocast, full_precision, resolve_device, seed_everything
from aoq.models.joint import JointModel, build_model, text_vocabulary
from aoq_train.loop import distributed
from aoq_train.loop.batches import epoch_loader
from aoq_train.evaluate import dev_validator
from aoq_train.objectives.goal import GoalSpec, goal_objective
from aoq_train.objectives.labels import label_prediction_loss
from aoq_train.objectives.losses import round1_loss
from aoq_train.loop.trainer import StepFn, TrainResult, fit


def goal_spec(goal_cfg: GoalConfig) -> GoalSpec:
    """The :class:`aoq_train.objectives.goal.GoalSpec` of a run's ``goal`` section."""
    return GoalSpec(**goal_cfg.model_dump())


def round1_step(
    train_cfg: TrainConfig, goal_cfg: GoalConfig | None = None, label_targets: Tensor | None = None
) -> StepFn:
    """The trainer's ``step``: encode a :func:`collate_pairs` batch, score it, apply ``train.loss``.

    Args:
        train_cfg: the ``train`` section (loss, margin, tau, label_lambda).
        goal_cfg: the ``goal`` section, used when ``train.loss == "goal"`` (default: its defaults).
        label_targets: (n_images, L) multi-hot labels of the training images, needed when
            ``train.label_lambda > 0`` (the model must then have a ``label_head``).

    Stats: ``pos`` (mean positive score) and ``hardest_neg`` (mean over captions of the
    highest negative-image score), to watch the margin open up; ``label_bce`` with the label term.
    """
    spec = goal_spec(goal_cfg or GoalConfig()) if train_cfg.loss == "goal" else None
    use_labels = train_cfg.label_lambda > 0
    if use_labels and label_targets is None:
        raise ValueError("train.label_lambda > 0 needs the label targets of the training images")

    def step(model: JointModel, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        device = next(model.parameters()).device
        # One forward call (both encoders): a DistributedDataParallel model syncs only that.
        with autocast(device, train_cfg.precision):
            img, cap = model(batch["images"].to(device, non_blocking=True),
                             batch["tokens"].to(device, non_blocking=True), batch["lengths"])
        # The loss sees the global batch under torchrun, in float32 whatever the precision.
        img, cap = distributed.gather_groups(full_precision(img)), distributed.gather_groups(full_precision(cap))
        lengths = distributed.gather_groups(batch["lengths"].to(device))
        scores = distributed.unwrap(model).pair_scores(img, cap, lengths)
        if spec is not None:
            loss = goal_objective(img, cap, spec)
        else:
            loss = round1_loss(train_cfg.loss, scores, margin=train_cfg.margin, tau=train_cfg.tau)
        stats: dict[str, float] = {}
        if use_labels:
            targets = label_targets[distributed.gather_groups(batch["image_ids"].to(device)).cpu()].to(device)
            head = distributed.unwrap(model).label_head
            label_loss = label_prediction_loss(head(img), head(cap), targets)
            loss = loss + train_cfg.label_lambda * label_loss
            stats["label_bce"] = float(label_loss.detach())
        with torch.no_grad():
            eye = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
            stats["pos"] = float(scores.diagonal().mean())
            stats["hardest_neg"] = float(scores.masked_fill(eye, -2.0).amax(dim=0).mean())
        return loss, stats

    return step


def train_round1(cfg: ExperimentConfig, run_dir: str | Path | None = None, *, progress_bar: bool = True) -> TrainResult:
    """Read the data, build vocabulary and model, and :func:`aoq_train.loop.trainer.fit` round 1.

    Args:
        cfg: the run configuration (``data``, ``model`` and ``train`` sections are used).
        run_dir: default ``<cfg.run_dir>/round1``.

    Returns:
        The trainer's result; ``result.best_dir`` is the baseline checkpoint.
    """
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir / "round1"
    train = load_split(cfg.data, "train")
    dev = load_split(cfg.data, "dev")
    vocab = text_vocabulary(cfg.model, train.captions, cfg.data.vocab_threshold)
    device = resolve_device(distributed.device_for(cfg.train.device, distributed.current()))
    labels, targets = None, None
    if cfg.train.label_lambda > 0:
        if train.labels is None:
            raise ConfigError(
                f"train.label_lambda={cfg.train.label_lambda} needs labels, but {train.source} has none "
                "(Karpathy JSON: a \"labels\" list per image; precomp: {split}_labels.json)"
            )
        labels = label_vocabulary(train.labels)
        targets = torch.from_numpy(multi_hot(train.labels, labels))
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model, len(vocab), train.feature_dim, n_labels=len(labels) if labels else None).to(device)
    # Frozen pretrained backbones: their features, cached once, stand in for pixels / tokens.
    train = with_backbone_features(model, train, vocab, progress=progress_bar)
    dev = with_backbone_features(model, dev, vocab, progress=progress_bar)
    image_mode, text_mode = input_modes(model)
    dataset = PairDataset(train, vocab, image_mode=image_mode, image_size=cfg.data.image_size, text_mode=text_mode)

    def make_loader(epoch: int, generator: torch.Generator, skip: int):
        return epoch_loader(dataset, cfg.train.batch_size, collate_pairs, generator, skip, cfg.train.num_workers)

    return fit(
        run_dir,
        cfg,
        cfg.train,
        model,
        vocab,
        make_loader,
        round1_step(cfg.train, cfg.goal, targets),
        dev_validator(dev, vocab, image_size=cfg.data.image_size, positives=cfg.eval.positives),
        role="round1",
        extra={"loss": cfg.train.loss, **({"labels": labels} if labels else {})},
        progress_bar=progress_bar,
    )
