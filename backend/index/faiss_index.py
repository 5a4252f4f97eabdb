"""FAISS indexes of one model's gallery, written as one atomic artefact directory.

Layout of ``<index_dir>/<model>/``::

    images.faiss     inner-product index of the gallery images (vector id = catalogue image id)
    captions.faiss   the same for the gallery captions (vector id = catalogue caption id)
    images.npy       the image embeddings (float32, row p = image position p), for exact
    captions.npy     ground-truth ranks over the full gallery and for image-id queries
    image_ids.npy    catalogue ids by position
    caption_ids.npy
    manifest.json    kind "aoq-index", model, checkpoint hash, index type, tuned parameters and
                     measured recall@10 against exact search, the hubness bank's provenance,
                     per-file hashes
    *_log_z.npy, *_active_*.npy   the hubness normalisers (:mod:`aoq_serve.index.bank`)

``<index_dir>/index.json`` names the models and a generation number; it is written last, after
the catalogue commit, and a running server reloads when it changes.

Approximate indexes (HNSW, IVF) are tuned on the gallery's own queries (captions against images
and images against captions): the search-time parameter grows until recall@10 against the exact
index reaches the target, and the measured value is recorded (docs/serving.md, Design notes).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from aoq.hubness import Normaliser
from aoq.io import (ArtefactError, atomic_dir, atomic_save_npy, atomic_write_json, parse_json, read_manifest,
                    write_manifest)
from aoq_serve.index.bank import load_bank
from aoq_serve.index.scan import FlatScan
from aoq_serve.index.shared import shared

log = logging.getLogger(__name__)

KIND = "aoq-index"
GENERATION_FILE = "index.json"
IndexType = Literal["flat", "hnsw", "ivf"]
MODALITIES = ("images", "captions")
RECALL_K = 10
#: queries used to measure recall of an approximate index (a random sample of the gallery's own).
RECALL_QUERIES = 2000
_HNSW_EF = (16, 32, 64, 128, 256, 512, 1024)
_SCORE_TOLERANCE = 1e-5
#: what a loaded index searches with: a FAISS index, or the CPU block scan of a flat one.
SearchIndex = faiss.Index | FlatScan


@dataclass(frozen=True)
class IndexSpec:
    """How to index: ``flat`` (exact, default), ``hnsw`` or ``ivf`` tuned to ``target_recall``."""

    type: IndexType = "flat"
    target_recall: float = 0.95
    hnsw_m: int = 32
    #: FAISS's default of 40 builds graphs that miss neighbours among near-duplicate captions
    #: (docs/serving.md, Index types).
    hnsw_ef_construction: int = 200
    #: IVF lists; None: about 4 * sqrt(N).
    ivf_nlist: int | None = None
    seed: int = 0


def _exact(vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    index = faiss.IndexIDMap(faiss.IndexFlatIP(vectors.shape[1]))
    index.add_with_ids(vectors, ids)
    return index


def _approximate(vectors: np.ndarray, ids: np.ndarray, spec: IndexSpec) -> faiss.Index:
    d = vectors.shape[1]
    if spec.type == "hnsw":
        hnsw = faiss.IndexHNSWFlat(d, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = spec.hnsw_ef_construction
        index = faiss.IndexIDMap(hnsw)
        index.add_with_ids(vectors, ids)
        return index
    nlist = spec.ivf_nlist or max(1, min(len(vectors) // 39, int(4 * math.sqrt(len(vectors)))))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = spec.seed
    ivf.train(vectors)
    ivf.add_with_ids(vectors, ids)
    return ivf


def set_search_param(index: faiss.Index, index_type: str, value: int | None) -> None:
    """Apply the tuned search-time parameter (HNSW efSearch, IVF nprobe) to a loaded index."""
    if value is None or index_type == "flat":
        return
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if index_type == "hnsw":
        inner.hnsw.efSearch = int(value)
    else:
        faiss.extract_index_ivf(index).nprobe = int(value)


def recall_at_k(index: faiss.Index, exact: faiss.Index, queries: np.ndarray, k: int = RECALL_K) -> float:
    """Share of the top-k results of ``index`` that score at least the exact k-th best score.

    Tie-aware, as in ann-benchmarks: with duplicate vectors (identical captions, or captions the
    tokenizer makes identical) exact search picks arbitrary ids among equal scores, so comparing
    id sets would count equally good answers as misses.
    """
    k = min(k, exact.ntotal)
    truth, _ = exact.search(queries, k)
    found, ids = index.search(queries, k)
    # FAISS sums in a different order per index type: allow float rounding on unit vectors.
    good = (found >= truth[:, -1:] - _SCORE_TOLERANCE) & (ids >= 0)
    return float(good.sum()) / float(truth.size)


def _tune(index: faiss.Index, exact: faiss.Index, queries: np.ndarray, spec: IndexSpec, what: str) -> dict[str, Any]:
    """Smallest search parameter reaching the target recall, and the recall measured with it."""
    if spec.type == "hnsw":
        name, grid = "efSearch", list(_HNSW_EF)
        built = {"M": spec.hnsw_m, "efConstruction": spec.hnsw_ef_construction}
    else:
        name, nlist = "nprobe", faiss.extract_index_ivf(index).nlist
        grid = sorted({min(2**e, nlist) for e in range(int(math.log2(nlist)) + 2)})
        built = {"nlist": nlist}
    recall = 0.0
    for value in grid:
        set_search_param(index, spec.type, value)
        recall = recall_at_k(index, exact, queries)
        if recall >= spec.target_recall:
            return {**built, name: value, "recall_at_10": round(recall, 4)}
    raise ArtefactError(
        f"{spec.type} index of the {what}: recall@10 against exact search is only {recall:.3f} at {name}={grid[-1]}, "
        f"below the target {spec.target_recall}; use --type flat for this gallery"
    )


def build_index(
    vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, spec: IndexSpec, name: str = "gallery"
) -> tuple[faiss.Index, dict[str, Any]]:
    """Index ``vectors`` under ``ids``; approximate types are tuned on ``queries``.

    Returns:
        The index and its parameters (``recall_at_10`` measured against exact search, 1.0 for flat).
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    exact = _exact(vectors, ids)
    if spec.type == "flat":
        return exact, {"recall_at_10": 1.0}
    index = _approximate(vectors, ids, spec)
    rng = np.random.default_rng(spec.seed)
    sample = queries[rng.choice(len(queries), size=min(RECALL_QUERIES, len(queries)), replace=False)]
    params = _tune(index, exact, np.ascontiguousarray(sample, dtype=np.float32), spec, name)
    log.info("%s index of the %s (%d vectors): %s", spec.type, name, len(vectors), params)
    return index, params


def write_model_index(
    out: Path,
    embeddings: dict[str, np.ndarray],
    ids: dict[str, np.ndarray],
    spec: IndexSpec,
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Build both indexes of a model and write them with their manifest into ``out`` atomically.

    Args:
        embeddings: ``{"images": (N_i, d), "captions": (N_c, d)}`` L2-normalised float32.
        ids: catalogue ids by position, same keys.
        meta: recorded in the manifest (model name, checkpoint hash, dataset, split...).
        arrays: more files of the artefact, ``{file name: array}`` (the hubness normalisers).

    Returns:
        The manifest (``params`` holds each modality's index parameters and recall).
    """
    params: dict[str, dict[str, Any]] = {}
    queries = {"images": embeddings["captions"], "captions": embeddings["images"]}
    with atomic_dir(out) as tmp:
        for modality in MODALITIES:
            index, params[modality] = build_index(embeddings[modality], ids[modality], queries[modality], spec, modality)
            faiss.write_index(index, str(tmp / f"{modality}.faiss"))
            atomic_save_npy(tmp / f"{modality}.npy", np.asarray(embeddings[modality], dtype=np.float32))
            atomic_save_npy(tmp / f"{modality[:-1]}_ids.npy", np.asarray(ids[modality], dtype=np.int64))
        for name, array in (arrays or {}).items():
            atomic_save_npy(tmp / name, array)
        config = {
            **meta,
            "index_type": spec.type,
            "dim": int(embeddings["images"].shape[1]),
            "counts": {m: int(len(ids[m])) for m in MODALITIES},
        }
        manifest = write_manifest(tmp, KIND, config, params=params)
    return manifest


@dataclass(frozen=True)
class FileStamp:
    """What identifies a file's bytes without reading them: its inode and its size and times."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileStamp:
        st = path.stat()
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def same_file(self, other: FileStamp) -> bool:
        return (self.device, self.inode) == (other.device, other.inode)


def _stamps(path: Path) -> dict[str, FileStamp]:
    """Stamps of the files an index directory holds (missing files are left out)."""
    return {f.name: FileStamp.of(f) for f in sorted(path.iterdir()) if f.is_file()}


@dataclass
class LoadedIndex:
    """A model's indexes and embeddings as loaded by the server (read-only after loading)."""

    path: Path
    manifest: dict[str, Any]
    faiss: dict[str, SearchIndex]
    embeddings: dict[str, np.ndarray]
    ids: dict[str, np.ndarray]
    #: the files as they were when their hashes were verified (see :meth:`changed_in_place`).
    stamps: dict[str, FileStamp]
    #: the hubness normalisers, ``{modality: {scope: Normaliser}}``; None: built without a bank.
    hubness: dict[str, dict[str, Normaliser]] | None = None

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    def changed_in_place(self) -> list[str]:
        """Files written to in place since they were verified: the same inode with another size or
        time. What is served was read into memory and does not change, but the files no longer
        back it (a restart would serve other bytes). A file replaced by a rename (a new inode, as
        ``aoq index`` does) is not listed."""
        changed = []
        for name, then in self.stamps.items():
            try:
                now = FileStamp.of(self.path / name)
            except FileNotFoundError:
                continue
            if now.same_file(then) and now != then:
                changed.append(name)
        return changed


def load_model_index(path: Path, use_gpu: bool | None = None) -> LoadedIndex:
    """Verify (per-file hashes) and load a model's index directory.

    Raises:
        ArtefactError: missing, foreign, corrupted directory, inconsistent contents, or files
            that changed while they were being verified and loaded.
    """
    stamps = _stamps(path) if path.is_dir() else {}
    manifest = read_manifest(path, kind=KIND)
    config = manifest["config"]
    indexes, embeddings, ids = {}, {}, {}
    for modality in MODALITIES:
        try:
            index = faiss.read_index(str(path / f"{modality}.faiss"))
        except RuntimeError as exc:
            raise ArtefactError(f"{path / f'{modality}.faiss'}: not a readable FAISS index ({exc})") from None
        set_search_param(index, config["index_type"], _search_value(manifest["params"][modality]))
        # Read into memory, never memory-mapped: a mapped file truncated while serving kills the
        # whole process with SIGBUS on the next query that touches the lost pages.
        embeddings[modality] = shared(_read_embeddings(path / f"{modality}.npy"))
        ids[modality] = np.load(path / f"{modality[:-1]}_ids.npy")
        n = config["counts"][modality]
        if not (index.ntotal == len(embeddings[modality]) == len(ids[modality]) == n):
            raise ArtefactError(
                f"{path}: {modality} index has {index.ntotal} vectors, embeddings {len(embeddings[modality])}, "
                f"ids {len(ids[modality])}, manifest {n}"
            )
        indexes[modality] = _serving_index(index, config["index_type"], embeddings[modality], ids[modality], use_gpu)
    hubness = load_bank(path, config)
    if _stamps(path) != stamps:
        raise ArtefactError(f"{path}: files changed while the index was being loaded; load it again")
    return LoadedIndex(path=path, manifest=manifest, faiss=indexes, embeddings=embeddings, ids=ids, stamps=stamps,
                       hubness=hubness)


def _read_embeddings(path: Path) -> np.ndarray:
    """A ``.npy`` file read into memory (no mapping).

    Raises:
        ArtefactError: the file is missing, truncated or not a ``.npy`` array.
    """
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ArtefactError(f"{path}: not a readable embeddings array ({exc})") from None


def _search_value(params: dict[str, Any]) -> int | None:
    return params.get("efSearch", params.get("nprobe"))


def _serving_index(index: faiss.Index, index_type: str, vectors: np.ndarray, ids: np.ndarray,
                   use_gpu: bool | None) -> SearchIndex:
    """What serves a loaded index: the GPU copy when faiss-gpu is installed, the block scan of
    :mod:`aoq_serve.index.scan` for a flat index on the CPU (the same exact search, cheaper per
    query in a batch), else the FAISS index itself."""
    served = _maybe_gpu(index, use_gpu)
    if served is index and index_type == "flat":
        return FlatScan.from_vectors(vectors, ids)
    return served


def _maybe_gpu(index: faiss.Index, use_gpu: bool | None) -> faiss.Index:
    """faiss-gpu is optional (docs/serving.md, Design notes): move flat indexes to the GPUs when it is installed."""
    wanted = use_gpu if use_gpu is not None else hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0
    if not wanted:
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except (RuntimeError, AttributeError) as exc:  # e.g. HNSW has no GPU version: keep the CPU index
        log.info("index stays on the CPU (%s)", exc)
        return index


_threads = {"wanted": 0}
_local = threading.local()


def set_search_threads(n: int) -> None:
    """OpenMP threads FAISS may use per query in :func:`search` (docs/serving.md, Design notes: one is fastest for
    single queries on a small machine). The OpenMP setting is per thread, and requests run on
    the server's worker threads, so each of them applies it on its first search."""
    _threads["wanted"] = n


def _apply_threads() -> None:
    wanted = _threads["wanted"]
    if wanted and getattr(_local, "threads", None) != wanted:
        faiss.omp_set_num_threads(wanted)
        _local.threads = wanted


def search(index: SearchIndex, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, ids) of one query vector; ids of missing results (-1) are dropped."""
    return search_many(index, query.reshape(1, -1), k)[0]


def search_many(index: SearchIndex, queries: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Top-``k`` (scores, ids) of each row of ``queries`` in one call; missing results (-1) dropped."""
    _apply_threads()
    k = min(k, index.ntotal)
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    keep = ids >= 0
    return [(scores[i][keep[i]], ids[i][keep[i]]) for i in range(len(queries))]


def full_rank(embeddings: np.ndarray, query: np.ndarray, positions: np.ndarray) -> float:
    """1-based rank, over the whole gallery, of the best of the items at ``positions``.

    Ties follow ``aoq.metrics`` (docs/evaluation.md, Ties): the expected rank when the tied items
    are put in a random order, so the service and ``aoq evaluate`` agree and a collapsed model
    shows the middle of the gallery, not rank 1.
    """
    scores = np.asarray(embeddings @ query.astype(np.float32), dtype=np.float32)
    truth = np.zeros(scores.shape[0], dtype=bool)
    truth[positions] = True
    return tied_rank(scores[~truth], scores[truth])


def tied_rank(negatives: np.ndarray, positives: np.ndarray) -> float:
    """1-based expected rank of the best of ``positives`` among ``negatives`` (ties in random order)."""
    best = positives.max()
    tied, peers = np.count_nonzero(negatives == best), np.count_nonzero(positives == best)
    return float(np.count_nonzero(negatives > best) + tied / (peers + 1) + 1)


def indexed_splits(path: Path, eval_split: str) -> tuple[str, ...]:
    """The splits a model's index holds, from its manifest (an index of the evaluation split
    alone names none). The files are verified when the index is loaded.

    Raises:
        ArtefactError: no readable manifest.
    """
    config = read_manifest(path, kind=KIND, verify=False)["config"]
    return tuple(config.get("splits") or (eval_split,))


def read_generation(index_dir: Path) -> dict[str, Any] | None:
    """The content of ``index.json`` (None when the directory was never indexed)."""
    path = index_dir / GENERATION_FILE
    return parse_json(path) if path.is_file() else None


def bump_generation(index_dir: Path, models: list[str]) -> dict[str, Any]:
    """Write ``index.json`` with the next generation number: the signal to reload."""
    previous = read_generation(index_dir) or {}
    known = sorted(set(previous.get("models", [])) | set(models))
    content = {"generation": int(previous.get("generation", 0)) + 1, "models": known}
    atomic_write_json(index_dir / GENERATION_FILE, content)
    return content
