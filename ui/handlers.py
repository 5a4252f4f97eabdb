"""What each UI event does: call the backend, render the answer, turn failures into messages.

Each function takes the ``BackendClient`` and plain values and returns plain values (HTML strings,
choice lists, figures), so the whole behaviour of the page, error paths included, is tested with
a fake backend and no browser. ``aoq_ui.app`` only wires these to Gradio components.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from aoq_serve.schemas import (
    CompareImageOut,
    CompareTextOut,
    ExampleCaption,
    ExampleImage,
    FailureItem,
)
from aoq_ui import plots
from aoq_ui.client import BackendClient, BackendError
from aoq_ui.render import (
    failure_choices,
    model_label,
    pick_default_models,
    render_error,
    render_failures_summary,
    render_image_column,
    render_metrics_table,
    render_negatives,
    render_notice,
    render_query_image,
    render_query_text,
    render_status,
    render_text_column,
)

N_EXAMPLES = 12
N_TRAIN_PICKS = 10

Columns = tuple[str, str, str]  # (message or query, left column, right column)


@dataclass
class PageData:
    """What the page needs once at load time: models, defaults and example queries."""

    status_html: str
    model_choices: list[tuple[str, str]] = field(default_factory=list)
    all_models: list[str] = field(default_factory=list)
    left: str | None = None
    right: str | None = None
    example_captions: list[ExampleCaption] = field(default_factory=list)
    example_images: list[ExampleImage] = field(default_factory=list)
    train_picks: list[tuple[str, str]] = field(default_factory=list)


def load_page(client: BackendClient) -> PageData:
    """Health, models and examples; a backend that is down gives a page with just the message."""
    try:
        health = client.health()
        models = client.models()
    except BackendError as exc:
        return PageData(status_html=render_status(client.base_url, error=exc))
    left, right, warnings = pick_default_models(models)
    page = PageData(
        status_html="",
        model_choices=[(model_label(m), m.name) for m in models if m.enabled],
        all_models=[m.name for m in models if m.enabled],
        left=left,
        right=right,
    )
    try:
        test = client.examples("test", N_EXAMPLES)
        page.example_captions, page.example_images = test.captions, test.images
    except BackendError as exc:
        warnings.append(f"Could not load example queries: {exc}")
    # Training items exist in the catalogue only for models with mined negatives: without them
    # the negatives tab has nothing to show, and the rest of the page still works.
    try:
        train = client.examples("train", N_TRAIN_PICKS)
        page.train_picks = [(f"caption {c.id}: {c.text}", f"caption:{c.id}") for c in train.captions]
        page.train_picks += [(f"image {i.id}", f"image:{i.id}") for i in train.images]
    except BackendError as exc:
        warnings.append(f"Could not load training examples for the negatives tab: {exc}")
    page.status_html = render_status(client.base_url, health, models, warnings=warnings)
    return page


def _check_models(left: str | None, right: str | None) -> str | None:
    if not left or not right:
        return "Pick a model for each column (the search service lists none, or none is selected)."
    return None


def _column_title(side: str, model: str) -> str:
    return f"{side}: {model}"


def _text_columns(client: BackendClient, answer: CompareTextOut) -> tuple[str, str]:
    return (render_text_column(answer.left, _column_title("Left", answer.left.model), client.public_url),
            render_text_column(answer.right, _column_title("Right", answer.right.model), client.public_url))


def _image_columns(answer: CompareImageOut) -> tuple[str, str]:
    return (render_image_column(answer.left, _column_title("Left", answer.left.model)),
            render_image_column(answer.right, _column_title("Right", answer.right.model)))


def search_text(client: BackendClient, query: str, left: str | None, right: str | None, k: int) -> Columns:
    """Text -> image for both models: (query line or error, left column, right column)."""
    query = (query or "").strip()
    if not query:
        return render_notice("Type a query or pick an example."), "", ""
    if problem := _check_models(left, right):
        return render_error(problem), "", ""
    try:
        answer = client.compare_text(query, [left, right], int(k))  # type: ignore[list-item]
    except BackendError as exc:
        return render_error(exc), "", ""
    return (render_query_text(answer.query), *_text_columns(client, answer))


def search_image(
    client: BackendClient,
    left: str | None,
    right: str | None,
    k: int,
    *,
    image: ExampleImage | None = None,
    upload: str | Path | None = None,
) -> Columns:
    """Image -> text for both models, from a gallery image or an uploaded file."""
    if image is None and upload is None:
        return render_notice("Click a test image or upload one."), "", ""
    if problem := _check_models(left, right):
        return render_error(problem), "", ""
    try:
        if image is not None:
            answer = client.compare_image(image_id=image.id, models=[left, right], k=int(k))  # type: ignore[list-item]
            query = render_query_image(client.public_url, image.image_url, f"test image {image.id}")
        else:
            answer = client.compare_image(file=upload, models=[left, right], k=int(k))  # type: ignore[list-item]
            query = render_notice(f"Query: uploaded image {Path(upload).name}")  # type: ignore[arg-type]
    except BackendError as exc:
        return render_error(exc), "", ""
    return (query, *_image_columns(answer))


def list_failures(
    client: BackendClient, direction: str, which: str, limit: int, left: str | None, right: str | None
) -> tuple[str, list[tuple[str, int]], dict[int, FailureItem]]:
    """(summary or error, dropdown choices, items by query id) for the failure-cases tab."""
    if problem := _check_models(left, right):
        return render_error(problem), [], {}
    try:
        failures = client.failures(direction, which, int(limit), [left, right])  # type: ignore[arg-type, list-item]
    except BackendError as exc:
        return render_error(exc), [], {}
    return render_failures_summary(failures), failure_choices(failures), {i.query_id: i for i in failures.items}


def show_failure(
    client: BackendClient,
    direction: str,
    item: FailureItem | None,
    left: str | None,
    right: str | None,
    k: int,
) -> Columns:
    """One failure case in the side-by-side view, queried again so both full rankings show."""
    if item is None:
        return render_notice("Pick a case from the list."), "", ""
    if direction == "t2i":
        if not item.query_text:
            return render_error(f"The failure list gave no text for caption {item.query_id}."), "", ""
        return search_text(client, item.query_text, left, right, k)
    url = item.image_url or f"/images/{item.query_id}"
    image = ExampleImage(id=item.query_id, image_url=url, thumbnail_url=url)
    return search_image(client, left, right, k, image=image)


def parse_train_pick(pick: str | None) -> tuple[str, int] | None:
    """``"caption:12"`` -> ``("caption", 12)``; anything else -> None."""
    if not pick or ":" not in pick:
        return None
    kind, _, number = pick.partition(":")
    if kind not in ("caption", "image") or not number.isdigit():
        return None
    return kind, int(number)


def show_negatives(
    client: BackendClient, kind: str, item_id: float | None, model: str | None, n: int, seed: float | None = None
) -> Columns:
    """(anchor or error, offline negatives, online negatives) of a training item (paper Fig. 3)."""
    if item_id is None or int(item_id) < 0:
        return render_notice("Enter a training caption or image id, or pick one from the list."), "", ""
    if not model:
        return render_error("Pick the model whose mined negatives to show."), "", ""
    try:
        answer = client.negatives(kind, int(item_id), model, int(n), None if seed is None else int(seed))
    except BackendError as exc:
        return render_error(exc), "", ""
    return render_negatives(answer, client.public_url)


def show_metrics(client: BackendClient, models: Sequence[str]) -> tuple[str, Figure | None, Figure | None]:
    """(R@K table or error, R@1 curves, rank histogram) of the chosen models."""
    if not models:
        return render_notice("Tick at least one model."), None, None
    try:
        all_metrics = [client.metrics(name) for name in models]
    except BackendError as exc:
        return render_error(exc), None, None
    return (render_metrics_table(all_metrics), plots.recall_curves_figure(all_metrics),
            plots.rank_histogram_figure(all_metrics))


__all__ = [
    "Columns",
    "PageData",
    "list_failures",
    "load_page",
    "parse_train_pick",
    "search_image",
    "search_text",
    "show_failure",
    "show_metrics",
    "show_negatives",
]
