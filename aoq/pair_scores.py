"""Score matrices of models that score pairs (SCAN, BFAN): bounded-memory blocks and shortlists.

A cross-attention model has no embedding to index, so the (n_images, n_captions) matrix is built
block by block from :class:`aoq.embed.EncodedFragments`: each block's (B, C, R, L) region-word
tensor holds at most :data:`BLOCK_ELEMENTS` elements, whatever the split's size. The blocks are
small enough for a core's cache, and on a CPU they are spread over ``torch.get_num_threads()``
workers that each run one block at a time on one thread: a block's many small element-wise
passes then never wait at a barrier for a descheduled sibling thread (the usual state of a shared
machine), and the cache holds the block's temporaries between passes (docs/evaluation.md).

Shortlist mode (the re-ranker setting): an embedding model ranks every item for each query, and
the pair model re-scores only the top N; the items beyond the shortlist keep the embedding
model's order below every shortlisted one (:func:`shortlist_sims`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from aoq.embed import EncodedFragments
from aoq.metrics import FOLD_IMAGES, N_FOLDS
from aoq.models.attention import RegionStats
from aoq.ranks import SimsFn

#: elements of one block's (B, C, R, L) region-word tensor: bounds the temporaries of a block
#: (float32: 512 KiB, about a core's L2 cache).
BLOCK_ELEMENTS = 1 << 17
#: captions per block (the images per block follow from BLOCK_ELEMENTS).
CAPTION_BLOCK = 32
#: the same two bounds on an accelerator: it is fed by few large kernels rather than many small
#: ones, and its memory holds a large block's temporaries (float32: 128 MiB each).
ACCELERATOR_BLOCK = (1 << 25, 512)
#: captions per step of :func:`score_matrix`'s progress bar (many blocks: work for every worker).
PROGRESS_CAPTIONS = 16 * CAPTION_BLOCK
#: (images, captions) of the COCO 5K test set, for the projected time.
COCO_5K = (FOLD_IMAGES * N_FOLDS, FOLD_IMAGES * N_FOLDS * 5)

#: ``score(regions (B, R, d), words (C, L, d), lengths (C,)) -> (B, C)`` on the model's device.
PairScoreFn = Callable[[Tensor, Tensor, Tensor], Tensor]
#: :data:`PairScoreFn` with the images' precomputed region terms (or None) as a fourth argument.
StatsScoreFn = Callable[[Tensor, Tensor, Tensor, RegionStats | None], Tensor]


@dataclass(frozen=True)
class ScoringTime:
    """How long a score matrix took: ``seconds`` for ``pairs`` pairs."""

    seconds: float
    pairs: int

    def projected_seconds(self, pairs: int) -> float:
        """The time of ``pairs`` pairs at this rate."""
        return self.seconds * pairs / max(self.pairs, 1)


def _to(x: np.ndarray, device: torch.device) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


@contextmanager
def _one_thread_per_block(device: torch.device) -> Iterator[ThreadPoolExecutor]:
    """A pool of ``torch.get_num_threads()`` block workers (one on an accelerator), with torch's
    intra-op threads set to one meanwhile (restored after)."""
    threads = torch.get_num_threads()
    workers = threads if device.type == "cpu" else 1
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            yield pool
    finally:
        torch.set_num_threads(threads)


def block_bounds(device: torch.device) -> tuple[int, int]:
    """(elements, captions) of one block on ``device``: cache-sized on a CPU, large elsewhere."""
    return (BLOCK_ELEMENTS, CAPTION_BLOCK) if device.type == "cpu" else ACCELERATOR_BLOCK


def _images_per_block(words: Tensor, regions: int, elements: int) -> int:
    return max(1, elements // (words.shape[0] * words.shape[1] * regions))


def score_block(score: PairScoreFn, fragments: EncodedFragments, image_ids: np.ndarray | range,
                caption_ids: np.ndarray | range, device: torch.device) -> np.ndarray:
    """The (len(image_ids), len(caption_ids)) float32 scores of these images and captions, in
    sub-blocks of at most :data:`BLOCK_ELEMENTS` region-word products, spread over the workers
    of :func:`_one_thread_per_block`."""
    image_ids, caption_ids = np.asarray(image_ids), np.asarray(caption_ids)
    out = np.empty((len(image_ids), len(caption_ids)), dtype=np.float32)
    regions = fragments.regions.shape[1]
    elements, caption_block = block_bounds(device)

    blocks = []
    with torch.inference_mode():
        for c0 in range(0, len(caption_ids), caption_block):
            words, lengths = fragments.captions(caption_ids[c0 : c0 + caption_block])
            blocks.append((c0, words.to(device), lengths.to(device)))
    tasks = [(k, i0) for k, (_, words, _) in enumerate(blocks)
             for i0 in range(0, len(image_ids), _images_per_block(words, regions, elements))]

    def run(task: tuple[int, int]) -> None:
        c0, words, lengths = blocks[task[0]]
        rows = image_ids[task[1] : task[1] + _images_per_block(words, regions, elements)]
        with torch.inference_mode():
            scores = score(_to(fragments.regions[rows], device), words, lengths)
            out[task[1] : task[1] + len(rows), c0 : c0 + words.shape[0]] = scores.float().cpu().numpy()

    with _one_thread_per_block(device) as pool:
        list(pool.map(run, tasks))  # list(): re-raises a worker's exception here
    return out


def score_matrix(score: PairScoreFn, fragments: EncodedFragments, device: torch.device,
                 images: range | None = None, progress: bool = False) -> tuple[np.ndarray, ScoringTime]:
    """The scores of ``images`` (a range; default all) and their captions (``captions_per_image``
    consecutive captions per image), with a progress bar counting pairs.

    Returns:
        The float32 (len(images), captions) matrix and the time it took.
    """
    images = range(fragments.n_images) if images is None else images
    cpi = fragments.n_captions // fragments.n_images
    captions = range(images.start * cpi, images.stop * cpi)
    out = np.empty((len(images), len(captions)), dtype=np.float32)
    start = time.perf_counter()
    with tqdm(total=out.size, desc="cross-attention scores", unit="pair", unit_scale=True,
              disable=not progress, leave=False) as bar:
        for c0 in range(0, len(captions), PROGRESS_CAPTIONS):
            cols = captions[c0 : c0 + PROGRESS_CAPTIONS]
            out[:, c0 : c0 + len(cols)] = score_block(score, fragments, images, cols, device)
            bar.update(len(images) * len(cols))
    return out, ScoringTime(time.perf_counter() - start, out.size)


def fold_scores(score: PairScoreFn, fragments: EncodedFragments, device: torch.device, fold_images: int,
                n_folds: int, progress: bool = False) -> tuple[SimsFn, ScoringTime]:
    """The COCO 1K protocol's score blocks only (each fold's images against its own captions, a
    fifth of the 5K matrix's pairs), as a sims function over the first ``fold_images * n_folds``
    images for :func:`aoq.metrics.fold_1k`."""
    blocks, seconds = [], 0.0
    for f in range(n_folds):
        block, timing = score_matrix(score, fragments, device, range(f * fold_images, (f + 1) * fold_images), progress)
        blocks.append(block)
        seconds += timing.seconds
    cpi = fragments.n_captions // fragments.n_images

    def fn(rows: slice, cols: slice) -> np.ndarray:
        f = rows.start // fold_images
        r0, c0 = f * fold_images, f * fold_images * cpi
        if rows.stop > r0 + fold_images or not c0 <= cols.start <= cols.stop <= c0 + fold_images * cpi:
            raise ValueError(f"rows {rows} and columns {cols} are not inside one fold")
        return blocks[f][rows.start - r0 : rows.stop - r0, cols.start - c0 : cols.stop - c0]

    return fn, ScoringTime(seconds, sum(b.size for b in blocks))


def shortlist(base: np.ndarray, n: int) -> np.ndarray:
    """(Q, min(n, G)) indices of each row's top ``n`` items of ``base`` (Q, G), best first (ties
    by index)."""
    if n < 1:
        raise ValueError(f"a shortlist needs n >= 1, got {n}")
    return np.argsort(-base, axis=1, kind="stable")[:, :n]


def rescore_shortlist(score: PairScoreFn, fragments: EncodedFragments, short: np.ndarray, queries: str,
                      device: torch.device, progress: bool = False) -> np.ndarray:
    """The pair model's scores of each query's shortlisted items: (Q, N), ``out[q, k]`` the score
    of query q with item ``short[q, k]``.

    Args:
        queries: ``images`` (rows of ``short`` are images, items captions) or ``captions``.
    """
    if queries not in ("images", "captions"):
        raise ValueError(f"queries must be 'images' or 'captions', got {queries!r}")
    out = np.empty(short.shape, dtype=np.float32)
    for q in tqdm(range(short.shape[0]), desc=f"re-rank ({queries} as queries)", disable=not progress, leave=False):
        if queries == "images":
            out[q] = score_block(score, fragments, [q], short[q], device)[0]
        else:
            out[q] = score_block(score, fragments, short[q], [q], device)[:, 0]
    return out


def shortlist_sims(base: np.ndarray, short: np.ndarray, rescored: np.ndarray) -> np.ndarray:
    """(Q, G) scores ranking each query's shortlist by ``rescored`` and every other item below
    it, in ``base``'s order (``base`` shifted below the lowest re-scored value)."""
    shift = (base.max() - rescored.min() + 1.0) if base.size else 0.0
    out = (base - shift).astype(np.float64)
    np.put_along_axis(out, short, rescored.astype(np.float64), axis=1)
    return out


def score_sentence(score: StatsScoreFn, words: np.ndarray, regions: np.ndarray, images: np.ndarray,
                   device: torch.device, stats: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """(len(images),) scores of one sentence's (L, d) word states against the gallery images
    ``images`` (rows of ``regions`` (G, R, d)), in one block (a shortlist's (N, 1, R, L) products
    are small): a re-ranker's text query.

    Args:
        stats: the gallery's precomputed region terms (:func:`aoq.models.attention.region_stats`:
            (G, R, R) and (G, R), rows as ``regions``): the largest passes of a query's scoring.
    """
    rows = np.asarray(images)
    with torch.inference_mode():
        terms = None if stats is None else (_to(stats[0][rows], device), _to(stats[1][rows], device))
        out = score(_to(regions[rows], device), _to(words, device)[None],
                    torch.tensor([len(words)], device=device), terms)
        return out[:, 0].float().cpu().numpy()


def score_image(score: PairScoreFn, regions: np.ndarray, gallery: EncodedFragments, captions: np.ndarray,
                device: torch.device) -> np.ndarray:
    """(len(captions),) scores of one image's (R, d) regions against the gallery captions
    ``captions`` of ``gallery``: a re-ranker's image query."""
    query = EncodedFragments(regions[None], gallery.words, gallery.offsets)
    return score_block(score, query, [0], captions, device)[0]
