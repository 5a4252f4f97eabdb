"""Offline hard-negative mining ("global similarity score prediction", docs/method.md, Two rounds).

After round 1, every training image is scored against every training caption. For each image we
keep the ids of its ``top_captions`` best captions other than its own, and for each caption the
ids of its ``top_images`` best images other than its own. Round 2 samples its offline negatives
from these lists (:mod:`training.sampling`).

How it is computed (torch backend)
    Blocked and streamed: a block of ``block_size`` queries is scored against the gallery one
    chunk of ``gallery_chunk`` columns at a time, so the full ``n_images x n_captions`` matrix
    never exists. The first chunk is a strided sample of the gallery (every n-th id), so its
    scores give each row a representative threshold: the score with about ``1.25 k + 32``
    gallery scores above it. Every chunk then contributes only its scores ``>= threshold``
    (one vectorised compare; ~2.5% of the scores), which are kept as packed keys and sorted
    once at the end. This costs a small fraction of the matrix product, unlike a running
    ``torch.topk`` merge, which is slower than the product itself on the CPU. Two safety
    valves keep it exact: a row holding more than ``max(2k, k + 4096)`` candidates is cut to
    its best k and its threshold raised to the k-th best score; a row that ends with fewer than
    k candidates (threshold guessed too high) is redone with no threshold.
    float32 on the CPU; on CUDA the products run in float16 and the compare on the GPU, only
    the passing scores travel to the host.

FAISS backend
    ``IndexFlatIP`` searched with ``k = H + own positives``, own positives dropped. A row whose
    lowest returned score equals its k-th kept score (a tie may continue past FAISS's cut) is
    redone by the torch path, so both backends follow the same tie rule.

Tie rule (deterministic)
    Higher score first; among equal scores, the lower gallery id first. Scores are compared as
    float32 values (``-0.0 == +0.0``). Implemented by ranking a packed int64 key
    ``(order-preserving int32 of the score) << 32 | (2**31 - 1 - id)``, so the ids equal those of
    a brute-force reference (full matrix, stable argsort on ``-score``) whenever both see the
    same float32 scores (always on exactly representable data; on the GPU the float16 products
    give slightly different scores, hence possibly a different order among near-ties).

Resuming
    With ``work_dir``, every finished query block is saved atomically as
    ``work_dir/parts/<direction>_<first row>.npy`` next to a ``job.json`` describing the job
    (embedding hashes, H, blocks, backend, precision). A rerun of the same job skips the blocks
    already on disk, so ``kill -9`` loses at most the block in progress. The artefact itself is
    written by :func:`save_mined` into a temporary directory renamed into place at the end.
"""

from aoq.mined import CAP_FILE, IMG_FILE, KIND, MinedNegatives, load_mined, save_mined
from training.mining.driver import mine_offline_negatives
from training.mining.job import mine_with_checkpoint
from training.mining.keys import decode_ids, decode_scores, encode_keys

__all__ = [
    "CAP_FILE", "IMG_FILE", "KIND", "MinedNegatives", "decode_ids", "decode_scores", "encode_keys",
    "load_mined", "mine_offline_negatives", "mine_with_checkpoint", "save_mined",
]
