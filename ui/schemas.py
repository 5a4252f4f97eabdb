"""The UI's view of the REST contract (docs/api.md): the answers it reads, validated.

The UI talks to the backend over HTTP only and may run on another machine, so it keeps its own
small models of the JSON instead of importing the backend's. Unknown fields are ignored, so the
backend can add fields without breaking the UI; a missing or mistyped field the UI needs becomes
a clear ``BackendError`` in the client instead of a ``KeyError`` deep in a render function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

#: fields holding an image URL the browser will load
URL_FIELDS = frozenset({"image_url", "thumbnail_url"})


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _urls_for_the_browser(cls, data: Any, info: ValidationInfo) -> Any:
        """Rewrite image URLs with the ``to_browser`` function of the validation context, if any.

        The backend builds image URLs from the address the UI used to reach it, which need not
        be the one the browser can reach (containers, proxies); the client passes the mapping.
        """
        to_browser: Callable[[str], str] | None = (info.context or {}).get("to_browser")
        if to_browser is None or not isinstance(data, dict):
            return data
        return {k: to_browser(v) if k in URL_FIELDS and isinstance(v, str) else v for k, v in data.items()}


class Health(_Answer):
    status: str
    models: list[str] = Field(default_factory=list)
    disabled: dict[str, str] = Field(default_factory=dict)
    version: str = ""


class ModelInfo(_Answer):
    name: str
    role: str
    loss: str = ""
    image_encoder: str = ""
    image_input: str = ""
    checkpoint_hash: str = ""
    dataset: str = ""
    enabled: bool = True
    disabled_reason: str | None = None


class ExampleCaption(_Answer):
    id: int
    text: str
    image_id: int | None = None


class ExampleImage(_Answer):
    id: int
    image_url: str
    thumbnail_url: str


class Examples(_Answer):
    captions: list[ExampleCaption] = Field(default_factory=list)
    images: list[ExampleImage] = Field(default_factory=list)


class ImageHit(_Answer):
    rank: int
    image_id: int
    score: float
    image_url: str
    thumbnail_url: str
    is_ground_truth: bool


class TextSearch(_Answer):
    """One model's answer to a text query (images ranked)."""

    model: str
    query: str
    caption_id: int | None = None
    ground_truth_ids: list[int] = Field(default_factory=list)
    ground_truth_rank: int | None = None
    results: list[ImageHit]
    latency_ms: float | None = None


class CaptionHit(_Answer):
    rank: int
    caption_id: int
    text: str
    image_id: int | None = None
    score: float
    is_ground_truth: bool


class ImageSearch(_Answer):
    """One model's answer to an image query (captions ranked)."""

    model: str
    image_id: int | None = None
    ground_truth_ids: list[int] = Field(default_factory=list)
    ground_truth_rank: int | None = None
    results: list[CaptionHit]
    latency_ms: float | None = None


class TextComparison(_Answer):
    query: str
    left: TextSearch
    right: TextSearch


class ImageComparison(_Answer):
    left: ImageSearch
    right: ImageSearch


Direction = Literal["t2i", "i2t"]
FailureKind = Literal["baseline_only", "aoq_only", "both"]


class FailureItem(_Answer):
    query_id: int
    query_text: str | None = None
    image_url: str | None = None
    left_rank: int | None = None
    right_rank: int | None = None


class Failures(_Answer):
    direction: Direction
    which: FailureKind
    left: str
    right: str
    total: int
    items: list[FailureItem]


class RecallRow(_Answer):
    r1: float
    r5: float
    r10: float
    medr: float
    meanr: float


class ProtocolTable(_Answer):
    i2t: RecallRow
    t2i: RecallRow
    rsum: float


class CurvePoint(_Answer):
    epoch: int
    round: int = 1
    i2t_r1: float | None = None
    t2i_r1: float | None = None
    rsum: float | None = None


class RankHistogram(_Answer):
    bins: list[str]
    counts: list[int]


class LabelRow(_Answer):
    map_at_r: float | None = None
    ndcg: float | None = None


class LabelTable(_Answer):
    k: int
    n_labels: int
    i2t: LabelRow
    t2i: LabelRow


class Metrics(_Answer):
    model: str
    tables: dict[str, ProtocolTable] = Field(default_factory=dict)
    curves: list[CurvePoint] = Field(default_factory=list)
    rank_histogram: RankHistogram | None = None
    #: label-wise metrics, only for galleries with labels
    labels: LabelTable | None = None


class NegativeItem(_Answer):
    id: int
    text: str | None = None
    image_url: str | None = None
    rank: int | None = None
    score: float | None = None


class Negatives(_Answer):
    kind: Literal["caption", "image"]
    id: int
    text: str | None = None
    image_url: str | None = None
    offline: list[NegativeItem] = Field(default_factory=list)
    online: list[NegativeItem] = Field(default_factory=list)
    #: optional (asked for in /tmp/ui-needs-endpoint.md): the anchor's matching items
    positives: list[NegativeItem] = Field(default_factory=list)
