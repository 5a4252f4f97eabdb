"""The hubness normalisers stored with a model's index (docs/serving.md, Hubness correction).

``aoq index`` embeds the bank (the training split) once and keeps, per gallery item, what a query
needs to be normalised: its log-denominator over the bank and whether it is in QB-Norm's
activation set. The activation set depends on the gallery a bank query ranks, so there is one per
scope (every indexed split, or the evaluation split alone); the log-denominator does not.
The bank's provenance (split, size, content hash, beta, k) goes into the index manifest.

Files in the index directory, per modality (``images``: normalised by the bank's captions, for
text queries; ``captions``: by the bank's images, for image queries)::

    <modality>_log_z.npy           float64, one per gallery position
    <modality>_active_<scope>.npy  bool, one per gallery position (False outside the scope)
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import numpy as np

from aoq.hubness import Normaliser, bank_normaliser
from aoq.io import ArtefactError
from aoq_serve.schemas import Scope

#: the manifest's ``config`` key of the bank's provenance
MANIFEST_KEY = "hubness"
SCOPES: tuple[str, ...] = get_args(Scope)
#: which bank modality normalises which gallery modality
BANK_OF = {"images": "captions", "captions": "images"}


def _log_z_file(modality: str) -> str:
    return f"{modality}_log_z.npy"


def _active_file(modality: str, scope: str) -> str:
    return f"{modality}_active_{scope}.npy"


def bank_arrays(gallery: dict[str, np.ndarray], eval_spans: dict[str, range], bank: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """The files of the normalisers of a gallery (``{"images": ..., "captions": ...}`` by position)
    whose evaluation split sits at ``eval_spans``, under ``bank`` (the training split's embeddings)."""
    files: dict[str, np.ndarray] = {}
    for modality, vectors in gallery.items():
        queries = bank[BANK_OF[modality]]
        whole = bank_normaliser(queries, vectors)
        span = eval_spans[modality]
        in_eval = np.zeros(len(vectors), dtype=bool)
        in_eval[span.start:span.stop] = bank_normaliser(queries, vectors[span.start:span.stop]).active
        files[_log_z_file(modality)] = whole.log_denominator
        files[_active_file(modality, "all")] = whole.active
        files[_active_file(modality, "test")] = in_eval
    return files


def load_bank(path: Path, config: dict) -> dict[str, dict[str, Normaliser]] | None:
    """``{modality: {scope: Normaliser}}`` of an index directory (already verified against its
    manifest), or None for an index built without a bank.

    Raises:
        ArtefactError: a file of the wrong length.
    """
    provenance = config.get(MANIFEST_KEY)
    if provenance is None:
        return None
    loaded: dict[str, dict[str, Normaliser]] = {}
    for modality in BANK_OF:
        # read whole, not memory-mapped: small, and never changed under a running query
        log_z = np.load(path / _log_z_file(modality))
        loaded[modality] = {}
        for scope in SCOPES:
            active = np.load(path / _active_file(modality, scope))
            if not (len(log_z) == len(active) == config["counts"][modality]):
                raise ArtefactError(f"{path}: {modality} hubness arrays hold {len(log_z)} and {len(active)} items, "
                                    f"the index {config['counts'][modality]}")
            loaded[modality][scope] = Normaliser(log_denominator=log_z, active=active, beta=provenance["beta"])
    return loaded
