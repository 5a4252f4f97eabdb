"""The two searches, on one served model: a sentence against the gallery images, an image
(a gallery image id or an upload) against the gallery captions.

The ground truth is known when the query is a gallery item (a caption's text exactly, or a
gallery image id). Its rank is over the whole gallery, not the top k: when it is among the
exact top-k results, the rank is read from them; otherwise it is computed against every gallery
embedding (one matrix-vector product), as in the evaluation code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from aoq_serve.index import faiss_index
from aoq_serve.errors import ServiceError
from aoq_serve.featurize import encode_text, encode_upload
from aoq_serve.registry import ServingModel
from aoq_serve.schemas import (
    THUMBNAIL_SIZE,
    CaptionHit,
    ImageHit,
    SearchImageOut,
    SearchTextOut,
)


@dataclass(frozen=True)
class Urls:
    """Absolute URLs of images, built from the base URL the client used to reach the service."""

    base: str

    def image(self, image_id: int) -> str:
        return f"{self.base}/images/{image_id}"

    def thumbnail(self, image_id: int, size: int = THUMBNAIL_SIZE) -> str:
        return f"{self.base}/images/{image_id}?size={size}"


def _ground_truth_rank(
    served: ServingModel, modality: str, query: np.ndarray, scores: np.ndarray, ids: np.ndarray,
    truth_ids: np.ndarray, truth_positions: np.ndarray,
) -> float:
    """1-based full-gallery rank of the best ground-truth item (expected rank over tie orders, as
    in aoq.metrics)."""
    found = np.isin(ids, truth_ids)
    if found.any() and served.index.config["index_type"] == "flat":
        best = scores[found].max()
        # Exact top-k: everything scoring at or above the best ground truth is in the list too,
        # unless a tie runs past the cut (the last score equals it): then rank the full gallery.
        if scores[-1] < best:
            return faiss_index.tied_rank(scores[~found], scores[found])
    return faiss_index.full_rank(served.index.embeddings[modality], query, truth_positions)


def search_text(served: ServingModel, query: str, k: int, urls: Urls) -> SearchTextOut:
    """Rank the gallery images for a sentence."""
    start = time.perf_counter()
    vector = encode_text(served.checkpoint, query)
    scores, ids = faiss_index.search(served.index.faiss["images"], vector, k)
    gallery = served.gallery
    position = gallery.text_positions.get(query)
    caption_id, truth, rank = None, np.empty(0, dtype=np.int64), None
    if position is not None:
        caption_id = int(gallery.ids.caption_ids[position])
        truth = gallery.ids.caption_image_ids[position : position + 1]
        truth_position = np.array([gallery.image_position(int(truth[0]))])
        rank = _ground_truth_rank(served, "images", vector, scores, ids, truth, truth_position)
    truth_set = set(truth.tolist())
    results = [
        ImageHit(rank=r + 1, image_id=int(i), score=float(s), image_url=urls.image(int(i)),
                 thumbnail_url=urls.thumbnail(int(i)), is_ground_truth=int(i) in truth_set)
        for r, (s, i) in enumerate(zip(scores, ids))
    ]
    return SearchTextOut(
        model=served.name, query=query, caption_id=caption_id, ground_truth_ids=sorted(truth_set),
        ground_truth_rank=rank, results=results, latency_ms=(time.perf_counter() - start) * 1000,
    )


def search_image(
    served: ServingModel, k: int, image_id: int | None = None, upload: Image.Image | None = None
) -> SearchImageOut:
    """Rank the gallery captions for a gallery image (by id) or an uploaded image.

    Raises:
        ServiceError: 404 the id is not a gallery image of the model; 422 an upload the model
            cannot featurise.
    """
    start = time.perf_counter()
    gallery = served.gallery
    truth, rank = np.empty(0, dtype=np.int64), None
    if image_id is not None:
        position = gallery.image_position(image_id)
        if position is None:
            raise ServiceError(
                404, f"image {image_id} is not in the gallery of model {served.name!r} "
                f"(dataset {gallery.dataset!r}, split {gallery.split!r})"
            )
        vector = np.asarray(served.index.embeddings["images"][position], dtype=np.float32)
    else:
        vector = encode_upload(served.checkpoint, upload, gallery.synthetic, gallery.dataset)
    scores, ids = faiss_index.search(served.index.faiss["captions"], vector, k)
    if image_id is not None:
        owners = gallery.ids.caption_image_ids
        first, last = np.searchsorted(owners, image_id, "left"), np.searchsorted(owners, image_id, "right")
        truth = gallery.ids.caption_ids[first:last]
        rank = _ground_truth_rank(served, "captions", vector, scores, ids, truth, np.arange(first, last))
    truth_set = set(truth.tolist())
    results = []
    for r, (s, c) in enumerate(zip(scores, ids)):
        p = gallery.caption_position(int(c))
        results.append(CaptionHit(rank=r + 1, caption_id=int(c), text=gallery.captions[p],
                                  image_id=int(gallery.ids.caption_image_ids[p]), score=float(s),
                                  is_ground_truth=int(c) in truth_set))
    return SearchImageOut(
        model=served.name, image_id=image_id, ground_truth_ids=sorted(truth_set), ground_truth_rank=rank,
        results=results, latency_ms=(time.perf_counter() - start) * 1000,
    )
