"""What the service says about a catalogued model (``/models``), served or disabled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aoq_serve.store.db import Model


@dataclass(frozen=True)
class ModelInfo:
    """What ``/models`` says about a model, served or not."""

    name: str
    role: str = "unknown"
    loss: str = ""
    image_encoder: str = ""
    image_input: str = ""
    checkpoint_hash: str = ""
    dataset: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: where ``metrics`` and the report's figures come from (``aoq_serve.schemas.Measured``).
    metrics_measured: dict[str, Any] | None = None
    evaluated: dict[str, Any] | None = None
    enabled: bool = False
    disabled_reason: str | None = None
    #: a re-ranker's shortlisting model and shortlist length (None for an embedding model).
    shortlist_by: str | None = None
    shortlist_n: int | None = None


def model_info(row: Model, dataset: str, enabled: bool, reason: str | None) -> ModelInfo:
    """What ``/models`` says about a catalogued model."""
    return ModelInfo(
        name=row.name, role=row.role, loss=row.loss, image_encoder=row.image_encoder,
        image_input=row.image_input, checkpoint_hash=row.checkpoint_hash, dataset=dataset,
        metrics=dict(row.metrics or {}), metrics_measured=(row.report or {}).get("selected_on"),
        evaluated=(row.report or {}).get("measured"), enabled=enabled, disabled_reason=reason,
    )
