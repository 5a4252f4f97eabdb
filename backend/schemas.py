"""Request and response models of the REST API (docs/api.md); they are what OpenAPI shows."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from aoq.names import FalseNegativeFilter, Normalisation, PositiveRule

MAX_QUERY_CHARS = 1000
MAX_K = 100
#: ids are 32-bit integers in the catalogue (PostgreSQL INTEGER).
MAX_ID = 2**31 - 1
#: the service's default upload limit (``AOQ_MAX_UPLOAD_BYTES``); the UI refuses larger files before they travel.
DEFAULT_MAX_UPLOAD_BYTES = 10 * 1024 * 1024
#: side of the thumbnails the result lists link to.
THUMBNAIL_SIZE = 128
#: the sizes ``/images/{id}?size=`` makes thumbnails of (the longer side, in pixels).
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 512
#: images per page of ``/gallery``.
MAX_GALLERY_PAGE = 100
#: what a search ranks: the whole catalogue (every indexed split) or the evaluation split alone.
Scope = Literal["all", "test"]
SCOPE_HELP = ("all: every split the index holds (train, dev and test); test: the evaluation split alone, whose "
              "ranks the metrics and failure cases use")
NORMALISE_HELP = ("query-time hubness correction with the training split as the bank (docs/serving.md, Hubness "
                  "correction; refused with 422 in a scope that holds the bank's split, scope all): none (raw scores), qbnorm (QB-Norm's dynamic inverted softmax: only a query whose "
                  "top-1 is some bank query's top-1 is normalised), invsoftmax (every query); scores are then "
                  "log-normalised scores")
#: a text search's optional ``intended`` field (search and compare alike).
IntendedAnswer = Annotated[str | None, Field(
    min_length=1, max_length=MAX_QUERY_CHARS,
    description="a caption text whose pictures are the correct answers of a free-text query (a showcased "
                "example's intended answer), by the model's rule; none are correct when no caption of the "
                "gallery has it")]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain a non-space character")
    return value


class ErrorOut(BaseModel):
    detail: str
    #: validation errors only: the individual problems (FastAPI's list, reduced to type/loc/msg).
    errors: list[dict] | None = None


class WorkerOut(BaseModel):
    """One worker process of the service, as it last published itself."""

    worker: int = Field(description="the worker's number, 0 to AOQ_WORKERS - 1 (a replacement keeps the number)")
    pid: int
    status: Literal["ok", "degraded"]
    models: list[str] = Field(description="names of the models this worker serves")
    disabled: dict[str, str] = Field(default_factory=dict, description="disabled model -> reason, in this worker")
    faults: dict[str, str] = Field(default_factory=dict, description="endpoints this worker disabled while serving")
    generation: int | None = Field(None, description="index generation this worker serves")


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"] = Field(
        description='"degraded" when a model or an endpoint is disabled, or no model can be served')
    models: list[str] = Field(description="names of the served (enabled) models")
    disabled: dict[str, str] = Field(description="disabled model -> reason")
    faults: dict[str, str] = Field(default_factory=dict, description="endpoint (or the catalogue) disabled while "
                                                                     "serving -> reason; POST /admin/reload checks again")
    version: str
    generation: int | None = Field(None, description="index generation being served (index.json)")
    workers: list[WorkerOut] = Field(default_factory=list, description="every worker process of the service (one "
                                     "when it runs one process); the fields above are the answering worker's")
    worker: int = Field(0, description="the number of the worker that answered (0 when the service runs one process)")


class Measured(BaseModel):
    """Where a figure comes from: which split, how many images, which protocol and positives rule,
    which training seeds (one served checkpoint is one seed)."""

    split: str
    n_images: int | None = None
    protocol: str | None = Field(None, description="full, 1k5fold or 5k; None where each table names its own")
    positives: PositiveRule = Field("pair", description="pair: a caption matches its own image; text: every image "
                                                        "with a caption of the same normalised text (docs/evaluation.md)")
    seeds: list[int] = Field(default_factory=list)


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
    metrics_measured: Measured | None = Field(None, description="where ``metrics`` come from")
    evaluated: Measured | None = Field(None, description="the evaluation split of /metrics, the failure cases "
                                                         "and the ground-truth ranks of searches")
    shortlist_by: str | None = Field(None, description="a re-ranker (a cross-attention model): the embedding model "
                                                       "whose FAISS shortlist it re-scores; null for other models")
    shortlist_n: int | None = Field(None, description="a re-ranker: how many of that model's items each query's "
                                                      "shortlist holds (searches ask for k <= shortlist_n)")


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
    name: str | None = Field(None, description="its first caption (the emoji set: the CLDR short name)")


class ExamplesOut(BaseModel):
    dataset: str
    split: str
    captions: list[ExampleCaption]
    images: list[ExampleImage]


class SearchTextIn(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    model: str = Field(min_length=1, max_length=200)
    k: int = Field(10, ge=1, le=MAX_K)
    scope: Scope = Field("all", description=SCOPE_HELP)
    normalise: Normalisation = Field("none", description=NORMALISE_HELP)
    intended: IntendedAnswer = None

    _query = field_validator("query")(_not_blank)


class GalleryImage(BaseModel):
    image_id: int
    name: str = Field(description="its first caption (the emoji set: the CLDR short name)")
    split: str
    image_url: str
    thumbnail_url: str


class ImageHit(GalleryImage):
    rank: int = Field(description="1-based, in the searched scope")
    score: float
    is_ground_truth: bool


class RerankContext(BaseModel):
    """How a re-ranker answered: a cross-attention model re-scored another model's shortlist."""

    kind: str = Field(description="the cross-attention model's kind: scan or bfan")
    shortlist_by: str = Field(description="the embedding model whose FAISS top shortlist_n it re-scored")
    shortlist_n: int


class SearchContext(BaseModel):
    """What a search covered and how its ground truth is judged."""

    scope: Scope
    searched: int = Field(description="items ranked (images for text queries, captions for image queries)")
    eval_split: str = Field(description="the split of ground_truth_rank, the metrics and the failure cases")
    positives: PositiveRule = Field(description="the model's evaluation rule for correct answers")
    normalise: Normalisation = Field("none", description="the hubness correction the list was ranked by")
    normalised: bool = Field(False, description="whether this query's scores were normalised (qbnorm keeps the raw "
                                                "order of a query whose top-1 is no bank query's top-1)")
    rerank: RerankContext | None = Field(None, description="set when the model is a re-ranker")


class SearchTextOut(BaseModel):
    model: str
    query: str
    caption_id: int | None = Field(description="set when the query's normalised text is a caption of the gallery "
                                               "(one of the evaluation split when there is one)")
    query_split: str | None = Field(None, description="the split of that caption")
    intended: str | None = Field(None, description="the request's intended answer, when it named one: the ground "
                                                   "truth is that caption's, and caption_id is its id (None when "
                                                   "the gallery has no such caption)")
    context: SearchContext
    ground_truth_ids: list[int] = Field(description="the correct images in the searched scope, by the positives rule")
    ground_truth: list[GalleryImage] = Field(default_factory=list, description="the first of them, named")
    scope_rank: float | None = Field(None, description="1-based rank of the best correct image in the searched "
                                                       "scope, as the results list counts (expected rank on ties)")
    ground_truth_rank: float | None = Field(description="1-based rank of the ground truth among the evaluation "
                                                        "split's images, as evaluated (expected rank when scores "
                                                        "tie; docs/evaluation.md); None when the query is not a "
                                                        "caption of the evaluation split")
    results: list[ImageHit]
    outside: ImageHit | None = Field(None, description="scope test: the best image outside the evaluation split "
                                                       "when it would be among the top k of the whole catalogue")
    latency_ms: float


class CaptionHit(BaseModel):
    rank: int = Field(description="1-based, in the searched scope; with the text rule a row stands for every "
                                  "caption of its text, so the next row's rank is this one's plus its copies")
    caption_id: int = Field(description="the best-scoring caption of the row")
    text: str
    copies: int = Field(1, description="captions of this text in the searched scope (the text rule lists a text once)")
    image_id: int
    image_name: str = Field("", description="the name of the caption's image")
    split: str = Field("", description="the split of the caption")
    thumbnail_url: str = Field("", description="the caption's image")
    score: float
    is_ground_truth: bool


class SearchImageOut(BaseModel):
    model: str
    image_id: int | None
    query: GalleryImage | None = Field(None, description="the query image, when it is a gallery image")
    context: SearchContext
    ground_truth_ids: list[int] = Field(description="the correct captions in the searched scope")
    ground_truth_texts: list[str] = Field(default_factory=list, description="the query image's own caption texts")
    scope_rank: float | None = None
    ground_truth_rank: float | None = Field(description="rank among the evaluation split's captions, as evaluated; "
                                                        "None unless the query is an image of that split")
    results: list[CaptionHit]
    outside: CaptionHit | None = None
    latency_ms: float


class CompareTextIn(BaseModel):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    models: list[str] | None = Field(
        None, min_length=2, max_length=2, description="[left, right]; default the baseline-role and aoq-role models"
    )
    k: int = Field(10, ge=1, le=MAX_K)
    scope: Scope = Field("all", description=SCOPE_HELP)
    normalise: Normalisation = Field("none", description=NORMALISE_HELP)
    intended: IntendedAnswer = None

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


class GalleryPageOut(BaseModel):
    dataset: str
    scope: Scope
    query: str = Field(description="the filter: images one of whose captions contains it (case folded)")
    total: int = Field(description="images matching the filter in the scope")
    offset: int
    images: list[GalleryImage]


class FailureItem(BaseModel):
    query_id: int = Field(description="caption id (t2i) or image id (i2t)")
    query_text: str | None = None
    image_url: str | None = None
    thumbnail_url: str | None = None
    image_id: int | None = Field(None, description="t2i: the ground-truth image; i2t: the query image")
    image_name: str | None = Field(None, description="the name of that image")
    left_rank: float
    right_rank: float
    copies: int = Field(1, description="queries this case stands for (t2i: captions of the same text with the same "
                                       "two ranks, such as both vendors' names of one emoji)")


class FailuresOut(BaseModel):
    direction: Literal["t2i", "i2t"]
    which: Literal["baseline_only", "aoq_only", "both"]
    left: str
    right: str
    total: int = Field(description="cases (a case stands for its copies)")
    queries: int | None = Field(None, description="queries the cases stand for")
    offset: int = 0
    measured: Measured | None = Field(None, description="the split and rule of the ranks")
    scope: Scope = Field("test", description="the search scope whose raw-score ranks these are (the evaluation "
                                             "split): open a case in it to see the same ranks")
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
    measured: Measured | None = Field(None, description="the split, rule and seed of the tables and histogram")
    curves_measured: Measured | None = Field(None, description="the split and rule of the training curves")
    tables: dict[str, ProtocolTable] = Field(description="protocol (full, 1k5fold, 5k) -> table, on the gallery split")
    curves: list[CurvePoint]
    rank_histogram: RankHistogram | None
    labels: LabelTable | None = Field(None, description="label-wise metrics, when the gallery has labels")


class NegativeItem(BaseModel):
    id: int
    text: str | None = Field(None, description="a caption's text, or an image's name")
    image_url: str | None = Field(None, description="an image, or a caption's image")
    rank: int | None = Field(None, description="offline: 1-based position in the mined list (before filtering)")
    score: float | None = Field(None, description="online: the model's score against the anchor")
    removed_by: FalseNegativeFilter | None = Field(
        None, description="offline, filtered lists: the false-negative filter that removed this candidate from the "
                          "lists round 2 samples from; null when it was kept")
    correct: bool = Field(
        False, description="*(added)* a correct match of the anchor under the text rule (`correct_rule`): it shares a "
                           "caption text with the anchor (an emoji's twin drawing, an identical caption), so it is "
                           "no negative at all; marked whether or not a filter removed it")


class NegativesOut(BaseModel):
    model: str
    kind: Literal["caption", "image"]
    id: int
    text: str | None = Field(None, description="the anchor caption's text, or the anchor image's name")
    image_url: str | None = Field(None, description="the anchor image, or the anchor caption's image")
    offline: list[NegativeItem]
    online: list[NegativeItem]
    filters: list[FalseNegativeFilter] = Field(
        default_factory=list, description="the false-negative filters of the mined lists, in the order they apply; "
                                          "empty when the lists were not filtered")
    correct_rule: Literal["text"] = Field(
        "text", description="*(added)* the rule `correct` follows: text identity, as the search pages tick answers")


class ReloadOut(BaseModel):
    generation: int | None
    models: list[str]
    disabled: dict[str, str]
    workers: list[WorkerOut] = Field(default_factory=list, description="every worker process after the reload")
