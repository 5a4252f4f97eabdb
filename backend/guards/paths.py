"""Confinement of every file the service reads for a request to the data directory.

Catalogue rows store paths relative to the data directory. Before a file is opened, the joined
path is resolved (following ``..`` and symbolic links) and must still lie inside the resolved
data directory, so a tampered catalogue row or a link pointing elsewhere cannot make the service
read an arbitrary file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aoq.config import DataConfig
from aoq.data.dataset import DataError
from aoq_serve.config import Settings
from aoq_serve.errors import ServiceError

#: an absolute POSIX path inside a message (not the ``//`` of a URL's scheme).
_ABSOLUTE = re.compile(r"(?<![\w:/.])/(?:[^\s;,()'\"/]+/)*([^\s;,()'\"/]+)")


def safe_path(data_dir: Path, relative: str | Path) -> Path:
    """``data_dir / relative`` resolved, when it stays inside ``data_dir``.

    Raises:
        ServiceError: 404 when the path escapes the data directory (the reason is not leaked).
    """
    root = data_dir.resolve()
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root):
        raise ServiceError(404, "file not available: it is outside the data directory")
    return candidate


def relative_to_data(data_dir: Path, path: str | Path) -> str:
    """``path`` relative to the data directory.

    Raises:
        DataError: the path is outside the data directory (the service could never read it).
    """
    root, resolved = data_dir.resolve(), Path(path).resolve()
    if not resolved.is_relative_to(root):
        raise DataError(f"{path}: outside the data directory {root}; pass the folder holding it as --data-dir")
    return str(resolved.relative_to(root))


def stored_data_config(data_dir: Path, cfg: DataConfig) -> dict[str, Any]:
    """A run's data section with its paths made relative to the data directory (for the catalogue)."""
    tree = cfg.model_dump(mode="json")
    tree["path"] = relative_to_data(data_dir, cfg.path)
    if cfg.image_root is not None:
        tree["image_root"] = relative_to_data(data_dir, cfg.image_root)
    return tree


def served_data_config(data_dir: Path, tree: dict[str, Any]) -> DataConfig:
    """The catalogue's data section back as a ``DataConfig`` whose paths are inside the data directory.

    Raises:
        ServiceError: 404 when a stored path escapes the data directory.
    """
    tree = dict(tree)
    tree["path"] = str(safe_path(data_dir, tree["path"]))
    if tree.get("image_root") is not None:
        tree["image_root"] = str(safe_path(data_dir, tree["image_root"]))
    return DataConfig.model_validate(tree)


def public_text(text: str, settings: Settings) -> str:
    """:func:`without_roots` with the service's three configured folders."""
    return without_roots(text, {"AOQ_INDEX_DIR": settings.index_dir, "AOQ_MODELS_DIR": settings.models_dir,
                                "AOQ_DATA_DIR": settings.data_dir})


def without_roots(text: str, roots: dict[str, Path]) -> str:
    """``text`` for public answers (``/health``): each configured folder's absolute path becomes
    its setting's name (``$AOQ_INDEX_DIR/aoq/images.npy``), and any other absolute path its file
    name, so the service's file layout is not disclosed; the log keeps the full paths."""
    spelled = [(str(spelling), name) for name, root in roots.items() for spelling in {root, root.resolve()}
               if str(spelling).startswith("/") and str(spelling) != "/"]
    for spelling, name in sorted(spelled, key=lambda pair: -len(pair[0])):
        text = re.sub(re.escape(spelling) + r"(?=/|\b|$)", f"${name}", text)
    return _ABSOLUTE.sub(lambda m: m.group(1), text)
