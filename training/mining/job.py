"""From a checkpoint to the mined artefact: what ``aoq mine`` and the pipeline run."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aoq.config import ConfigError, Round2Config
from aoq.device import resolve_device
from aoq.io import (
    ArtefactError,
    atomic_save_npy,
    stamp_matches,
    write_stamp,
)
from aoq.mined import MinedNegatives, load_mined, save_mined
from aoq_train.mining.canonical import RULE
from aoq_train.mining.diagnostics import HardnessSettings, hardness_diagnostics
from aoq_train.mining.driver import mine_offline_negatives, product_precision
from aoq_train.mining.false_negatives import filter_inputs, filter_stats, filtered_lists
from aoq_train.mining.truth import detector_scores, list_shares, split_truth
from aoq_train.round2.depth import Depths, check_depths, round2_depths

log = logging.getLogger(__name__)


def _data_identity(data_cfg: Any, n_images: int, n_captions: int) -> dict[str, Any]:
    return {
        "format": data_cfg.format,
        "path": str(data_cfg.path),
        "split": data_cfg.train_split,
        "n_images": n_images,
        "n_captions": n_captions,
    }


def diagnostics_settings(r2: Round2Config, depths: Depths) -> HardnessSettings:
    """The settings of the hardness diagnostics: those of ``round2``, at its ``depths`` for the
    split (resolved once, :func:`aoq_train.round2.depth.round2_depths`)."""
    return HardnessSettings(
        batch_size=r2.batch_size, seed=r2.seed, depth=r2.depth, h_rel=r2.h_rel, h_t=depths.h_t, h_i=depths.h_i,
        sampling=r2.sampling, normal_center=r2.normal_center, normal_scale=r2.normal_scale,
        margin_online=r2.margin_online, margin_offline=r2.margin_offline, alpha=r2.alpha, beta=r2.beta,
    )


def _up_to_date(out: Path, want: dict[str, Any]) -> MinedNegatives | None:
    """The existing artefact at ``out`` if it was mined by the same checkpoint, data and H (its
    diagnostics may still be of other settings: see :func:`mine_with_checkpoint`)."""
    if not (out / "manifest.json").is_file():
        return None
    try:
        mined = load_mined(out)
    except ArtefactError as exc:
        log.warning("%s: re-mining, the existing artefact is unusable (%s)", out, exc)
        return None
    return mined if all(mined.manifest.get(key) == value for key, value in want.items()) else None


def _embeddings(ckpt: Any, split: Any, identity: dict, work: Path, device: torch.device, progress: bool):
    """Embed the split with the checkpoint, cached in ``work`` so a resumed job does not redo it."""
    from aoq.embed import encode_split

    key_file = work / "embeddings.json"
    key = {"checkpoint_hash": ckpt.content_hash, "data": identity}
    if stamp_matches(key_file, key):
        try:
            return np.load(work / "img_emb.npy"), np.load(work / "cap_emb.npy")
        except (OSError, ValueError):
            pass  # damaged outside our atomic writes: embed again
    ckpt.model.to(device)
    img, cap = encode_split(ckpt.model, ckpt.vocab, split, device=device,
                            image_size=ckpt.config.data.image_size, progress=progress)
    atomic_save_npy(work / "img_emb.npy", img)
    atomic_save_npy(work / "cap_emb.npy", cap)
    write_stamp(key_file, key)  # written last: its presence means both arrays are complete
    return img, cap


def mine_with_checkpoint(
    checkpoint: str | Path,
    cfg: Any,
    out: str | Path,
    *,
    progress: bool = True,
) -> tuple[MinedNegatives, bool]:
    """Embed the training split of ``cfg.data`` with ``checkpoint`` and mine it into ``out``.

    The checkpoint may be of any model kind (a "teacher"); only its embeddings are used. The
    mining settings are ``cfg.mining`` (top_captions, top_images, block_size, backend, device, and
    the false-negative filters: with ``filters`` the lists are mined deeper and hold the first
    candidates no enabled filter flags, :mod:`aoq_train.mining.false_negatives`).
    The artefact also holds ``diagnostics.json``, the hardness diagnostics of
    :mod:`aoq_train.mining.diagnostics` at ``cfg.round2``'s batch size and depth (a warning is
    logged when the offline negatives are not harder than the in-batch ones).
    Nothing is done when ``out`` already holds an artefact mined by the same checkpoint (content
    hash), data and H under the same ranking rule (:data:`aoq_train.mining.canonical.RULE`; the
    products, recorded as ``precision``, do not change the lists), with diagnostics of the same
    round-2 settings; when only those settings changed, the lists are
    kept and only the diagnostics are recomputed. Work files (embeddings, per-block parts) live
    in a hidden sibling ``.<out>.work`` until the artefact is in place, so an interrupted run
    resumes.

    Returns:
        ``(artefact, skipped)``.

    Raises:
        ArtefactError: the checkpoint is damaged (``CheckpointError``).
        DataError: the training split cannot be read.
        ValueError: H larger than the split allows.
        ConfigError: the round-2 depth is deeper than the lists (``aoq_train.round2.depth``), the
            mining precision does not run on the mining device, or the filters leave a list too short.
    """
    from aoq.checkpoint import load_checkpoint
    from aoq.data.load import load_split

    out = Path(out)
    m = cfg.mining
    ckpt = load_checkpoint(checkpoint)
    split = load_split(cfg.data, "train")
    identity = _data_identity(cfg.data, split.n_images, split.n_captions)
    device = resolve_device(m.device)
    try:
        products = product_precision(device, m.backend, m.precision)
    except ValueError as exc:
        raise ConfigError(f"mining.precision: {exc}") from None
    want = {"checkpoint_hash": ckpt.content_hash, "top_captions": m.top_captions,
            "top_images": m.top_images, "data": identity, "ranking": RULE,  # an older rule: re-mined
            "filters": list(m.filters)}
    if m.filters:
        want.update(semantic_tau=m.semantic_tau, teacher_rho=m.teacher_rho)
    # round 2's depths on this split, resolved once: the diagnostics, their shares and the lists' check read them
    depths = round2_depths(cfg.round2, split.n_images, split.n_captions)
    settings = diagnostics_settings(cfg.round2, depths)
    existing = _up_to_date(out, want)
    if existing is not None and existing.manifest.get("diagnostics_settings") == settings.as_dict():
        return existing, True
    work = out.parent / f".{out.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    img, cap = _embeddings(ckpt, split, identity, work, device, progress)
    cpi = split.captions_per_image

    def mine(top_captions: int, top_images: int) -> tuple[np.ndarray, np.ndarray]:
        return mine_offline_negatives(img, cap, cpi, top_captions, top_images, m.block_size, device,
                                      backend=m.backend, precision=m.precision, work_dir=work, progress=progress)

    filtered = None
    if existing is not None:  # same lists, other round-2 settings: only the diagnostics change
        log.info("%s: lists up to date, recomputing the hardness diagnostics for the new round-2 settings", out)
        img_top_caps, cap_top_imgs = np.array(existing.img_top_caps), np.array(existing.cap_top_imgs)
        filtered = None if existing.filtered is None else {k: np.array(v) for k, v in existing.filtered.items()}
    elif m.filters:
        try:
            inputs = filter_inputs(split, img, cap, m.semantic_tau, m.teacher_rho, progress)
            img_top_caps, cap_top_imgs, filtered = filtered_lists(
                mine, m.top_captions, m.top_images, split.n_images, cpi, inputs, m.filters)
        except ValueError as exc:
            raise ConfigError(f"{out}: {exc}") from None
    else:
        img_top_caps, cap_top_imgs = mine(m.top_captions, m.top_images)
    check_depths(img_top_caps, cap_top_imgs, depths, cfg.round2, out)
    diagnostics = hardness_diagnostics(img, cap, cpi, img_top_caps, cap_top_imgs, settings, captions=split.captions)
    truth = split_truth(split, cfg.data.path, cfg.data.format, cfg.eval.positives)
    diagnostics["shares"] = list_shares(img_top_caps, cap_top_imgs, truth, *depths)
    if filtered is not None:  # what the filters caught (the premise before them: the unfiltered lists')
        diagnostics["filters"] = filter_stats(filtered, m.filters, m.top_captions, m.top_images)
        diagnostics["filters"]["detectors"] = detector_scores(filtered, list(m.filters), truth, *depths)
    for warning in diagnostics["warnings"]:
        log.warning("%s: %s", out, warning)
    save_mined(out, img_top_caps, cap_top_imgs, {
        **want,
        "checkpoint": str(checkpoint),
        "teacher_model": ckpt.config.model.image_encoder,
        "backend": m.backend,
        "precision": products,  # which products found the candidates (the lists are the same)
        "diagnostics_settings": settings.as_dict(),
    }, config=m.model_dump(mode="json"), diagnostics=diagnostics, filtered=filtered)
    shutil.rmtree(work, ignore_errors=True)
    return load_mined(out), False
