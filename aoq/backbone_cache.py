"""Backbone features of frozen pretrained encoders, computed once per split and cached on disk.

With a frozen backbone, training only runs the projection heads, so the backbone's outputs can
be computed once: the pooled 1280-d EfficientNet-Lite0 vector of every image and the 384-d
MiniLM sentence vector of every caption. They are cached under a key that is the SHA-256 of

- the backbone's identity (package, version, SHA-256 of its weights file),
- the preprocessing version (``IMAGE_PREPROCESS`` / ``TEXT_PREPROCESS``),
- the content: SHA-256 of every image file, in split order / the caption strings, in order;

so any change to the weights, the preprocessing, an image's bytes or a caption gives a new
entry, and moving a dataset does not. Layout::

    <root>/<backbone>/<key>/features.npy    float32 (rows, dim), read as a memory map
    <root>/<backbone>/<key>/manifest.json   kind "backbone-features", the key's inputs, file hash

Each entry is written atomically (``aoq.io.atomic_dir``) and verified when read; a damaged
entry is recomputed. ``<root>`` is ``$AOQ_FEATURE_CACHE``, else ``~/.cache/aoq/features``.

Fine-tuned backbones (``model.image_finetune_blocks`` / ``text_finetune_layers`` > 0) bypass the
cache: their outputs change every step, and caching the activations below the trained units
would cost a (49 x channels)-float map per image for a saving that only matters on big runs.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from aoq.data.dataset import DataError, SplitData
from aoq.data.loaders import ImageMode, TextMode, load_pixels
from aoq.io import (
    ArtefactError,
    atomic_dir,
    exclusive,
    read_manifest,
    sha256_file,
    sha256_json,
    write_manifest,
)
from aoq.caption_features import caption_backbone_features, caption_token_states, token_spans
from aoq.backbone_runtime import (
    POOLED_GRAPH,
    has_image_onnx,
    image_backbone,
    image_onnx,
    requested_runtime,
    runtime_name,
    runtime_version,
)
from aoq.models.effnet_lite import FEATURE_DIM, INPUT_SIZE
from aoq.models.joint import JointModel
from aoq.models.pretrained import (
    IMAGE_PREPROCESS,
    TEXT_PREPROCESS,
    EffNetImageEncoder,
    MiniLMTextEncoder,
    MiniLMWordEncoder,
)

log = logging.getLogger(__name__)

CACHE_ENV = "AOQ_FEATURE_CACHE"
KIND = "backbone-features"
FEATURES = "features.npy"
_MARK = "backbone_features"
#: fewer images than this run in this process: starting a worker (torch import, weights) costs
#: about as much CPU as featurising 100-200 images.
POOL_MIN_IMAGES = 1000
#: ``auto`` exports the image backbone to ONNX for this many images or more: the export takes
#: about as long as PyTorch featurising 200-400 images.
EXPORT_MIN_IMAGES = 1000


def cache_root(root: str | Path | None = None) -> Path:
    """``root``, else ``$AOQ_FEATURE_CACHE``, else ``~/.cache/aoq/features``."""
    if root is not None:
        return Path(root)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "aoq" / "features"


@dataclass
class CachedFeatures:
    """One cache entry: ``features``, a (rows, dim) float32 or (rows, regions, dim) float16 memory
    map, its folder, and whether it was already there (``hit``) or computed by this call."""

    features: np.ndarray
    path: Path
    hit: bool


def cached_features(root: Path, key_inputs: dict, compute: Callable[[], np.ndarray] | None,
                    rows: int, made_by: Callable[[], str] | None = None,
                    dtype: type[np.floating] = np.float32) -> CachedFeatures | None:
    """Return the entry for ``key_inputs``, computing and storing it on a miss.

    Args:
        root: the cache root.
        key_inputs: JSON-able; its ``backbone.name`` names the subfolder, its SHA-256 the entry.
        compute: makes the (rows, ...) array on a miss; None only looks (a miss gives None).
        rows: the expected number of rows (an entry with another count is recomputed).
        made_by: names the runtime that computed the features (called after ``compute``), for the
            manifest; not part of the key.
        dtype: what the array is stored as (the region maps: float16, half the disk).
    """
    key = sha256_json(key_inputs)
    folder = root / key_inputs["backbone"]["name"] / key
    entry = _stored(folder, rows, quiet=False)
    if entry is not None or compute is None:
        return entry
    # Jobs side by side (two seeds of one experiment) miss the same entry at once: one computes,
    # the other waits and reads it.
    with exclusive(folder.parent / f".{key}.lock",
                   on_wait=lambda: log.info("waiting for another process to store %s", folder)):
        entry = _stored(folder, rows, quiet=True)
        if entry is not None:
            return entry
        array = np.ascontiguousarray(compute(), dtype=dtype)
        if array.shape[0] != rows:
            raise ValueError(f"computed {array.shape[0]} feature rows, expected {rows}")
        with atomic_dir(folder) as tmp:
            np.save(tmp / FEATURES, array)
            write_manifest(tmp, KIND, key_inputs, key=key, shape=list(array.shape),
                           runtime=made_by() if made_by else runtime_version("torch"))
    return CachedFeatures(np.load(folder / FEATURES, mmap_mode="r"), folder, hit=False)


def _stored(folder: Path, rows: int, quiet: bool) -> CachedFeatures | None:
    """The entry in ``folder`` if it is complete and has ``rows`` rows, else None (said in the
    log unless ``quiet``: the second look, under the lock, repeats the first's findings)."""
    if not folder.is_dir():
        return None
    try:
        read_manifest(folder, kind=KIND)
        features = np.load(folder / FEATURES, mmap_mode="r")
        if features.shape[0] == rows:
            return CachedFeatures(features, folder, hit=True)
        if not quiet:
            log.warning("%s: %d rows, expected %d; recomputing", folder, features.shape[0], rows)
    except (ArtefactError, OSError, ValueError) as exc:
        if not quiet:
            log.warning("%s: unusable cache entry (%s); recomputing", folder, exc)
    return None


def image_key_inputs(identity: dict, paths: Sequence[Path]) -> dict:
    """What keys the image features of ``paths`` (in order) for a backbone ``identity``."""
    return {"backbone": identity, "preprocess": IMAGE_PREPROCESS,
            "files_sha256": sha256_json([sha256_file(p) for p in paths])}


def caption_key_inputs(identity: dict, captions: Sequence[str]) -> dict:
    """What keys the features of ``captions`` (in order) for a backbone ``identity``."""
    return {"backbone": identity, "preprocess": TEXT_PREPROCESS, "captions_sha256": sha256_json(list(captions))}


def has_entry(key_inputs: dict, root: str | Path | None = None) -> bool:
    """Whether the cache holds a complete entry for ``key_inputs`` (its file hash is checked
    only when the entry is read)."""
    folder = cache_root(root) / key_inputs["backbone"]["name"] / sha256_json(key_inputs)
    return (folder / "manifest.json").is_file() and (folder / FEATURES).is_file()


ImageRunner = Callable[[torch.Tensor], np.ndarray]


def _torch_runner(encoder: EffNetImageEncoder) -> ImageRunner:
    device = next(encoder.parameters()).device

    @torch.inference_mode()
    def run(pixels: torch.Tensor) -> np.ndarray:
        return encoder.backbone_features(pixels.to(device)).float().cpu().numpy()

    return run


def _image_features(run: ImageRunner, paths: Sequence[Path], batch_size: int, bar: tqdm | None = None) -> np.ndarray:
    out = [np.zeros((0, FEATURE_DIM), np.float32)]
    for start in range(0, len(paths), batch_size):
        batch = paths[start:start + batch_size]
        out.append(run(torch.stack([load_pixels(p, INPUT_SIZE) for p in batch])))
        if bar is not None:
            bar.update(len(batch))
    return np.concatenate(out)


@dataclass(frozen=True)
class ImageRuntime:
    """How image features are computed: ``name`` (``torch``, ``openvino`` or ``onnxruntime``), the
    exported model the latter two read, and the images per forward pass.

    PyTorch takes batches of 8: at 32 the 224 x 224 activations are large enough that the
    allocator hands them back to the kernel after every layer, and the page faults cost as much
    as the convolutions (docs/models.md, Speed). OpenVINO and ONNX Runtime take one image at a
    time, ONNX Runtime's fastest (docs/performance.md), and a picture's features then never depend
    on the pictures beside it."""

    name: str = "torch"
    onnx: Path | None = None
    batch_size: int = 8

    def runner(self, encoder: EffNetImageEncoder | None) -> ImageRunner:
        if self.name != "torch":
            assert self.onnx is not None
            return image_backbone(self.name, self.onnx)
        return _torch_runner(encoder if encoder is not None else EffNetImageEncoder(embed_dim=8).eval())


def image_runtime(encoder: EffNetImageEncoder, root: Path, n_images: int, name: str | None = None,
                  graph: str = POOLED_GRAPH) -> ImageRuntime:
    """The runtime that featurises ``n_images`` images (``AOQ_BACKBONE_RUNTIME``,
    :mod:`aoq.backbone_runtime`), with the backbone exported to ONNX under ``root`` when it is
    OpenVINO or ONNX Runtime (``graph``: its pooled features or its feature map). ``auto`` exports only for
    :data:`EXPORT_MIN_IMAGES` images or more (the export costs seconds), and uses an export
    already there for any number."""
    chosen = runtime_name(name)
    small = n_images < EXPORT_MIN_IMAGES and not has_image_onnx(encoder, root, graph)
    if chosen == "torch" or (small and requested_runtime(name) == "auto"):
        return ImageRuntime()
    return ImageRuntime(chosen, image_onnx(encoder, root, graph), batch_size=1)


_WORKER_RUN: ImageRunner | None = None
#: added to the image workers' niceness (:func:`_init_worker`)
WORKER_NICENESS = 10


def _init_worker(runtime: ImageRuntime) -> None:
    """A pool worker's own backbone (PyTorch's without the head, or an OpenVINO or ONNX Runtime
    session), on one thread: the workers share the cores between them. They run at a lower
    priority (:data:`WORKER_NICENESS`): the captions that :func:`precompute_backbone_features`
    computes beside them on one thread then keep a core to themselves and, being the longer
    single-threaded part, no longer finish alone while the other cores idle; the images take
    whatever the captions leave, all of it once they are done."""
    global _WORKER_RUN
    os.nice(WORKER_NICENESS)
    torch.set_num_threads(1)
    _WORKER_RUN = runtime.runner(None)


def _worker_chunk(paths: list[Path], batch_size: int) -> np.ndarray:
    assert _WORKER_RUN is not None
    return _image_features(_WORKER_RUN, paths, batch_size)


def _chunks(paths: Sequence[Path], batch_size: int) -> list[list[Path]]:
    # Chunks of a few batches keep every worker busy to the end and the bar moving; they are cut
    # at the same places whatever the number of workers, so the rows never depend on it.
    step = 16 * batch_size
    return [list(paths[s:s + step]) for s in range(0, len(paths), step)]


def _image_pool(workers: int, runtime: ImageRuntime) -> ProcessPoolExecutor:
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(runtime,))


def image_backbone_features(encoder: EffNetImageEncoder, paths: Sequence[Path], progress: bool = False,
                            workers: int = 1, runtime: ImageRuntime | None = None) -> np.ndarray:
    """Pooled EfficientNet-Lite0 features of image files, (len(paths), 1280) float32.

    Args:
        runtime: PyTorch (the default), OpenVINO or ONNX Runtime (:func:`image_runtime`).
        workers: processes to share the work (each imports torch and loads its own copy of the
            backbone, a few seconds and some hundreds of MB); 1 runs in this process. Rows are in
            ``paths`` order either way.
    """
    runtime = runtime or ImageRuntime("torch")
    bar = tqdm(total=len(paths), desc="EfficientNet-Lite0 features", disable=not progress, leave=False)
    with bar:
        if workers <= 1 or len(paths) < POOL_MIN_IMAGES:
            return _image_features(runtime.runner(encoder), paths, runtime.batch_size, bar)
        chunks = _chunks(paths, runtime.batch_size)
        with _image_pool(workers, runtime) as pool:
            futures = [pool.submit(_worker_chunk, chunk, runtime.batch_size) for chunk in chunks]
            out = []
            for future, chunk in zip(futures, chunks):
                out.append(future.result())
                bar.update(len(chunk))
        return np.concatenate(out)


def cached_modalities(model: JointModel) -> tuple[bool, bool]:
    """Whether the model's image / text encoder has a frozen pretrained backbone (cacheable):
    its pooled features, or for the cross-attention models' MiniLM words its token states."""
    image = isinstance(model.image_encoder, EffNetImageEncoder) and model.image_encoder.is_frozen
    text = isinstance(model.text_encoder, (MiniLMTextEncoder, MiniLMWordEncoder)) and model.text_encoder.is_frozen
    return image, text


def input_modes(model: JointModel) -> tuple[ImageMode, TextMode]:
    """The dataset modes to feed ``model`` a split prepared by :func:`with_backbone_features`."""
    image, text = cached_modalities(model)
    return ("features" if image else model.image_input), ("features" if text else "tokens")  # type: ignore[return-value]


def with_backbone_features(model: JointModel, split: SplitData, vocab, *, root: str | Path | None = None,
                           progress: bool = False, workers: int = 1, compute_missing: bool = True) -> SplitData:
    """The split with the cached backbone features of ``model``'s frozen pretrained encoders in
    ``features`` (images) and ``caption_features`` (captions); the split itself when there are none.

    ``workers`` processes compute missing image features (:func:`image_backbone_features`). With
    ``compute_missing=False`` only existing entries are used: a modality whose entry is missing
    keeps the split's own inputs (the service uses this, so that no request featurises a split).

    Raises:
        DataError: an image backbone needs image files and the split has none.
    """
    image, text = cached_modalities(model)
    if not (image or text):
        return split
    want = {"image": model.image_encoder.identity.to_dict() if image else None,
            "text": model.text_encoder.identity.to_dict() if text else None}
    if split.extra.get(_MARK) == want:
        return split
    base = cache_root(root)
    features, caption_features = split.features, split.caption_features
    complete = True
    if image:
        if split.image_paths is None:
            raise DataError(f"{split.source}: model.image_encoder=effnet_lite0 needs the image files, and this "
                            "split has none (use the Karpathy JSON of the dataset)")
        enc: EffNetImageEncoder = model.image_encoder  # type: ignore[assignment]
        paths = list(split.image_paths)
        inputs = image_key_inputs(want["image"], paths)
        chosen: list[ImageRuntime] = []  # decided on a miss only: the runtime may export first

        def compute() -> np.ndarray:
            chosen.append(image_runtime(enc, base, len(paths)))
            return image_backbone_features(enc, paths, progress=progress, workers=workers, runtime=chosen[0])

        entry = cached_features(base, inputs, compute if compute_missing else None, len(paths),
                                lambda: runtime_version(chosen[0].name))
        if entry is None:
            complete = False
        else:
            log.info("%s %s image features: %s", "cached" if entry.hit else "computed", split.name, entry.path)
            features = entry.features
    spans = split.caption_spans
    if text:
        found = _caption_entry(model.text_encoder, vocab, split, base, progress, compute_missing)  # type: ignore[arg-type]
        if found is None:
            complete = False
        else:
            entry, spans = found
            log.info("%s %s caption features: %s", "cached" if entry.hit else "computed", split.name, entry.path)
            caption_features = entry.features
    extra = {**split.extra, _MARK: want} if complete else split.extra
    return dataclasses.replace(split, features=features, caption_features=caption_features, caption_spans=spans,
                               extra=extra)


#: Builds the caption encoder and its vocabulary when :func:`precompute_backbone_features` needs them.
TextEncoderFactory = Callable[[], tuple[MiniLMTextEncoder | MiniLMWordEncoder, object]]


def precompute_backbone_features(splits: Sequence[SplitData], *, image: EffNetImageEncoder | None,
                                 text: TextEncoderFactory | None, root: str | Path | None = None,
                                 progress: bool = False, workers: int = 1) -> None:
    """Every missing cache entry of ``splits`` in one go (``make demo``): the image features of
    all splits on a pool of ``workers`` processes while this process computes the caption
    features on one thread, so that the cores stay busy with both. Each entry is the one
    :func:`with_backbone_features` computes (same key, same rows, same runtime rule).

    ``image`` is the frozen image encoder (None: no image entries); ``text`` builds the frozen
    caption encoder and its vocabulary (None: no caption entries). It is called once the image
    workers have their work: loading MiniLM (transformers' first import) takes seconds of one
    core, which the workers would otherwise wait for.

    Raises:
        DataError: an image backbone needs image files and a split has none.
    """
    base = cache_root(root)
    jobs: list[tuple[list[Path], dict]] = []
    if image is not None:
        for split in splits:
            if split.image_paths is None:
                raise DataError(f"{split.source}: model.image_encoder=effnet_lite0 needs the image files")
            inputs = image_key_inputs(image.identity.to_dict(), list(split.image_paths))
            if not has_entry(inputs, base):
                jobs.append((list(split.image_paths), inputs))
    total = sum(len(paths) for paths, _ in jobs)
    runtime = image_runtime(image, base, total) if image is not None and jobs else ImageRuntime()
    pool = _image_pool(workers, runtime) if workers > 1 and total >= POOL_MIN_IMAGES else None
    bar = tqdm(total=total, desc="EfficientNet-Lite0 features", disable=not progress or not total, leave=False)
    futures = []
    if pool is not None:
        for paths, _ in jobs:
            futures.append([pool.submit(_worker_chunk, chunk, runtime.batch_size)
                            for chunk in _chunks(paths, runtime.batch_size)])
            for future, chunk in zip(futures[-1], _chunks(paths, runtime.batch_size)):
                future.add_done_callback(lambda _, n=len(chunk): bar.update(n))
    threads = torch.get_num_threads()
    try:
        if text is not None:
            if pool is not None:
                torch.set_num_threads(1)  # the pool's workers have the other cores
            encoder, vocab = text()
            for split in splits:
                _caption_entry(encoder, vocab, split, base, progress)
        torch.set_num_threads(threads)
        for k, (paths, inputs) in enumerate(jobs):
            def compute(k: int = k, paths: list[Path] = paths) -> np.ndarray:
                if pool is None:
                    return _image_features(runtime.runner(image), paths, runtime.batch_size, bar)
                return np.concatenate([future.result() for future in futures[k]])

            entry = cached_features(base, inputs, compute, len(paths), lambda: runtime_version(runtime.name))
            log.info("computed image features: %s", entry.path if entry else None)
    finally:
        torch.set_num_threads(threads)
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _caption_entry(encoder: MiniLMTextEncoder | MiniLMWordEncoder, vocab, split: SplitData, base: Path,
                   progress: bool, compute_missing: bool = True) -> tuple[CachedFeatures, np.ndarray | None] | None:
    """The split's caption entry and, for token states, each caption's rows in it (None: one row
    per caption)."""
    inputs = caption_key_inputs(encoder.identity.to_dict(), split.captions)
    if isinstance(encoder, MiniLMWordEncoder):
        spans, ids, starts = token_spans(vocab, split.captions)
        entry = cached_features(
            base, {**inputs, "output": "token_states"},
            (lambda: caption_token_states(encoder, ids, starts, progress=progress)) if compute_missing
            else None, int(starts[-1]))
        return None if entry is None else (entry, spans)
    entry = cached_features(
        base, inputs,
        (lambda: caption_backbone_features(encoder, vocab, split.captions, progress=progress)) if compute_missing
        else None, split.n_captions)
    return None if entry is None else (entry, None)
