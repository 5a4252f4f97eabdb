"""The false-negative step of ``aoq mine`` (``mining.filters``; docs/method.md, False negatives):
mine deeper than the lists must be, flag the candidates each row needs, keep the first
candidates no enabled filter flags, and count what each filter removed.

Each enabled filter is evaluated on every candidate checked, on its own (one bit per filter),
so the artefact shows which of them flag what, and the report scores each one as a
false-negative detector.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from aoq.data.dataset import SplitData
from aoq.mined import UNCHECKED
from aoq_train.mining.canonical import canonical_inputs, canonical_pairs, float32_levels, float32_margin
from aoq_train.mining.filters import (
    BLOCK_ELEMENTS,
    KEPT,
    ORDER,
    FilterInputs,
    compact,
    enabled_bits,
    first_flag,
    flag_rows,
    near_duplicate_keys,
    text_ids,
)
from aoq_train.mining.text_flags import TextTables, flag_progressively, mask_flagged, text_only, text_tables

log = logging.getLogger(__name__)

#: the raw lists are mined this many times deeper than the lists round 2 reads (nearly free: the
#: miner's cost is the score matrix, not the depth), then flagged a slice at a time
DEPTH_FACTOR = 8
#: the first slice every row is flagged over, as a multiple of the lists' depth (a few candidates
#: per list are flagged); a row that keeps too few is flagged over a slice twice as wide, and so on
SLICE_FACTOR = 1.25
#: the cache folder (and artefact kind) of the near-duplicate text pairs
NEAR_DUPLICATES = "near-duplicate-pairs"
#: ``mine(top_captions, top_images) -> (img_top_caps, cap_top_imgs)``
Mine = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def sentence_vectors(captions: Sequence[str], progress: bool = False) -> np.ndarray:
    """Unit all-MiniLM-L6-v2 sentence vectors of the captions (mean pooled, the model card's),
    from the backbone feature cache: computed once per caption set (the model is loaded only
    then), shared with every model that trains on the same captions with the MiniLM encoder."""
    from aoq.backbone_cache import cache_root, caption_backbone_features, caption_key_inputs, cached_features
    from aoq.models.packages import minilm_identity

    def compute() -> np.ndarray:
        from aoq.models.pretrained import MiniLMTextEncoder, WordPieceVocab

        encoder = MiniLMTextEncoder(embed_dim=1).eval()  # only the frozen backbone is used
        return caption_backbone_features(encoder, WordPieceVocab(), captions, progress=progress)

    entry = cached_features(cache_root(), caption_key_inputs(minilm_identity().to_dict(), captions), compute,
                            len(captions))
    vectors = np.asarray(entry.features, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def near_duplicates(captions: Sequence[str], ids: np.ndarray, tau: float, progress: bool = False) -> np.ndarray:
    """The near-duplicate text pairs of a caption set at ``tau`` (:func:`near_duplicate_keys`),
    cached beside the backbone features, so every mining of the same captions reuses them."""
    from aoq.backbone_cache import cache_root, caption_key_inputs
    from aoq.io import ArtefactError, atomic_dir, atomic_save_npy, read_manifest, sha256_json, write_manifest
    from aoq.models.packages import minilm_identity

    inputs = {"kind": NEAR_DUPLICATES, "tau": tau, **caption_key_inputs(minilm_identity().to_dict(), captions)}
    folder = cache_root() / NEAR_DUPLICATES / sha256_json(inputs)
    try:
        read_manifest(folder, kind=NEAR_DUPLICATES)
        return np.load(folder / "keys.npy")
    except (ArtefactError, OSError, ValueError):
        pass  # missing or damaged: computed again
    vectors = sentence_vectors(captions, progress)
    first = np.unique(ids, return_index=True)[1]  # one vector per distinct text, in text-id order
    keys = near_duplicate_keys(vectors[first], tau)
    with atomic_dir(folder) as tmp:
        atomic_save_npy(tmp / "keys.npy", keys)
        write_manifest(tmp, NEAR_DUPLICATES, inputs)
    return keys


def filter_inputs(split: SplitData, img_emb: np.ndarray, cap_emb: np.ndarray, tau: float, rho: float,
                  progress: bool = False) -> FilterInputs:
    """What the filters read for a training split mined with these embeddings; the near-duplicate
    pairs are read (or computed) whenever a filter runs, since every filter's flags are recorded."""
    ids = text_ids(split.captions)
    img, cap = (canonical_inputs(np.asarray(x, dtype=np.float32))[0] for x in (img_emb, cap_emb))  # as mined
    return FilterInputs(split.captions_per_image, ids, near_duplicates(split.captions, ids, tau, progress), img, cap,
                        rho)


def filtered_lists(mine: Mine, top_captions: int, top_images: int, n_images: int, cpi: int, inputs: FilterInputs,
                   filters: Sequence[str]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The lists round 2 samples from, ``top_captions`` / ``top_images`` candidates per row that no
    enabled filter flags, and the raw lists with the filters' flags (``aoq.mined.FILTER_FILES``
    keys, trimmed to the deepest candidate flagged).

    The raw lists are mined ``DEPTH_FACTOR`` times deeper at once; every row is flagged over its
    first ``SLICE_FACTOR`` x depth candidates, and a row that keeps too few over the next slice,
    twice as wide, and so on; candidates a row did not need carry ``UNCHECKED``. The few rows that run
    out of the deep list (a generic caption with near-duplicates all over the gallery) are ranked
    over the whole gallery in the miner's order (canonical scores, ties by id) and take their
    remaining candidates from there. With text filters only, flags are compiled lookups
    (:mod:`aoq_train.mining.text_flags`): the same flags, slices and lists as numpy's path.

    Raises:
        ValueError: even the whole gallery leaves a row too few candidates.
    """
    raw = dict(zip(("img", "cap"), mine(min(cpi * (n_images - 1), DEPTH_FACTOR * top_captions),
                                        min(n_images - 1, DEPTH_FACTOR * top_images))))
    enabled = enabled_bits(filters)
    out: dict[str, np.ndarray] = {}
    tops = []
    for side, top in (("img", top_captions), ("cap", top_images)):
        image_anchors = side == "img"
        # text filters only: compiled lookups; with the teacher, numpy (its einsum decides its ties)
        tables = text_tables(inputs, filters, image_anchors) if text_only(filters) else None
        deep = np.asarray(raw[side])
        bits, checked, kept = _flag_progressively(deep, np.full(len(deep), top), inputs, filters, image_anchors,
                                                  tables=tables)
        short = np.flatnonzero(kept < top)
        # every other row keeps ``top`` within the flagged columns; the short rows' lists come
        # from the whole gallery, written over what compact takes from their (all kept) heads
        flagged = bits[:, :checked] & enabled
        flagged[short] = KEPT
        lists = compact(deep[:, :checked], flagged, top)
        margin = float32_margin(inputs.img_emb, inputs.cap_emb) if len(short) else 0.0
        step = max(1, BLOCK_ELEMENTS // (len(inputs.text_ids) if image_anchors else n_images))
        for block in (short[i:i + step] for i in range(0, len(short), step)):
            kept_deep = (bits[block] & enabled) == 0
            if tables is None:
                lists[block] = _whole_gallery(block, deep[block], kept_deep, top, inputs, filters, image_anchors,
                                              margin)
            else:
                lists[block] = _whole_gallery_text(block, deep[block], kept_deep, top, inputs, filters, tables,
                                                   image_anchors, margin)
            log.info("filters %s: %d %s lists needed more than %d candidates; ranked over the whole gallery",
                     list(filters), len(short), "image" if image_anchors else "caption", deep.shape[1])
        tops.append(lists)
        out[f"{side}_raw"], out[f"{side}_flags"] = deep[:, :checked], bits[:, :checked]
    return tops[0], tops[1], out


def _gallery_scores(rows: np.ndarray, deep: np.ndarray, inputs: FilterInputs,
                    image_anchors: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(queries, gallery, float32 scores of the anchors ``rows`` against the whole gallery with
    their own positives and their deep lists at -inf, how many columns that excludes)."""
    img, cap, cpi = inputs.img_emb, inputs.cap_emb, inputs.captions_per_image
    queries, gallery = (img, cap) if image_anchors else (cap, img)
    own = rows[:, None] * cpi + np.arange(cpi) if image_anchors else (rows // cpi)[:, None]
    scores = queries[rows] @ gallery.T  # float32: finds the candidates, the canonical score ranks them
    np.put_along_axis(scores, np.concatenate([own, deep], axis=1), -np.inf, axis=1)  # ranked last, never taken
    return queries, gallery, scores, own.shape[1] + deep.shape[1]


def _whole_gallery_text(rows: np.ndarray, deep: np.ndarray, kept: np.ndarray, top: int, inputs: FilterInputs,
                        filters: Sequence[str], tables: TextTables, image_anchors: bool, margin: float) -> np.ndarray:
    """:func:`_whole_gallery` for text filters only: their flags are a lookup per pair, so every
    flagged item of the gallery is set aside first (-inf) and one ranking of what remains gives
    each row's next unflagged candidates at once, with no rounds of ranking and flagging heads.
    ``kept``: the deep lists' unflagged candidates."""
    queries, gallery, scores, _ = _gallery_scores(rows, deep, inputs, image_anchors)
    available = np.empty(len(rows), dtype=np.int64)
    mask_flagged(scores, np.ascontiguousarray(rows, dtype=np.int64), image_anchors, available, *tables.args())
    needs = top - kept.sum(axis=1)
    if (available < needs).any():
        _too_few(rows[np.argmax(available < needs)], top, filters, image_anchors)
    k = int(needs.max())
    g = scores.shape[1]
    # every item of a row's exact top k lies within 2 margins of its k-th float32 score
    # (:func:`_ranked_head`); a float32 level at or below that is the same test without a float64
    # copy, and it never passes a -inf (a row with fewer than k left keeps all of them)
    level = float32_levels(np.partition(scores, g - k, axis=1)[:, g - k], 2 * margin)
    r, c = np.nonzero(scores >= level[:, None])  # row-major: r ascending
    order = np.lexsort((c, -canonical_pairs(queries, gallery, rows[r], c), r))
    r, c = r[order], c[order]
    starts, ends = (np.searchsorted(r, np.arange(len(rows)), side=side) for side in ("left", "right"))
    head = c[np.minimum(starts[:, None] + np.arange(k), ends[:, None] - 1)]  # past a row's needs: repeats, not taken
    # compact keeps what is KEPT (0, False): the deep lists' unflagged candidates, then each row's needs
    return compact(np.concatenate([deep, head], axis=1),
                   np.concatenate([~kept, np.arange(k) >= needs[:, None]], axis=1), top)


def _too_few(anchor: int, top: int, filters: Sequence[str], image_anchors: bool) -> NoReturn:
    """Refuse a list the whole gallery cannot fill (``ValueError``)."""
    raise ValueError(f"the filters {list(filters)} leave the {'image' if image_anchors else 'caption'} list "
                     f"of anchor {anchor} fewer than {top} candidates even over the whole gallery: "
                     "lower mining.top_captions / top_images or loosen the filters")


def _whole_gallery(rows: np.ndarray, deep: np.ndarray, kept: np.ndarray, top: int, inputs: FilterInputs,
                   filters: Sequence[str], image_anchors: bool, margin: float) -> np.ndarray:
    """The first ``top`` unflagged candidates of the anchors ``rows``: those of their deep lists
    (``kept``: unflagged), then the rest of the gallery in the miner's order (canonical score,
    then id), ranked and flagged over heads as deep as the deep lists, four times deeper each
    time a row still keeps too few. ``margin``: :func:`aoq_train.mining.canonical.float32_margin`
    of the embeddings."""
    queries, gallery, scores, excluded = _gallery_scores(rows, deep, inputs, image_anchors)
    available = scores.shape[1] - excluded
    needs = top - kept.sum(axis=1)
    out = np.empty((len(rows), top), dtype=np.int32)
    todo, depth = np.arange(len(rows)), min(available, deep.shape[1])  # these rows needed more than that
    if available == 0:  # the deep lists held the whole gallery: nothing left to rank
        _too_few(rows[0], top, filters, image_anchors)
    while len(todo):
        head = _ranked_head(scores if len(todo) == len(rows) else scores[todo], depth, margin,
                            lambda r, c: canonical_pairs(queries, gallery, rows[todo][r], c))
        bits = _flag_progressively(head, needs[todo], inputs, filters, image_anchors, rows[todo])[0]
        more = first_flag(bits, filters) == KEPT
        done = more.sum(axis=1) >= needs[todo]  # unchecked candidates lie past a row's needs only
        if done.any():
            out[todo[done]] = compact(np.concatenate([deep[todo[done]], head[done]], axis=1),
                                      np.where(np.concatenate([kept[todo[done]], more[done]], axis=1), KEPT, 1), top)
        todo = todo[~done]
        if len(todo) and depth == available:
            _too_few(rows[todo[0]], top, filters, image_anchors)
        depth = min(available, 4 * depth)
    return out


def _ranked_head(scores: np.ndarray, k: int, margin: float,
                 exact: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """(R, k) ids of every row's ``k`` best exact scores, by exact score then id. ``scores`` are
    float32 products within ``margin`` of the exact ones (``exact(rows, ids)``): every item of a
    row's exact top k scores at least the k-th float32 score minus ``2 margin`` (at least k
    items reach the k-th float32 score, so their exact scores are above any item below that),
    so only those are scored exactly and sorted."""
    kth = np.partition(scores, scores.shape[1] - k, axis=1)[:, scores.shape[1] - k]
    r, c = np.nonzero(scores >= (kth.astype(np.float64) - 2 * margin)[:, None])  # row-major: r ascending
    order = np.lexsort((c, -exact(r, c), r))
    starts = np.searchsorted(r[order], np.arange(len(scores)))
    return c[order][starts[:, None] + np.arange(k)]


def _flag_progressively(lists: np.ndarray, needs: np.ndarray, inputs: FilterInputs, filters: Sequence[str],
                        image_anchors: bool, rows: np.ndarray | None = None,
                        tables: TextTables | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """The flags of the anchors' candidates ``lists`` (anchor ``rows[i]`` has row ``i``; all
    anchors by default), flagged a slice at a time for the rows that still keep fewer than
    their ``needs`` (slices twice as wide each time), the number of leading columns any row
    was flagged over, and how many flagged candidates of each row no filter flags; unchecked
    candidates carry ``UNCHECKED``. ``tables``: text filters only, flagged by the compiled
    kernel (the same slices, row by row)."""
    anchors = np.arange(lists.shape[0]) if rows is None else np.asarray(rows)
    bits = np.full(lists.shape, UNCHECKED, dtype=np.uint8)
    kept = np.zeros(lists.shape[0], dtype=np.int64)
    width = int(np.ceil(SLICE_FACTOR * max(1, int(needs.max(initial=1)))))
    if tables is not None:
        checked = flag_progressively(np.ascontiguousarray(lists), np.ascontiguousarray(anchors, dtype=np.int64),
                                     np.ascontiguousarray(needs, dtype=np.int64), width, image_anchors, bits, kept,
                                     *tables.args())
        return bits, checked, kept
    todo, start = np.flatnonzero(needs > 0), 0
    while len(todo) and start < lists.shape[1]:
        stop = min(lists.shape[1], start + width)
        bits[todo, start:stop] = flag_rows(lists[todo, start:stop], anchors[todo], inputs, filters, image_anchors)
        kept[todo] += (first_flag(bits[todo, start:stop], filters) == KEPT).sum(axis=1)  # only the new slice
        todo, start, width = todo[kept[todo] < needs[todo]], stop, 2 * width
    return bits, start, kept


def filter_stats(filtered: dict[str, np.ndarray], filters: Sequence[str], top_captions: int,
                 top_images: int) -> dict[str, Any]:
    """What the filters flagged within the unfiltered lists' depth (the first ``top_captions`` /
    ``top_images`` raw candidates, what round 2 would otherwise sample from), per direction: for
    each filter on its own and for the enabled ones together, the share of candidates flagged
    and the share of lists with at least one."""
    out: dict[str, Any] = {"filters": list(filters)}
    for side, depth in (("img", top_captions), ("cap", top_images)):
        bits = np.asarray(filtered[f"{side}_flags"])[:, :depth]
        masks = {name: (bits >> k & 1).astype(bool) for k, name in enumerate(ORDER) if name in filters}
        masks["enabled"] = first_flag(bits, filters) > 0
        out["image_lists" if side == "img" else "caption_lists"] = {
            name: {"candidates": float(mask.mean()), "lists": float(mask.any(axis=1).mean())}
            for name, mask in masks.items()}
    return out
