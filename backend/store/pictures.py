"""The content of the picture files the service shows: a SHA-256 per file, recorded by ``aoq index``
and checked by the service, so a file swapped on disk (another emoji under the same name, still a
valid PNG) is never served for the picture the catalogue and the index describe.

``aoq index`` writes the digests of every split whose pictures a model shows as one array per
split in the model's index folder (``pictures_<split>.npy``, ``(n_images, 32)`` bytes, zeros for
an image without a file); the index manifest hashes that file like the others. The service
compares every file with its digest when it loads the models (again on each reload; files whose
inode, size and times are unchanged since they were last hashed are not read again), and each
served file's bytes before answering.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from aoq_serve.store.catalogue import position

log = logging.getLogger(__name__)
#: bytes of one digest (SHA-256).
DIGEST_BYTES = 32
_NO_FILE = bytes(DIGEST_BYTES)


def digests_file(split: str) -> str:
    """The index folder's file holding the picture digests of ``split``."""
    return f"pictures_{split}.npy"


def digest_of(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def file_digest(path: Path) -> bytes:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def split_digests(files: list[Path] | None, n_images: int) -> np.ndarray:
    """``(n_images, 32)`` uint8: the digest of each image's file (zeros: features only)."""
    out = np.zeros((n_images, DIGEST_BYTES), dtype=np.uint8)
    for p, path in enumerate(tqdm(files or [], desc="picture digests", leave=False,
                                  disable=files is None or len(files) < 2000)):
        out[p] = np.frombuffer(file_digest(path), dtype=np.uint8)
    return out


def expected(row: np.ndarray) -> bytes | None:
    """A stored digest row as bytes (None: the image has no file)."""
    data = bytes(row)
    return None if data == _NO_FILE else data


@dataclass(frozen=True)
class ImagePaths:
    """Image files (relative to the data directory) by catalogue id, as verified at load time,
    with the digest of each file's bytes recorded by ``aoq index``: ``/images`` serves these, so
    a later edit of the catalogue or a file swapped on disk cannot swap pictures."""

    ids: np.ndarray
    paths: tuple[str | None, ...]
    #: ``(n, 32)`` uint8 SHA-256 of each file (:mod:`aoq_serve.store.pictures`).
    digests: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, paths: list[str | None], digests: np.ndarray) -> ImagePaths:
        order = np.argsort(ids, kind="stable")
        return cls(np.asarray(ids, dtype=np.int64)[order], tuple(paths[i] for i in order), digests[order])

    def get(self, image_id: int) -> str | None:
        """The image's path ("" for a features-only image), None when it is not one of these."""
        p = position(self.ids, image_id)
        return None if p is None else self.paths[p] or ""

    def digest(self, image_id: int) -> bytes | None:
        """The recorded digest of the image's file (None: not one of these, or no file)."""
        p = position(self.ids, image_id)
        return None if p is None else expected(self.digests[p])


def _stamp(path: Path) -> tuple[int, int, int, int, int]:
    # ctime changes on every write and rename and cannot be set back by a user.
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class PictureChecker:
    """Compares picture files with their recorded digests, hashing a file again only when its
    stamp (device, inode, size, modification and change times) changed since it was hashed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[Path, tuple[tuple[int, int, int, int, int], bytes]] = {}

    def mismatch(self, path: Path, digest: bytes) -> str | None:
        """None when the file holds the recorded bytes (or is missing: ``/images`` answers 404
        for it), else the reason, naming the file."""
        try:
            stamp = _stamp(path)
            with self._lock:
                known = self._known.get(path)
            if known is None or known[0] != stamp:
                known = (stamp, file_digest(path))
                with self._lock:
                    self._known[path] = known
        except OSError:
            return None
        if known[1] == digest:
            return None
        return (f"{path} differs from the picture file that aoq index recorded (sha256 {known[1].hex()[:12]}, "
                f"recorded {digest.hex()[:12]}); restore it or re-run aoq index")

    def compare(self, data_dir: Path, ids: np.ndarray, paths: list[str | None],
                digests: np.ndarray) -> dict[int, str]:
        """``{image id: reason}`` of a split's picture files that differ from their digests (each
        logged once): that picture is disabled, not the model."""
        root, bad = data_dir.resolve(), {}
        for image_id, path, row in zip(ids, paths, digests):
            digest = expected(row)
            file = (root / path).resolve() if path and digest is not None else None
            if file is None or not file.is_relative_to(root):
                continue  # no file, or one /images refuses to read
            reason = self.mismatch(file, digest)
            if reason is not None:
                bad[int(image_id)] = reason
                log.error("picture %d disabled: %s", int(image_id), reason)
        return bad
