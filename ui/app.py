"""The Gradio Blocks page: two models side by side, failure cases, offline negatives, metrics.

The page holds no model: every result comes from the search service through ``BackendClient``,
and the pictures come through the page's own server (``aoq_ui.media``) unless the client was
given the service's public URL. Behaviour lives in ``aoq_ui.handlers``; this module only lays
out components and wires events, the shared controls and side-by-side views coming from
``aoq_ui.controls``. The address bar follows the last search (``aoq_ui.state``), so a copied link
opens the same view.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urljoin

# Gradio reads this when it is imported and when it launches: no telemetry, no version check.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from aoq_serve.schemas import DEFAULT_MAX_UPLOAD_BYTES, MAX_K  # noqa: E402
from aoq_ui import handlers  # noqa: E402
from aoq_ui.client import BackendClient  # noqa: E402
from aoq_ui.controls import DEFAULT_K, DEFAULT_NORMALISE, Shared, SideBySide, normalise_dropdown, rerun, \
    rerun_on_switch, shared_settings, side_by_side  # noqa: E402
from aoq_ui.examples import ExampleQuery  # noqa: E402
from aoq_ui.media import media_routes  # noqa: E402
from aoq_ui.render import CSS, render_notice  # noqa: E402
from aoq_ui.render_analysis import DIRECTION_LABELS, WHICH_LABELS  # noqa: E402
from aoq_ui.seeds import SeedSummary  # noqa: E402
from aoq_ui.state import parse_view  # noqa: E402

TITLE = "AOQ retrieval: baseline vs AOQ"
DEFAULT_CONCURRENCY = 4
N_PAGE = 12  # example queries shown per page
#: Gradio's status line announces this key when an event ends, and ships no English for it.
I18N = {"en": {"common.complete": "Results updated"}}
#: the address bar follows the newest "link to this view" a search renders (a new link, or an
#: old one whose address the page patched in place).
FOLLOW_SHARE_LINKS = """() => {
  const follow = (link) => history.replaceState(null, "", link.getAttribute("href"));
  const found = (node) => node.matches && node.matches("a.aoq-share") ? [node]
    : node.querySelectorAll ? [...node.querySelectorAll("a.aoq-share")] : [];
  new MutationObserver((records) => records.forEach((r) => {
    const links = r.type === "attributes" ? found(r.target) : [...r.addedNodes].flatMap(found);
    if (links.length) follow(links[links.length - 1]);
  })).observe(document.body, {childList: true, subtree: true, attributes: true, attributeFilter: ["href"]});
}"""


#: the "one drawing per name" switch: the class on <body> that hides twin drawings (.aoq-twin).
ONE_DRAWING_JS = "(on) => { document.body.classList.toggle('aoq-one-drawing', on); return []; }"


def _origin(request: gr.Request) -> str:
    """The page's address as the browser used it (the gallery needs absolute picture URLs)."""
    headers = request.headers
    scheme = headers.get("x-forwarded-proto") or request.url.scheme
    return f"{scheme}://{headers.get('x-forwarded-host') or headers.get('host')}"


def _thumbs(images, request: gr.Request) -> list[tuple[str, str]]:
    origin = _origin(request) + "/"
    return [(urljoin(origin, i.thumbnail_url), i.name) for i in images]


def build_app(
    client: BackendClient, *, concurrency: int = DEFAULT_CONCURRENCY, example_queries: Sequence[ExampleQuery] = (),
    seeds: SeedSummary | None = None,
) -> gr.Blocks:
    """The comparison page for the search service ``client`` talks to (not contacted until a page
    loads); ``example_queries`` (``aoq_ui.examples``) are offered as clickable free-text queries;
    ``seeds`` (``aoq_ui.seeds``), the pair's multi-seed result, goes beside the served seed."""
    free_text = list(example_queries)
    #: a showcased example's intended caption, by its text (also when typed or opened from a link)
    intents = {q.text: q.intends for q in free_text if q.intends}
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"## {TITLE}\nTop-k results of two models for the same query; \u2714 marks a correct answer "
                    "(paper Fig. 5).")
        status = gr.HTML(elem_id="status")
        shared = shared_settings(client)
        left, right, top_k, scope = shared.settings
        with gr.Tabs(elem_id="tabs") as tabs:
            t2i, query_box, examples, captions = _text_to_image_tab(shared, free_text, intents)
            i2t, browser = _image_to_text_tab(shared)
            failures = _failures_tab(shared)
            negatives = _negatives_tab(shared)
            metric_models, known_models = _metrics_tab(shared, seeds)
        views = [t2i, i2t, failures]

        def rerun_all(left_name, right_name, k, where, *per_view):
            lasts, normalised = per_view[:len(views)], per_view[len(views):]
            return [o for last, how in zip(lasts, normalised) for o in rerun(client, last, left_name, right_name, k,
                                                                              where, how)]

        inputs = [*shared.settings, *(v.last for v in views), *(v.normalise for v in views)]
        outputs = [o for v in views for o in v.outputs]
        for event in (left.input, right.input, top_k.input, scope.input):
            # while a run is on its way, only the newest setting waits (a dragged slider sends many)
            event(rerun_all, inputs, outputs, trigger_mode="always_last")
        scope.input(browser.refresh, [scope, browser.filter], browser.outputs)

        def on_load(request: gr.Request):
            page = handlers.load_page(client)
            view = parse_view(dict(request.query_params))
            pick_left = view.left if view.left in page.all_models else page.left
            pick_right = view.right if view.right in page.all_models else page.right
            k, where, how = view.k or DEFAULT_K, view.scope or "all", view.normalise or DEFAULT_NORMALISE
            pictures, shown, line = handlers.gallery_page(client, where, "", 0)
            text = view.query or (free_text[0].text if free_text else
                                  page.example_captions[0].text if page.example_captions else "")
            first = handlers.parse_train_pick(page.train_picks[0][1]) if page.train_picks else None
            filled = {
                status: page.status_html,
                left: gr.update(choices=page.model_choices, value=pick_left),
                right: gr.update(choices=page.model_choices, value=pick_right),
                top_k: k, scope: where, query_box: text,
                negatives.model: gr.update(choices=page.model_choices, value=page.right),
                negatives.pick: gr.update(choices=page.train_picks, value=page.train_picks[0][1] if first else None),
                negatives.kind: gr.update(value=first[0]) if first else gr.update(),
                negatives.item: gr.update(value=first[1]) if first else gr.update(),
                metric_models: gr.update(choices=page.all_models, value=[m for m in (pick_left, pick_right) if m]),
                known_models: page.models,
                examples: gr.update(samples=[[c.text] for c in page.example_captions]),
                captions: page.example_captions,
                browser.gallery: _thumbs(pictures, request), browser.items: pictures, browser.page: shown,
                browser.line: line,
                tabs: gr.Tabs(selected=view.tab),
                # a link's hubness correction is its own tab's
                t2i.normalise: how if view.tab == "t2i" else DEFAULT_NORMALISE,
                i2t.normalise: how if view.tab == "i2t" else DEFAULT_NORMALISE,
            }
            last = {"text": view.query, "intended": intents.get(view.query)} if view.query and view.tab == "t2i" else \
                {"image_id": view.image, "image_url": client.browser_url(f"/images/{view.image}")} \
                if view.image is not None and view.tab == "i2t" else {}
            if last:
                target = t2i if "text" in last else i2t
                columns = handlers.run_last(client, last, pick_left, pick_right, k, where, how)
                filled.update(dict(zip(target.outputs, [*columns, last])))
            return filled

        demo.load(on_load, outputs=[status, left, right, top_k, scope, query_box, negatives.model, negatives.pick,
                                    negatives.kind, negatives.item, metric_models, known_models, examples,
                                    captions, *browser.outputs, tabs, t2i.normalise, i2t.normalise, *t2i.outputs,
                                    *i2t.outputs])

    # Two models answer every query: let a few events run at once instead of Gradio's one.
    demo.queue(default_concurrency_limit=concurrency)
    return demo


def _text_to_image_tab(shared: Shared, free_text: list[ExampleQuery], intents: dict[str, str]
                       ) -> tuple[SideBySide, gr.Textbox, gr.Dataset, gr.State]:
    """A query box, the free-text examples and example captions; returns the view, the query
    box, the examples and their captions for the page load."""
    api = shared.api
    with gr.Tab("Text to image", id="t2i"):
        captions = gr.State([])
        with gr.Row():
            query = gr.Textbox(label="Query", placeholder="describe a picture", elem_id="t2i-query", scale=5)
            normalise = normalise_dropdown("t2i")
            search = gr.Button("Search", variant="primary", elem_id="t2i-search", scale=1)
        if free_text:
            groups = ", ".join(dict.fromkeys(q.group for q in free_text))
            fine = gr.Dataset(components=[query], samples=[[q.text] for q in free_text], type="index",
                              label=f"Fine-grained queries ({groups}); each is judged by the caption it intends, "
                                    "named in the verdict line",
                              samples_per_page=len(free_text), elem_id="t2i-free-examples")
        examples = gr.Dataset(components=[query], samples=[], type="index",
                              label="Example queries (captions of the test split)", samples_per_page=N_PAGE)
        one_drawing = gr.Checkbox(label="one drawing per name: hide a picture whose name a higher one of its column "
                                        "has (a twin, such as the other vendor's drawing of an emoji); ranks still "
                                        "count it",
                                  value=False, elem_id="t2i-one-drawing")
        view = side_by_side("t2i", normalise=normalise)
    # the page's own style sheet hides the marked twins (aoq_ui.render): no round trip to the service
    one_drawing.change(None, one_drawing, None, js=ONE_DRAWING_JS)

    def run(text, left, right, k, scope, how):
        last = {"text": text, "intended": intents.get((text or "").strip())} if text else {}
        return (*handlers.search_text(api, text, left, right, k, scope, how, last.get("intended")), last)

    def on_example(index, known, left, right, k, scope, how):
        text = known[index].text if index is not None and 0 <= index < len(known) else ""
        return text, *run(text, left, right, k, scope, how)

    settings = [*shared.settings, normalise]
    search.click(run, [query, *settings], view.outputs)
    query.submit(run, [query, *settings], view.outputs)
    examples.click(on_example, [examples, captions, *settings], [query, *view.outputs])
    if free_text:
        def on_free(index, left, right, k, scope, how):
            text = free_text[index].text if index is not None and 0 <= index < len(free_text) else ""
            return text, *run(text, left, right, k, scope, how)

        fine.click(on_free, [fine, *settings], [query, *view.outputs])
    rerun_on_switch(shared, view)
    return view, query, examples, captions


@dataclass(frozen=True)
class _Browser:
    """The paged gallery of the image-to-text tab."""

    filter: gr.Textbox
    gallery: gr.Gallery
    items: gr.State
    page: gr.State
    line: gr.HTML
    refresh: object  # (scope, filter, request) -> outputs, page 0

    @property
    def outputs(self) -> list[gr.components.Component]:
        return [self.gallery, self.items, self.page, self.line]


def _image_to_text_tab(shared: Shared) -> tuple[SideBySide, _Browser]:
    """The catalogue's pictures to browse and click, or an upload."""
    api = shared.api
    with gr.Tab("Image to text", id="i2t"):
        items, page = gr.State([]), gr.State(0)
        with gr.Row():
            with gr.Column(scale=4):
                with gr.Row():
                    search_filter = gr.Textbox(label="Filter the pictures by caption text", elem_id="i2t-filter",
                                               placeholder="e.g. flag, skin tone, cat", scale=3)
                    previous = gr.Button("\u25c0 previous page", elem_id="i2t-previous", scale=1)
                    following = gr.Button("next page \u25b6", elem_id="i2t-next", scale=1)
                line = gr.HTML(elem_id="i2t-page")
                gallery = gr.Gallery(label="Pictures: click one to search with it", columns=8, height=340,
                                     object_fit="contain", allow_preview=False, buttons=[], elem_id="i2t-gallery")
            with gr.Column(scale=1):
                upload = gr.File(label="...or upload a PNG/JPEG", file_types=[".png", ".jpg", ".jpeg"],
                                 type="filepath", elem_id="i2t-upload", height=140)
                upload_search = gr.Button("Search with the upload", elem_id="i2t-upload-search")
                normalise = normalise_dropdown("i2t", scale=1)
        view = side_by_side("i2t", "i2t-query", normalise)

    def show(scope, text, number, request: gr.Request):
        pictures, shown, html = handlers.gallery_page(api, scope, text, number)
        return _thumbs(pictures, request), pictures, shown, html

    def refresh(scope, text, request: gr.Request):
        return show(scope, text, 0, request)

    def back(scope, text, number, request: gr.Request):
        return show(scope, text, number - 1, request)

    def forward(scope, text, number, request: gr.Request):
        return show(scope, text, number + 1, request)

    def answer(last, left, right, k, scope, how):
        columns = handlers.run_last(api, last, left, right, k, scope, how)
        return (*(columns or (render_notice("Click a picture of the gallery or upload one."), "", "")), last)

    def on_pick(evt: gr.SelectData, known, left, right, k, scope, how):
        picked = known[evt.index] if isinstance(evt.index, int) and evt.index < len(known) else None
        return answer({"image_id": picked.image_id, "image_url": picked.image_url} if picked else {},
                      left, right, k, scope, how)

    def on_upload(path, left, right, k, scope, how):
        return answer({"upload": path} if path else {}, left, right, k, scope, how)

    browser = _Browser(search_filter, gallery, items, page, line, refresh)
    search_filter.submit(refresh, [shared.scope, search_filter], browser.outputs)
    previous.click(back, [shared.scope, search_filter, page], browser.outputs)
    following.click(forward, [shared.scope, search_filter, page], browser.outputs)
    gallery.select(on_pick, [items, *shared.settings, normalise], view.outputs)
    upload_search.click(on_upload, [upload, *shared.settings, normalise], view.outputs)
    rerun_on_switch(shared, view)
    return view, browser


def _failures_tab(shared: Shared) -> SideBySide:
    """The queries one model misses at rank 1, a page at a time; a picked one side by side."""
    api = shared.api
    with gr.Tab("Failure cases", id="failures"):
        listed = gr.State({})
        with gr.Row():
            direction = gr.Radio([(v, k) for k, v in DIRECTION_LABELS.items()], value="t2i", label="Direction")
            which = gr.Radio([(v, k) for k, v in WHICH_LABELS.items()], value="baseline_only", label="Cases")
            per_page = gr.Slider(5, MAX_K, value=20, step=5, label="cases per page", elem_id="failures-per-page")
        with gr.Row():
            list_cases = gr.Button("List cases", variant="primary", elem_id="failures-list")
            previous = gr.Button("\u25c0 previous page", elem_id="failures-previous")
            following = gr.Button("next page \u25b6", elem_id="failures-next")
        summary = gr.HTML(elem_id="failures-summary")
        cases = gr.Dropdown(label="Case (pick one to see both rankings)", choices=[], elem_id="failures-case")
        view = side_by_side("failures")

    def show(d, w, n, number, left, right):
        html, choices, listed_page, shown = handlers.list_failures(api, d, w, n, number, left, right)
        state = {"direction": d, "which": w, "per_page": n, "failures": listed_page, "page": shown}
        return html, gr.update(choices=choices, value=None), state, "", "", "", {}

    def step(state, delta, left, right):
        if not state:
            return show("t2i", "baseline_only", 20, 0, left, right)
        return show(state["direction"], state["which"], state["per_page"], state["page"] + delta, left, right)

    def on_case(query_id, state, left, right, k, scope):
        last = handlers.failure_query(state.get("failures") if state else None, query_id)
        columns = handlers.run_last(api, last, left, right, k, scope)
        return (*(columns or (render_notice("Pick a case from the list."), "", "")), last)

    outputs = [summary, cases, listed, *view.outputs]
    list_cases.click(lambda d, w, n, left, right: show(d, w, n, 0, left, right),
                     [direction, which, per_page, shared.left, shared.right], outputs)
    previous.click(lambda s, left, right: step(s, -1, left, right), [listed, shared.left, shared.right], outputs)
    following.click(lambda s, left, right: step(s, 1, left, right), [listed, shared.left, shared.right], outputs)
    cases.input(on_case, [cases, listed, *shared.settings], view.outputs)
    return view


@dataclass(frozen=True)
class _Negatives:
    pick: gr.Dropdown
    kind: gr.Radio
    item: gr.Number
    model: gr.Dropdown


def _negatives_tab(shared: Shared) -> _Negatives:
    """Offline vs online hard negatives of a training item; returns what the page load fills."""
    api = shared.api
    with gr.Tab("Offline negatives", id="negatives"):
        gr.Markdown("What each method learns from (paper Fig. 3): the hardest negatives of a training "
                    "item mined offline from the whole training set, next to the hardest ones a "
                    "random batch offers online.")
        with gr.Row():
            train_pick = gr.Dropdown(label="Training examples", choices=[], scale=3, elem_id="negatives-pick")
            model = gr.Dropdown(label="Model (whose mining run)", choices=[], scale=2)
        with gr.Row():
            kind = gr.Radio([("caption", "caption"), ("image", "image")], value="caption", label="Anchor kind")
            item_id = gr.Number(label="Training item id", value=None, precision=0, minimum=0)
            n_negatives = gr.Slider(1, 10, value=5, step=1, label="negatives")
            batch_seed = gr.Number(label="online batch seed", value=0, precision=0, minimum=0)
            show = gr.Button("Show", variant="primary", elem_id="negatives-show")
        anchor = gr.HTML()
        with gr.Row(equal_height=False):
            offline = gr.HTML(elem_id="negatives-offline")
            online = gr.HTML(elem_id="negatives-online")

    def on_show(anchor_kind, identifier, name, n, seed):
        return handlers.show_negatives(api, anchor_kind, identifier, name, n, seed)

    def on_pick(pick, name, n, seed):
        parsed = handlers.parse_train_pick(pick)
        if parsed is None:
            return gr.update(), gr.update(), "", "", ""
        return parsed[0], parsed[1], *handlers.show_negatives(api, parsed[0], parsed[1], name, n, seed)

    outputs = [anchor, offline, online]
    show.click(on_show, [kind, item_id, model, n_negatives, batch_seed], outputs)
    train_pick.input(on_pick, [train_pick, model, n_negatives, batch_seed], [kind, item_id, *outputs])
    return _Negatives(train_pick, kind, item_id, model)


def _metrics_tab(shared: Shared, seeds: SeedSummary | None) -> tuple[gr.CheckboxGroup, gr.State]:
    """R@K tables, training curves and rank histograms, each explained; returns the model
    picker and the models' descriptions for the page load."""
    api = shared.api
    with gr.Tab("Metrics", id="metrics") as tab:
        known = gr.State([])
        with gr.Row():
            models = gr.CheckboxGroup(label="Models", choices=[], scale=4)
            refresh = gr.Button("Refresh", scale=1, elem_id="metrics-refresh")
        table = gr.HTML(elem_id="metrics-table")
        curves = gr.Plot(label="R@1 during training", elem_id="metrics-curves")
        curves_note = gr.HTML(elem_id="metrics-curves-note")
        histogram = gr.Plot(label="Cross-retrieval rank histogram", elem_id="metrics-histogram")
        histogram_note = gr.HTML(elem_id="metrics-histogram-note")

    def on_metrics(names, described):
        html, curve_figure, histogram_figure = handlers.show_metrics(api, names or [], described or [], seeds)
        notes = handlers.plot_notes(described or [])
        return html, curve_figure, f'<div class="aoq-meta">{notes[0]}</div>', histogram_figure, \
            f'<div class="aoq-meta">{notes[1]}</div>'

    outputs = [table, curves, curves_note, histogram, histogram_note]
    refresh.click(on_metrics, [models, known], outputs)
    tab.select(on_metrics, [models, known], outputs)
    return models, known


def launch(demo: gr.Blocks, client: BackendClient, host: str, port: int, *, block: bool = True):
    """Serve ``demo`` (and the relay of ``client``'s pictures) with nothing that reaches
    outside: no share link, telemetry, SSR or history.

    With ``block=False`` it returns once the server is up (tests); ``demo.close()`` stops it.
    """
    return demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        inbrowser=False,
        prevent_thread_lock=not block,
        show_error=False,
        quiet=True,
        max_file_size=DEFAULT_MAX_UPLOAD_BYTES,
        ssr_mode=False,
        mcp_server=False,
        pwa=False,
        run_history=False,
        enable_monitoring=False,
        footer_links=["settings"],
        css=CSS,
        js=FOLLOW_SHARE_LINKS,
        i18n=gr.I18n(**I18N),
        app_kwargs={"routes": media_routes(client)},
    )
