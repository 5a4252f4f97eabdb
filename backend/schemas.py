"""Request and response models of the REST API (docs/api.md); they are what OpenAPI shows."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

MAX_QUERY_CHARS = 1000
MAX_K = 100
#: ids are 32-bit integers in the catalogue (PostgreSQL INTEGER).
MAX_ID = 2**31 - 1
#: the service's default upload limit (``AOQ_MAX_UPLOAD_BYTES``); the UI refuses larger files before they travel.
DEFAULT_MAX_UPLOAD_BYTES = 10 * 1024 * 1024
#: side of the thumbnails the result lists link to.
THUMBNAIL_SIZE = 128


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain a non-space character")
    return value


class ErrorOut(BaseModel):
    detail: str
    #: validation errors only: the individual problems (FastAPI's list, reduced to type/loc/msg).
    errors: list[dict] | None = None


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"] = Field(description='"degraded" when no model can be served')
    models: list[str] = Field(description="names of the served (enabled) models")
    disabled: dict[str, str] = Field(description="disabled model -> reason")
    version: str
    generation: int | None = Field(None, description="index generation being served (index.json)")


class ModelOut(BaseModel):
    name: str
    role: str
    loss: str
    image_encoder: str
    image_input: str
    checkpoint_hash: str
    dataset: str
    enabled: bool
    disabled_reason: str | None
    metrics: dict = Field(description="the checkpoint's own metrics (the dev split it was selected on)")


class SplitCounts(BaseModel):
    images: int
    captions: int


class DatasetOut(BaseModel):
    name: str
    n_images: int
    n_captions: int
    splits: dict[str, SplitCounts]
    synthetic: bool


class ExampleCaption(BaseModel):
    id: int
    text: str
    image_id: int


class ExampleImage(BaseModel):
    id: int
    image_url: str
    thumbnail_url: str


class ExamplesOut(BaseModel):
    dataset: str
    split: str
    captions: list[ExampleCaption]
    images: list[ExampleImage]


class SearchTextIn(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    model: str = Field(min_length=1, max_length=200)
    k: int = Field(10, ge=1, le=MAX_K)

    _query = field_validator("query")(_not_blank)


class ImageHit(BaseModel):
    rank: int = Field(description="1-based")
    image_id: int
    score: float
    image_url: str
    thumbnail_url: str
    is_ground_truth: bool


class SearchTextOut(BaseModel):
    model: str
    query: str
    caption_id: int | None = Field(description="set when the query is exactly a gallery caption")
    ground_truth_ids: list[int]
    ground_truth_rank: float | None = Field(description="1-based rank of the ground truth in the full gallery "
                                                        "(expected rank when scores tie; docs/evaluation.md)")
    results: list[ImageHit]
    latency_ms: float


class CaptionHit(BaseModel):
    rank: int
    caption_id: int
    text: str
    image_id: int
    score: float
    is_ground_truth: bool


class SearchImageOut(BaseModel):
    model: str
    image_id: int | None
    ground_truth_ids: list[int]
    ground_truth_rank: float | None
    results: list[CaptionHit]
    latency_ms: float


class CompareTextIn(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    models: list[str] | None = Field(
        None, min_length=2, max_length=2, description="[left, right]; default the baseline-role and aoq-role models"
    )
    k: int = Field(10, ge=1, le=MAX_K)

    _query = field_validator("query")(_not_blank)


class CompareTextOut(BaseModel):
    query: str
    left: SearchTextOut
    right: SearchTextOut


class CompareImageOut(BaseModel):
    left: SearchImageOut
    right: SearchImageOut


class CaptionOut(BaseModel):
    id: int
    text: str
    image_id: int
    split: str


class FailureItem(BaseModel):
    query_id: int = Field(description="caption id (t2i) or image id (i2t)")
    query_text: str | None = None
    image_url: str | None = None
    image_id: int | None = Field(None, description="t2i: the ground-truth image; i2t: the query image")
    left_rank: float
    right_rank: float


class FailuresOut(BaseModel):
    direction: Literal["t2i", "i2t"]
    which: Literal["baseline_only", "aoq_only", "both"]
    left: str
    right: str
    total: int
    items: list[FailureItem]


class RecallRow(BaseModel):
    r1: float
    r5: float
    r10: float
    medr: float
    meanr: float


class ProtocolTable(BaseModel):
    i2t: RecallRow
    t2i: RecallRow
    rsum: float


class CurvePoint(BaseModel):
    epoch: int
    round: int
    i2t_r1: float | None = None
    t2i_r1: float | None = None
    rsum: float | None = None


class RankHistogram(BaseModel):
    bins: list[str]
    counts: list[int]


class LabelRow(BaseModel):
    map_at_r: float | None = Field(description="mAP@R, binary relevance = shares a label (fraction)")
    ndcg: float | None = Field(description="NDCG@k, relevance = number of shared labels (fraction)")


class LabelTable(BaseModel):
    k: int
    n_labels: int
    i2t: LabelRow
    t2i: LabelRow


class MetricsOut(BaseModel):
    model: str
    tables: dict[str, ProtocolTable] = Field(description="protocol (full, 1k5fold, 5k) -> table, on the gallery split")
    curves: list[CurvePoint]
    rank_histogram: RankHistogram | None
    labels: LabelTable | None = Field(None, description="label-wise metrics, when the gallery has labels")


class NegativeItem(BaseModel):
    id: int
    text: str | None = None
    image_url: str | None = None
    rank: int | None = Field(None, description="offline: 1-based position in the mined list")
    score: float | None = Field(None, description="online: the model's score against the anchor")


class NegativesOut(BaseModel):
    model: str
    kind: Literal["caption", "image"]
    id: int
    text: str | None = None
    image_url: str | None = None
    offline: list[NegativeItem]
    online: list[NegativeItem]


class ReloadOut(BaseModel):
    generation: int | None
    models: list[str]
    disabled: dict[str, str]
