"""``aoq index``: catalogue a gallery split and index it with every checkpoint of a models folder.

For each checkpoint (one subfolder of the models directory), in this order:

1. its dataset's splits are catalogued (images with paths relative to the data directory and
   sizes, captions): the training, dev and evaluation splits (``gallery="all"``, what the
   service searches by default), or the evaluation split alone (``gallery="eval"``; the training
   split is then catalogued too when the checkpoint names mined negatives, which ``/negatives``
   shows);
2. the gallery's images and captions are embedded with the model, and both FAISS indexes are
   written atomically to ``<out>/<model>/`` with their manifest (which names the splits) and the
   hubness normalisers of the gallery under the training split as the bank (its provenance in the
   manifest; :mod:`aoq_serve.index.bank`);
3. in one transaction: the model row (role, loss, checkpoint hash, metrics, the report of
   :mod:`aoq_serve.index.reports`, computed on the evaluation split with the checkpoint's
   positives rule), its index records and the evaluation split's ground-truth ranks (failure cases).

A cross-attention checkpoint (SCAN, BFAN) is a re-ranker: it is indexed after the embedding
models, its gallery's fragments are written instead of FAISS indexes
(:mod:`aoq_serve.index.rerank`), naming the embedding model whose FAISS top ``shortlist_n`` it
re-scores (``shortlist_by``, indexed into the same folder), and its row has no index records nor
ranks.

``<out>/index.json`` is rewritten last, after every commit: a running server sees the new
generation and swaps to the new indexes; until then it keeps answering from the old ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image, UnidentifiedImageError
from sqlalchemy.orm import Session, sessionmaker
from tqdm.auto import tqdm

from aoq.checkpoint import Checkpoint, load_checkpoint
from aoq.config import DataConfig, ExperimentConfig, load_config
from aoq.data.dataset import DataError, SplitData, label_vocabulary, multi_hot
from aoq.data.karpathy import read_karpathy
from aoq.data.load import load_split
from aoq.device import resolve_device
from aoq.embed import encode_fragments, encode_split
from aoq.hubness import bank_provenance
from aoq.io import ArtefactError, parse_json, read_manifest
from aoq.names import CROSS_ATTENTION_ENCODERS
from aoq_serve.guards.paths import relative_to_data, stored_data_config
from aoq_serve.index.bank import MANIFEST_KEY, bank_arrays
from aoq_serve.index.faiss_index import KIND as FAISS_KIND
from aoq_serve.index.faiss_index import IndexSpec, bump_generation, write_model_index
from aoq_serve.index.rerank import DEFAULT_SHORTLIST_N, joined_fragments, write_rerank_index
from aoq_serve.index.reports import gallery_ranks, model_report
from aoq_serve.search.negatives import TRAIN_SPLIT
from aoq_serve.store import catalogue
from aoq_serve.store.catalogue import SplitIds
from aoq_serve.store.db import create_schema, make_engine, session_factory, utcnow
from aoq_serve.store.pictures import digests_file, split_digests

log = logging.getLogger(__name__)

SYNTHETIC_KIND = "synthetic_dataset"
#: checkpoints written by the trainer say which round they come from; the pipeline says the role.
ROLE_ALIASES = {"round1": "baseline", "round2": "aoq"}
#: what an index folder holds; raised when the service needs something older folders lack
#: (2: the digests of the picture files), so the demo's up-to-date stamp no longer matches.
INDEX_FORMAT = 2


@dataclass
class IndexJob:
    models_dir: Path
    data_dir: Path
    out: Path
    catalogue_url: str
    #: the evaluation split: ground-truth ranks, failure cases, the /metrics report.
    split: str = "test"
    #: what the service searches: every split of the data (train, dev and ``split``) or ``split`` alone.
    gallery: Literal["all", "eval"] = "all"
    spec: IndexSpec = field(default_factory=IndexSpec)
    #: use this run configuration's data section instead of each checkpoint's own.
    config: Path | None = None
    overrides: list[str] = field(default_factory=list)
    device: str = "auto"
    batch_size: int = 256
    #: the served embedding model whose FAISS shortlist the cross-attention checkpoints re-rank.
    shortlist_by: str | None = None
    #: how many of its items each query's shortlist holds.
    shortlist_n: int = DEFAULT_SHORTLIST_N


def discover_checkpoints(models_dir: Path) -> list[Path]:
    """Checkpoint folders (those with a manifest) directly under ``models_dir``, by name.

    Raises:
        ArtefactError: the folder is missing or holds no checkpoint.
    """
    if not models_dir.is_dir():
        raise ArtefactError(f"{models_dir}: models directory not found")
    # ".<name>.*" folders are atomic writes that a kill interrupted (aoq.io.atomic_dir), not models
    found = sorted(p.parent for p in models_dir.glob("*/manifest.json") if not p.parent.name.startswith("."))
    if not found:
        raise ArtefactError(f"{models_dir}: no checkpoint folders (subfolders with a manifest.json)")
    return found


def is_synthetic(data_cfg: DataConfig) -> bool:
    """Whether the data comes from ``aoq synth`` (its manifest sits in the data folder or above it)."""
    path = Path(data_cfg.path)
    folder = path if path.is_dir() else path.parent
    for candidate in (folder, folder.parent):
        try:
            if read_manifest(candidate, verify=False).get("kind") == SYNTHETIC_KIND:
                return True
        except ArtefactError:
            continue
    return False


def image_files(data_cfg: DataConfig, role: str, split: SplitData) -> list[Path] | None:
    """The split's image files: its own, or for precomp features those of a Karpathy JSON beside
    the precomp folder (``aoq synth`` writes both) whose split has exactly the same captions."""
    if split.image_paths is not None:
        return list(split.image_paths)
    if data_cfg.format != "precomp":
        return None
    for json_path in sorted(Path(data_cfg.path).parent.glob("dataset_*.json")):
        try:
            described = read_karpathy(json_path, captions_per_image=split.captions_per_image)
        except DataError as exc:
            log.info("%s: not used for image files (%s)", json_path, exc)
            continue
        twin = described.splits.get(role)
        if twin is not None and twin.captions == split.captions:
            log.info("images of split %r: %s", role, json_path)
            return list(twin.image_paths)
    log.warning("%s: no image files for split %r (features only): /images will answer 404", data_cfg.path, role)
    return None


def _sizes(paths: list[Path]) -> list[tuple[int, int]]:
    sizes = []
    for path in tqdm(paths, desc="image sizes", leave=False, disable=len(paths) < 2000):
        try:
            with Image.open(path) as image:
                sizes.append(image.size)
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"{path}: not a readable image ({exc})") from None
    return sizes


class _Catalogue:
    """Registers datasets and splits once per run, shared by the checkpoints that use them."""

    def __init__(self, sessions: sessionmaker, data_dir: Path) -> None:
        self.sessions, self.data_dir = sessions, data_dir
        self.splits: dict[tuple[str, str], tuple[SplitIds, SplitData]] = {}
        #: digests of the picture files of each split registered by this run, keyed like ``splits``.
        self.pictures: dict[tuple[str, str], np.ndarray] = {}

    def split(self, data_cfg: DataConfig, role: str) -> tuple[SplitIds, SplitData]:
        key = (data_cfg.name, role)
        if key in self.splits:
            return self.splits[key]
        split = load_split(data_cfg, role)
        files = image_files(data_cfg, role, split)
        rel = None if files is None else [relative_to_data(self.data_dir, p) for p in files]
        sizes = None if files is None else _sizes(files)
        with self.sessions() as session, session.begin():
            dataset = catalogue.get_or_create_dataset(
                session, data_cfg.name, data_cfg.format, is_synthetic(data_cfg), split.captions_per_image,
                stored_data_config(self.data_dir, data_cfg),
            )
            ids = catalogue.register_split(session, dataset, role, split, rel, sizes)
        self.pictures[key] = split_digests(files, split.n_images)
        log.info("catalogued %s/%s: %d images, %d captions", data_cfg.name, role, split.n_images, split.n_captions)
        self.splits[key] = (ids, split)
        return ids, split


def _resolve(value: str | None, checkpoint_dir: Path) -> Path | None:
    """A path recorded in a checkpoint's extra.json: absolute, or relative to the run folder
    (``runs/<name>``, where the pipeline publishes ``models/<model>``), the checkpoint folder or
    the working directory, the first that exists."""
    if not value:
        return None
    path = Path(value)
    candidates = [path] if path.is_absolute() else [checkpoint_dir.parent.parent / path, checkpoint_dir / path, path]
    return next((c.resolve() for c in candidates if c.exists()), None)


def _metrics_logs(extra: dict[str, Any], role: str, checkpoint_dir: Path) -> list[tuple[Path, int]]:
    """``(metrics.jsonl, round)`` pairs: one path (round 1 for the baseline, 2 for every model
    trained on mined negatives) or a list (rounds 1, 2...)."""
    value = extra.get("metrics_log")
    if isinstance(value, list):
        pairs = [(_resolve(v, checkpoint_dir), r) for r, v in enumerate(value, start=1)]
    else:
        pairs = [(_resolve(value, checkpoint_dir), 1 if role == "baseline" else 2)]
    return [(p, r) for p, r in pairs if p is not None]


def gallery_splits(job: IndexJob, data_cfg: DataConfig) -> list[str]:
    """The splits a model's gallery holds: the evaluation split, and the training and dev splits
    unless the job indexes the evaluation split alone."""
    if job.gallery == "eval":
        return [job.split]
    return list(dict.fromkeys([data_cfg.train_split, data_cfg.dev_split, job.split]))


def measured(split: str, n_images: int | None, cfg: ExperimentConfig, seed: int,
             protocol: str | None = None) -> dict[str, Any]:
    """What a figure of the report is measured on (``aoq_serve.schemas.Measured``)."""
    return {"split": split, "n_images": n_images, "protocol": protocol, "positives": cfg.eval.positives,
            "seeds": [seed]}


def _role(ckpt: Checkpoint) -> str:
    role = str(ckpt.extra.get("role") or ckpt.path.name)
    return ROLE_ALIASES.get(role, role)


def is_cross_attention(path: Path) -> bool:
    """Whether a checkpoint folder holds a cross-attention model (from its config, before loading)."""
    model = parse_json(path / "config.json", what="checkpoint config").get("model") or {}
    return model.get("image_encoder") in CROSS_ATTENTION_ENCODERS


def check_shortlist(job: IndexJob, rerankers: list[Path], embedding: list[Path]) -> None:
    """Refuse a job whose re-rankers name no usable shortlisting model, before any work.

    Raises:
        ArtefactError: no ``shortlist_by`` for a re-ranker, or a ``shortlist_n`` below 1.
    """
    if not rerankers:
        return
    if job.shortlist_by is None:
        raise ArtefactError(f"{rerankers[0].name} is a cross-attention model, served as a re-ranker: name the "
                            f"embedding model whose FAISS shortlist it re-ranks with --shortlist-by")
    if job.shortlist_n < 1:
        raise ArtefactError(f"--shortlist-n must be >= 1, got {job.shortlist_n}")
    if job.shortlist_by not in {p.name for p in embedding}:
        raise ArtefactError(f"--shortlist-by {job.shortlist_by}: not an embedding model of {job.models_dir} "
                            f"(those: {', '.join(p.name for p in embedding) or 'none'})")


def _shortlister(job: IndexJob) -> dict[str, Any]:
    """The index manifest of the model that shortlists for the re-rankers (indexed by this job).

    Raises:
        ArtefactError: it holds no embedding model's index.
    """
    try:
        return read_manifest(job.out / job.shortlist_by, kind=FAISS_KIND)
    except ArtefactError as exc:
        raise ArtefactError(f"--shortlist-by {job.shortlist_by}: not an indexed embedding model of {job.out} "
                            f"({exc})") from None


def _index_reranker(job: IndexJob, sessions: sessionmaker, registry: _Catalogue, path: Path) -> dict[str, Any]:
    name = path.name
    base = _shortlister(job)["config"]
    ckpt = load_checkpoint(path, device=resolve_device(job.device))
    cfg = load_config(job.config, job.overrides) if job.config else ckpt.config
    role = _role(ckpt)
    ids, split = registry.split(cfg.data, job.split)
    parts = sorted((registry.split(cfg.data, s) for s in gallery_splits(job, cfg.data)),
                   key=lambda part: int(part[0].image_ids[0]) if part[0].n_images else 0)
    fragments = joined_fragments([encode_fragments(ckpt.model, ckpt.vocab, part, batch_size=job.batch_size,
                                                   progress=True) for _, part in parts])
    gallery = catalogue.joined_ids([p for p, _ in parts])
    digest = catalogue.gallery_digest(gallery, [c for _, part in parts for c in part.captions])
    if base.get("gallery_hash") != digest:
        raise ArtefactError(f"--shortlist-by {job.shortlist_by}: its index holds another gallery than {name}'s; "
                            f"index both over the same data")
    meta = {"model": name, "checkpoint_hash": ckpt.content_hash, "dataset": cfg.data.name, "split": job.split,
            "splits": [p.split for p, _ in parts], "gallery_hash": digest, "shortlist_by": job.shortlist_by,
            "shortlist_by_hash": base["checkpoint_hash"], "shortlist_n": job.shortlist_n}
    write_rerank_index(job.out / name, fragments, {"images": gallery.image_ids, "captions": gallery.caption_ids},
                       meta)
    seed = cfg.round2.seed if ckpt.extra.get("mined_dir") else cfg.train.seed
    report = {"measured": measured(job.split, split.n_images, cfg, seed)}
    loss = ckpt.extra.get("loss") or (cfg.round2.loss if role == "aoq" else cfg.train.loss)
    with sessions() as session, session.begin():
        catalogue.upsert_model(
            session, name, role=role, loss=str(loss), image_encoder=ckpt.config.model.image_encoder,
            image_input=ckpt.model.image_input, dataset_id=ids.dataset_id, gallery_split=ids.split,
            checkpoint_path=str(ckpt.path.resolve()), checkpoint_hash=ckpt.content_hash, metrics=ckpt.metrics,
            report=report, mined_dir=None,
        )
    log.info("%s (%s): re-ranks the top %d of %s over %d images, %d captions", name, role, job.shortlist_n,
             job.shortlist_by, fragments.n_images, fragments.n_captions)
    return {"model": name, "role": role, "rsum": None, "params": {}, "shortlist_by": job.shortlist_by,
            "shortlist_n": job.shortlist_n}


def _index_one(job: IndexJob, sessions: sessionmaker, registry: _Catalogue, path: Path) -> dict[str, Any]:
    name = path.name
    ckpt = load_checkpoint(path, device=resolve_device(job.device))
    cfg = load_config(job.config, job.overrides) if job.config else ckpt.config
    role = _role(ckpt)
    ids, split = registry.split(cfg.data, job.split)
    mined_dir = _resolve(ckpt.extra.get("mined_dir"), path)
    if ckpt.extra.get("mined_dir") and mined_dir is None:
        log.warning("%s: mined_dir %r not found; /negatives will answer 404 for this model", name, ckpt.extra["mined_dir"])
    served_splits = [registry.split(cfg.data, TRAIN_SPLIT)[0]] if mined_dir is not None else []
    # every split's ids are one contiguous run: in id order the parts are the gallery's positions
    parts = sorted((registry.split(cfg.data, s) for s in gallery_splits(job, cfg.data)),
                   key=lambda part: int(part[0].image_ids[0]) if part[0].n_images else 0)
    embedded = [encode_split(ckpt.model, ckpt.vocab, part, batch_size=job.batch_size,
                             image_size=cfg.data.image_size, progress=True) for _, part in parts]
    img_emb, cap_emb = next(e for (p, _), e in zip(parts, embedded) if p.split == job.split)
    gallery = catalogue.joined_ids([p for p, _ in parts])
    cpi = split.captions_per_image
    texts = split.captions if cfg.eval.positives == "text" else None
    ranks = gallery_ranks(img_emb, cap_emb, cpi, texts)
    with sessions() as session:
        # every split whose pictures the service shows: the gallery's, and the negatives explorer's
        paths_hash = {p.split: catalogue.paths_digest(p.image_ids, catalogue.image_paths(session, p.dataset_id, p.split))
                      for p in [p for p, _ in parts] + served_splits}
    query_ids = {"t2i": ids.caption_ids, "i2t": ids.image_ids}
    vectors = {"images": np.concatenate([e[0] for e in embedded]), "captions": np.concatenate([e[1] for e in embedded])}
    bank, provenance = _bank(job, cfg, ckpt, registry, parts, embedded)
    meta = {"model": name, "checkpoint_hash": ckpt.content_hash, "dataset": cfg.data.name, "split": job.split,
            "splits": [p.split for p, _ in parts],
            "gallery_hash": catalogue.gallery_digest(gallery, [c for _, part in parts for c in part.captions]),
            "paths_hash": paths_hash,
            "ranks_hash": {d: catalogue.ranks_digest(query_ids[d], r) for d, r in ranks.items()},
            "picture_digests": sorted(paths_hash),
            MANIFEST_KEY: provenance}
    pictures = {digests_file(split): registry.pictures[(cfg.data.name, split)] for split in paths_hash}
    manifest = write_model_index(job.out / name, vectors, {"images": gallery.image_ids, "captions": gallery.caption_ids},
                                 job.spec, meta, {**bank_arrays(vectors, _eval_spans(parts, job.split), bank), **pictures})
    labels = None if split.labels is None else multi_hot(split.labels, label_vocabulary(split.labels))
    report = model_report(img_emb, cap_emb, cpi, _metrics_logs(ckpt.extra, role, path), labels, texts)
    seed = cfg.round2.seed if ckpt.extra.get("mined_dir") else cfg.train.seed
    report["measured"] = measured(job.split, split.n_images, cfg, seed)
    report["curves_measured"] = measured(cfg.data.dev_split, None, cfg, seed)
    report["selected_on"] = measured(cfg.data.dev_split, ckpt.metrics.get("n_images"), cfg, seed,
                                     ckpt.metrics.get("protocol"))
    loss = ckpt.extra.get("loss") or (cfg.round2.loss if role == "aoq" else cfg.train.loss)
    with sessions() as session, session.begin():
        record_model(session, name, role, str(loss), ckpt, ids, manifest, ranks, report, mined_dir)
    full = report["tables"]["full"]
    log.info("%s (%s): indexed %d images, %d captions; full-gallery rsum %.1f", name, role,
             len(img_emb), len(cap_emb), full["rsum"])
    return {"model": name, "role": role, "rsum": full["rsum"], "params": manifest["params"]}


def _bank(job: IndexJob, cfg: ExperimentConfig, ckpt: Checkpoint, registry: _Catalogue, parts: list,
          embedded: list) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The hubness bank, the training split's embeddings (those of the gallery when it holds the
    split, else embedded now), and its provenance."""
    role = cfg.data.train_split
    found = [e for (p, _), e in zip(parts, embedded) if p.split == role]
    if found:
        images, captions = found[0]
    else:
        images, captions = encode_split(ckpt.model, ckpt.vocab, registry.split(cfg.data, role)[1],
                                        batch_size=job.batch_size, image_size=cfg.data.image_size, progress=True)
    return {"images": images, "captions": captions}, bank_provenance(role, images, captions)


def _eval_spans(parts: list, split: str) -> dict[str, range]:
    """Where the evaluation split's images and captions sit among the gallery's positions."""
    images = captions = 0
    for ids, part in parts:
        if ids.split == split:
            return {"images": range(images, images + part.n_images),
                    "captions": range(captions, captions + part.n_captions)}
        images, captions = images + part.n_images, captions + part.n_captions
    raise ValueError(f"the gallery holds no split {split!r}")


def record_model(session: Session, name: str, role: str, loss: str, ckpt: Checkpoint, ids: SplitIds,
                 manifest: dict, ranks: dict[str, Any], report: dict, mined_dir: Path | None) -> None:
    """Catalogue a model indexed over the gallery ``ids``: its row, its two index records (from the
    index ``manifest``) and its ground-truth ranks (``{"t2i": per caption, "i2t": per image}``,
    either may be missing)."""
    model = catalogue.upsert_model(
        session, name, role=role, loss=loss, image_encoder=ckpt.config.model.image_encoder,
        image_input=ckpt.model.image_input, dataset_id=ids.dataset_id, gallery_split=ids.split,
        checkpoint_path=str(ckpt.path.resolve()), checkpoint_hash=ckpt.content_hash,
        metrics=ckpt.metrics, report=report, mined_dir=None if mined_dir is None else str(mined_dir),
    )
    built_at, config = utcnow(), manifest["config"]
    for modality in ("images", "captions"):
        catalogue.add_index_record(
            session, model, modality, config["index_type"], config["counts"][modality], config["dim"],
            manifest["files"][f"{modality}.faiss"], manifest["params"][modality], built_at,
        )
    for direction, query_ids in (("t2i", ids.caption_ids), ("i2t", ids.image_ids)):
        if direction in ranks:
            catalogue.store_ranks(session, model, direction, query_ids, ranks[direction])


def index_models(job: IndexJob) -> list[dict[str, Any]]:
    """Run the whole job; returns one summary per model (name, role, rsum, index parameters)."""
    engine = make_engine(job.catalogue_url)
    try:
        create_schema(engine)
        sessions = session_factory(engine)
        registry = _Catalogue(sessions, job.data_dir)
        found = discover_checkpoints(job.models_dir)
        rerankers = [path for path in found if is_cross_attention(path)]
        embedding = [path for path in found if path not in rerankers]
        check_shortlist(job, rerankers, embedding)
        # the embedding models first: a re-ranker's index is checked against its shortlister's
        summaries = [_index_one(job, sessions, registry, path) for path in embedding]
        summaries += [_index_reranker(job, sessions, registry, path) for path in rerankers]
        bump_generation(job.out, [s["model"] for s in summaries])
        return summaries
    finally:
        engine.dispose()
