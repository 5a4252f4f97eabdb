"""Pure functions that turn the backend's answers into the HTML the page shows: the status line,
the two result columns and the query line above them.

No Gradio and no HTTP here, so every string the user sees can be tested without a browser.
All text that comes from the backend or the user is HTML-escaped. Image URLs are used as the
client rewrote them for the browser (``aoq_ui.client``). Every number says what it counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from html import escape

from aoq_serve.schemas import (
    DatasetOut,
    GalleryImage,
    HealthOut,
    Measured,
    ModelOut,
    SearchImageOut,
    SearchTextOut,
)
from aoq_ui.client import BackendError, BackendUnavailable
from aoq_ui.state import View, view_query

TICK = "\u2714"  # heavy check mark, as the paper ticks correct items
DOT = " \u00b7 "
#: how the status line lists a catalogue's splits (others follow by name).
SPLIT_ORDER = ("train", "dev", "val", "test")
SCOPE_LABELS = {"all": "whole catalogue (all splits)", "test": "test split only"}
RULES = {
    "pair": "a caption's own picture is its only correct answer (the published COCO / Flickr30K protocol)",
    "text": "identical caption texts are one answer: every picture with a caption of the query's text, "
            "such as the other vendor's drawing, is correct",
}

CSS = """
.aoq-col h4 { margin: 0 0 .3em 0; }
.aoq-meta { font-size: .9em; opacity: .85; margin-bottom: .5em; }
/* the Metrics tab's key message: one served seed beside the multi-seed result */
.aoq-seeds { border-left: 4px solid #2a6fb0; background: rgba(42,111,176,.08); padding: .5em .8em;
             margin: .3em 0 .8em 0; border-radius: 4px; }
.aoq-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(90px, 1fr)); gap: .5em; }
.aoq-card { border: 3px solid transparent; border-radius: 6px; padding: 2px; margin: 0; text-align: center; }
.aoq-card img { width: 100%; height: auto; border-radius: 4px; }
.aoq-card.aoq-gt, li.aoq-gt { border-color: #2e9d4f; background: rgba(46,157,79,.12); }
.aoq-caption { font-size: .85em; }
.aoq-name { display: block; font-size: .85em; line-height: 1.2; overflow-wrap: anywhere; }
.aoq-split { display: inline-block; font-size: .75em; padding: 0 .35em; border-radius: 4px;
             background: rgba(200,140,20,.2); border: 1px solid rgba(200,140,20,.6); }
.aoq-tick { color: #2e9d4f; font-weight: bold; }
.aoq-list { padding-left: 0; list-style: none; margin: 0; }
.aoq-list li { border: 2px solid transparent; border-radius: 6px; padding: .25em .4em; margin: .15em 0;
               display: flex; gap: .5em; align-items: center; }
.aoq-list li img { width: 40px; height: 40px; flex: none; border-radius: 4px; }
.aoq-rank { font-variant-numeric: tabular-nums; opacity: .8; }
.aoq-removed { opacity: .55; }
.aoq-removed .aoq-name, .aoq-removed .aoq-text { text-decoration: line-through; }
.aoq-why { font-size: .8em; color: #b03a2e; }
.aoq-error { border: 1px solid #c0392b; background: rgba(192,57,43,.1); color: inherit;
             padding: .6em .8em; border-radius: 6px; }
.aoq-notice { border: 1px solid #888; padding: .6em .8em; border-radius: 6px; margin: .3em 0; }
.aoq-query img.aoq-queryimg { max-width: 160px; border-radius: 4px; }
.aoq-truth { display: flex; flex-wrap: wrap; gap: .4em; align-items: flex-start; margin: .3em 0; }
.aoq-truth figure { margin: 0; width: 84px; text-align: center; border: 2px solid #2e9d4f; border-radius: 6px; }
.aoq-truth img { width: 64px; height: 64px; }
.aoq-links a { margin-right: 1em; }
.aoq-enlarge { display: block; font-size: .75em; cursor: zoom-in; opacity: .8; }
.aoq-one-drawing .aoq-twin { display: none; }
/* the switch is offered only while a column holds a twin: elsewhere it would change nothing (the
   bordered box Gradio wraps it in goes with it) */
body:not(:has(#t2i-left .aoq-twin, #t2i-right .aoq-twin)) .form:has(> #t2i-one-drawing) { display: none !important; }
.aoq-verdict { margin: .3em 0; padding: .3em .6em; border-left: 4px solid #2e9d4f; }
.aoq-only { display: inline-block; font-size: .75em; padding: 0 .35em; border-radius: 4px;
            background: rgba(60,110,200,.15); border: 1px solid rgba(60,110,200,.6); }
.aoq-table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
.aoq-table th, .aoq-table td { border: 1px solid #8884; padding: .2em .5em; text-align: right; }
.aoq-table th:first-child, .aoq-table td:first-child { text-align: left; }
.aoq-table td img { width: 48px; height: 48px; }
.aoq-failures td:nth-child(2), .aoq-failures th:nth-child(2) { text-align: left; }
.aoq-metrics td:nth-child(-n+3), .aoq-metrics th:nth-child(-n+3) { text-align: left; }
#i2t-gallery .caption-label { white-space: normal; overflow: visible; text-overflow: clip; max-width: 100%;
                              line-height: 1.15; }
#i2t-gallery .grid-wrap { overflow-x: hidden; }
"""


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
    """Dropdown label: name, role (unless the name says it), loss and encoder (what differs
    between the two columns); a re-ranker's, what it re-ranks."""
    if model.shortlist_by is not None:
        return f"{model.name} ({model.image_encoder.upper()}, re-ranking the top {model.shortlist_n} of {model.shortlist_by})"
    role = model.role if model.role != model.name else ""
    bits = [b for b in (role, model.loss, model.image_encoder) if b]
    return f"{model.name} ({', '.join(bits)})" if bits else model.name


def measured_label(measured: Measured | None) -> str:
    """Where a figure comes from, in words: split, size, protocol, rule and seeds."""
    if measured is None:
        return "origin not recorded (indexed by an older aoq index)"
    size = f" ({measured.n_images:,} images)" if measured.n_images else ""
    protocol = f", {measured.protocol} protocol" if measured.protocol else ""
    seeds = measured.seeds
    seed = f", seed {seeds[0]}" if len(seeds) == 1 else f", mean of seeds {', '.join(map(str, seeds))}" if seeds else ""
    return f"{measured.split} split{size}{protocol}, positives rule {measured.positives}{seed}"


def _catalogue(datasets: Sequence[DatasetOut], models: Sequence[ModelOut]) -> str:
    """What the galleries hold and where the ground truth comes from."""
    served = {m.dataset for m in models if m.enabled}
    lines = []
    for dataset in datasets:
        if dataset.name not in served:
            continue
        ordered = sorted(dataset.splits.items(), key=lambda s: (SPLIT_ORDER.index(s[0]) if s[0] in SPLIT_ORDER
                                                                 else len(SPLIT_ORDER), s[0]))
        splits = DOT.join(f"{name} {counts.images:,}" for name, counts in ordered)
        lines.append(f"Catalogue <b>{escape(dataset.name)}</b>: {dataset.n_images:,} pictures and "
                     f"{dataset.n_captions:,} captions in {len(dataset.splits)} split(s) ({escape(splits)}); "
                     f"searches cover every split unless the scope says <i>test split only</i>.")
    evaluated = next((m.evaluated for m in models if m.enabled and m.evaluated), None)
    if evaluated is not None:
        lines.append(f"Ground truth, ranks, failure cases and metrics: {escape(measured_label(evaluated))}; "
                     f"{escape(RULES[evaluated.positives])}.")
    return "".join(f'<div class="aoq-meta">{line}</div>' for line in lines)


def render_status(
    backend_url: str,
    health: HealthOut | None = None,
    models: Sequence[ModelOut] = (),
    error: BackendError | None = None,
    warnings: Iterable[str] = (),
    datasets: Sequence[DatasetOut] = (),
) -> str:
    """The lines at the top of the page: the service, its models, and what the catalogue holds."""
    if error is not None:
        return render_error(error)
    parts = [f"Search service <code>{escape(backend_url)}</code>"]
    if health is not None:
        parts.append(f"status {escape(health.status)}, version {escape(health.version or '?')}")
    if models:
        enabled = ", ".join(escape(m.name) for m in models if m.enabled) or "none"
        parts.append(f"models: {enabled}")
    html = '<div class="aoq-meta">' + DOT.join(parts) + "</div>" + _catalogue(datasets, models)
    problems = [f"Model '{m.name}' is disabled: {m.disabled_reason or 'no reason given'}" for m in models
                if not m.enabled]
    if health is not None:
        known = {m.name for m in models}
        problems += [f"Model '{n}' is disabled: {r}" for n, r in health.disabled.items() if n not in known]
    problems += list(warnings)
    return html + "".join(render_error(p) for p in problems)


def format_rank(rank: float) -> str:
    """A 1-based rank as the page shows it: whole ranks as integers, an expected rank of tied
    scores with one decimal (docs/evaluation.md, Ties)."""
    return f"{rank:.0f}" if float(rank).is_integer() else f"{rank:.1f}"


def _split_badge(split: str, eval_split: str) -> str:
    """A badge on items outside the evaluation split (training and dev items)."""
    return "" if split == eval_split else f' <span class="aoq-split">{escape(split)} split</span>'


def _tick(is_ground_truth: bool) -> str:
    return f' <span class="aoq-tick" title="a correct answer">{TICK}</span>' if is_ground_truth else ""


def _truth_line(answer: SearchTextOut | SearchImageOut, what: str) -> str:
    """Where the best correct answer ranks: in the searched scope (out of how many, and whether
    the list shows it), and in the evaluation split."""
    context = answer.context
    if answer.scope_rank is None and answer.ground_truth_rank is None:
        return ""
    bits = []
    if answer.scope_rank is not None:
        shown = len(answer.results)
        # a caption row stands for all its copies, so the rows shown cover ranks up to the last
        # row's rank plus its copies, not only up to the number of rows
        last = max((r.rank + getattr(r, "copies", 1) - 1 for r in answer.results), default=0)
        seen = "among" if answer.scope_rank <= last else "not among"
        bits.append(f"first correct {what} at <b>#{format_rank(answer.scope_rank)}</b> of {context.searched:,} "
                    f"searched, {seen} the {shown} shown")
    else:
        bits.append(f"no correct {what} in the {escape(SCOPE_LABELS[context.scope])}")
    if answer.ground_truth_rank is not None:
        bits.append(f"rank {format_rank(answer.ground_truth_rank)} among the {escape(context.eval_split)} "
                    f"split's {what}s, as evaluated")
    return DOT.join(bits)


#: what a column header says of the hubness correction its list was ranked by (docs/serving.md)
NORMALISE_LABELS = {"none": "raw scores (no hubness correction)", "qbnorm": "QB-Norm",
                    "invsoftmax": "inverted softmax"}
#: the hubness correction switch of the side-by-side tabs: (label, the request's ``normalise``)
NORMALISE_CHOICES = [("none", "none"), ("QB-Norm (dynamic inverted softmax)", "qbnorm"),
                     ("inverted softmax", "invsoftmax")]


def _normalise_line(answer: SearchTextOut | SearchImageOut) -> str:
    context = answer.context
    label = NORMALISE_LABELS[context.normalise]
    if context.normalise == "none":
        return label
    if context.normalised:
        return f"ranked by {label}: log-normalised scores"
    return f"ranked by {label}: this query's top-1 is no bank query's top-1, raw order kept"


def column_title(side: str, answer: SearchTextOut | SearchImageOut) -> str:
    """A column's heading: the side and the model; a re-ranker names what it re-ranks."""
    rerank = answer.context.rerank
    if rerank is None:
        return f"{side}: {answer.model}"
    kind = rerank.kind.upper()
    named = "" if answer.model.upper() == kind else f" ({answer.model})"
    return f"{side}: {kind}, re-ranking the top {rerank.shortlist_n} of {rerank.shortlist_by}{named}"


def _header(title: str, answer: SearchTextOut | SearchImageOut, what: str) -> str:
    meta = [f"{answer.latency_ms:.1f} ms", f"{answer.context.searched:,} {what}s searched"]
    if truth := _truth_line(answer, what):
        meta.append(truth)
    return (f"<h4>{escape(title)}</h4><div class=\"aoq-meta\">{DOT.join(meta)}</div>"
            f"<div class=\"aoq-meta aoq-normalise\">{escape(_normalise_line(answer))}</div>")


ONLY_HERE = ('<span class="aoq-only" title="the other column does not list it among its top k">'
             "only this column</span>")


def _enlarge(url: str, name: str) -> str:
    """A link that opens the full-size picture in a new tab."""
    return (f'<a class="aoq-enlarge" href="{escape(url)}" target="_blank" title="the full-size picture of {name}">'
            "\u2922 enlarge</a>")


def render_text_column(answer: SearchTextOut, title: str, other: SearchTextOut | None = None,
                       search_by: View | None = None) -> str:
    """One model's top-k images for a text query: rank, score, name, split; ticks on correct ones;
    pictures that the ``other`` column does not list are marked. With ``search_by`` (the page's
    settings) a picture is a link to the image-to-text view searching by it; a picture whose name
    an earlier one of the column has (a twin drawing) is marked for the "one drawing per name"
    switch."""
    eval_split = answer.context.eval_split
    theirs = None if other is None else {h.image_id for h in other.results}
    cards, seen = [], set()
    for hit in answer.results:
        twin = " aoq-twin" if hit.name.lower() in seen else ""
        seen.add(hit.name.lower())
        gt = " aoq-gt" if hit.is_ground_truth else ""
        only = ONLY_HERE if theirs is not None and hit.image_id not in theirs else ""
        href = hit.image_url if search_by is None else \
            view_query(replace(search_by, tab="i2t", query=None, image=hit.image_id))
        target = ' target="_blank"' if search_by is None else ' class="aoq-search-by" title="search by this picture"'
        name = escape(hit.name)
        cards.append(
            f'<figure class="aoq-card{gt}{twin}" data-image-id="{hit.image_id}">'
            f'<a href="{escape(href)}"{target}><img src="{escape(hit.thumbnail_url)}" '
            f'alt="{name}" title="{name}" loading="eager"></a>'
            f'<figcaption class="aoq-caption"><span class="aoq-rank">#{hit.rank}</span> '
            f'<span class="aoq-rank">score {hit.score:.3f}</span>{_tick(hit.is_ground_truth)}'
            f'<span class="aoq-name">{name}</span>{_split_badge(hit.split, eval_split)}{only}'
            f"{_enlarge(hit.image_url, name)}</figcaption></figure>"
        )
    body = '<div class="aoq-grid">' + "".join(cards) + "</div>" if cards else render_notice("No results.")
    return f'<div class="aoq-col">{_header(title, answer, "image")}{body}</div>'


def render_image_column(answer: SearchImageOut, title: str, other: SearchImageOut | None = None,
                        search_by: View | None = None) -> str:
    """One model's top-k captions for an image query: rank, text, its picture, score; under the
    text rule a row stands for every caption of its text (x copies); texts that the ``other``
    column does not list are marked. With ``search_by`` (the page's settings) a caption is a link
    to the text-to-image view searching by it."""
    eval_split = answer.context.eval_split
    theirs = None if other is None else {h.text.lower() for h in other.results}
    items = []
    for hit in answer.results:
        only = ONLY_HERE if theirs is not None and hit.text.lower() not in theirs else ""
        gt = ' class="aoq-gt"' if hit.is_ground_truth else ""
        copies = (f' <span class="aoq-rank" title="this text is the caption of {hit.copies} pictures in the '
                  f'searched scope">\u00d7{hit.copies}</span>') if hit.copies > 1 else ""
        picture = (f'<img src="{escape(hit.thumbnail_url)}" alt="{escape(hit.image_name)}" '
                   f'title="{escape(hit.image_name)}" loading="eager">') if hit.thumbnail_url else ""
        text = escape(hit.text) if search_by is None else (
            f'<a class="aoq-search-by" title="search by this caption" '
            f'href="{escape(view_query(replace(search_by, tab="t2i", query=hit.text, image=None)))}">'
            f"{escape(hit.text)}</a>")
        items.append(
            f'<li{gt} data-caption-id="{hit.caption_id}">{picture}<span><span class="aoq-rank">#{hit.rank}</span> '
            f"{text}{copies}{_tick(hit.is_ground_truth)} <span class=\"aoq-rank\">"
            f"(score {hit.score:.3f})</span>{_split_badge(hit.split, eval_split)}{only}</span></li>"
        )
    body = '<ol class="aoq-list">' + "".join(items) + "</ol>" if items else render_notice("No results.")
    return f'<div class="aoq-col">{_header(title, answer, "caption")}{body}</div>'


def _figure(item: GalleryImage, eval_split: str) -> str:
    name = escape(item.name)
    return (f'<figure><img src="{escape(item.thumbnail_url)}" alt="{name}" title="{name}">'
            f'<figcaption class="aoq-name">{name}{_split_badge(item.split, eval_split)}</figcaption></figure>')


def _notices(left: SearchTextOut | SearchImageOut, right: SearchTextOut | SearchImageOut) -> str:
    """What a newcomer needs to read the two columns right: the same model twice, a search of
    the test split alone, and a better match outside it."""
    out = []
    if left.model == right.model:
        out.append(render_notice(f"Both columns show the same model ({left.model}): pick another model on one "
                                 "side to compare two."))
    context = left.context
    if context.scope == "test":
        message = (f"Searching the {context.eval_split} split only ({context.searched:,} items); the training "
                   "and dev splits are left out.")
        outside = left.outside or right.outside
        if outside is not None:
            name = getattr(outside, "name", None) or getattr(outside, "text", "")
            message += (f" Outside it the whole catalogue has a higher-scoring item: \u201c{name}\u201d "
                        f"({outside.split} split, #{outside.rank} in the whole catalogue, the scope "
                        f"\u2018{SCOPE_LABELS['all']}\u2019).")
        out.append(f'<div class="aoq-notice" role="status">{escape(message)}</div>')
    return "".join(out)


def verdict(left: SearchTextOut | SearchImageOut, right: SearchTextOut | SearchImageOut) -> str:
    """One line that reads the comparison: where each column's first correct answer is, out of
    how many correct answers the scope holds and how many each column shows."""
    def place(answer: SearchTextOut | SearchImageOut) -> str:
        rank = "none in the scope" if answer.scope_rank is None else f"#{format_rank(answer.scope_rank)}"
        return f"{escape(answer.model)} {rank}"

    what = "intended answer \u201c" + escape(left.intended) + "\u201d; " \
        if isinstance(left, SearchTextOut) and left.intended else ""
    return (f'<div class="aoq-verdict"><b>Verdict:</b> {what}first correct answer {place(left)}, {place(right)}, '
            f"of {len(left.ground_truth_ids):,} correct in the {escape(SCOPE_LABELS[left.context.scope])}, "
            f"{len(left.results)} shown.</div>")


def render_text_query(left: SearchTextOut, right: SearchTextOut, links: str = "") -> str:
    """The query line of a text search: the query, notices, the verdict, the correct pictures
    (named) or why there are none, then ``links`` (share, export)."""
    context = left.context
    head = (f'<div class="aoq-query">Query: <q>{escape(left.query)}</q> \u00b7 scope: '
            f"{escape(SCOPE_LABELS[context.scope])}</div>")
    if left.ground_truth_ids or right.ground_truth_ids:
        head += verdict(left, right)
    if left.ground_truth:
        truth = (f'<div class="aoq-meta">Correct answers by the positives rule {context.positives} '
                 f"({escape(RULES[context.positives])}):</div><div class=\"aoq-truth\">"
                 + "".join(_figure(g, context.eval_split) for g in left.ground_truth) + "</div>")
    elif left.caption_id is not None:
        what = f"The intended answer \u201c{left.intended}\u201d" if left.intended else "The query"
        truth = render_notice(f"{what} is a caption of the {left.query_split} split; its pictures lie outside "
                              f"the {SCOPE_LABELS[context.scope]}, so no answer here is correct.")
    elif left.intended:
        truth = ('<div class="aoq-meta aoq-free"><b>Free text: judge by eye.</b> Its intended answer '
                 f"\u201c{escape(left.intended)}\u201d is no caption of this catalogue (a subset of the dataset?), so "
                 "no answer is marked correct.</div>")
    else:
        truth = ('<div class="aoq-meta aoq-free"><b>Free text: judge by eye.</b> No caption of the catalogue has '
                 "this text and no intended answer was given, so no answer is marked correct.</div>")
    return head + _notices(left, right) + truth + links


def render_image_query(left: SearchImageOut, right: SearchImageOut, label: str, image_url: str,
                       links: str = "") -> str:
    """The query line of an image search: the picture, its name and own captions in full (its
    ground truth), notices, then ``links``."""
    context = left.context
    query = left.query
    name = escape(query.name) if query else escape(label)
    head = (f'<div class="aoq-query">Query: {escape(label)} \u00b7 scope: {escape(SCOPE_LABELS[context.scope])}<br>'
            f'<img class="aoq-queryimg" src="{escape(image_url)}" alt="{name}" title="{name}"></div>')
    legend = ('<div class="aoq-meta">Each caption text is listed once, at the rank of its best copy; \u00d7n: n '
              "captions of the searched scope have this text, so the next row's rank is n places on.</div>"
              if context.positives == "text" else "")
    if query is None:
        truth = '<div class="aoq-meta">An uploaded picture: no caption of the catalogue is marked correct.</div>'
    else:
        own = "".join(f"<li>{escape(t)}</li>" for t in left.ground_truth_texts)
        truth = (f'<div class="aoq-meta"><b>{name}</b>{_split_badge(query.split, context.eval_split)}: its own '
                 f"captions, correct by the positives rule {context.positives} ({escape(RULES[context.positives])}):"
                 f'</div><ul class="aoq-meta">{own}</ul>')
    verdict_line = verdict(left, right) if query is not None else ""
    return head + verdict_line + _notices(left, right) + truth + legend + links
