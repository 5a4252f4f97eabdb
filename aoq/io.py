"""Atomic artefact writing and content hashing.

Every artefact the project writes (checkpoints, mined negatives, indexes, reports) goes through
these helpers so that a crash or ``kill -9`` never leaves a half-written file where a reader
would find it: data is written to a temporary sibling, flushed, fsync'ed and renamed.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

MANIFEST = "manifest.json"


class ArtefactError(RuntimeError):
    """An artefact on disk is missing, truncated, corrupted or does not match what was asked."""


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    with atomic_open(path) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 text atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON atomically (stable bytes for hashing)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_save_npy(path: str | Path, array: np.ndarray) -> Path:
    """Save a numpy array in ``.npy`` format atomically (loadable with ``mmap_mode='r'``)."""
    with atomic_open(path) as fh:
        np.save(fh, np.ascontiguousarray(array), allow_pickle=False)
    return Path(path)


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file handle whose content appears at ``path`` only if the block succeeds.

    For writers that stream (``torch.save``) and should not build the whole payload in memory
    first: the handle is a temp file beside ``path``, flushed, fsync'ed and renamed on success,
    deleted on failure.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@functools.lru_cache(maxsize=1)
def _syncfs() -> Any:
    """libc ``syncfs`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).syncfs
    return None


def _sync_tree(root: Path) -> None:
    """Make every file under ``root`` durable before the directory is renamed into place.

    On Linux one ``syncfs`` flushes the whole filesystem for about the cost of one ``fsync``;
    fsync'ing files one by one costs milliseconds each (minutes for the 100,000 PNGs of a
    synthetic dataset). Elsewhere, or if ``syncfs`` fails, each file is fsync'ed.
    """
    syncfs = _syncfs()
    if syncfs is not None:
        fd = os.open(root, os.O_RDONLY)
        try:
            if syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    for f in root.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Build a directory in a temporary sibling and move it to ``final`` only on success.

    An existing ``final`` is replaced: it is first renamed aside, then removed, so a reader sees
    either the old complete directory or the new complete one, never a mixture.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        _sync_tree(tmp)
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def exclusive(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` (created, and left, empty) for the body:
    two processes that would build the same artefact take turns, so the second finds the
    first's instead of building it again and replacing it under a reader. The kernel drops the
    lock when its holder dies. ``on_wait`` is called once if another holder makes this wait."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_replaceable(out: str | Path, kind: str, what: str) -> None:
    """Raise :class:`ArtefactError` unless ``out`` is absent, an empty folder or an earlier
    artefact of ``kind`` (``what`` names it in the message): a builder that replaces its output
    must never delete a user's own folder.
    """
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise ArtefactError(f"{out}: exists and is not a folder")
    if not any(out.iterdir()):
        return
    try:
        read_manifest(out, kind=kind, verify=False)
    except ArtefactError as exc:
        raise ArtefactError(f"{out}: refusing to replace a folder that is not {what} ({exc})") from exc


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of the canonical JSON form of ``obj`` (config hashing)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def file_hashes(directory: str | Path) -> dict[str, str]:
    """SHA-256 of every file under ``directory`` except the manifest, keyed by relative path."""
    directory = Path(directory)
    return {
        str(p.relative_to(directory)): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }


def content_hash(hashes: dict[str, str]) -> str:
    """One hash for a set of file hashes: the identity of an artefact directory."""
    return sha256_json(sorted(hashes.items()))


def write_manifest(directory: str | Path, kind: str, config: Any, **extra: Any) -> dict:
    """Write ``manifest.json`` into ``directory``: kind, config, per-file hashes, content hash."""
    directory = Path(directory)
    hashes = file_hashes(directory)
    manifest = {
        "kind": kind,
        "config": config,
        "files": hashes,
        "content_hash": content_hash(hashes),
        **extra,
    }
    atomic_write_json(directory / MANIFEST, manifest)
    return manifest


def parse_json(path: Path, error: type[Exception] = ArtefactError, what: str = "") -> Any:
    """The JSON value in the file ``path`` (which exists); bytes that are not UTF-8 JSON raise
    ``error`` naming the file (and ``what`` it holds)."""
    try:
        return json.loads(Path(path).read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: {what + ' is ' if what else ''}not valid JSON ({exc})") from None


def read_manifest(directory: str | Path, kind: str | None = None, verify: bool = True) -> dict:
    """Read and check an artefact directory's manifest.

    Raises:
        ArtefactError: naming the directory or file that is missing, of the wrong kind, or whose
            bytes no longer match the recorded hash (corruption, truncation, tampering).
    """
    directory = Path(directory)
    mpath = directory / MANIFEST
    if not directory.is_dir():
        raise ArtefactError(f"{directory}: no such artefact directory")
    if not mpath.is_file():
        raise ArtefactError(f"{mpath}: manifest missing (incomplete or foreign directory)")
    manifest = parse_json(mpath, what="manifest")
    if kind is not None and manifest.get("kind") != kind:
        raise ArtefactError(f"{directory}: is a {manifest.get('kind')!r} artefact, expected {kind!r}")
    if verify:
        for rel, digest in manifest.get("files", {}).items():
            f = directory / rel
            if not f.is_file():
                raise ArtefactError(f"{f}: listed in the manifest but missing")
            if sha256_file(f) != digest:
                raise ArtefactError(f"{f}: content hash mismatch (corrupted or truncated file)")
    return manifest


def stamp_matches(path: str | Path, key: Any) -> bool:
    """True when the JSON stamp at ``path`` holds exactly ``key``: the work it marks was done for
    these inputs. A missing or unreadable stamp is no match (the work is redone)."""
    try:
        return json.loads(Path(path).read_text()) == key
    except (OSError, ValueError):
        return False


def write_stamp(path: str | Path, key: Any) -> None:
    """Record ``key`` at ``path`` atomically; write it last, once the work it marks is complete."""
    atomic_write_json(path, key)
