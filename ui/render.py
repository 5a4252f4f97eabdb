"""Pure functions that turn the backend's answers into the HTML the page shows.

No Gradio and no HTTP here, so every string the user sees can be tested without a browser.
All text that comes from the backend or the user is HTML-escaped. Image URLs in answers may be
relative to the backend (``/images/3``); they are made absolute against ``public_url``, the
backend URL as the browser reaches it, because the browser fetches the images itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from urllib.parse import urljoin

from aoq_serve.schemas import (
    FailuresOut,
    HealthOut,
    MetricsOut,
    ModelOut,
    NegativeItem,
    NegativesOut,
    SearchImageOut,
    SearchTextOut,
)
from aoq_ui.client import BackendError, BackendUnavailable

TICK = "\u2714"  # heavy check mark, as the paper ticks correct items
GT_THUMB_PX = 96

WHICH_LABELS = {
    "baseline_only": "left (baseline) wrong at rank 1, right (AOQ) right",
    "aoq_only": "right (AOQ) wrong at rank 1, left (baseline) right",
    "both": "both wrong at rank 1",
}
DIRECTION_LABELS = {"t2i": "text \u2192 image", "i2t": "image \u2192 text"}

CSS = """
.aoq-col h4 { margin: 0 0 .3em 0; }
.aoq-meta { font-size: .9em; opacity: .85; margin-bottom: .5em; }
.aoq-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(100px, 1fr)); gap: .5em; }
.aoq-card { border: 3px solid transparent; border-radius: 6px; padding: 2px; text-align: center; }
.aoq-card img { width: 100%; height: auto; image-rendering: pixelated; border-radius: 4px; }
.aoq-card.aoq-gt, li.aoq-gt { border-color: #2e9d4f; background: rgba(46,157,79,.12); }
.aoq-caption { font-size: .85em; }
.aoq-tick { color: #2e9d4f; font-weight: bold; }
.aoq-list { padding-left: 0; list-style: none; margin: 0; }
.aoq-list li { border: 2px solid transparent; border-radius: 6px; padding: .25em .4em; margin: .15em 0; }
.aoq-rank { font-variant-numeric: tabular-nums; opacity: .8; }
.aoq-error { border: 1px solid #c0392b; background: rgba(192,57,43,.1); color: inherit;
             padding: .6em .8em; border-radius: 6px; }
.aoq-notice { border: 1px solid #888; padding: .6em .8em; border-radius: 6px; }
.aoq-query img { max-width: 192px; image-rendering: pixelated; border-radius: 4px; }
.aoq-meta img.aoq-gtthumb { display: inline-block; width: 40px; height: 40px; margin: 0 .2em;
                           vertical-align: middle; image-rendering: pixelated; border: 2px solid #2e9d4f; }
.aoq-table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
.aoq-table th, .aoq-table td { border: 1px solid #8884; padding: .2em .5em; text-align: right; }
.aoq-table th:first-child, .aoq-table td:first-child { text-align: left; }
"""


def media_url(public_url: str, url: str) -> str:
    """``url`` from an answer, absolute for the browser (relative ones are joined to ``public_url``)."""
    return urljoin(public_url.rstrip("/") + "/", url)


def render_error(error: BackendError | str) -> str:
    """The red box shown instead of results; the message names what went wrong and what to do."""
    if isinstance(error, BackendUnavailable):
        title = "Search service unavailable"
    elif isinstance(error, BackendError) and error.status is not None and error.status < 500:
        title = "Rejected by the search service"
    else:
        title = "Error"
    return f'<div class="aoq-error" role="alert"><b>{title}:</b> {escape(str(error))}</div>'


def render_notice(message: str) -> str:
    return f'<div class="aoq-notice">{escape(message)}</div>'


def pick_default_models(models: Sequence[ModelOut]) -> tuple[str | None, str | None, list[str]]:
    """Default (left, right) model names: the enabled models with role baseline and aoq.

    A missing role falls back to another enabled model (a single model is compared with itself)
    and adds a warning naming what is missing; no enabled model gives ``(None, None, [...])``.
    """
    enabled = [m for m in models if m.enabled]
    if not enabled:
        return None, None, ["The search service has no enabled model: build indexes with `aoq index`."]
    warnings = []
    picks: list[str] = []
    for role in ("baseline", "aoq"):
        match = next((m.name for m in enabled if m.role == role), None)
        if match is None:
            spare = [m.name for m in enabled if m.name not in picks] or [enabled[0].name]
            match = spare[0]
            warnings.append(f"No enabled model has role '{role}'; showing '{match}' in its place.")
        picks.append(match)
    return picks[0], picks[1], warnings


def model_label(model: ModelOut) -> str:
    """Dropdown label: name, role, loss and encoder (what differs between the two columns)."""
    bits = [b for b in (model.role, model.loss, model.image_encoder) if b]
    return f"{model.name} ({', '.join(bits)})" if bits else model.name


def render_status(
    backend_url: str,
    health: HealthOut | None = None,
    models: Sequence[ModelOut] = (),
    error: BackendError | None = None,
    warnings: Iterable[str] = (),
) -> str:
    """The line at the top of the page: where the backend is and which models it serves."""
    if error is not None:
        return render_error(error)
    parts = [f"Search service <code>{escape(backend_url)}</code>"]
    if health is not None:
        parts.append(f"status {escape(health.status)}, version {escape(health.version or '?')}")
    if models:
        enabled = ", ".join(escape(m.name) for m in models if m.enabled) or "none"
        parts.append(f"models: {enabled}")
    html = '<div class="aoq-meta">' + " \u00b7 ".join(parts) + "</div>"
    problems = [f"Model '{m.name}' is disabled: {m.disabled_reason or 'no reason given'}" for m in models
                if not m.enabled]
    if health is not None:
        known = {m.name for m in models}
        problems += [f"Model '{n}' is disabled: {r}" for n, r in health.disabled.items() if n not in known]
    problems += list(warnings)
    return html + "".join(render_error(p) for p in problems)


def _score(value: float) -> str:
    return f"{value:.3f}"


def format_rank(rank: float) -> str:
    """A 1-based rank as the page shows it: whole ranks as integers, an expected rank of tied
    scores with one decimal (docs/evaluation.md, Ties)."""
    return f"{rank:.0f}" if float(rank).is_integer() else f"{rank:.1f}"


def _gt_line(public_url: str, rank: float | None, gt_ids: Sequence[int], results_gt: bool, what: str) -> str:
    if rank is None:
        if not gt_ids:
            return "no ground truth (free query)"
        return f"ground-truth {what} not ranked"
    line = f"ground-truth {what} at rank <b>{format_rank(rank)}</b>"
    if what == "image" and not results_gt:
        # The ground truth fell outside the top k: show it so the miss can be judged by eye.
        thumbs = "".join(
            f' <img class="aoq-gtthumb" alt="ground truth {i}" '
            f'src="{escape(media_url(public_url, f"/images/{i}?size={GT_THUMB_PX}"))}">'
            for i in gt_ids[:3]
        )
        line += thumbs
    return line


def _header(title: str, meta: str, latency_ms: float | None) -> str:
    latency = f"{latency_ms:.1f} ms \u00b7 " if latency_ms is not None else ""
    return f"<h4>{escape(title)}</h4><div class=\"aoq-meta\">{latency}{meta}</div>"


def _tick(is_ground_truth: bool) -> str:
    return f' <span class="aoq-tick" title="ground truth">{TICK}</span>' if is_ground_truth else ""


def render_text_column(answer: SearchTextOut, title: str, public_url: str) -> str:
    """One model's top-k images for a text query: rank, score, a tick on ground-truth images."""
    any_gt = any(hit.is_ground_truth for hit in answer.results)
    meta = _gt_line(public_url, answer.ground_truth_rank, answer.ground_truth_ids, any_gt, "image")
    cards = []
    for hit in answer.results:
        gt = " aoq-gt" if hit.is_ground_truth else ""
        tick = _tick(hit.is_ground_truth)
        cards.append(
            f'<div class="aoq-card{gt}" data-image-id="{hit.image_id}">'
            f'<a href="{escape(media_url(public_url, hit.image_url))}" target="_blank">'
            f'<img src="{escape(media_url(public_url, hit.thumbnail_url))}" alt="image {hit.image_id}" '
            f'loading="eager"></a>'
            f'<div class="aoq-caption"><span class="aoq-rank">#{hit.rank}</span> '
            f"{_score(hit.score)}{tick}</div></div>"
        )
    body = '<div class="aoq-grid">' + "".join(cards) + "</div>" if cards else render_notice("No results.")
    return f'<div class="aoq-col">{_header(title, meta, answer.latency_ms)}{body}</div>'


def render_image_column(answer: SearchImageOut, title: str) -> str:
    """One model's top-k captions for an image query: rank, score, a tick on ground-truth captions."""
    any_gt = any(hit.is_ground_truth for hit in answer.results)
    meta = _gt_line("", answer.ground_truth_rank, answer.ground_truth_ids, any_gt, "caption")
    items = []
    for hit in answer.results:
        gt = ' class="aoq-gt"' if hit.is_ground_truth else ""
        tick = _tick(hit.is_ground_truth)
        items.append(
            f'<li{gt} data-caption-id="{hit.caption_id}"><span class="aoq-rank">#{hit.rank}</span> '
            f"{escape(hit.text)}{tick} <span class=\"aoq-rank\">({_score(hit.score)})</span></li>"
        )
    body = '<ol class="aoq-list">' + "".join(items) + "</ol>" if items else render_notice("No results.")
    return f'<div class="aoq-col">{_header(title, meta, answer.latency_ms)}{body}</div>'


def render_query_text(query: str) -> str:
    return f'<div class="aoq-query">Query: <q>{escape(query)}</q></div>'


def render_query_image(public_url: str, url: str, label: str) -> str:
    return (f'<div class="aoq-query">Query: {escape(label)}<br>'
            f'<img src="{escape(media_url(public_url, url))}" alt="{escape(label)}"></div>')


def failure_choices(failures: FailuresOut) -> list[tuple[str, int]]:
    """Dropdown entries (label, query id) for the listed failure cases."""
    choices = []
    for item in failures.items:
        what = item.query_text if failures.direction == "t2i" else f"image {item.query_id}"
        what = what or f"query {item.query_id}"
        short = what if len(what) <= 70 else what[:67] + "..."
        choices.append((f"{short}  [{failures.left}: rank {format_rank(item.left_rank)}, "
                        f"{failures.right}: rank {format_rank(item.right_rank)}]", item.query_id))
    return choices


def render_failures_summary(failures: FailuresOut) -> str:
    """How many cases of the asked kind exist, and how many are listed."""
    kind = WHICH_LABELS.get(failures.which, failures.which)
    direction = DIRECTION_LABELS.get(failures.direction, failures.direction)
    return (f'<div class="aoq-meta">{direction}, {escape(kind)} (left = {escape(failures.left)}, '
            f"right = {escape(failures.right)}): <b>{failures.total}</b> case(s) in the test split, "
            f"{len(failures.items)} listed. Pick one to see both rankings.</div>")


def _negative_item(public_url: str, item: NegativeItem, kind: str) -> str:
    if item.rank is not None:
        badge = f"#{item.rank}"
    elif item.score is not None:
        badge = _score(item.score)
    else:
        badge = ""
    badge_html = f'<span class="aoq-rank">{badge}</span> ' if badge else ""
    if kind == "image" or item.image_url:
        url = item.image_url or f"/images/{item.id}"
        return (f'<div class="aoq-card" data-id="{item.id}"><img src="{escape(media_url(public_url, url))}" '
                f'alt="image {item.id}"><div class="aoq-caption">{badge_html}id {item.id}</div></div>')
    return f'<li data-id="{item.id}">{badge_html}{escape(item.text or "")}</li>'


def _negative_block(public_url: str, title: str, items: Sequence[NegativeItem], kind: str) -> str:
    if not items:
        inner = render_notice("none")
    elif kind == "image":
        inner = '<div class="aoq-grid">' + "".join(_negative_item(public_url, i, kind) for i in items) + "</div>"
    else:
        inner = '<ol class="aoq-list">' + "".join(_negative_item(public_url, i, kind) for i in items) + "</ol>"
    return f'<div class="aoq-col"><h4>{escape(title)}</h4>{inner}</div>'


def render_negatives(answer: NegativesOut, public_url: str) -> tuple[str, str, str]:
    """(anchor, offline column, online column) for the offline-negatives tab (paper Fig. 3).

    A caption anchor has image negatives and an image anchor has caption negatives.
    """
    if answer.kind == "caption":
        anchor = f'<div class="aoq-query">Anchor caption {answer.id}: <q>{escape(answer.text or "")}</q></div>'
        negative_kind = "image"
    else:
        anchor = render_query_image(public_url, answer.image_url or f"/images/{answer.id}", f"anchor image {answer.id}")
        negative_kind = "caption"
    offline = _negative_block(public_url, "Offline hard negatives (mined from the whole training set; rank)",
                              answer.offline, negative_kind)
    online = _negative_block(public_url, "Online hard negatives (hardest in a random batch of 128; score)",
                             answer.online, negative_kind)
    return anchor, offline, online


_TABLE_COLUMNS = {"r1": "R@1", "r5": "R@5", "r10": "R@10", "medr": "medr", "meanr": "meanr"}


def render_metrics_table(all_metrics: Sequence[MetricsOut]) -> str:
    """The R@K table of every model under every protocol it was evaluated with."""
    head = "".join(f"<th>{d} {label}</th>" for d in ("i2t", "t2i") for label in _TABLE_COLUMNS.values())
    rows = []
    for metrics in all_metrics:
        if not metrics.tables:
            rows.append(f"<tr><td>{escape(metrics.model)}</td><td colspan=\"12\">not evaluated</td></tr>")
        for protocol, table in metrics.tables.items():
            cells = "".join(f"<td>{getattr(getattr(table, d), c):.1f}</td>"
                            for d in ("i2t", "t2i") for c in _TABLE_COLUMNS)
            rows.append(f"<tr><td>{escape(metrics.model)}</td><td>{escape(protocol)}</td>{cells}"
                        f"<td>{table.rsum:.1f}</td></tr>")
    table = (f'<table class="aoq-table"><tr><th>model</th><th>protocol</th>{head}<th>rsum</th></tr>'
             + "".join(rows) + "</table>")
    return table + render_label_table(all_metrics)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def render_label_table(all_metrics: Sequence[MetricsOut]) -> str:
    """mAP@R and NDCG@k of the models whose gallery has labels; empty when none has."""
    rows = [
        f"<tr><td>{escape(m.model)}</td><td>{m.labels.n_labels}</td>"
        + "".join(f"<td>{_percent(getattr(getattr(m.labels, d), c))}</td>"
                  for d in ("i2t", "t2i") for c in ("map_at_r", "ndcg"))
        + f"<td>{m.labels.k}</td></tr>"
        for m in all_metrics
        if m.labels is not None
    ]
    if not rows:
        return ""
    head = "".join(f"<th>{d} {c}</th>" for d in ("i2t", "t2i") for c in ("mAP@R", "NDCG@k"))
    return ('<p>Label-wise retrieval (relevance = shared labels, percent)</p>'
            f'<table class="aoq-table aoq-labels"><tr><th>model</th><th>labels</th>{head}<th>k</th></tr>'
            + "".join(rows) + "</table>")
