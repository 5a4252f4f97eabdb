"""What each UI event does: call the backend, render the answer, turn failures into messages.

Each function takes the ``BackendClient`` and plain values and returns plain values (HTML strings,
choice lists, figures), so the whole behaviour of the page, error paths included, is tested with
a fake backend and no browser. ``aoq_ui.app`` only wires these to Gradio components.

A failed query never leaves old results on screen: its message takes the query line and both
columns are emptied.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from matplotlib.figure import Figure

from aoq_serve.schemas import ExampleCaption, FailuresOut, GalleryImage, ModelOut
from aoq_ui import plots
from aoq_ui.client import UPLOAD_TYPES, BackendClient, BackendError
from aoq_ui.export import download_link
from aoq_ui.render import (
    SCOPE_LABELS,
    column_title,
    format_rank,
    model_label,
    pick_default_models,
    render_error,
    render_image_column,
    render_image_query,
    render_notice,
    render_status,
    render_text_column,
    render_text_query,
)
from aoq_ui.render_analysis import failure_choices, render_failures, render_metrics_table, render_negatives, \
    render_seed_note, render_selection
from aoq_ui.seeds import SeedSummary
from aoq_ui.state import View, view_query

N_EXAMPLES = 12
N_TRAIN_PICKS = 10
#: pictures per page of the gallery browser.
GALLERY_PAGE = 24
#: uploads up to this size are shown back in the query line (as a data: URL).
PREVIEW_BYTES = 2 * 1024 * 1024

Columns = tuple[str, str, str]  # (query line or message, left column, right column)
#: the query a view shows, to run it again when k, the scope, the hubness correction or a model
#: changes: {"text": ..., "intended": ...},
#: {"image_id": ..., "image_url": ...} or {"upload": path}; empty when there is none. A failure
#: case also fixes the scope and hubness correction it was evaluated in ("scope", "normalise") and
#: says so ("note").
LastQuery = dict


@dataclass
class PageData:
    """What the page needs once at load time: models, defaults, the catalogue and examples."""

    status_html: str
    models: list[ModelOut] = field(default_factory=list)
    model_choices: list[tuple[str, str]] = field(default_factory=list)
    all_models: list[str] = field(default_factory=list)
    left: str | None = None
    right: str | None = None
    example_captions: list[ExampleCaption] = field(default_factory=list)
    train_picks: list[tuple[str, str]] = field(default_factory=list)


def load_page(client: BackendClient) -> PageData:
    """Health, models, datasets and examples; a backend that is down gives a page with just the message."""
    try:
        health = client.health()
        models = client.models()
        datasets = client.datasets()
    except BackendError as exc:
        return PageData(status_html=render_status(client.base_url, error=exc))
    left, right, warnings = pick_default_models(models)
    page = PageData(
        status_html="",
        models=models,
        model_choices=[(model_label(m), m.name) for m in models if m.enabled],
        all_models=[m.name for m in models if m.enabled],
        left=left,
        right=right,
    )
    try:
        test = client.examples("test", N_EXAMPLES)
        # twins (both vendors' drawings) share their first caption: offer each text once
        first: dict[str, ExampleCaption] = {}
        for caption in test.captions:
            first.setdefault(caption.text.lower(), caption)
        page.example_captions = list(first.values())
    except BackendError as exc:
        warnings.append(f"Could not load example queries: {exc}")
    # Training items exist in the catalogue only for models with mined negatives: without them
    # the negatives tab has nothing to show, and the rest of the page still works.
    try:
        train = client.examples("train", N_TRAIN_PICKS)
        page.train_picks = [(f"caption {c.id}: {c.text}", f"caption:{c.id}") for c in train.captions]
        page.train_picks += [(f"image {i.id}: {i.name or ''}", f"image:{i.id}") for i in train.images]
    except BackendError as exc:
        warnings.append(f"Could not load training examples for the negatives tab: {exc}")
    page.status_html = render_status(client.base_url, health, models, warnings=warnings, datasets=datasets)
    return page


def _check_models(left: str | None, right: str | None) -> str | None:
    if not left or not right:
        return "Pick a model for each column (the search service lists none, or none is selected)."
    return None


def _links(view: View, answer) -> str:
    return (f'<div class="aoq-links"><a class="aoq-share" href="{escape(view_query(view))}">link to this view</a>'
            f"{download_link(answer)}</div>")


def search_text(client: BackendClient, query: str, left: str | None, right: str | None, k: int,
                scope: str = "all", normalise: str = "none", intended: str | None = None) -> Columns:
    """Text -> image for both models, ranked under the hubness correction ``normalise``, judged by
    the ``intended`` caption when given (a showcased example's): (query line or error, left
    column, right column)."""
    query = (query or "").strip()
    if not query:
        return render_notice("Type a query or pick an example."), "", ""
    if problem := _check_models(left, right):
        return render_error(problem), "", ""
    try:
        answer = client.compare_text(query, [left, right], int(k), scope, normalise, intended)  # type: ignore[list-item]
    except BackendError as exc:
        return render_error(exc), "", ""
    view = View(tab="t2i", query=query, left=left, right=right, k=int(k), scope=scope, normalise=normalise)
    return (render_text_query(answer.left, answer.right, _links(view, answer)),
            render_text_column(answer.left, column_title("Left", answer.left), answer.right, view),
            render_text_column(answer.right, column_title("Right", answer.right), answer.left, view))


def _preview(path: Path) -> str:
    """The upload as a data: URL the query line can show (empty when too large to inline)."""
    mime = UPLOAD_TYPES.get(path.suffix.lower())
    try:
        size = path.stat().st_size
    except OSError:
        return ""
    if mime is None or size > PREVIEW_BYTES:
        return ""
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def search_image(
    client: BackendClient,
    left: str | None,
    right: str | None,
    k: int,
    scope: str = "all",
    normalise: str = "none",
    *,
    image_id: int | None = None,
    image_url: str = "",
    upload: str | Path | None = None,
) -> Columns:
    """Image -> text for both models, from a gallery image (its id and URL) or an uploaded file,
    ranked under the hubness correction ``normalise``."""
    if image_id is None and upload is None:
        return render_notice("Click a picture of the gallery or upload one."), "", ""
    if problem := _check_models(left, right):
        return render_error(problem), "", ""
    try:
        if image_id is not None:
            answer = client.compare_image(image_id=image_id, models=[left, right], k=int(k), scope=scope,  # type: ignore[list-item]
                                          normalise=normalise)
            label, url = f"picture {image_id}", image_url
            links = _links(View(tab="i2t", image=image_id, left=left, right=right, k=int(k), scope=scope,
                                normalise=normalise), answer)
        else:
            path = Path(upload)  # type: ignore[arg-type]
            answer = client.compare_image(file=path, models=[left, right], k=int(k), scope=scope,  # type: ignore[list-item]
                                          normalise=normalise)
            label, url = f"uploaded picture {path.name}", _preview(path)
            links = f'<div class="aoq-links">{download_link(answer)}</div>'
    except BackendError as exc:
        return render_error(exc), "", ""
    settings = View(tab="i2t", left=left, right=right, k=int(k), scope=scope, normalise=normalise)
    return (render_image_query(answer.left, answer.right, label, url, links),
            render_image_column(answer.left, column_title("Left", answer.left), answer.right, settings),
            render_image_column(answer.right, column_title("Right", answer.right), answer.left, settings))


def run_last(client: BackendClient, last: LastQuery | None, left: str | None, right: str | None, k: int,
             scope: str, normalise: str = "none") -> Columns | None:
    """A view's query (again, when k, the scope, the hubness correction or a model changed); None
    when it has none."""
    if not last:
        return None
    scope, normalise = last.get("scope", scope), last.get("normalise", normalise)
    if "text" in last:
        columns = search_text(client, last["text"], left, right, k, scope, normalise, last.get("intended"))
    elif "image_id" in last:
        columns = search_image(client, left, right, k, scope, normalise, image_id=last["image_id"],
                               image_url=last["image_url"])
    else:
        columns = search_image(client, left, right, k, scope, normalise, upload=last["upload"])
    if last.get("note"):
        columns = (render_notice(last["note"]) + columns[0], *columns[1:])
    return columns


def gallery_page(client: BackendClient, scope: str, query: str, page: int
                 ) -> tuple[list[GalleryImage], int, str]:
    """(pictures, the page actually shown, a line saying which of how many) of the gallery browser."""
    page = max(0, int(page))
    try:
        found = client.gallery(scope, query or "", page * GALLERY_PAGE, GALLERY_PAGE)
        if not found.images and page > 0:  # past the end (the filter shrank the list): its last page
            page = max(0, (found.total - 1) // GALLERY_PAGE)
            found = client.gallery(scope, query or "", page * GALLERY_PAGE, GALLERY_PAGE)
    except BackendError as exc:
        return [], 0, render_error(exc)
    where = "whole catalogue" if scope == "all" else "test split"
    matching = f" matching \u201c{escape(query)}\u201d" if query else ""
    if not found.images:
        return [], page, render_notice(f"No picture of the {where}{matching}.")
    first = found.offset + 1
    line = (f'<div class="aoq-meta">Pictures {first:,}\u2013{found.offset + len(found.images):,} of '
            f"{found.total:,} in the {where}{matching} (page {page + 1} of {(found.total - 1) // GALLERY_PAGE + 1}); "
            f"click one to search with it.</div>")
    return found.images, page, line


def list_failures(
    client: BackendClient, direction: str, which: str, per_page: int, page: int, left: str | None,
    right: str | None,
) -> tuple[str, list[tuple[str, int]], FailuresOut | None, int]:
    """(the page's table or an error, dropdown choices, the listed page or None, the page shown)."""
    if problem := _check_models(left, right):
        return render_error(problem), [], None, 0
    page = max(0, int(page))
    try:
        failures = client.failures(direction, which, int(per_page), [left, right], page * int(per_page))  # type: ignore[list-item]
        if not failures.items and page > 0:
            page = max(0, (failures.total - 1) // int(per_page))
            failures = client.failures(direction, which, int(per_page), [left, right], page * int(per_page))  # type: ignore[list-item]
    except BackendError as exc:
        return render_error(exc), [], None, 0
    return render_failures(failures), failure_choices(failures), failures, page


def failure_query(failures: FailuresOut | None, query_id: int | None) -> LastQuery:
    """The query of a listed failure case, to show it in the side-by-side view in the scope and
    with the raw scores its listed ranks were evaluated in (so the columns show the same ranks)."""
    item = next((i for i in failures.items if i.query_id == query_id), None) if failures else None
    if item is None or failures is None:
        return {}
    if failures.direction == "t2i":
        if not item.query_text:
            return {}
        query: LastQuery = {"text": item.query_text}
    else:
        query = {"image_id": item.query_id, "image_url": item.image_url or ""}
    note = (f"Opened as evaluated: {SCOPE_LABELS[failures.scope]}, raw scores (no hubness correction); the list "
            f"gave {failures.left} rank {format_rank(item.left_rank)}, {failures.right} rank "
            f"{format_rank(item.right_rank)}. The scope and correction above do not apply to this view.")
    return {**query, "scope": failures.scope, "normalise": "none", "note": note}


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
    return render_negatives(answer)


def show_metrics(client: BackendClient, names: Sequence[str], models: Sequence[ModelOut] = (),
                 seeds: SeedSummary | None = None) -> tuple[str, Figure | None, Figure | None]:
    """(R@K table or error, R@1 curves, rank histogram) of the chosen models, each labelled, the
    served seed beside the multi-seed result ``seeds`` when given."""
    if not names:
        return render_notice("Tick at least one model."), None, None
    try:
        all_metrics = [client.metrics(name) for name in names]
    except BackendError as exc:
        return render_error(exc), None, None
    return (render_seed_note(seeds, all_metrics, models) + render_metrics_table(all_metrics)
            + render_selection(models, names),
            plots.recall_curves_figure(all_metrics), plots.rank_histogram_figure(all_metrics))


def plot_notes(models: Sequence[ModelOut]) -> tuple[str, str]:
    """One sentence under each plot saying what it shows."""
    evaluated = next((m.evaluated for m in models if m.evaluated), None)
    split = evaluated.split if evaluated else "evaluation"
    curves = ("R@1 after each training epoch on the dev split, which picks the checkpoint: the baseline is "
              "round 1, AOQ round 2, trained from scratch on the negatives mined with the baseline, so each "
              "model's epochs count from 1.")
    histogram = (f"For every caption of the {split} split and its own picture, the worse of two ranks, the "
                 "picture's for the caption and the caption's for the picture, on the caption scale (the AOQ "
                 "supplement's cross-retrieval rank, by the pair rule, so a twin picture counts against it): "
                 "more pairs in the left bars is better.")
    return curves, histogram
