"""Offline hard-negative mining ("global similarity score prediction", docs/method.md, Two rounds).

After round 1, every training image is scored against every training caption. For each image we
keep the ids of its ``top_captions`` best captions other than its own, and for each caption the
ids of its ``top_images`` best images other than its own. Round 2 samples its offline negatives
from these lists (:mod:`aoq_train.mining.sampling`).

How it is computed (torch backend)
    On the CPU, one pass for both directions (:mod:`aoq_train.mining.fused`): both lists read the
    same matrix ``img @ cap.T`` (rows: an image's top captions; columns: a caption's top images),
    so every tile of it is computed once, 512 image rows x 1024 captions at a time, and both
    directions select from it. A score enters a row's (column's) candidate pool when it reaches
    the row's (column's) threshold, first estimated from a fair sample of the scores, then raised
    as the pools fill (to a k-th best, exact, or to a new estimate from the larger sample). The
    candidates are kept as packed keys and sorted once at the end. Lists whose estimate was too
    high are redone with no threshold, so the result is exact. ``precision="bf16"`` scores the
    tiles with bfloat16 products, filters them with a proven bound on their error
    (:mod:`aoq_train.mining.bf16`) and re-scores only the candidates in float32: the same exact
    lists. ``precision="auto"`` (the default) does so where this CPU's bf16 products pay.
    On CUDA, each direction on its own (:mod:`aoq_train.mining.topk`): a block of ``block_size``
    queries against the gallery one chunk at a time, float32 products (``precision="fp16"``:
    float16 products with float32 results, faster, not exact), the compare on the GPU; only the
    passing scores travel to the host.

FAISS backend
    ``IndexFlatIP`` searched with ``k = H + own positives``, own positives dropped. A row whose
    lowest returned score equals its k-th kept score (a tie may continue past FAISS's cut) is
    redone by the torch path, so both backends follow the same tie rule.

Tie rule (deterministic)
    Higher score first; among equal scores, the lower gallery id first. Scores are compared as
    float32 values (``-0.0 == +0.0``). Implemented by ranking a packed int64 key
    ``(order-preserving int32 of the score) << 32 | (2**31 - 1 - id)``, so the ids equal those of
    a brute-force reference (full matrix, stable argsort on ``-score``) whenever both see the
    same float32 scores (always on exactly representable data; float16 products on the GPU give
    slightly different scores, hence a different order among near-ties).

Resuming
    With ``work_dir``, every finished block is saved atomically as
    ``work_dir/parts/<direction>_<first row>.npy`` next to a ``job.json`` describing the job
    (embedding hashes, H, blocks, backend, precision, layout). A rerun of the same job skips the
    blocks already on disk. On the CPU the caption lists are complete only at the end of the pass;
    its column pools are saved every ``fused.SNAPSHOT_SECONDS`` (10 minutes), so ``kill -9`` loses
    at most about that much work. The artefact itself is written by :func:`save_mined` into a
    temporary directory renamed into place at the end.
"""

from aoq.mined import CAP_FILE, IMG_FILE, KIND, MinedNegatives, load_mined, save_mined
from aoq_train.mining.driver import mine_offline_negatives
from aoq_train.mining.job import mine_with_checkpoint
from aoq_train.mining.keys import decode_ids, decode_scores, encode_keys

__all__ = [
    "CAP_FILE", "IMG_FILE", "KIND", "MinedNegatives", "decode_ids", "decode_scores", "encode_keys",
    "load_mined", "mine_offline_negatives", "mine_with_checkpoint", "save_mined",
]
