"""Hardness diagnostics of the mined lists at the round-1 model: does the paper's premise hold?

AOQ assumes the offline negatives it samples are *harder* than the in-batch hardest negatives
of round 2 (docs/method.md, The adaptive weight). Whether they are depends on the sampling depth
relative to the data: a batch of B captions out of N sees the hardest caption of an image around
global rank N / B, so a depth ``h_t`` well above N / B samples easier negatives than the batch
already holds. This module measures it from the round-1 embeddings, before round 2 trains:

For B-sized batches of training captions drawn as in round 2 (one item per caption), and for
each anchor (the image of a caption, and the caption itself):

* the global rank of the in-batch hardest negative (1 = the hardest negative of the whole split;
  rank = 1 + the negatives scoring strictly higher). Captions of the anchor's own image are not
  negatives and are left out of the batch's candidates here (the round-2 loss does not mask
  them; with B much smaller than N they are rare);
* the rank and score of the offline negative drawn by :func:`aoq_train.round2.sampling.sample_offline_negatives`
  at the configured depth;
* ``S_on - S_off`` (negative: the offline negative is the harder one);
* the share of rows where each hinge of Eq. 5 is active at this model (online i2t/t2i with
  margin gamma_1, offline i2t/t2i and the two derived pairs with gamma_2);
* the adaptive weights ``w_i``, ``w_t`` of Eq. 5 (:func:`aoq_train.objectives.losses.adaptive_weights`):
  quantiles and the share below zero.

The premise holds when, in both directions, the mean ``S_on - S_off`` is negative; otherwise the
result carries a warning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from aoq_train.objectives.losses import adaptive_weights
from aoq_train.round2.sampling import DrawKey, sample_offline_negatives

KIND = "hardness_diagnostics"
#: batches sampled by default: enough anchors for stable medians, a small fraction of mining's cost.
DEFAULT_BATCHES = 32
QUANTILES = {"min": 0.0, "p10": 0.1, "p25": 0.25, "median": 0.5, "p75": 0.75, "p90": 0.9, "max": 1.0}
HINGES = ("online_i2t", "online_t2i", "offline_i2t", "offline_t2i", "pair", "pair_tilde")


@dataclass(frozen=True, kw_only=True)
class HardnessSettings:
    """Everything the diagnostics depend on besides the embeddings and lists: the batches, draws
    (at depths already resolved for the split) and loss of the round 2 they look ahead to. Given
    explicitly (:func:`aoq_train.mining.job.diagnostics_settings` reads them from ``round2``).
    ``depth`` and ``h_rel`` only record how ``h_t``/``h_i`` were chosen."""

    batch_size: int
    max_batches: int = DEFAULT_BATCHES
    seed: int
    depth: str
    h_rel: float | None
    h_t: int
    h_i: int
    sampling: str
    normal_center: float
    normal_scale: float
    margin_online: float
    margin_offline: float
    alpha: float
    beta: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, in field order (the artefact records it and compares it on a rerun)."""
        return asdict(self)


def sample_batches(n_captions: int, batch_size: int, max_batches: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, B)`` caption ids: the first ``n = min(max_batches, N // B)`` batches of a permutation."""
    batch_size = min(batch_size, n_captions)
    n = max(1, min(max_batches, n_captions // batch_size))
    return rng.permutation(n_captions)[: n * batch_size].reshape(n, batch_size)


def _global_rank(scores: np.ndarray, own: np.ndarray, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank (1 + negatives strictly above) and score of ``picked[k]`` in row k; ``own`` masks positives."""
    negatives = np.where(own, -np.inf, scores)
    value = scores[np.arange(len(picked)), picked]
    return 1 + np.count_nonzero(negatives > value[:, None], axis=1), value


def _batch_rows(img: np.ndarray, cap: np.ndarray, cpi: int, captions: np.ndarray, lists: tuple,
                s: HardnessSettings, draws: DrawKey) -> dict[str, np.ndarray]:
    """Per-anchor scores and ranks of one batch of caption ids."""
    images = captions // cpi
    rows = img[images] @ cap.T  # image anchors against every caption
    cols = cap[captions] @ img.T  # caption anchors against every image
    in_batch = rows[:, captions]  # (B, B): S(image of a, caption b)
    same = images[:, None] == images[None, :]
    masked = np.where(same, -np.inf, in_batch)
    t_on, i_on = captions[masked.argmax(axis=1)], images[masked.argmax(axis=0)]
    neg = sample_offline_negatives(captions, *lists, s.h_t, s.h_i, draws, s.sampling,
                                   center=s.normal_center, scale=s.normal_scale)
    own_caps = (np.arange(cap.shape[0])[None, :] // cpi) == images[:, None]
    own_imgs = np.arange(img.shape[0])[None, :] == images[:, None]
    out = {"positive": in_batch.diagonal().copy()}
    out["i2t_on_rank"], out["i2t_on"] = _global_rank(rows, own_caps, t_on)
    out["i2t_off_rank"], out["i2t_off"] = _global_rank(rows, own_caps, neg.t_off)
    out["t2i_on_rank"], out["t2i_on"] = _global_rank(cols, own_imgs, i_on)
    out["t2i_off_rank"], out["t2i_off"] = _global_rank(cols, own_imgs, neg.i_off)
    out["pair"] = (img[neg.i_off] * cap[neg.t_off]).sum(axis=1)
    out["pair_tilde"] = (img[neg.i_off_tilde] * cap[neg.t_off_tilde]).sum(axis=1)
    return out


def _summary(values: np.ndarray) -> dict[str, float]:
    q = np.quantile(values, list(QUANTILES.values()))
    return {"mean": float(values.mean()), **{k: float(v) for k, v in zip(QUANTILES, q)}}


def _direction(r: dict[str, np.ndarray], key: str, depth: int) -> dict[str, Any]:
    on, off = r[f"{key}_on"], r[f"{key}_off"]
    return {
        "in_batch_rank": _summary(r[f"{key}_on_rank"].astype(np.float64)),
        "in_batch_within_depth": float(np.mean(r[f"{key}_on_rank"] <= depth)),
        "in_batch_score": float(on.mean()),
        "offline_rank": _summary(r[f"{key}_off_rank"].astype(np.float64)),
        "offline_score": float(off.mean()),
        "on_minus_off": float(np.mean(on - off)),
        "offline_harder": float(np.mean(off > on)),
    }


def _hinges(r: dict[str, np.ndarray], g1: float, g2: float) -> dict[str, float]:
    pos = r["positive"]
    active = {
        "online_i2t": g1 - pos + r["i2t_on"], "online_t2i": g1 - pos + r["t2i_on"],
        "offline_i2t": g2 - pos + r["i2t_off"], "offline_t2i": g2 - pos + r["t2i_off"],
        "pair": g2 - pos + r["pair"], "pair_tilde": g2 - pos + r["pair_tilde"],
    }
    return {name: float(np.mean(active[name] > 0)) for name in HINGES}


def _weights(r: dict[str, np.ndarray], alpha: float, beta: float) -> dict[str, Any]:
    w_i, w_t = (w.numpy() for w in adaptive_weights(
        *(torch.from_numpy(np.asarray(r[k], dtype=np.float64)) for k in ("i2t_off", "i2t_on", "t2i_off", "t2i_on")),
        alpha=alpha, beta=beta))
    return {"image": {**_summary(w_i), "negative": float(np.mean(w_i < 0))},
            "caption": {**_summary(w_t), "negative": float(np.mean(w_t < 0))}}


def premise_warning(result: dict[str, Any]) -> str | None:
    """The warning text when the offline negatives are not harder than the in-batch ones."""
    weak = [(name, result[key]) for name, key in (("image", "image_anchors"), ("caption", "caption_anchors"))
            if result[key]["on_minus_off"] >= 0]
    if not weak:
        return None
    detail = "; ".join(
        f"{name} anchors: mean S_on - S_off = {d['on_minus_off']:+.4f}, median rank offline "
        f"{d['offline_rank']['median']:.0f} vs in-batch {d['in_batch_rank']['median']:.0f}" for name, d in weak)
    return (f"offline negatives at h_t={result['settings']['h_t']}, h_i={result['settings']['h_i']} are not harder "
            f"than the in-batch hardest negatives of a batch of {result['settings']['batch_size']} ({detail}): "
            "the premise of AOQ does not hold at this depth; sample shallower (lower round2.h_t/h_i, or "
            "round2.depth=relative with a smaller h_rel) or mine with a stronger model (docs/mining.md)")


def hardness_diagnostics(
    img_emb: np.ndarray,
    cap_emb: np.ndarray,
    captions_per_image: int,
    img_top_caps: np.ndarray,
    cap_top_imgs: np.ndarray,
    settings: HardnessSettings,
    batches: np.ndarray | None = None,
    captions: list[str] | None = None,
) -> dict[str, Any]:
    """The diagnostics of the module docstring.

    Args:
        img_emb / cap_emb: round-1 embeddings of the training split (scores = dot products).
        img_top_caps / cap_top_imgs: the mined lists of those embeddings.
        settings: the round-2 settings to look ahead to.
        batches: ``(n, B)`` caption ids to use as batches; default :func:`sample_batches` from
            ``settings.seed``.
        captions: the training captions; with them, ``certain_false_negatives`` is added.

    Returns:
        ``{"kind", "settings", "anchors", "image_anchors", "caption_anchors", "hinges_active",
        "adaptive_weight", "premise_holds", "warnings"}``.
    """
    rng = np.random.default_rng([settings.seed, 3])  # 3: its own stream, apart from round 2's
    # Kept in their own dtype (float32 from the encoder): a batch's rows are B x N scores.
    img, cap = np.asarray(img_emb), np.asarray(cap_emb)
    if batches is None:
        batches = sample_batches(cap.shape[0], settings.batch_size, settings.max_batches, rng)
    lists = (img_top_caps, cap_top_imgs)
    # the offline items round 2 draws for these captions in its first epoch (the same keys)
    draws = DrawKey(settings.seed, 0)
    parts = [_batch_rows(img, cap, captions_per_image, np.asarray(b, dtype=np.int64), lists, settings, draws)
             for b in batches]
    rows = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    result: dict[str, Any] = {
        "kind": KIND,
        "settings": settings.as_dict(),
        "anchors": int(rows["positive"].size),
        "image_anchors": _direction(rows, "i2t", settings.h_t),
        "caption_anchors": _direction(rows, "t2i", settings.h_i),
        "hinges_active": _hinges(rows, settings.margin_online, settings.margin_offline),
        "adaptive_weight": _weights(rows, settings.alpha, settings.beta),
    }
    if captions is not None:
        result["certain_false_negatives"] = certain_false_negatives(img_top_caps, captions, captions_per_image,
                                                                    settings.h_t)
    warning = premise_warning(result)
    result["premise_holds"] = warning is None
    result["warnings"] = [warning] if warning else []
    return result


def certain_false_negatives(img_top_caps: np.ndarray, captions: list[str], captions_per_image: int,
                            depth: int) -> dict[str, float]:
    """Mined captions within ``depth`` whose text is one of the anchor image's own captions (by
    :func:`aoq.data.facts.text_identity`): ``pairs`` is their share of all (image, mined caption)
    pairs within the depth, ``images`` the share of images with at least one."""
    from aoq.data.facts import text_identity

    top = np.asarray(img_top_caps)[:, :depth]
    images = np.repeat(np.arange(top.shape[0]), top.shape[1])
    hit = text_identity(captions, captions_per_image)(top.reshape(-1), images).reshape(top.shape)
    return {"pairs": float(hit.mean()), "images": float(hit.any(axis=1).mean())}


def summary_line(result: dict[str, Any]) -> str:
    """One line for ``aoq mine``: depth, median ranks, S_on - S_off per direction, the verdict."""
    s = result["settings"]

    def part(name: str, d: dict[str, Any]) -> str:
        return (f"{name}: in-batch hardest rank {d['in_batch_rank']['median']:.0f} (median), offline "
                f"{d['offline_rank']['median']:.0f}, S_on-S_off {d['on_minus_off']:+.3f}")

    verdict = "premise holds" if result["premise_holds"] else "WARNING: offline negatives not harder than in-batch"
    return (f"hardness at h_t={s['h_t']}, h_i={s['h_i']}, batch {s['batch_size']}, {result['anchors']} anchors: "
            f"{part('images', result['image_anchors'])}; {part('captions', result['caption_anchors'])}; {verdict}")
