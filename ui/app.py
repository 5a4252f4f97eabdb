"""The Gradio Blocks page: baseline and AOQ side by side, failure cases, offline negatives, metrics.

The page holds no model: every result comes from the search service through ``BackendClient``,
and images are ``<img>`` URLs on the backend that the browser fetches itself (the backend must be
reachable from the browser: pass ``public_url`` when the browser sees it under another address).
Behaviour lives in ``ui.handlers``; this module only lays out components and wires events.
"""

from __future__ import annotations

import os

# Gradio reads this when it is imported and when it launches: no telemetry, no version check.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402

from ui import handlers  # noqa: E402
from ui.client import BackendClient  # noqa: E402
from ui.render import CSS, DIRECTION_LABELS, WHICH_LABELS, media_url  # noqa: E402

TITLE = "AOQ retrieval: baseline vs AOQ"
DEFAULT_K = 5
DEFAULT_CONCURRENCY = 4
N_PAGE = 12  # example queries shown per page
MAX_UPLOAD = "10mb"  # the backend's upload limit; larger files are refused before they travel


def build_app(
    backend_url: str,
    *,
    public_url: str | None = None,
    client: BackendClient | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> gr.Blocks:
    """The comparison page for the search service at ``backend_url`` (not contacted until a page loads)."""
    api = client or BackendClient(backend_url, public_url=public_url)

    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        captions_state = gr.State([])
        images_state = gr.State([])
        failures_state = gr.State({})

        gr.Markdown(f"## {TITLE}\nTop-k results of two models for the same query; "
                    "\u2714 marks the ground truth (paper Fig. 5).")
        status = gr.HTML(elem_id="status")
        with gr.Row():
            left_model = gr.Dropdown(label="Left model", choices=[], elem_id="left-model", scale=2)
            right_model = gr.Dropdown(label="Right model", choices=[], elem_id="right-model", scale=2)
            top_k = gr.Slider(1, 20, value=DEFAULT_K, step=1, label="top k", scale=1)

        with gr.Tab("Text to image"):
            with gr.Row():
                query = gr.Textbox(label="Query", placeholder="describe an image", elem_id="t2i-query", scale=5)
                search = gr.Button("Search", variant="primary", elem_id="t2i-search", scale=1)
            examples = gr.Dataset(components=[query], samples=[], type="index",
                                  label="Example queries (test split)", samples_per_page=N_PAGE)
            t2i_query = gr.HTML()
            with gr.Row(equal_height=False):
                t2i_left = gr.HTML(elem_id="t2i-left")
                t2i_right = gr.HTML(elem_id="t2i-right")

        with gr.Tab("Image to text"):
            with gr.Row():
                gallery = gr.Gallery(label="Test images: click one", columns=6, height=260,
                                     allow_preview=False, buttons=[], elem_id="i2t-gallery", scale=3)
                with gr.Column(scale=1):
                    upload = gr.Image(label="...or upload a PNG/JPEG", type="filepath", format="png",
                                      sources=["upload"], height=180, elem_id="i2t-upload")
                    upload_search = gr.Button("Search with the upload", elem_id="i2t-upload-search")
            i2t_query = gr.HTML()
            with gr.Row(equal_height=False):
                i2t_left = gr.HTML(elem_id="i2t-left")
                i2t_right = gr.HTML(elem_id="i2t-right")

        with gr.Tab("Failure cases"):
            with gr.Row():
                direction = gr.Radio([(v, k) for k, v in DIRECTION_LABELS.items()], value="t2i", label="Direction")
                which = gr.Radio([(v, k) for k, v in WHICH_LABELS.items()], value="baseline_only", label="Cases")
                limit = gr.Slider(5, 100, value=20, step=5, label="list at most")
            list_cases = gr.Button("List cases", elem_id="failures-list")
            summary = gr.HTML()
            cases = gr.Dropdown(label="Case", choices=[], elem_id="failures-case")
            fail_query = gr.HTML()
            with gr.Row(equal_height=False):
                fail_left = gr.HTML(elem_id="failures-left")
                fail_right = gr.HTML(elem_id="failures-right")

        with gr.Tab("Offline negatives"):
            gr.Markdown("What each method learns from (paper Fig. 3): the hardest negatives of a training "
                        "item mined offline from the whole training set, next to the hardest ones a "
                        "random batch offers online.")
            with gr.Row():
                train_pick = gr.Dropdown(label="Training examples", choices=[], scale=3)
                neg_model = gr.Dropdown(label="Model (whose mining run)", choices=[], scale=2)
            with gr.Row():
                kind = gr.Radio([("caption", "caption"), ("image", "image")], value="caption", label="Anchor kind")
                item_id = gr.Number(label="Training item id", value=None, precision=0, minimum=0)
                n_negatives = gr.Slider(1, 10, value=5, step=1, label="negatives")
                batch_seed = gr.Number(label="online batch seed", value=0, precision=0, minimum=0)
                show_negs = gr.Button("Show", variant="primary", elem_id="negatives-show")
            anchor = gr.HTML()
            with gr.Row(equal_height=False):
                offline = gr.HTML(elem_id="negatives-offline")
                online = gr.HTML(elem_id="negatives-online")

        with gr.Tab("Metrics") as metrics_tab:
            with gr.Row():
                metric_models = gr.CheckboxGroup(label="Models", choices=[], scale=4)
                refresh = gr.Button("Refresh", scale=1)
            table = gr.HTML(elem_id="metrics-table")
            curves = gr.Plot(label="R@1 during training")
            histogram = gr.Plot(label="Cross-retrieval rank histogram")

        # -- events --------------------------------------------------------------------------

        def on_load():
            page = handlers.load_page(api)
            samples = [[c.text] for c in page.example_captions]
            thumbs = [(media_url(api.public_url, i.thumbnail_url), f"image {i.id}") for i in page.example_images]
            return (
                page.status_html,
                gr.update(choices=page.model_choices, value=page.left),
                gr.update(choices=page.model_choices, value=page.right),
                gr.update(choices=page.model_choices, value=page.right),
                gr.update(choices=page.all_models, value=[m for m in (page.left, page.right) if m]),
                gr.update(samples=samples),
                page.example_captions,
                thumbs,
                page.example_images,
                gr.update(choices=page.train_picks, value=None),
            )

        demo.load(on_load, outputs=[status, left_model, right_model, neg_model, metric_models, examples,
                                    captions_state, gallery, images_state, train_pick])

        def on_text(q, left, right, k):
            return handlers.search_text(api, q, left, right, k)

        text_outputs = [t2i_query, t2i_left, t2i_right]
        search.click(on_text, [query, left_model, right_model, top_k], text_outputs)
        query.submit(on_text, [query, left_model, right_model, top_k], text_outputs)

        def on_example(index, captions, left, right, k):
            if index is None or not 0 <= index < len(captions):
                return gr.update(), *handlers.search_text(api, "", left, right, k)
            text = captions[index].text
            return text, *handlers.search_text(api, text, left, right, k)

        examples.click(on_example, [examples, captions_state, left_model, right_model, top_k],
                       [query, *text_outputs])

        def on_gallery(evt: gr.SelectData, images, left, right, k):
            image = images[evt.index] if isinstance(evt.index, int) and evt.index < len(images) else None
            return handlers.search_image(api, left, right, k, image=image)

        image_outputs = [i2t_query, i2t_left, i2t_right]
        gallery.select(on_gallery, [images_state, left_model, right_model, top_k], image_outputs)

        def on_upload(path, left, right, k):
            return handlers.search_image(api, left, right, k, upload=path)

        upload_search.click(on_upload, [upload, left_model, right_model, top_k], image_outputs)

        def on_list(d, w, lim, left, right):
            html, choices, items = handlers.list_failures(api, d, w, lim, left, right)
            return html, gr.update(choices=choices, value=None), {"direction": d, "items": items}, "", "", ""

        list_cases.click(on_list, [direction, which, limit, left_model, right_model],
                         [summary, cases, failures_state, fail_query, fail_left, fail_right])

        def on_case(query_id, state, left, right, k):
            item = state.get("items", {}).get(query_id) if state else None
            return handlers.show_failure(api, state.get("direction", "t2i") if state else "t2i",
                                         item, left, right, k)

        cases.input(on_case, [cases, failures_state, left_model, right_model, top_k],
                    [fail_query, fail_left, fail_right])

        def on_negatives(anchor_kind, identifier, model, n, seed):
            return handlers.show_negatives(api, anchor_kind, identifier, model, n, seed)

        negatives_outputs = [anchor, offline, online]
        show_negs.click(on_negatives, [kind, item_id, neg_model, n_negatives, batch_seed], negatives_outputs)

        def on_pick(pick, model, n, seed):
            parsed = handlers.parse_train_pick(pick)
            if parsed is None:
                return gr.update(), gr.update(), "", "", ""
            return parsed[0], parsed[1], *handlers.show_negatives(api, parsed[0], parsed[1], model, n, seed)

        train_pick.input(on_pick, [train_pick, neg_model, n_negatives, batch_seed],
                         [kind, item_id, *negatives_outputs])

        def on_metrics(models):
            return handlers.show_metrics(api, models or [])

        metrics_outputs = [table, curves, histogram]
        refresh.click(on_metrics, [metric_models], metrics_outputs)
        metrics_tab.select(on_metrics, [metric_models], metrics_outputs)

    # Two models answer every query: let a few events run at once instead of Gradio's one.
    demo.queue(default_concurrency_limit=concurrency)
    return demo


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
        max_file_size=MAX_UPLOAD,
        ssr_mode=False,
        mcp_server=False,
        pwa=False,
        run_history=False,
        enable_monitoring=False,
        footer_links=["settings"],
        css=CSS,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m ui.app [options]``: the same as ``aoq ui [options]``."""
    from training.cli import main as aoq_main

    return aoq_main(["ui", *(argv or [])])


if __name__ == "__main__":
    raise SystemExit(main(__import__("sys").argv[1:]))
