"""Round 2: train a model with offline hard negatives (paper Eq. 3-5 and the Table 3 ablations).

Each training caption ``c`` of image ``i`` is one positive pair ``(i, t)``. Every epoch draws,
for every caption, the four offline items of :mod:`aoq_train.round2.sampling` from the mined lists
(``t_off``, ``i_off``, ``t~_off``, ``i~_off``), as a pure function of (``round2.seed``, epoch), so
a resumed epoch sees the same negatives. A batch of B pairs is collated as

    images   = [i_1..i_B | i_off_1..i_off_B | i~_off_1..i~_off_B]      (3B items)
    captions = [t_1..t_B | t_off_1..t_off_B | t~_off_1..t~_off_B]      (3B items)

and the step encodes them in one forward call of the model, which keeps the groups apart for an
encoder with batch statistics (:func:`aoq.models.joint.encode_groups`), then reads every score from these
embeddings: the (B, B) in-batch matrix ``S(i_a, t_b)`` plus the row-wise dot products
``i2t_off = S(i, t_off)``, ``t2i_off = S(i_off, t)``, ``off_pair = S(i_off, t_off)`` and
``off_pair_tilde = S(i~_off, t~_off)``. The loss is :func:`aoq_train.objectives.losses.round2_loss` with
``round2.loss`` / ``round2.variant`` and the margins, alpha and beta of the config. When the
derived pairs are not used (``offline_triplet``, or ``online_quin`` which derives them from the
batch) the ``~`` items are neither loaded nor encoded (2B items per modality).

The mined lists may come from any checkpoint (a "teacher", e.g. mined with vse, trained with
vsrn): round 2 only reads their ids. ``round2.init``: ``scratch`` (default, the paper's choice)
builds a fresh model; ``finetune`` starts from the weights of ``round2.init_from``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset

from aoq.backbone_cache import input_modes, with_backbone_features
from aoq.checkpoint import load_checkpoint
from aoq.config import ConfigError, ExperimentConfig, Round2Config
from aoq.data.dataset import SplitData
from aoq.data.load import load_split
from aoq.data.loaders import (
    CaptionDataset,
    ImageDataset,
    ImageMode,
    TextMode,
    pad_tokens,
)
from aoq.data.vocab import Vocabulary
from aoq.device import autocast, full_precision, resolve_device, seed_everything
from aoq.io import ArtefactError, atomic_write_json
from aoq.mined import MinedNegatives, load_mined
from aoq.models.joint import JointModel, build_model, text_vocabulary
from aoq_train.loop import distributed
from aoq_train.loop.batches import epoch_loader
from aoq_train.round2.depth import Depths, checked_depths
from aoq_train.evaluate import dev_validator
from aoq_train.objectives.losses import round2_loss
from aoq_train.round2.sampling import CaptionTrueOf, DrawKey, OfflineNegatives, sample_offline_negatives
from aoq_train.loop.trainer import StepFn, TrainResult, fit

log = logging.getLogger(__name__)


def uses_derived_pairs(r2: Round2Config) -> bool:
    """Whether the loss reads ``off_pair_tilde`` (so the ``~`` items must be loaded and encoded)."""
    return r2.loss != "offline_triplet" and r2.variant != "online_quin"


def epoch_negatives(
    mined: MinedNegatives, r2: Round2Config, depths: Depths, epoch: int,
    caption_true_of: CaptionTrueOf | None = None,
) -> OfflineNegatives:
    """The offline items of every training caption for ``epoch`` at the run's ``depths``: a pure
    function of the seed (and of the facts, when ``caption_true_of`` filters false negatives)."""
    return sample_offline_negatives(
        np.arange(mined.cap_top_imgs.shape[0]), mined.img_top_caps, mined.cap_top_imgs, depths.h_t, depths.h_i,
        DrawKey(r2.seed, epoch), r2.sampling, center=r2.normal_center, scale=r2.normal_scale,
        caption_true_of=caption_true_of,
    )


def false_negative_check(train: SplitData, r2: Round2Config) -> CaptionTrueOf | None:
    """The oracle of ``round2.false_negative_filter`` (not in the paper), or None when it is off:
    the split's structured facts (the synthetic benchmark records them), which say exactly which
    mined captions are true of an anchor. The filters that need no ground truth are
    ``mining.filters`` (docs/method.md, False negatives).

    Raises:
        ConfigError: the filter is on and the split has no structured facts.
    """
    if not r2.false_negative_filter:
        return None
    if train.facts is None:
        raise ConfigError(f"{train.source}: round2.false_negative_filter needs the structured facts of the synthetic "
                          "benchmark; on other data filter the mined lists instead (mining.filters, e.g. [identity, "
                          "semantic])")
    return train.facts.caption_true_of


class Round2Dataset(Dataset):
    """One item per training caption: the positive pair and its offline items of this epoch.

    Call :meth:`set_negatives` before each epoch. Items are tuples
    ``(images, token sequences, caption id, image id)`` where ``images`` holds
    ``(i, i_off[, i~_off])`` and ``token sequences`` ``(t, t_off[, t~_off])``.
    """

    def __init__(
        self, split: SplitData, vocab: Vocabulary, image_mode: ImageMode = "features", image_size: int = 64,
        derived: bool = True, text_mode: TextMode = "tokens",
    ) -> None:
        self.split, self.derived = split, derived
        self.images = ImageDataset(split, image_mode, image_size)
        self.captions = CaptionDataset(split, vocab, text_mode)
        self.negatives: OfflineNegatives | None = None

    def set_negatives(self, negatives: OfflineNegatives) -> None:
        if len(negatives.t_off) != self.split.n_captions:
            raise ValueError(f"{len(negatives.t_off)} sampled negatives for {self.split.n_captions} captions")
        self.negatives = negatives

    def __len__(self) -> int:
        return self.split.n_captions

    def __getitem__(self, c: int) -> tuple[list[Tensor], list[Tensor], int, int]:
        if self.negatives is None:
            raise RuntimeError("Round2Dataset.set_negatives() must be called before reading items")
        neg, i = self.negatives, c // self.split.captions_per_image
        image_ids = [i, int(neg.i_off[c])] + ([int(neg.i_off_tilde[c])] if self.derived else [])
        caption_ids = [c, int(neg.t_off[c])] + ([int(neg.t_off_tilde[c])] if self.derived else [])
        return [self.images[j][0] for j in image_ids], [self.captions[t][0] for t in caption_ids], c, i


def collate_round2(batch: list[tuple[list[Tensor], list[Tensor], int, int]]) -> dict[str, Tensor]:
    """Stack a batch group by group: ``images`` (kB, ...) = [positives | i_off | i~_off],
    ``tokens`` (kB, L) / ``lengths`` (kB,) likewise for captions (k = 3, or 2 without the ``~``
    items), ``caption_ids`` / ``image_ids`` (B,) of the positives."""
    images, captions, caption_ids, image_ids = zip(*batch)
    groups = len(images[0])
    tokens, lengths = pad_tokens([item[g] for g in range(groups) for item in captions])
    return {
        "images": torch.stack([item[g] for g in range(groups) for item in images]),
        "tokens": tokens,
        "lengths": lengths,
        "caption_ids": torch.tensor(caption_ids, dtype=torch.long),
        "image_ids": torch.tensor(image_ids, dtype=torch.long),
    }


def round2_scores(img_emb: Tensor, cap_emb: Tensor, batch: int, *, model: JointModel | None = None,
                  lengths: Tensor | None = None) -> dict[str, Tensor]:
    """All the scores of a round-2 batch from the encoded groups of :func:`collate_round2`.

    Args:
        img_emb: (kB, ...) encodings of [i | i_off (| i~_off)].
        cap_emb: (kB, ...) encodings of [t | t_off (| t~_off)].
        batch: B.
        model: score with its ``pair_scores`` / ``aligned_scores`` (a cross-attention model needs
            this, with ``lengths``); None: dot products of embeddings.
        lengths: (kB,) caption lengths, with ``model``.

    Returns:
        ``scores`` (B, B) and the (B,) vectors ``i2t_off``, ``t2i_off``, ``off_pair`` and, with
        three groups, ``off_pair_tilde``.
    """
    img, cap = img_emb.split(batch), cap_emb.split(batch)
    if model is None:
        def pairs(i: int, t: int) -> Tensor:
            return img[i] @ cap[t].T

        def aligned(i: int, t: int) -> Tensor:
            return (img[i] * cap[t]).sum(dim=1)
    else:
        lens = lengths.split(batch)

        def pairs(i: int, t: int) -> Tensor:
            return model.pair_scores(img[i], cap[t], lens[t])

        def aligned(i: int, t: int) -> Tensor:
            return model.aligned_scores(img[i], cap[t], lens[t])

    out = {"scores": pairs(0, 0), "i2t_off": aligned(0, 1), "t2i_off": aligned(1, 0), "off_pair": aligned(1, 1)}
    if len(img) == 3:
        out["off_pair_tilde"] = aligned(2, 2)
    return out


def round2_step(r2: Round2Config) -> StepFn:
    """The trainer's ``step``: the groups encoded by the model's forward (apart where an encoder
    uses batch statistics, :func:`aoq.models.joint.encode_groups`), the
    scores, ``round2.loss``.

    Stats: ``pos`` (mean positive score), ``hardest_neg`` (mean hardest in-batch negative image
    of a caption), ``i2t_off`` / ``t2i_off`` (mean offline negative scores) and, with the derived
    pairs, ``derived_active`` (share of the derived-pair hinges ``[g2 - S(i, t) + S(i~, t~)]+``
    that are active: how often the ``~`` pairs still add a gradient).
    """

    def step(model: JointModel, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        device = next(model.parameters()).device
        b = batch["caption_ids"].shape[0]
        groups = batch["images"].shape[0] // b
        images = batch["images"].to(device, non_blocking=True)
        tokens, lengths = batch["tokens"].to(device, non_blocking=True), batch["lengths"].to(device)
        # One forward call (under torchrun DDP syncs gradients only through forward); the model keeps
        # the groups apart where an encoder uses batch statistics. Scores in full precision whatever
        # the autocast.
        with autocast(device, r2.precision):
            img, cap = model(images, tokens, lengths, groups)
        img, cap = full_precision(img), full_precision(cap)
        if isinstance(model, DistributedDataParallel):  # the global batch, gathered group by group
            img, cap = distributed.gather_groups(img, groups), distributed.gather_groups(cap, groups)
            lengths = distributed.gather_groups(lengths, groups)
            b = img.shape[0] // groups
        s = round2_scores(img, cap, b, model=distributed.unwrap(model), lengths=lengths)
        derived = (s["off_pair"], s["off_pair_tilde"]) if "off_pair_tilde" in s else (None, None)
        loss = round2_loss(
            s["scores"], s["i2t_off"], s["t2i_off"], *derived, loss=r2.loss, variant=r2.variant,
            margin_online=r2.margin_online, margin_offline=r2.margin_offline, alpha=r2.alpha, beta=r2.beta,
        )
        with torch.no_grad():
            scores = s["scores"]
            eye = torch.eye(b, dtype=torch.bool, device=scores.device)
            stats = {
                "pos": float(scores.diagonal().mean()),
                "hardest_neg": float(scores.masked_fill(eye, -2.0).amax(dim=0).mean()),
                "i2t_off": float(s["i2t_off"].mean()),
                "t2i_off": float(s["t2i_off"].mean()),
            }
            if "off_pair_tilde" in s:
                hinge = r2.margin_offline - scores.diagonal() + s["off_pair_tilde"]
                stats["derived_active"] = float((hinge > 0).double().mean())
        return loss, stats

    return step


def _check_mined(mined: MinedNegatives, train: SplitData, r2: Round2Config) -> Depths:
    """The run's depths, once the lists are known to be of this split and deep enough for them."""
    shape = (mined.img_top_caps.shape[0], mined.cap_top_imgs.shape[0])
    if shape != (train.n_images, train.n_captions):
        raise ArtefactError(
            f"{mined.path}: mined for {shape[0]} images / {shape[1]} captions, but the training split "
            f"{train.source} has {train.n_images} / {train.n_captions}; mine this dataset (aoq mine)"
        )
    return checked_depths(mined.img_top_caps, mined.cap_top_imgs, r2, mined.path)


def _guard_mined_identity(run_dir: Path, mined: MinedNegatives) -> None:
    """A run resumes only with the mined lists it started with (they are not in the config)."""
    record = run_dir / "mined.json"
    identity = {"content_hash": mined.manifest["content_hash"], "path": str(mined.path)}
    if record.is_file():
        saved = json.loads(record.read_text())
        if saved.get("content_hash") != identity["content_hash"]:
            raise ConfigError(
                f"{run_dir}: started with mined negatives {saved.get('path')} ({saved.get('content_hash', '')[:12]}), "
                f"now given {mined.path} ({identity['content_hash'][:12]}); use another output folder"
            )
    else:
        atomic_write_json(record, identity)


def _initial_model(cfg: ExperimentConfig, train: SplitData) -> tuple[JointModel, Vocabulary, dict[str, Any]]:
    """A fresh model (scratch) or the ``round2.init_from`` weights (finetune), seeded."""
    r2 = cfg.round2
    seed_everything(r2.seed)
    if r2.init == "scratch":
        vocab = text_vocabulary(cfg.model, train.captions, cfg.data.vocab_threshold)
        return build_model(cfg.model, len(vocab), train.feature_dim), vocab, {"init": "scratch"}
    if not r2.init_from:
        raise ConfigError("round2.init=finetune needs round2.init_from (the round-1 checkpoint; --init-from)")
    ckpt = load_checkpoint(r2.init_from)
    if ckpt.config.model != cfg.model:
        raise ConfigError(
            f"{r2.init_from}: finetune needs the same model section; checkpoint has "
            f"{ckpt.config.model.model_dump()}, config has {cfg.model.model_dump()}"
        )
    return ckpt.model.train(), ckpt.vocab, {"init": "finetune", "init_from": str(r2.init_from),
                                            "init_hash": ckpt.content_hash}


def train_round2(
    cfg: ExperimentConfig,
    mined_dir: str | Path,
    run_dir: str | Path | None = None,
    *,
    progress_bar: bool = True,
) -> TrainResult:
    """Read the data and the mined lists, build the model, and :func:`aoq_train.loop.trainer.fit` round 2.

    Args:
        cfg: the run configuration (``data``, ``model`` and ``round2`` sections are used).
        mined_dir: a mined-negatives artefact of the training split (``aoq mine``).
        run_dir: default ``<cfg.run_dir>/round2``.

    Raises:
        ArtefactError: the mined artefact is damaged or belongs to another split.
        ConfigError: ``round2.h_t``/``h_i`` deeper than the mined lists, a finetune without a
            usable ``init_from``, or a resumed run given other mined lists.
    """
    r2 = cfg.round2
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir / "round2"
    train = load_split(cfg.data, "train")
    dev = load_split(cfg.data, "dev")
    mined = load_mined(mined_dir)
    depths = _check_mined(mined, train, r2)
    _guard_mined_identity(run_dir, mined)
    model, vocab, init = _initial_model(cfg, train)
    model = model.to(resolve_device(distributed.device_for(r2.device, distributed.current())))
    train = with_backbone_features(model, train, vocab, progress=progress_bar)
    dev = with_backbone_features(model, dev, vocab, progress=progress_bar)
    image_mode, text_mode = input_modes(model)
    dataset = Round2Dataset(train, vocab, image_mode, cfg.data.image_size, uses_derived_pairs(r2), text_mode)

    true_of = false_negative_check(train, r2)

    def make_loader(epoch: int, generator: torch.Generator, skip: int):
        negatives = epoch_negatives(mined, r2, depths, epoch, true_of)
        if true_of is not None:
            log.info("round 2 epoch %d: %d offline draws redrawn as false negatives, %d still false negatives",
                     epoch + 1, negatives.filtered, negatives.false_negatives)
        if negatives.collisions:
            log.warning("round 2 epoch %d: %d derived pairs are positives (h_i=1)", epoch + 1, negatives.collisions)
        dataset.set_negatives(negatives)
        return epoch_loader(dataset, r2.batch_size, collate_round2, generator, skip, r2.num_workers)

    extra = {
        "loss": r2.loss,
        "variant": r2.variant,
        "h_t": depths.h_t,
        "h_i": depths.h_i,
        **init,
        "mined": str(mined.path),
        "mined_hash": mined.manifest["content_hash"],
        "teacher_hash": mined.checkpoint_hash,
        "teacher_model": mined.manifest.get("teacher_model"),
    }
    return fit(run_dir, cfg, r2, model, vocab, make_loader, round2_step(r2),
               dev_validator(dev, vocab, image_size=cfg.data.image_size, positives=cfg.eval.positives),
               role="round2", extra=extra,
               progress_bar=progress_bar)
