"""Index arrays shared by the worker processes of one server: the first worker to load an array
writes it once into the server's private shared-memory directory, named by a hash of its
content, and every worker maps that file read-only, so the OS keeps one copy of the pages for
all of them (docs/serving.md, Workers).

The service reads its index files into memory, never maps them, because a file truncated while
mapped kills the process (SIGBUS); the files mapped here are the server's own copies, in a
directory only the server's user can write, which ``aoq index`` never touches.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
_share_dir: Path | None = None


def set_share_dir(directory: Path | None) -> None:
    """Share arrays through ``directory`` from now on (None: every process keeps its own)."""
    global _share_dir
    _share_dir = directory


def shared(array: np.ndarray) -> np.ndarray:
    """``array`` itself, or where a share directory is set, a read-only mapping of the shared
    copy of its content (equal bytes, dtype and shape)."""
    if _share_dir is None:
        return array
    array = np.ascontiguousarray(array)
    digest = hashlib.blake2b(memoryview(array).cast("B"), digest_size=16)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    path = _share_dir / f"{digest.hexdigest()}.npy"
    if not path.exists():
        # Written aside, then renamed: a worker never maps a half-written file; two workers
        # writing the same content at once each rename a complete copy.
        temp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        try:
            with open(temp, "wb") as f:
                np.save(f, array, allow_pickle=False)
            os.replace(temp, path)
        except OSError as exc:  # e.g. a container's small /dev/shm: this worker keeps its own copy
            temp.unlink(missing_ok=True)
            log.warning("index array of %d bytes kept per worker: %s cannot hold it (%s)", array.nbytes,
                        _share_dir, exc.strerror or exc)
            return array
    return np.load(path, mmap_mode="r", allow_pickle=False)
