"""Evaluate a model or a checkpoint on a split under a retrieval protocol.

Protocols (``aoq.metrics``): ``full`` (every image of the split at once), ``1k5fold``
(COCO "1K": the mean over 5 consecutive folds of 1,000 images) and ``5k`` (the first 5,000
images). Every result names its protocol, so 1K and 5K numbers cannot be confused.
``labels`` is the ``full`` protocol plus the label-wise metrics (mAP@R, NDCG@k, relevance = shared
labels) of a split that carries labels. ``positives`` (``eval.positives``) is ``pair`` (each
caption matches its own image, the published protocol) or ``text`` (identical caption texts are
one answer; the result's ``merged`` counts the pairs that rule added). ``hubness`` ranks by the
query-time normalisations of :mod:`aoq.hubness`, exactly (every score of the split), with the
training split as the bank (docs/serving.md, Hubness correction).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from aoq.checkpoint import load_checkpoint
from aoq.data.dataset import SplitData, split_targets
from aoq.data.load import load_split
from aoq.data.vocab import Vocabulary, coverage, format_coverage
from aoq.device import resolve_device
from aoq.embed import encode_fragments, encode_split
from aoq.hubness import HUB_ITEMS, bank_normaliser, bank_provenance, direction_fns, hub_share, top1_per_query
from aoq.label_metrics import label_metrics, label_metrics_folds, split_label_metrics
from aoq.metrics import (
    PROTOCOLS,
    chance_rsum,
    evaluate_directions,
    evaluate_embeddings,
    evaluate_scores,
)
from aoq.models.joint import JointModel
from aoq.names import Normalisation, PositiveRule
from aoq.pair_scores import COCO_5K, score_matrix
from aoq_train.pairwise_eval import evaluate_pairwise

#: the protocols a hubness normalisation evaluates under: one gallery, the whole split
HUBNESS_PROTOCOLS = ("full", "labels")


def evaluate_model(
    model: JointModel,
    vocab: Vocabulary,
    split: SplitData,
    protocol: str = "full",
    *,
    image_size: int = 64,
    batch_size: int = 256,
    device: str | torch.device | None = None,
    ndcg_k: int = 10,
    positives: PositiveRule = "pair",
) -> dict:
    """Embed ``split`` with ``model`` and compute R@1/5/10, medr, meanr both ways and rsum.

    With ``protocol="labels"`` the recalls are those of ``full`` and the result also has
    ``"labels"``: :func:`aoq.label_metrics.label_metrics` with NDCG cut-off ``ndcg_k``.

    Returns:
        ``{"i2t": {...}, "t2i": {...}, "rsum": float, "protocol": str, "positives": str,
        "merged": int}`` (+ ``"labels"``).

    Raises:
        DataError: ``protocol="labels"`` on a split without labels.
    """
    _check_labels(split, protocol == "labels")
    if model.pairwise:
        return evaluate_pairwise(model, vocab, split, protocol, batch_size=batch_size, device=device,
                                 positives=positives, ndcg_k=ndcg_k)
    img, cap = encode_split(model, vocab, split, batch_size=batch_size, device=device, image_size=image_size)
    return _evaluate_encoded(img, cap, split, protocol, ndcg_k, positives)


def _check_labels(split: SplitData, wanted: bool) -> None:
    if wanted:
        split_targets(split)


def _label_scores(img: np.ndarray, cap: np.ndarray, split: SplitData, ndcg_k: int, folds: bool) -> dict:
    """The label-wise metrics of a labelled split's embeddings, whole or over the 1K folds."""
    targets = split_targets(split)
    scores = (label_metrics_folds if folds else label_metrics)(img, cap, targets, split.captions_per_image, ndcg_k)
    return {**scores, "n_labels": int(targets.shape[1])}


def _recalls(img: np.ndarray, cap: np.ndarray, split: SplitData, protocol: str, positives: PositiveRule) -> dict:
    texts = split.captions if positives == "text" else None
    result = evaluate_embeddings(img, cap, split.captions_per_image, protocol=protocol, texts=texts)
    return {**result, "positives": positives}


def _evaluate_encoded(img: np.ndarray, cap: np.ndarray, split: SplitData, protocol: str, ndcg_k: int,
                      positives: PositiveRule) -> dict:
    if protocol != "labels":
        return _recalls(img, cap, split, protocol, positives)
    result = _recalls(img, cap, split, "full", positives)
    return {**result, "labels": _label_scores(img, cap, split, ndcg_k, folds=False), "protocol": "labels"}


def dev_validator(split: SplitData, vocab: Vocabulary, image_size: int = 64, batch_size: int = 256,
                  positives: PositiveRule = "pair"):
    """The trainer's ``validate`` function: full-protocol metrics of a model on the dev split, plus
    ``chance_rsum`` (the expected rsum of random scores on it, read by the collapse guard)."""
    chance = chance_rsum(split.n_images, split.captions_per_image)

    def validate(model: JointModel) -> dict:
        result = evaluate_model(model, vocab, split, "full", image_size=image_size, batch_size=batch_size,
                                positives=positives)
        return {**result, "chance_rsum": chance}

    return validate


def evaluate_checkpoint(
    ckpt_dir: str | Path,
    split_name: str = "test",
    protocol: str = "full",
    data_path: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    batch_size: int = 256,
    ndcg_k: int = 10,
    positives: PositiveRule | None = None,
    hubness: Normalisation | None = None,
    shortlist_by: str | Path | None = None,
    shortlist_n: int = 100,
    shortlist_cost: bool = False,
    ensemble: str | Path | None = None,
) -> dict:
    """Load a checkpoint and evaluate it on one split of its dataset (or of ``data_path``).

    A cross-attention checkpoint (scan, bfan) is scored pair by pair (:func:`evaluate_pairwise`,
    with a progress bar; the result's ``scoring`` projects the COCO 5K time); ``shortlist_by``
    (an embedding model's checkpoint) re-scores only the top ``shortlist_n`` of its ranking, and
    ``shortlist_cost`` also scores every pair and reports what the cut costs; ``ensemble`` (a
    second cross-attention checkpoint) averages the two models' scores.

    Args:
        ckpt_dir: a checkpoint directory (``aoq.checkpoint``).
        split_name: ``train``/``dev``/``test`` (mapped through the checkpoint's data config) or a
            file-level split name such as ``testall``.
        protocol: ``full``, ``1k5fold``, ``5k`` or ``labels`` (full + label-wise metrics).
        data_path: read the split from here instead of the checkpoint's ``data.path`` (same format).
        positives: ``pair`` or ``text``; None takes the checkpoint config's ``eval.positives``.
        hubness: ``none``, ``qbnorm`` or ``invsoftmax`` (protocols ``full`` and ``labels``): rank by
            that normalisation (:func:`evaluate_hubness`); None: the plain evaluation.

    Returns:
        ``evaluate_model``'s dict (``n_images`` = images evaluated) plus ``split``,
        ``checkpoint`` (the checkpoint's content hash) and ``vocabulary``: how many of the
        split's caption tokens, and how many whole captions, the model's vocabulary does not know
        (:func:`aoq.data.vocab.coverage`); retrieval of captions made only of unknown words
        is blind, so a low score can come from the vocabulary rather than the model.

    Raises:
        CheckpointError / DataError: a broken checkpoint or dataset.
        ValueError: ``hubness`` with a protocol of folds or a subset.
    """
    loaded = _load(ckpt_dir, split_name, data_path, device, protocol == "labels")
    if loaded[0].model.pairwise:
        return _evaluate_pairwise_checkpoint(loaded, protocol, device, batch_size, positives, hubness,
                                             shortlist_by, shortlist_n, shortlist_cost, ensemble)
    if ensemble is not None:
        raise ValueError("--ensemble averages two cross-attention models' scores; this checkpoint is an embedding model")
    if shortlist_by is not None or shortlist_cost:
        raise ValueError("--shortlist-by re-ranks with a cross-attention model; this checkpoint is an embedding model")
    if hubness is not None and protocol not in HUBNESS_PROTOCOLS:
        raise ValueError(f"--hubness evaluates the whole split (protocol full or labels), not {protocol}")
    split, img, cap, common, configured, bank = _encoded(loaded, batch_size, hubness not in (None, "none"))
    rule = positives or configured
    if hubness is not None:
        result = evaluate_hubness(img, cap, split, hubness, bank, rule, ndcg_k if protocol == "labels" else None)
        return {"n_images": split.n_images, **result, "protocol": protocol, **common}
    return {"n_images": split.n_images, **_evaluate_encoded(img, cap, split, protocol, ndcg_k, rule), **common}


def evaluate_hubness(img: np.ndarray, cap: np.ndarray, split: SplitData, method: Normalisation,
                     bank: tuple[np.ndarray, np.ndarray, dict] | None, positives: PositiveRule = "pair",
                     ndcg_k: int | None = None) -> dict:
    """The full protocol of a split's embeddings ranked under a hubness ``method``, exactly.

    Args:
        bank: (images, captions, provenance) of the bank split; None only for ``method="none"``.
        ndcg_k: add the label-wise metrics with this NDCG cut-off (full score matrices).

    Returns:
        :func:`aoq.metrics.evaluate_directions`'s dict, plus ``"hubness"``: the method, the bank's
        provenance and ``hub_share`` per direction (the share of queries whose top-1 is one of the
        most frequent top-1 items, :func:`aoq.hubness.hub_share`); ``"labels"`` with ``ndcg_k``.
    """
    n_images, n_captions = img.shape[0], cap.shape[0]
    if bank is None:
        images = captions = None
        provenance: dict = {}
    else:
        # text->image normalises the images by the bank's captions; image->text the captions by its images
        images, captions = bank_normaliser(bank[1], img), bank_normaliser(bank[0], cap)
        provenance = bank[2]
    i2t_fn, t2i_fn = direction_fns(img, cap, images, captions, method)  # type: ignore[arg-type]
    texts = split.captions if positives == "text" else None
    result = {**evaluate_directions(i2t_fn, t2i_fn, n_images, split.captions_per_image, texts), "positives": positives}
    top1 = top1_per_query(i2t_fn, t2i_fn, n_images, n_captions)
    result["hubness"] = {"normalise": method, "bank": provenance,
                         "hub_share": {d: hub_share(top1[d]) for d in ("i2t", "t2i")}}
    if ndcg_k is not None:
        whole_i, whole_c = slice(0, n_images), slice(0, n_captions)
        result["labels"] = split_label_metrics(i2t_fn(whole_i, whole_c), t2i_fn(whole_i, whole_c).T, split, ndcg_k)
    return result


def _load(ckpt_dir: str | Path, split_name: str, data_path: str | Path | None, device: str | torch.device,
          labels: bool) -> tuple:
    """A checkpoint, its data config (with ``data_path``), one split of it and the fields every
    result of it carries (split, checkpoint hash, vocabulary coverage)."""
    ckpt = load_checkpoint(ckpt_dir, resolve_device(device))
    data_cfg = ckpt.config.data
    if data_path is not None:
        data_cfg = data_cfg.model_copy(update={"path": str(data_path)})
    split = load_split(data_cfg, split_name)
    _check_labels(split, labels)
    common = {"split": split_name, "checkpoint": ckpt.content_hash}
    # Unknown words exist only for a word vocabulary; a WordPiece tokenizer (minilm) covers every word.
    if isinstance(ckpt.vocab, Vocabulary):
        common["vocabulary"] = coverage(ckpt.vocab, split.captions)
    return ckpt, data_cfg, split, common


def _encoded(loaded: tuple, batch_size: int, bank: bool) -> tuple:
    """The split of :func:`_load`'s result, its embeddings by the checkpoint's model, the fields
    every result of it carries, the checkpoint config's ``eval.positives`` and, with ``bank``, the
    training split's (images, captions, provenance) embeddings (else None).

    Raises:
        ValueError: a cross-attention model (it has no embeddings).
    """
    ckpt, data_cfg, split, common = loaded
    if ckpt.model.pairwise:
        raise ValueError("a cross-attention model has no embeddings: evaluate it with aoq evaluate "
                         "(no --hubness, no comparison of protocols from one encoding)")
    img, cap = encode_split(ckpt.model, ckpt.vocab, split, batch_size=batch_size, image_size=data_cfg.image_size)
    embedded_bank = None
    if bank:
        train = load_split(data_cfg, data_cfg.train_split)
        bank_img, bank_cap = encode_split(ckpt.model, ckpt.vocab, train, batch_size=batch_size,
                                          image_size=data_cfg.image_size)
        embedded_bank = (bank_img, bank_cap, bank_provenance(data_cfg.train_split, bank_img, bank_cap))
    return split, img, cap, common, ckpt.config.eval.positives, embedded_bank


def _evaluate_pairwise_checkpoint(loaded: tuple, protocol: str, device: str | torch.device, batch_size: int,
                                  positives: PositiveRule | None, hubness: Normalisation | None,
                                  shortlist_by: str | Path | None, shortlist_n: int, shortlist_cost: bool,
                                  ensemble: str | Path | None) -> dict:
    if hubness is not None:
        raise ValueError("--hubness needs embeddings; a cross-attention model has none")
    ckpt, data_cfg, split, common = loaded
    by = None
    if shortlist_by is not None:
        teacher = load_checkpoint(shortlist_by, resolve_device(device))
        if teacher.model.pairwise:
            raise ValueError(f"--shortlist-by {shortlist_by}: needs an embedding model, not a cross-attention one")
        by = encode_split(teacher.model, teacher.vocab, split, batch_size=batch_size, image_size=data_cfg.image_size)
        common["shortlist_by"] = teacher.content_hash
    second = None
    if ensemble is not None:
        other = load_checkpoint(ensemble, resolve_device(device))
        if not other.model.pairwise:
            raise ValueError(f"--ensemble {ensemble}: needs a cross-attention model, not an embedding one")
        second = (other.model, other.vocab)
        common["ensemble"] = other.content_hash
    result = evaluate_pairwise(ckpt.model, ckpt.vocab, split, protocol, batch_size=batch_size,
                               positives=positives or ckpt.config.eval.positives, progress=True,
                               shortlist_by=by, shortlist_n=shortlist_n, shortlist_cost=shortlist_cost,
                               ensemble=second)
    return {"n_images": split.n_images, **result, **common}


def compare_checkpoint(ckpt_dir: str | Path, split_name: str = "test", *, labels: bool = False,
                       device: str | torch.device = "auto", batch_size: int = 256, ndcg_k: int = 10) -> dict:
    """Every protocol that applies to a checkpoint on one split, from one encoding of the split:
    ``full``, plus ``1k5fold`` and ``5k`` when the split has 5,000 images or more.

    ``labels``: add the label-wise metrics (``"labels"``) to one protocol, ``1k5fold`` where it
    applies (the mean over the folds, :func:`aoq.label_metrics.label_metrics_folds`: ranking
    25,000 captions for each of 5,000 images and back costs about a minute of CPU per model) and
    ``full`` otherwise.

    Returns:
        ``{protocol: result}``, each result as :func:`evaluate_checkpoint`'s for that protocol.
    """
    loaded = _load(ckpt_dir, split_name, None, device, labels)
    if loaded[0].model.pairwise:
        return _compare_pairwise(loaded, labels, batch_size, ndcg_k)
    split, img, cap, common, positives, _ = _encoded(loaded, batch_size, False)
    protocols = PROTOCOLS if split.n_images >= 5000 else ("full",)
    results = {p: {**_recalls(img, cap, split, p, positives), **common} for p in protocols}
    if labels:
        where = "1k5fold" if "1k5fold" in results else "full"
        results[where]["labels"] = _label_scores(img, cap, split, ndcg_k, folds=where == "1k5fold")
    return results


def _compare_pairwise(loaded: tuple, labels: bool, batch_size: int, ndcg_k: int) -> dict:
    """:func:`compare_checkpoint` for a cross-attention model: one score matrix of the split, every
    protocol from it; the label-wise metrics (``labels``) go with ``full``."""
    ckpt, _, split, common = loaded
    device = next(ckpt.model.parameters()).device
    fragments = encode_fragments(ckpt.model, ckpt.vocab, split, batch_size=batch_size, device=device)
    sims, timing = score_matrix(ckpt.model.pair_scores, fragments, device)
    positives = ckpt.config.eval.positives
    texts = split.captions if positives == "text" else None
    scoring = {"seconds": timing.seconds, "pairs": timing.pairs,
               "projected_coco5k_s": timing.projected_seconds(COCO_5K[0] * COCO_5K[1])}
    protocols = PROTOCOLS if split.n_images >= COCO_5K[0] else ("full",)
    results = {p: {**evaluate_scores(sims, split.captions_per_image, p, texts=texts), "positives": positives,
                   "scoring": scoring, **common} for p in protocols}
    if labels:
        results["full"]["labels"] = split_label_metrics(sims, sims.T, split, ndcg_k)
    return results


def format_table(result: dict) -> str:
    """A readable table of an evaluation result; the first line names split and protocol."""
    merged = f", {result['merged']} pairs merged" if result.get("positives") == "text" else ""
    lines = [
        f"split {result.get('split', '?')} ({result.get('n_images', '?')} images), protocol {result['protocol']}, "
        f"positives {result.get('positives', 'pair')}{merged}",
        f"{'direction':<22}{'R@1':>8}{'R@5':>8}{'R@10':>8}{'medr':>8}{'meanr':>9}",
    ]
    for key, label in (("i2t", "image->text (i2t)"), ("t2i", "text->image (t2i)")):
        m = result[key]
        lines.append(f"{label:<22}{m['r1']:>8.2f}{m['r5']:>8.2f}{m['r10']:>8.2f}{m['medr']:>8.1f}{m['meanr']:>9.2f}")
    lines.append(f"rsum {result['rsum']:.2f}")
    scoring = result.get("scoring")
    if scoring:
        cut = f", re-ranking the top {result['shortlist']} of the embedding model" if "shortlist" in result else ""
        lines.append(f"cross-attention scoring{cut}: {scoring['pairs']:,} pairs in {scoring['seconds']:.1f} s; "
                     f"the same on COCO 5K ({COCO_5K[0]:,} images, {COCO_5K[1]:,} captions) projected "
                     f"{scoring['projected_coco5k_s'] / 60:.1f} min")
    cost = result.get("shortlist_cost")
    if cost:
        diff = cost["difference"]
        lines.append(f"the shortlist's cost (re-ranked minus full scoring, full scored in {cost['full_seconds']:.1f} s)")
        for key, label in (("i2t", "image->text (i2t)"), ("t2i", "text->image (t2i)")):
            m = diff[key]
            lines.append(f"{label:<22}{m['r1']:>+8.2f}{m['r5']:>+8.2f}{m['r10']:>+8.2f}{m['medr']:>+8.1f}{m['meanr']:>+9.2f}")
        lines.append(f"rsum {diff['rsum']:+.2f} (full scoring {cost['full']['rsum']:.2f})")
    if "vocabulary" in result:
        lines.append(f"unknown words: {format_coverage(result['vocabulary'])}")
    hub = result.get("hubness")
    if hub:
        shares = hub["hub_share"]
        lines.append(f"hubness normalisation {hub['normalise']}: share of queries whose top-1 is one of the "
                     f"{HUB_ITEMS} most frequent top-1 items i2t {100 * shares['i2t']:.1f}%, t2i {100 * shares['t2i']:.1f}%")
    labels = result.get("labels")
    if labels:
        ndcg = f"ndcg_at_{labels['k']}"
        lines.append(f"label-wise ({labels['n_labels']} labels, relevance = shared labels; percent)")
        lines.append(f"{'direction':<22}{'mAP@R':>9}{'NDCG@' + str(labels['k']):>10}{'queries':>9}")
        for key, label in (("i2t", "image->text (i2t)"), ("t2i", "text->image (t2i)")):
            m = labels[key]
            lines.append(f"{label:<22}{100 * m['map_at_r']:>9.2f}{100 * m[ndcg]:>10.2f}{m['queries']:>9d}")
    return "\n".join(lines)
