"""The mined-negatives artefact: per image the ids of its hardest captions, per caption the ids of its
hardest images (written by the miner, read by round 2 and by the service's negatives explorer).

With false-negative filters (``mining.filters``) the artefact also holds the deeper lists mined
before filtering (``*_raw_*.npy``) and, per candidate, which filters flag it (``*_flags.npy``, one
bit per filter in the order of :data:`aoq.names.FALSE_NEGATIVE_FILTERS`); the top lists are then the
first unflagged candidates of the raw lists under the filters the manifest names (``filters``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aoq.io import ArtefactError, atomic_dir, atomic_save_npy, atomic_write_json, read_manifest, write_manifest
from aoq.names import FALSE_NEGATIVE_FILTERS

log = logging.getLogger(__name__)

KIND = "mined_negatives"
IMG_FILE = "img_top_caps.npy"
CAP_FILE = "cap_top_imgs.npy"
#: hardness diagnostics of the lists at the round-1 model (training/mining/diagnostics.py).
DIAGNOSTICS_FILE = "diagnostics.json"
#: the flag bit of a raw candidate the filters were not evaluated on: it lies beyond the depth its
#: row needed (the rows that kept too few were mined deeper, the others' new candidates not checked)
UNCHECKED = 0x80
#: the filtered artefact's extra arrays: raw lists (int32) and their filter flags (uint8 bits)
FILTER_FILES = {"img_raw": ("img_raw_caps.npy", np.int32), "img_flags": ("img_flags.npy", np.uint8),
                "cap_raw": ("cap_raw_imgs.npy", np.int32), "cap_flags": ("cap_flags.npy", np.uint8)}


def removed_by(flags: np.ndarray, enabled: list[str]) -> list[str | None]:
    """Per candidate, the first enabled filter (in the fixed order) whose flag bit is set, or None
    when none is: the filter that removed it from the list round 2 samples from."""
    out: list[str | None] = []
    for bits in np.asarray(flags).reshape(-1).tolist():
        out.append(next((name for k, name in enumerate(FALSE_NEGATIVE_FILTERS)
                         if name in enabled and bits >> k & 1), None))
    return out


@dataclass
class MinedNegatives:
    """A loaded mined-negatives artefact (arrays memory-mapped read-only)."""

    img_top_caps: np.ndarray  # (N_i, H_t) int32
    cap_top_imgs: np.ndarray  # (N_c, H_i) int32
    manifest: dict
    path: Path
    #: the raw lists and their flags (keys of ``FILTER_FILES``), None when the lists were not filtered
    filtered: dict[str, np.ndarray] | None = None

    @property
    def filters(self) -> list[str]:
        """The filters that made the top lists (empty for unfiltered lists)."""
        return list(self.manifest.get("filters", []))

    @property
    def top_captions(self) -> int:
        return int(self.img_top_caps.shape[1])

    @property
    def top_images(self) -> int:
        return int(self.cap_top_imgs.shape[1])

    @property
    def captions_per_image(self) -> int:
        return int(self.cap_top_imgs.shape[0] // self.img_top_caps.shape[0])

    @property
    def checkpoint_hash(self) -> str | None:
        return self.manifest.get("checkpoint_hash")

    @property
    def diagnostics(self) -> dict | None:
        """The hardness diagnostics written with the lists (None for artefacts without them)."""
        path = self.path / DIAGNOSTICS_FILE
        return json.loads(path.read_text()) if path.is_file() else None


def save_mined(
    directory: str | Path,
    img_top_caps: np.ndarray,
    cap_top_imgs: np.ndarray,
    manifest_extra: dict[str, Any] | None = None,
    config: Any = None,
    diagnostics: dict[str, Any] | None = None,
    filtered: dict[str, np.ndarray] | None = None,
) -> dict:
    """Write the artefact atomically: both arrays (int32 ``.npy``), ``diagnostics.json`` when
    given, the raw lists and flags of a filtered artefact (``filtered``, keys of
    ``FILTER_FILES``), and ``manifest.json`` (whose hashes cover every file).

    ``manifest_extra`` typically holds ``checkpoint_hash``; the H values and shapes are added
    here. Returns the manifest.
    """
    extra = dict(manifest_extra or {})
    extra.update(
        top_captions=int(img_top_caps.shape[1]),
        top_images=int(cap_top_imgs.shape[1]),
        shapes={IMG_FILE: list(img_top_caps.shape), CAP_FILE: list(cap_top_imgs.shape)},
    )
    with atomic_dir(directory) as tmp:
        atomic_save_npy(tmp / IMG_FILE, np.asarray(img_top_caps, dtype=np.int32))
        atomic_save_npy(tmp / CAP_FILE, np.asarray(cap_top_imgs, dtype=np.int32))
        if diagnostics is not None:
            atomic_write_json(tmp / DIAGNOSTICS_FILE, diagnostics)
        for key, array in (filtered or {}).items():
            name, dtype = FILTER_FILES[key]
            atomic_save_npy(tmp / name, np.asarray(array, dtype=dtype))
            extra["shapes"][name] = list(np.shape(array))
        manifest = write_manifest(tmp, KIND, config, **extra)
    return manifest


def load_mined(directory: str | Path, verify: bool = True) -> MinedNegatives:
    """Load a mined-negatives artefact, memory-mapped read-only.

    Raises:
        ArtefactError: the directory, manifest or an array is missing, of another kind,
            corrupted or truncated (hash or shape mismatch), naming the file.
    """
    directory = Path(directory)
    manifest = read_manifest(directory, kind=KIND, verify=verify)
    img_top_caps, cap_top_imgs = (_array(directory, name, np.int32, manifest) for name in (IMG_FILE, CAP_FILE))
    if img_top_caps.shape[0] == 0 or cap_top_imgs.shape[0] % img_top_caps.shape[0]:
        raise ArtefactError(
            f"{directory}: {cap_top_imgs.shape[0]} caption rows do not match {img_top_caps.shape[0]} image rows"
        )
    filtered = None
    if manifest.get("filters"):
        filtered = {key: _array(directory, name, dtype, manifest) for key, (name, dtype) in FILTER_FILES.items()}
    return MinedNegatives(img_top_caps, cap_top_imgs, manifest, directory, filtered)


def _array(directory: Path, name: str, dtype: type, manifest: dict) -> np.ndarray:
    """One 2-D array of the artefact, memory-mapped, checked against its dtype and recorded shape."""
    path = directory / name
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtefactError(f"{path}: cannot be read as a .npy array ({exc})") from exc
    expected = manifest.get("shapes", {}).get(name)
    if arr.dtype != dtype or arr.ndim != 2 or (expected is not None and list(arr.shape) != expected):
        raise ArtefactError(f"{path}: expected {np.dtype(dtype).name} {expected}, found {arr.dtype} {list(arr.shape)}")
    return arr


