"""Offline hard-negative mining ("global similarity score prediction", docs/method.md, Two rounds).

After round 1, every training image is scored against every training caption. For each image we
keep the ids of its ``top_captions`` best captions other than its own, and for each caption the
ids of its ``top_images`` best images other than its own. Round 2 samples its offline negatives
from these lists (:mod:`aoq_train.round2.sampling`).

How it is computed (torch backend)
    On the CPU, one pass for both directions (:mod:`aoq_train.mining.fused`): both lists read the
    same matrix ``img @ cap.T`` (rows: an image's top captions; columns: a caption's top images),
    so every tile of it is computed once, 512 image rows x 1024 captions at a time, and both
    directions select from it. A score is a candidate when its tile product reaches a list's
    threshold minus a proven bound on that product's distance to the pair's canonical score
    (below); candidates are re-scored canonically and enter the row's (column's) candidate pool
    when the canonical score reaches the threshold, first estimated from a fair sample, then
    raised as the pools fill (to a k-th best, exact, or to a new estimate from the larger
    sample). The candidates are kept as packed keys and sorted once at the end. Lists whose
    estimate was too high are redone with no threshold, so the result is exact.
    ``precision="bf16"`` scores the tiles with bfloat16 products (:mod:`aoq_train.mining.bf16`
    bounds their error), ``precision="int8"`` with exact int8 products of rounded embeddings
    (:mod:`aoq_train.mining.int8`); ``precision="auto"`` (the default) takes bf16 where this
    CPU's bf16 products pay, else int8 where its int8 products do. On CUDA, each direction on its own (:mod:`aoq_train.mining.topk`): a block of
    ``block_size`` queries against the gallery one chunk at a time, float32 (or float16)
    products, the compare on the GPU; the candidates within the bound of each list's k-th best
    are re-scored canonically on the GPU.

FAISS backend
    ``IndexFlatIP`` searched with ``k = H + own positives + 64``, own positives dropped, the
    candidates within the bound of the k-th re-scored canonically. A row where near-equal scores
    may continue past FAISS's cut is redone by the torch path.

Tie rule (deterministic, the same on every machine)
    Higher canonical score first; among equal scores, the lower gallery id first. The canonical
    score (:mod:`aoq_train.mining.canonical`) is a float64 sum of the float32 embeddings'
    products in a fixed order, rounded to float32: bit for bit the same whatever the CPU, the
    BLAS, the precision mode or the device, so the lists are too. Implemented by ranking a
    packed int64 key ``(order-preserving int32 of the score) << 32 | (2**31 - 1 - id)``
    (:mod:`aoq_train.mining.keys`). The rule is recorded with every job and artefact
    (``ranking``): artefacts of another rule are mined again.

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
