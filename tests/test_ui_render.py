"""What the page shows, without a browser: render functions on contract JSON, plots, and the
event handlers against a fake search service, error paths included."""

from __future__ import annotations

import re

import pytest

from aoq_serve.schemas import (
    ExampleImage,
    FailureItem,
    FailuresOut,
    HealthOut,
    MetricsOut,
    ModelOut,
    NegativesOut,
    SearchImageOut,
    SearchTextOut,
)
from tests.ui_fake_backend import (
    BASE,
    CAPTIONS,
    METRICS,
    MODELS,
    FakeBackend,
    image_answer,
    text_answer,
)
from aoq_ui import handlers, plots
from aoq_ui.client import BackendError, BackendUnavailable
from aoq_ui.render import (
    TICK,
    failure_choices,
    media_url,
    pick_default_models,
    render_error,
    render_image_column,
    render_metrics_table,
    render_negatives,
    render_status,
    render_text_column,
)

PUBLIC = "http://public:8000"
RED0 = CAPTIONS[0][0]


def _srcs(html: str) -> list[str]:
    return re.findall(r'<img[^>]* src="([^"]+)"', html)


def _models(*specs: tuple[str, str, bool]) -> list[ModelOut]:
    return [ModelOut.model_validate({**MODELS[0], "name": n, "role": r, "enabled": e,
                                     "disabled_reason": None if e else "index missing"})
            for n, r, e in specs]


def _metrics(model: str, **fields: object) -> MetricsOut:
    """A /metrics answer; unset parts are empty, as for a model that was never evaluated."""
    return MetricsOut.model_validate({"model": model, "tables": {}, "curves": [], "rank_histogram": None, **fields})


# -- render ------------------------------------------------------------------------------------


def test_media_url_joins_relative_and_keeps_absolute():
    assert media_url(PUBLIC, "/images/3?size=64") == "http://public:8000/images/3?size=64"
    assert media_url(PUBLIC + "/", "images/3") == "http://public:8000/images/3"
    assert media_url(PUBLIC, "http://cdn.local/x.png") == "http://cdn.local/x.png"


def test_text_column_ticks_only_the_ground_truth():
    answer = SearchTextOut.model_validate(text_answer("aoq", RED0, [0, 2, 1, 3], 3))
    html = render_text_column(answer, "Right: aoq", PUBLIC)
    assert _srcs(html) == [f"{PUBLIC}/images/{i}?size=64" for i in (0, 2, 1)]
    assert html.count(TICK) == 1 and html.count("aoq-card aoq-gt") == 1
    assert 'data-image-id="0"><a href="http://public:8000/images/0"' in html
    assert "ground-truth image at rank <b>1</b>" in html
    assert "#1</span> 0.900" in html and "#3</span> 0.700" in html
    assert '<h4>Right: aoq</h4><div class="aoq-meta">1.5 ms \u00b7 ground-truth image at rank' in html


def test_text_column_shows_a_ground_truth_outside_the_top_k():
    answer = SearchTextOut.model_validate(text_answer("baseline", RED0, [2, 1, 0, 3], 2))
    html = render_text_column(answer, "Left: baseline", PUBLIC)
    assert TICK not in html
    assert "ground-truth image at rank <b>3</b>" in html
    assert _srcs(html) == [f"{PUBLIC}/images/0?size=96", f"{PUBLIC}/images/2?size=64", f"{PUBLIC}/images/1?size=64"]


def test_free_query_has_no_ground_truth_and_is_escaped():
    answer = SearchTextOut.model_validate(text_answer("aoq", "<script>x</script>", [1, 0], 2))
    html = render_text_column(answer, "Left: <b>", PUBLIC)
    assert "no ground truth (free query)" in html and TICK not in html
    assert "<script>" not in html and "Left: &lt;b&gt;" in html


def test_image_column_ticks_captions_and_escapes_text():
    raw = image_answer("baseline", 0, [7, 0, 1], 3)
    raw["results"][0]["text"] = "a <i>blue</i> square"
    html = render_image_column(SearchImageOut.model_validate(raw), "Left: baseline")
    assert html.count(TICK) == 2 and html.count('class="aoq-gt"') == 2
    assert "a &lt;i&gt;blue&lt;/i&gt; square" in html
    assert re.findall(r'data-caption-id="(\d+)"', html) == ["7", "0", "1"]
    assert "ground-truth caption at rank <b>2</b>" in html and "<img" not in html


def test_empty_results_say_so():
    answer = SearchTextOut.model_validate(text_answer("a", "q", [], 10))
    assert "No results." in render_text_column(answer, "Left: a", PUBLIC)


@pytest.mark.parametrize(
    ("error", "title"),
    [
        (BackendUnavailable("down"), "Search service unavailable"),
        (BackendError("bad k", status=422), "Rejected by the search service"),
        (BackendError("boom", status=500), "Error"),
        ("plain <message>", "Error"),
    ],
)
def test_error_box_titles_and_escaping(error, title):
    html = render_error(error)
    assert html.startswith(f'<div class="aoq-error" role="alert"><b>{title}:</b> ')
    assert "<message>" not in html


def test_default_models_by_role():
    models = _models(("aoq-run", "aoq", True), ("base-run", "baseline", True), ("x", "other", True))
    assert pick_default_models(models) == ("base-run", "aoq-run", [])


def test_missing_role_falls_back_with_a_warning():
    left, right, warnings = pick_default_models(_models(("b", "baseline", True), ("a", "aoq", False),
                                                        ("o", "other", True)))
    assert (left, right) == ("b", "o")
    assert warnings == ["No enabled model has role 'aoq'; showing 'o' in its place."]
    only = pick_default_models(_models(("b", "baseline", True)))
    assert only[:2] == ("b", "b")


def test_no_enabled_model():
    assert pick_default_models(_models(("b", "baseline", False))) == (
        None, None, ["The search service has no enabled model: build indexes with `aoq index`."])


def test_status_lists_models_and_disabled_reasons():
    health = HealthOut(status="ok", models=["b"], disabled={"a": "index missing", "ghost": "checkpoint gone"},
                    version="0.1.0")
    html = render_status(BASE, health, _models(("b", "baseline", True), ("a", "aoq", False)))
    assert f"<code>{BASE}</code>" in html and "models: b" in html and "version 0.1.0" in html
    assert "Model &#x27;a&#x27; is disabled: index missing" in html
    assert "Model &#x27;ghost&#x27; is disabled: checkpoint gone" in html
    assert html.count("aoq-error") == 2


def test_failure_choices_label_ranks():
    failures = FailuresOut(direction="t2i", which="baseline_only", left="baseline", right="aoq", total=2,
                           items=[FailureItem(query_id=4, query_text="x" * 80, left_rank=3, right_rank=1),
                                  FailureItem(query_id=5, query_text="short", left_rank=8, right_rank=2)])
    assert failure_choices(failures) == [
        ("x" * 67 + "...  [baseline: rank 3, aoq: rank 1]", 4),
        ("short  [baseline: rank 8, aoq: rank 2]", 5),
    ]
    images = failures.model_copy(update={"direction": "i2t"})
    assert failure_choices(images)[0][0] == "image 4  [baseline: rank 3, aoq: rank 1]"


def test_negatives_of_a_caption_are_images_and_of_an_image_captions():
    caption = NegativesOut.model_validate({"model": "aoq", "kind": "caption", "id": 3, "text": "a <red> square",
                                          "offline": [{"id": 9, "image_url": "/images/9", "rank": 1}],
                                          "online": [{"id": 2, "score": 0.5}]})
    anchor, offline, online = render_negatives(caption, PUBLIC)
    assert "Anchor caption 3: <q>a &lt;red&gt; square</q>" in anchor
    assert _srcs(offline) == [f"{PUBLIC}/images/9"] and "#1</span>" in offline
    assert _srcs(online) == [f"{PUBLIC}/images/2"] and "0.500</span>" in online
    image = NegativesOut.model_validate({"model": "aoq", "kind": "image", "id": 4,
                                         "offline": [{"id": 7, "text": "t1", "rank": 2}], "online": []})
    anchor, offline, online = render_negatives(image, PUBLIC)
    assert _srcs(anchor) == [f"{PUBLIC}/images/4"]
    assert '<li data-id="7"><span class="aoq-rank">#2</span> t1</li>' in offline
    assert "none" in online and "<img" not in offline


def test_metrics_table_rows():
    html = render_metrics_table([_metrics("baseline", **METRICS), _metrics("aoq")])
    assert html.count("<tr>") == 3
    assert ("<td>baseline</td><td>full</td><td>40.0</td><td>70.0</td><td>80.0</td><td>2.0</td><td>5.5</td>"
            "<td>30.0</td><td>60.0</td><td>75.0</td><td>3.0</td><td>7.2</td><td>355.0</td>") in html
    assert "<td>aoq</td><td colspan=\"12\">not evaluated</td>" in html
    assert "<th>i2t R@1</th>" in html and "<th>t2i meanr</th>" in html
    assert "Label-wise" not in html  # no model has labels


def test_metrics_table_adds_label_wise_rows_when_present():
    labels = {"k": 10, "n_labels": 6, "i2t": {"map_at_r": 0.5, "ndcg": 0.25},
              "t2i": {"map_at_r": None, "ndcg": 0.125}}
    html = render_metrics_table([MetricsOut.model_validate({"model": "goal", **METRICS, "labels": labels}),
                                 MetricsOut.model_validate({"model": "baseline", **METRICS})])
    assert "<th>i2t mAP@R</th>" in html and "<th>t2i NDCG@k</th>" in html
    assert ("<td>goal</td><td>6</td><td>50.0</td><td>25.0</td><td>n/a</td><td>12.5</td><td>10</td>") in html
    assert html.count("<td>baseline</td>") == 1  # recall table only


# -- plots -------------------------------------------------------------------------------------


def test_curve_positions_put_round_two_after_round_one():
    metrics = _metrics("aoq", curves=[
        {"epoch": 1, "round": 2, "i2t_r1": 3.0}, {"epoch": 0, "round": 2, "i2t_r1": 2.0},
        {"epoch": 1, "round": 1, "i2t_r1": 1.0}, {"epoch": 0, "round": 1, "i2t_r1": 0.5}])
    placed = plots.curve_positions(metrics.curves)
    assert [(x, p.round, p.epoch) for x, p in placed] == [(1, 1, 0), (2, 1, 1), (3, 2, 0), (4, 2, 1)]
    fig = plots.recall_curves_figure([metrics])
    lines = fig.axes[0].get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[1, 2], [3, 4]]
    assert [line.get_label() for line in lines] == ["aoq (round 1)", "aoq (round 2)"]
    assert fig.axes[1].get_lines() == []  # no t2i values given


def test_histogram_shares_align_bins_across_models():
    a = _metrics("a", rank_histogram={"bins": ["1", "2-5"], "counts": [3, 1]})
    b = _metrics("b", rank_histogram={"bins": ["1", ">5"], "counts": [1, 1]})
    bins, shares = plots.histogram_table([a, b, _metrics("c")])
    assert bins == ["1", "2-5", ">5"]
    assert shares == {"a": [75.0, 25.0, 0.0], "b": [50.0, 0.0, 50.0]}
    fig = plots.rank_histogram_figure([a, b])
    assert len(fig.axes[0].patches) == 6
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == bins


def test_empty_plots_say_so():
    assert plots.recall_curves_figure([_metrics("a")]).axes[0].texts[0].get_text() == \
        "no training curves recorded"
    assert plots.rank_histogram_figure([]).axes[0].texts[0].get_text() == "no rank histogram recorded"


# -- handlers against the fake service ----------------------------------------------------------


def test_load_page_fills_models_and_examples():
    fake = FakeBackend()
    page = handlers.load_page(fake.client(PUBLIC))
    assert (page.left, page.right) == ("baseline", "aoq")
    assert page.model_choices == [("baseline (baseline, max_violation, vse)", "baseline"),
                                  ("aoq (aoq, adaptive_offline_quintuplet, vse)", "aoq")]
    assert len(page.example_captions) == handlers.N_EXAMPLES and len(page.example_images) == 4
    assert page.train_picks[0] == (f"caption 100: {RED0}", "caption:100")
    assert page.train_picks[-1] == ("image 103", "image:103")
    assert "aoq-error" not in page.status_html and "models: baseline, aoq" in page.status_html


def test_load_page_when_the_backend_is_down():
    page = handlers.load_page(FakeBackend(down=True).client())
    assert page.model_choices == [] and page.left is None and page.example_captions == []
    assert "Search service unavailable" in page.status_html and "aoq serve" in page.status_html


def test_load_page_with_the_aoq_model_missing():
    fake = FakeBackend(models=[dict(MODELS[0]), {**MODELS[1], "enabled": False, "disabled_reason": "no index"}])
    page = handlers.load_page(fake.client())
    assert (page.left, page.right) == ("baseline", "baseline")
    assert "Model &#x27;aoq&#x27; is disabled: no index" in page.status_html
    assert "No enabled model has role &#x27;aoq&#x27;" in page.status_html


def test_load_page_survives_failing_examples():
    page = handlers.load_page(FakeBackend(fail={"/examples": (404, "no test split")}).client())
    assert page.left == "baseline" and page.example_captions == []
    assert "Could not load example queries: no test split" in page.status_html


def test_search_text_side_by_side():
    fake = FakeBackend()
    query, left, right = handlers.search_text(fake.client(PUBLIC), f"  {RED0} ", "baseline", "aoq", 3)
    assert query == f'<div class="aoq-query">Query: <q>{RED0}</q></div>'
    assert "ground-truth image at rank <b>3</b>" in left and left.count(TICK) == 1
    assert "ground-truth image at rank <b>1</b>" in right and right.count(TICK) == 1
    assert "<h4>Left: baseline</h4>" in left and "<h4>Right: aoq</h4>" in right


def test_search_text_checks_input_before_calling():
    fake = FakeBackend()
    assert handlers.search_text(fake.client(), "   ", "baseline", "aoq", 3)[0] == \
        '<div class="aoq-notice">Type a query or pick an example.</div>'
    message, left, right = handlers.search_text(fake.client(), "q", None, "aoq", 3)
    assert "Pick a model for each column" in message and (left, right) == ("", "")
    assert fake.requests == []


def test_search_text_shows_the_backend_detail():
    message, left, right = handlers.search_text(FakeBackend().client(), "q", "baseline", "gone", 3)
    assert message == ('<div class="aoq-error" role="alert"><b>Rejected by the search service:</b> '
                       "unknown model &#x27;gone&#x27;; known: [&#x27;baseline&#x27;, &#x27;aoq&#x27;]</div>")
    assert (left, right) == ("", "")
    down = handlers.search_text(FakeBackend(down=True).client(), "q", "baseline", "aoq", 3)
    assert "Search service unavailable" in down[0]


def test_search_image_from_gallery_and_upload(tmp_path):
    fake = FakeBackend()
    client = fake.client(PUBLIC)
    image = ExampleImage(id=0, image_url="/images/0", thumbnail_url="/images/0?size=64")
    query, left, right = handlers.search_image(client, "baseline", "aoq", 5, image=image)
    assert _srcs(query) == [f"{PUBLIC}/images/0"] and "test image 0" in query
    assert left.count(TICK) == 3 and right.count(TICK) == 4
    upload = tmp_path / "mine.png"
    upload.write_bytes(b"png")
    query, left, _ = handlers.search_image(client, "baseline", "aoq", 5, upload=upload)
    assert "uploaded image mine.png" in query and "no ground truth (free query)" in left
    assert handlers.search_image(client, "baseline", "aoq", 5)[0] == \
        '<div class="aoq-notice">Click a test image or upload one.</div>'


def test_failures_list_then_show_each_direction():
    client = FakeBackend().client(PUBLIC)
    summary, choices, items = handlers.list_failures(client, "t2i", "baseline_only", 20, "baseline", "aoq")
    assert "<b>7</b> case(s) in the test split, 1 listed" in summary
    assert choices == [(f"{RED0}  [baseline: rank 3, aoq: rank 1]", 0)]
    query, left, right = handlers.show_failure(client, "t2i", items[0], "baseline", "aoq", 3)
    assert RED0 in query and "rank <b>3</b>" in left and "rank <b>1</b>" in right
    _, _, items = handlers.list_failures(client, "i2t", "both", 20, "baseline", "aoq")
    query, left, right = handlers.show_failure(client, "i2t", items[1], "baseline", "aoq", 3)
    assert _srcs(query) == [f"{PUBLIC}/images/1"] and "data-caption-id" in left
    assert "Pick a case" in handlers.show_failure(client, "t2i", None, "baseline", "aoq", 3)[0]


def test_failures_error_clears_the_list():
    client = FakeBackend(fail={"/failures": (404, "no evaluation cache for model 'aoq'")}).client()
    summary, choices, items = handlers.list_failures(client, "t2i", "both", 20, "baseline", "aoq")
    assert "no evaluation cache for model &#x27;aoq&#x27;" in summary and choices == [] and items == {}


def test_negatives_handler_and_its_404():
    client = FakeBackend().client(PUBLIC)
    anchor, offline, online = handlers.show_negatives(client, "caption", 3.0, "aoq", 5)
    assert "Anchor caption 3" in anchor and _srcs(offline) == [f"{PUBLIC}/images/3"]
    missing = FakeBackend(fail={"/negatives": (404, "no mined negatives are registered for model 'baseline'")})
    message = handlers.show_negatives(missing.client(), "caption", 3, "baseline", 5)[0]
    assert "Rejected by the search service:</b> no mined negatives are registered" in message
    assert "Enter a training caption" in handlers.show_negatives(client, "caption", None, "aoq", 5)[0]
    assert handlers.parse_train_pick("image:12") == ("image", 12)
    assert handlers.parse_train_pick("image:x") is None and handlers.parse_train_pick(None) is None


def test_metrics_handler():
    table, curves, histogram = handlers.show_metrics(FakeBackend().client(), ["baseline", "aoq"])
    assert table.count("<td>full</td>") == 2
    assert len(curves.axes[0].get_lines()) == 2 and len(histogram.axes[0].patches) == 8
    table, curves, histogram = handlers.show_metrics(FakeBackend().client(), ["baseline", "nope"])
    assert "unknown model &#x27;nope&#x27;" in table and curves is None and histogram is None
