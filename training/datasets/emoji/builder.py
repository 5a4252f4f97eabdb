"""Build the emoji dataset: render, drop, split, and write both layouts atomically.

Layout of ``out`` (the conventions of the synthetic benchmark)::

    dataset_emoji.json                 Karpathy format (splits "train", "val", "test"); each image
                                       entry also has "emoji", "emoji_id", "name", "base",
                                       "vendor" and "labels" (["group:...", "subgroup:..."])
    images/{train,val,test}/<vendor>_<emoji id>.png   SIZE x SIZE RGB on white
    precomp/{train,dev,test}_ims.npy   (N, N_REGIONS, FEATURE_DIM) float32 region features
    precomp/{train,dev,test}_caps.txt  5 captions per image, image order
    LICENSES/                          the vendors' and Unicode's licences and attribution
    README.md                          what the folder holds, attribution, counts
    manifest.json                      kind "emoji_dataset", arguments, sources, counts, hashes

Same sources and arguments give byte-identical files: every order is fixed (emoji-test.txt order,
then vendor), PNGs are written with fixed options, and splits come from a seeded hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from aoq.data.vocab import tokenize
from aoq.features import FEATURE_DIM, N_REGIONS, extract_regions
from aoq.io import (
    ArtefactError,
    atomic_dir,
    atomic_save_npy,
    check_replaceable,
    read_manifest,
    write_manifest,
)
from aoq_train.datasets.emoji.captions import CAPTIONS_PER_IMAGE, emoji_captions
from aoq_train.datasets.emoji.catalogue import Emoji, load_catalogue
from aoq_train.datasets.emoji.render import (
    ART,
    SIZE,
    NotoRenderer,
    TwemojiRenderer,
    is_blank,
)
from aoq_train.datasets.emoji.sources import EmojiSources, locate_sources
from aoq_train.datasets.synth.render import png_bytes

log = logging.getLogger(__name__)

MANIFEST_KIND = "emoji_dataset"
#: bump when the same sources and arguments would produce different files.
BUILDER_VERSION = 1
VENDORS: tuple[str, ...] = ("noto", "twemoji")
#: precomp split name -> Karpathy split name.
SPLITS: dict[str, str] = {"train": "train", "dev": "val", "test": "test"}
#: share of bases (or images, with split_by="image") per split, in SPLITS order.
SPLIT_SHARES: dict[str, float] = {"train": 0.8, "dev": 0.1, "test": 0.1}
SPLIT_BY = ("base", "image")
DROP_MISSING, DROP_BLANK, DROP_SHARED = "missing", "blank", "shared_artwork"


@dataclass
class Picture:
    """One vendor's rendering of one emoji, kept in memory until the drops are known."""

    emoji: Emoji
    vendor: str
    png: bytes
    pixel_hash: str
    features: np.ndarray

    @property
    def key(self) -> str:
        """``<vendor>_<emoji id>``: the file stem and the image's identity."""
        return f"{self.vendor}_{self.emoji.id}"


def build_emoji_dataset(
    out: str | Path,
    *,
    split_by: str = "base",
    limit: int | None = None,
    seed: int = 0,
    include: tuple[str, ...] = (),
    sources: EmojiSources | None = None,
    progress: bool = True,
    workers: int = 1,
) -> dict:
    """Build the dataset into ``out`` (atomically replacing an earlier emoji dataset there).

    Args:
        out: output folder; must not exist, be empty, or hold an earlier emoji dataset.
        split_by: ``"base"`` keeps every variant of a base emoji (skin tones, genders, hair) and
            both vendors' pictures in one split; ``"image"`` assigns each picture on its own.
        limit: keep whole base emoji, in seeded-hash order, until ``limit`` emoji are chosen
            (at most ``limit``; at least one base); None keeps all.
        seed: seeds the split hash and the ``limit`` choice.
        include: CLDR short names whose bases ``limit`` keeps first (a demo whose tests name them).
        sources: the inputs (default: :func:`locate_sources` with its defaults/environment).
        progress: show a progress bar while rendering.
        workers: processes that render (the files are the same for any number).

    Returns:
        The manifest written, with ``stats``: images per vendor and split, drops by reason.

    Raises:
        ValueError: a bad ``split_by``, ``limit`` or ``seed``, or an ``include`` name of no emoji.
        DataError: a missing source, naming the package to install.
        ArtefactError: ``out`` holds something that is not an emoji dataset.
    """
    if split_by not in SPLIT_BY:
        raise ValueError(f"split_by must be one of {', '.join(SPLIT_BY)}, got {split_by!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out = Path(out)
    check_replaceable(out, MANIFEST_KIND, "an emoji dataset")
    sources = sources or locate_sources()
    catalogue = load_catalogue(sources.emoji_test, [sources.cldr_annotations, sources.cldr_derived],
                               sources.unicode_data)
    chosen = select_emoji(catalogue, limit, seed, include)
    pictures, dropped = render_all(chosen, sources, progress, workers)
    pictures, shared = drop_shared_artwork(pictures)
    for vendor, n in shared.items():
        dropped[vendor][DROP_SHARED] += n
    splits = assign_splits(pictures, split_by, seed)

    config = build_config(sources, split_by, limit, seed, include)
    stats = _stats(chosen, pictures, dropped, splits)
    with atomic_dir(out) as tmp:
        tmp.chmod(0o755)  # a temporary folder is private (0700); a dataset is meant to be shared
        _write_layouts(tmp, splits)
        _write_licences(tmp, sources, stats)
        return write_manifest(
            tmp, MANIFEST_KIND, config,
            n_regions=N_REGIONS, feature_dim=FEATURE_DIM, captions_per_image=CAPTIONS_PER_IMAGE, stats=stats,
        )


def build_config(sources: EmojiSources, split_by: str, limit: int | None, seed: int,
                 include: tuple[str, ...] = ()) -> dict:
    """The manifest ``config`` of a build: its arguments, the builder version and the sources."""
    config = {
        "split_by": split_by,
        "limit": limit,
        "seed": seed,
        "image_size": SIZE,
        "split_shares": SPLIT_SHARES,
        "builder_version": BUILDER_VERSION,
        "sources": sources.fingerprint(),
    }
    # only when given: the datasets built before the option existed keep their manifests
    if include:
        config["include"] = list(include)
    return config


def ensure_emoji_dataset(
    out: str | Path, *, split_by: str = "base", limit: int | None = None, seed: int = 0,
    include: tuple[str, ...] = (), sources: EmojiSources | None = None, progress: bool = True, workers: int = 1,
) -> bool:
    """Build the dataset into ``out`` unless it already holds one built from these sources with
    these arguments (``make demo``). Returns True when it built, False when it skipped.

    Raises:
        DataError: a missing source, naming the package to install.
    """
    sources = sources or locate_sources()
    try:
        config = read_manifest(out, kind=MANIFEST_KIND, verify=False)["config"]
        if config == json.loads(json.dumps(build_config(sources, split_by, limit, seed, include))):
            log.info("dataset %s: up to date, skipped", out)
            return False
    except ArtefactError:
        pass
    build_emoji_dataset(out, split_by=split_by, limit=limit, seed=seed, include=include, sources=sources,
                        progress=progress, workers=workers)
    return True


def select_emoji(catalogue: list[Emoji], limit: int | None, seed: int, include: tuple[str, ...] = ()
                 ) -> list[Emoji]:
    """Whole bases, those of the ``include`` names first, then in seeded-hash order, until
    ``limit`` emoji; catalogue order is kept."""
    if limit is None:
        return catalogue
    members: dict[str, int] = Counter(e.base for e in catalogue)
    by_name = {e.name: e.base for e in catalogue}
    unknown = [name for name in include if name not in by_name]
    if unknown:
        raise ValueError(f"include: no emoji is called {', '.join(map(repr, unknown))}")
    first = list(dict.fromkeys(by_name[name] for name in include))
    keep: set[str] = set()
    total = 0
    for base in first + sorted(set(members) - set(first), key=lambda b: (_unit_hash(seed, "limit", b), b)):
        if keep and total + members[base] > limit:
            continue
        keep.add(base)
        total += members[base]
        if total >= limit:
            break
    return [e for e in catalogue if e.base in keep]


def render_all(
    emoji: list[Emoji], sources: EmojiSources, progress: bool, workers: int = 1
) -> tuple[list[Picture], dict[str, Counter[str]]]:
    """Every vendor's picture of every emoji, minus missing and blank ones (counted by reason),
    in ``emoji`` order, rendered by ``workers`` processes (the same pictures for any number)."""
    pictures: list[Picture] = []
    dropped: dict[str, Counter[str]] = {vendor: Counter() for vendor in VENDORS}
    chunks = [emoji[s:s + RENDER_CHUNK] for s in range(0, len(emoji), RENDER_CHUNK)]
    bar = tqdm(total=len(emoji), desc="rendering emoji", unit="emoji", disable=not progress)
    with bar, contextlib.ExitStack() as stack:
        if workers > 1 and len(emoji) >= RENDER_POOL_MIN:
            pool = stack.enter_context(ProcessPoolExecutor(
                min(workers, len(chunks)), mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_renderers, initargs=(sources,)))
            results = pool.map(_render_chunk, chunks)
        else:
            _init_renderers(sources)
            results = map(_render_chunk, chunks)
        for chunk, (rendered, chunk_dropped) in zip(chunks, results):
            pictures += rendered
            for vendor in VENDORS:
                dropped[vendor].update(chunk_dropped[vendor])
            bar.update(len(chunk))
    return pictures, dropped


#: emoji per task of the rendering processes: small enough to keep them busy to the end.
RENDER_CHUNK = 64
#: fewer emoji than this render in this process: a rendering process takes about a second to
#: start (imports, fonts), the time of some 70 emoji.
RENDER_POOL_MIN = 500
_RENDERERS: tuple[NotoRenderer, TwemojiRenderer] | None = None


def _init_renderers(sources: EmojiSources) -> None:
    global _RENDERERS
    _RENDERERS = (NotoRenderer(sources.noto_font), TwemojiRenderer(sources.twemoji_svg_dir))


def _render_chunk(emoji: list[Emoji]) -> tuple[list[Picture], dict[str, Counter[str]]]:
    """The pictures of a run of emoji, and the drops by vendor and reason."""
    assert _RENDERERS is not None
    noto, twemoji = _RENDERERS
    pictures: list[Picture] = []
    dropped: dict[str, Counter[str]] = {vendor: Counter() for vendor in VENDORS}
    for item in emoji:
        for vendor in VENDORS:
            image = noto.render(item.text) if vendor == "noto" else twemoji.render(item.codepoints)
            if image is None:
                dropped[vendor][DROP_MISSING] += 1
            elif is_blank(image):
                dropped[vendor][DROP_BLANK] += 1
            else:
                digest = hashlib.sha256(image.tobytes()).hexdigest()
                pictures.append(Picture(item, vendor, png_bytes(image), digest, extract_regions(image)))
    return pictures, dropped


def drop_shared_artwork(pictures: list[Picture]) -> tuple[list[Picture], Counter[str]]:
    """Drop every picture whose pixels another emoji of the same vendor also has.

    All copies go: a picture that stands for two emoji would make one of them a certain false
    negative of the other. Returns the kept pictures and the number dropped per vendor.
    """
    counts = Counter((p.vendor, p.pixel_hash) for p in pictures)
    kept = [p for p in pictures if counts[(p.vendor, p.pixel_hash)] == 1]
    dropped = Counter(p.vendor for p in pictures if counts[(p.vendor, p.pixel_hash)] > 1)
    return kept, dropped


def assign_splits(pictures: list[Picture], split_by: str, seed: int) -> dict[str, list[Picture]]:
    """Pictures per precomp split, in catalogue then vendor order (a seeded hash decides)."""
    bounds = np.cumsum(list(SPLIT_SHARES.values()))
    out: dict[str, list[Picture]] = {split: [] for split in SPLITS}
    ordered = sorted(pictures, key=lambda p: (p.emoji.order, VENDORS.index(p.vendor)))
    for picture in ordered:
        key = picture.emoji.base if split_by == "base" else picture.key
        index = int(np.searchsorted(bounds, _unit_hash(seed, "split", key), side="right"))
        out[list(SPLITS)[min(index, len(SPLITS) - 1)]].append(picture)
    return out


def _unit_hash(seed: int, purpose: str, key: str) -> float:
    """A number in [0, 1) fixed by ``seed``, ``purpose`` and ``key`` (same on every machine)."""
    digest = hashlib.sha256(f"{seed}/{purpose}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _write_layouts(root: Path, splits: dict[str, list[Picture]]) -> None:
    (root / "precomp").mkdir()
    imgid = 0
    with open(root / "dataset_emoji.json", "w", encoding="utf-8") as karpathy:
        karpathy.write('{"dataset": "emoji", "images": [\n')
        for split, pictures in splits.items():
            if not pictures:  # a tiny --limit can leave a split empty; no reader takes empty files
                continue
            folder = root / "images" / SPLITS[split]
            folder.mkdir(parents=True)
            captions: list[str] = []
            for picture in pictures:
                filename = f"{picture.key}.png"
                (folder / filename).write_bytes(picture.png)
                texts = emoji_captions(picture.emoji)
                captions.extend(texts)
                entry = _entry(picture, split, filename, texts, imgid)
                karpathy.write(("" if imgid == 0 else ",\n") + json.dumps(entry, sort_keys=True, ensure_ascii=False))
                imgid += 1
            atomic_save_npy(root / "precomp" / f"{split}_ims.npy", np.stack([p.features for p in pictures]))
            (root / "precomp" / f"{split}_caps.txt").write_text("".join(c + "\n" for c in captions), encoding="utf-8")
        karpathy.write("\n]}\n")


def _entry(picture: Picture, split: str, filename: str, captions: list[str], imgid: int) -> dict:
    emoji = picture.emoji
    sentids = list(range(imgid * CAPTIONS_PER_IMAGE, (imgid + 1) * CAPTIONS_PER_IMAGE))
    return {
        "filepath": f"images/{SPLITS[split]}",
        "filename": filename,
        "split": SPLITS[split],
        "imgid": imgid,
        "sentids": sentids,
        "sentences": [
            {"raw": raw, "tokens": tokenize(raw), "sentid": sid, "imgid": imgid} for raw, sid in zip(captions, sentids)
        ],
        "emoji": emoji.text,
        "emoji_id": emoji.id,
        "name": emoji.name,
        "base": emoji.base,
        "vendor": picture.vendor,
        "labels": [f"group:{emoji.group}", f"subgroup:{emoji.subgroup}"],
    }


def _stats(
    chosen: list[Emoji], pictures: list[Picture], dropped: dict[str, Counter[str]], splits: dict[str, list[Picture]]
) -> dict:
    per_vendor = Counter(p.vendor for p in pictures)
    return {
        "emoji": len(chosen),
        "emoji_without_cldr_name": sum(not e.cldr for e in chosen),
        "bases": len({e.base for e in chosen}),
        "images": {vendor: per_vendor[vendor] for vendor in VENDORS},
        "dropped": {vendor: {r: dropped[vendor][r] for r in (DROP_MISSING, DROP_BLANK, DROP_SHARED)}
                    for vendor in VENDORS},
        "splits": {
            split: {"images": len(ps), "emoji": len({p.emoji.id for p in ps}), "bases": len({p.emoji.base for p in ps})}
            for split, ps in splits.items()
        },
    }


_TWEMOJI_ATTRIBUTION = """Twemoji graphics
Copyright Twitter, Inc and other contributors (Twemoji), maintained by jdecked.
Licensed under CC-BY 4.0: https://creativecommons.org/licenses/by/4.0/
Source of the files used: the npm package @twemoji/svg {version}.
Changes: each SVG was rasterised with cairosvg to {art}x{art} pixels and centred on a white
{size}x{size} canvas. The package's own licence (MIT, for the packaging) is
twemoji-svg-package.LICENSE.txt.
"""


def _write_licences(root: Path, sources: EmojiSources, stats: dict) -> None:
    folder = root / "LICENSES"
    folder.mkdir()
    for name, path in sorted(sources.licence_files.items()):
        shutil.copyfile(path, folder / name)
    (folder / "twemoji-graphics.ATTRIBUTION.txt").write_text(
        _TWEMOJI_ATTRIBUTION.format(version=sources.twemoji_version, art=ART, size=SIZE), encoding="utf-8"
    )
    (root / "README.md").write_text(_readme(sources, stats), encoding="utf-8")


def _readme(sources: EmojiSources, stats: dict) -> str:
    lines = [
        "# Emoji image-caption dataset",
        "",
        "Built by `aoq data emoji` (see docs/emoji.md of the AOQ toolkit). Pictures of Unicode emoji by",
        "two vendors, each with five captions taken by a fixed rule from Unicode CLDR annotations and",
        "Unicode character names.",
        "",
        "## Attribution and licences (LICENSES/)",
        "",
        "- Noto Color Emoji, Copyright Google Inc., SIL Open Font License 1.1 (Debian package",
        "  fonts-noto-color-emoji): `noto-color-emoji.copyright.txt`.",
        "- Twemoji graphics, Copyright Twitter, Inc and other contributors, CC-BY 4.0 (npm package",
        f"  @twemoji/svg {sources.twemoji_version}): `twemoji-graphics.ATTRIBUTION.txt`,",
        "  `twemoji-svg-package.LICENSE.txt`.",
        "- Unicode CLDR annotations and the Unicode Character Database, Copyright Unicode, Inc., Unicode",
        "  licence (Debian packages unicode-cldr-core, unicode-data): `unicode-cldr-core.copyright.txt`,",
        "  `unicode-data.copyright.txt`.",
        "",
        "## Counts",
        "",
        "```",
        json.dumps(stats, indent=2, sort_keys=True),
        "```",
        "",
    ]
    return "\n".join(lines)

