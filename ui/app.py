"""The Gradio Blocks page: baseline and AOQ side by side, failure cases, offline negatives, metrics.

The page holds no model: every result comes from the search service through ``BackendClient``,
and images are ``<img>`` URLs on the backend that the browser fetches itself (the backend must be
reachable from the browser: pass ``public_url`` when the browser sees it under another address).
Behaviour lives in ``aoq_ui.handlers``; this module only lays out components and wires events.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

# Gradio reads this when it is imported and when it launches: no telemetry, no version check.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from aoq_serve.schemas import DEFAULT_MAX_UPLOAD_BYTES  # noqa: E402
from aoq_ui import handlers  # noqa: E402
from aoq_ui.client import BackendClient  # noqa: E402
from aoq_ui.examples import ExampleQuery  # noqa: E402
from aoq_ui.render import CSS, DIRECTION_LABELS, WHICH_LABELS, media_url  # noqa: E402

TITLE = "AOQ retrieval: baseline vs AOQ"
DEFAULT_K = 5
DEFAULT_CONCURRENCY = 4
N_PAGE = 12  # example queries shown per page


@dataclass(frozen=True)
class _Shared:
    """What every tab reads: the client and the model pickers and top-k above the tabs."""

    api: BackendClient
    left: gr.Dropdown
    right: gr.Dropdown
    top_k: gr.Slider

    @property
    def pair_and_k(self) -> list[gr.components.Component]:
        return [self.left, self.right, self.top_k]


@dataclass(frozen=True)
class _Filled:
    """The components of the tabs that the page load fills from the backend."""

    query: gr.Textbox
    examples: gr.Dataset
    captions: gr.State
    gallery: gr.Gallery
    images: gr.State
    train_pick: gr.Dropdown
    neg_kind: gr.Radio
    neg_item: gr.Number
    neg_model: gr.Dropdown
    metric_models: gr.CheckboxGroup


def build_app(
    backend_url: str,
    *,
    public_url: str | None = None,
    client: BackendClient | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    example_queries: Sequence[ExampleQuery] = (),
) -> gr.Blocks:
    """The comparison page for the search service at ``backend_url`` (not contacted until a page loads).

    ``example_queries`` (``aoq_ui.examples``) are offered as clickable free-text queries next to the
    test-split examples.
    """
    api = client or BackendClient(backend_url, public_url=public_url)

    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(f"## {TITLE}\nTop-k results of two models for the same query; "
                    "\u2714 marks the ground truth (paper Fig. 5).")
        status = gr.HTML(elem_id="status")
        with gr.Row():
            left = gr.Dropdown(label="Left model", choices=[], elem_id="left-model", scale=2)
            right = gr.Dropdown(label="Right model", choices=[], elem_id="right-model", scale=2)
            top_k = gr.Slider(1, 20, value=DEFAULT_K, step=1, label="top k", scale=1)
        shared = _Shared(api, left, right, top_k)
        free_text = list(example_queries)
        query, examples, captions = _text_to_image_tab(shared, free_text)
        gallery, images = _image_to_text_tab(shared)
        _failures_tab(shared)
        train_pick, neg_kind, neg_item, neg_model = _negatives_tab(shared)
        metric_models = _metrics_tab(shared)
        _fill_on_load(demo, shared, status, _Filled(query, examples, captions, gallery, images, train_pick,
                                                    neg_kind, neg_item, neg_model, metric_models),
                      free_text[0].text if free_text else None)

    # Two models answer every query: let a few events run at once instead of Gradio's one.
    demo.queue(default_concurrency_limit=concurrency)
    return demo


def _fill_on_load(demo: gr.Blocks, shared: _Shared, status: gr.HTML, tabs: _Filled, first_query: str | None) -> None:
    """At each page load: the status line, the model choices and the example queries; the query
    box starts on ``first_query`` (else the first test caption), so every tab's button works as
    the page opens."""
    api = shared.api

    def on_load():
        page = handlers.load_page(api)
        samples = [[c.text] for c in page.example_captions]
        thumbs = [(media_url(api.public_url, i.thumbnail_url), f"image {i.id}") for i in page.example_images]
        # The negatives tab starts on the first training example, so "Show" works as it stands.
        first = handlers.parse_train_pick(page.train_picks[0][1]) if page.train_picks else None
        query = first_query or (page.example_captions[0].text if page.example_captions else "")
        # keyed by component: Gradio matches a dict's values to the outputs by key, not by position
        return {
            status: page.status_html,
            shared.left: gr.update(choices=page.model_choices, value=page.left),
            shared.right: gr.update(choices=page.model_choices, value=page.right),
            tabs.neg_model: gr.update(choices=page.model_choices, value=page.right),
            tabs.metric_models: gr.update(choices=page.all_models, value=[m for m in (page.left, page.right) if m]),
            tabs.examples: gr.update(samples=samples),
            tabs.captions: page.example_captions,
            tabs.gallery: thumbs,
            tabs.images: page.example_images,
            tabs.train_pick: gr.update(choices=page.train_picks, value=page.train_picks[0][1] if first else None),
            tabs.neg_kind: gr.update(value=first[0]) if first else gr.update(),
            tabs.neg_item: gr.update(value=first[1]) if first else gr.update(),
            tabs.query: query,
        }

    demo.load(on_load, outputs=[status, shared.left, shared.right, *(getattr(tabs, f.name) for f in dataclasses.fields(tabs))])


def _text_to_image_tab(shared: _Shared, free_text: list[ExampleQuery]) -> tuple[gr.Textbox, gr.Dataset, gr.State]:
    """A query box, the given free-text examples and example captions; returns (query box,
    examples, their captions) for the page load."""
    api = shared.api
    with gr.Tab("Text to image"):
        captions = gr.State([])
        with gr.Row():
            query = gr.Textbox(label="Query", placeholder="describe an image", elem_id="t2i-query", scale=5)
            search = gr.Button("Search", variant="primary", elem_id="t2i-search", scale=1)
        if free_text:
            groups = ", ".join(dict.fromkeys(q.group for q in free_text))
            fine = gr.Dataset(components=[query], samples=[[q.text] for q in free_text], type="index",
                              label=f"Fine-grained queries, free text ({groups})",
                              samples_per_page=len(free_text), elem_id="t2i-free-examples")
        examples = gr.Dataset(components=[query], samples=[], type="index",
                              label="Example queries (test split)", samples_per_page=N_PAGE)
        shown_query = gr.HTML()
        with gr.Row(equal_height=False):
            left_column = gr.HTML(elem_id="t2i-left")
            right_column = gr.HTML(elem_id="t2i-right")

    def on_text(q, left, right, k):
        return handlers.search_text(api, q, left, right, k)

    def on_example(index, known, left, right, k):
        if index is None or not 0 <= index < len(known):
            return gr.update(), *handlers.search_text(api, "", left, right, k)
        text = known[index].text
        return text, *handlers.search_text(api, text, left, right, k)

    outputs = [shown_query, left_column, right_column]
    search.click(on_text, [query, *shared.pair_and_k], outputs)
    query.submit(on_text, [query, *shared.pair_and_k], outputs)
    examples.click(on_example, [examples, captions, *shared.pair_and_k], [query, *outputs])
    if free_text:
        def on_free(index, left, right, k):
            text = free_text[index].text if index is not None and 0 <= index < len(free_text) else ""
            return text, *handlers.search_text(api, text, left, right, k)

        fine.click(on_free, [fine, *shared.pair_and_k], [query, *outputs])
    return query, examples, captions


def _image_to_text_tab(shared: _Shared) -> tuple[gr.Gallery, gr.State]:
    """Test images to click, or an upload; returns (gallery, its images) for the page load."""
    api = shared.api
    with gr.Tab("Image to text"):
        images = gr.State([])
        with gr.Row():
            gallery = gr.Gallery(label="Test images: click one", columns=6, height=260,
                                 allow_preview=False, buttons=[], elem_id="i2t-gallery", scale=3)
            with gr.Column(scale=1):
                upload = gr.Image(label="...or upload a PNG/JPEG", type="filepath", format="png",
                                  sources=["upload"], height=180, elem_id="i2t-upload")
                upload_search = gr.Button("Search with the upload", elem_id="i2t-upload-search")
        shown_query = gr.HTML(elem_id="i2t-query")
        with gr.Row(equal_height=False):
            left_column = gr.HTML(elem_id="i2t-left")
            right_column = gr.HTML(elem_id="i2t-right")

    def on_gallery(evt: gr.SelectData, known, left, right, k):
        image = known[evt.index] if isinstance(evt.index, int) and evt.index < len(known) else None
        return handlers.search_image(api, left, right, k, image=image)

    def on_upload(path, left, right, k):
        return handlers.search_image(api, left, right, k, upload=path)

    outputs = [shown_query, left_column, right_column]
    gallery.select(on_gallery, [images, *shared.pair_and_k], outputs)
    upload_search.click(on_upload, [upload, *shared.pair_and_k], outputs)
    return gallery, images


def _failures_tab(shared: _Shared) -> None:
    """List the queries one model misses at rank 1, then show a picked one side by side."""
    api = shared.api
    with gr.Tab("Failure cases"):
        listed = gr.State({})
        with gr.Row():
            direction = gr.Radio([(v, k) for k, v in DIRECTION_LABELS.items()], value="t2i", label="Direction")
            which = gr.Radio([(v, k) for k, v in WHICH_LABELS.items()], value="baseline_only", label="Cases")
            limit = gr.Slider(5, 100, value=20, step=5, label="list at most")
        list_cases = gr.Button("List cases", elem_id="failures-list")
        summary = gr.HTML(elem_id="failures-summary")
        cases = gr.Dropdown(label="Case", choices=[], elem_id="failures-case")
        shown_query = gr.HTML()
        with gr.Row(equal_height=False):
            left_column = gr.HTML(elem_id="failures-left")
            right_column = gr.HTML(elem_id="failures-right")

    def on_list(d, w, lim, left, right):
        html, choices, items = handlers.list_failures(api, d, w, lim, left, right)
        return html, gr.update(choices=choices, value=None), {"direction": d, "items": items}, "", "", ""

    def on_case(query_id, state, left, right, k):
        item = state.get("items", {}).get(query_id) if state else None
        return handlers.show_failure(api, state.get("direction", "t2i") if state else "t2i", item, left, right, k)

    columns = [shown_query, left_column, right_column]
    list_cases.click(on_list, [direction, which, limit, shared.left, shared.right], [summary, cases, listed, *columns])
    cases.input(on_case, [cases, listed, *shared.pair_and_k], columns)


def _negatives_tab(shared: _Shared) -> tuple[gr.Dropdown, gr.Radio, gr.Number, gr.Dropdown]:
    """Offline vs online hard negatives of a training item; returns (training picks, anchor kind,
    item id, model) for the page load."""
    api = shared.api
    with gr.Tab("Offline negatives"):
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
    return train_pick, kind, item_id, model


def _metrics_tab(shared: _Shared) -> gr.CheckboxGroup:
    """R@K tables, training curves and rank histograms; returns the model picker for the page load."""
    api = shared.api
    with gr.Tab("Metrics") as tab:
        with gr.Row():
            models = gr.CheckboxGroup(label="Models", choices=[], scale=4)
            refresh = gr.Button("Refresh", scale=1, elem_id="metrics-refresh")
        table = gr.HTML(elem_id="metrics-table")
        curves = gr.Plot(label="R@1 during training")
        histogram = gr.Plot(label="Cross-retrieval rank histogram")

    def on_metrics(names):
        return handlers.show_metrics(api, names or [])

    outputs = [table, curves, histogram]
    refresh.click(on_metrics, [models], outputs)
    tab.select(on_metrics, [models], outputs)
    return models


def launch(demo: gr.Blocks, host: str, port: int, *, block: bool = True):
    """Serve ``demo`` with nothing that reaches outside: no share link, telemetry, SSR or history.

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
    )
