"""What the page shows, without a browser: render functions on contract JSON, the export, the
view in the address, and the plots."""

from __future__ import annotations

import base64
import csv
import io
import re

import pytest

from aoq_serve.schemas import (
    CompareImageOut,
    CompareTextOut,
    DatasetOut,
    FailureItem,
    FailuresOut,
    HealthOut,
    Measured,
    MetricsOut,
    ModelOut,
    NegativesOut,
    SearchImageOut,
    SearchTextOut,
)
from tests.ui_fake_backend import (
    BASE,
    CAPTIONS,
    EVALUATED,
    METRICS,
    MODELS,
    ORDERS_I2T,
    ORDERS_T2I,
    image_answer,
    text_answer,
)
from aoq_ui import plots
from aoq_ui.client import BackendError, BackendUnavailable
from aoq_ui.export import COLUMNS, comparison_csv, download_link, file_name
from aoq_ui.render import (
    TICK,
    measured_label,
    model_label,
    pick_default_models,
    render_error,
    render_image_column,
    render_image_query,
    render_status,
    render_text_column,
    render_text_query,
)
from aoq_ui.render_analysis import (
    failure_choices,
    render_failures,
    render_metrics_table,
    render_negatives,
    render_selection,
)
from aoq_ui.state import View, parse_view, view_query

RED0 = CAPTIONS[0][0]


def _srcs(html: str) -> list[str]:
    return re.findall(r'<img[^>]* src="([^"]+)"', html)


def _alts(html: str) -> list[str]:
    return re.findall(r'<img[^>]* alt="([^"]*)"', html)


def _models(*specs: tuple[str, str, bool]) -> list[ModelOut]:
    return [ModelOut.model_validate({**MODELS[0], "name": n, "role": r, "enabled": e,
                                     "disabled_reason": None if e else "index missing"})
            for n, r, e in specs]


def _metrics(model: str, **fields: object) -> MetricsOut:
    """A /metrics answer; unset parts are empty, as for a model that was never evaluated."""
    return MetricsOut.model_validate({"model": model, "tables": {}, "curves": [], "rank_histogram": None, **fields})


def _text(model: str, query: str = RED0, k: int = 4, scope: str = "all") -> SearchTextOut:
    return SearchTextOut.model_validate(text_answer(model, query, ORDERS_T2I[model], k, scope))


def _image(model: str, image_id: int | None = 0, k: int = 5) -> SearchImageOut:
    return SearchImageOut.model_validate(image_answer(model, image_id, ORDERS_I2T[model], k))


# -- the result columns ------------------------------------------------------------------------


def test_text_column_names_every_picture_marks_the_twins_and_the_training_split():
    html = render_text_column(_text("baseline"), "Left: baseline")
    assert _srcs(html) == [f"/images/{i}?size=64" for i in (4, 2, 0, 1)]
    assert _alts(html) == ["flag: Japan", "blue square", "red square", "red square"]
    assert re.findall(r'class="aoq-name">([^<]*)<', html) == ["flag: Japan", "blue square", "red square", "red square"]
    assert html.count(TICK) == 2 and html.count("aoq-card aoq-gt") == 2  # both twins are correct
    assert html.count("train split</span>") == 1  # the one training picture, marked
    assert ('<h4>Left: baseline</h4><div class="aoq-meta">1.5 ms \u00b7 6 images searched \u00b7 first correct image '
            "at <b>#3</b> of 6 searched, among the 4 shown \u00b7 rank 3 among the test split's images, as evaluated</div>") in html
    assert '#1</span> <span class="aoq-rank">score 0.900</span>' in html


def test_free_text_has_no_truth_line_and_is_escaped():
    html = render_text_column(_text("aoq", "<script>x</script>", 2), "Left: <b>")
    assert "first correct" not in html and TICK not in html
    assert "<script>" not in html and "Left: &lt;b&gt;" in html


def test_image_column_lists_each_text_once_with_its_copies_and_picture():
    html = render_image_column(_image("baseline"), "Left: baseline")
    assert re.findall(r'data-caption-id="(\d+)"', html) == ["12", "0", "1", "22", "2"]
    assert re.findall(r'class="aoq-rank">#(\d+)<', html) == ["1", "2", "4", "6", "7"]  # a row stands for its copies
    assert html.count("\u00d72</span>") == 3 and html.count(TICK) == 3
    assert _alts(html) == ["blue square", "red square", "red square", "flag: Japan", "red square"]
    assert "first correct caption at <b>#2</b> of " in html


def test_image_column_escapes_text():
    raw = image_answer("baseline", 0, [0], 1)
    raw["results"][0]["text"] = "a <i>blue</i> square"
    html = render_image_column(SearchImageOut.model_validate(raw), "Left: baseline")
    assert "a &lt;i&gt;blue&lt;/i&gt; square" in html and "<i>" not in html


def test_empty_results_say_so():
    answer = SearchTextOut.model_validate(text_answer("baseline", "q", [], 10))
    assert "No results." in render_text_column(answer, "Left: a")


# -- the query line ----------------------------------------------------------------------------


def test_text_query_line_shows_the_correct_pictures_by_name_and_the_rule():
    html = render_text_query(_text("baseline"), _text("aoq"), "<p>links</p>")
    assert html.startswith(f'<div class="aoq-query">Query: <q>{RED0}</q> \u00b7 scope: whole catalogue (all splits)')
    assert "Correct answers by the positives rule text" in html and "the other vendor" in html
    assert _alts(html) == ["red square", "red square"] and html.endswith("<p>links</p>")
    assert "same model" not in html


def test_free_text_query_line_says_why_nothing_is_correct():
    html = render_text_query(_text("baseline", "flag of Japan"), _text("aoq", "flag of Japan"))
    assert "<b>Free text: judge by eye.</b> No caption of the catalogue has this text" in html
    assert "Verdict" not in html


def test_test_scope_says_what_is_left_out_and_the_better_match_outside():
    left, right = _text("baseline", "flag of Japan", scope="test"), _text("aoq", "flag of Japan", scope="test")
    html = render_text_query(left, right)
    assert "scope: test split only" in html
    assert ("Searching the test split only (4 items); the training and dev splits are left out. Outside it the whole "
            "catalogue has a higher-scoring item: \u201cflag: Japan\u201d (train split, #1 in the whole catalogue, the scope "
            "\u2018whole catalogue (all splits)\u2019).") in html
    assert 'role="status"' in html


def test_the_same_model_twice_is_said():
    html = render_text_query(_text("aoq"), _text("aoq"))
    assert "Both columns show the same model (aoq)" in html


def test_image_query_line_shows_the_picture_its_name_and_own_captions():
    html = render_image_query(_image("baseline"), _image("aoq"), "picture 0", "/media/images/0")
    assert _srcs(html) == ["/media/images/0"] and _alts(html) == ["red square"]
    assert [f"red square number {j}" for j in range(5)] == re.findall(r"<li>([^<]*)</li>", html)
    assert "\u00d7n: n captions of the searched scope have this text" in html
    upload = render_image_query(_image("baseline", None), _image("aoq", None), "uploaded picture a.png",
                                "data:image/png;base64,AA==")
    assert "An uploaded picture: no caption of the catalogue is marked correct." in upload


# -- status, defaults, errors ------------------------------------------------------------------


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


def test_status_lists_models_disabled_reasons_and_what_the_catalogue_holds():
    health = HealthOut(status="ok", models=["b"], disabled={"a": "index missing", "ghost": "checkpoint gone"},
                       version="0.1.0")
    dataset = DatasetOut.model_validate({"name": "synth", "n_images": 7273, "n_captions": 36365, "synthetic": False,
                                         "splits": {"dev": {"images": 599, "captions": 2995},
                                                    "test": {"images": 924, "captions": 4620},
                                                    "train": {"images": 5750, "captions": 28750}}})
    html = render_status(BASE, health, _models(("b", "baseline", True), ("a", "aoq", False)), datasets=[dataset])
    assert f"<code>{BASE}</code>" in html and "models: b" in html and "version 0.1.0" in html
    assert ("Catalogue <b>synth</b>: 7,273 pictures and 36,365 captions in 3 split(s) "
            "(train 5,750 \u00b7 dev 599 \u00b7 test 924)") in html
    assert "Ground truth, ranks, failure cases and metrics: test split (4 images), positives rule text, seed 0" in html
    assert "Model &#x27;a&#x27; is disabled: index missing" in html
    assert "Model &#x27;ghost&#x27; is disabled: checkpoint gone" in html
    assert html.count("aoq-error") == 2


def test_measured_label_says_split_size_protocol_rule_and_seeds():
    assert measured_label(Measured.model_validate(EVALUATED)) == "test split (4 images), positives rule text, seed 0"
    assert measured_label(Measured(split="dev", n_images=599, protocol="full", positives="pair", seeds=[0, 1])) == \
        "dev split (599 images), full protocol, positives rule pair, mean of seeds 0, 1"
    assert measured_label(None).startswith("origin not recorded")


# -- analysis tabs -----------------------------------------------------------------------------


def _failures(direction: str = "t2i", offset: int = 20) -> FailuresOut:
    return FailuresOut(direction=direction, which="baseline_only", left="baseline", right="aoq", total=45,
                       offset=offset, measured=Measured.model_validate(EVALUATED),
                       items=[FailureItem(query_id=4, query_text="x" * 80, image_name="red square",
                                          thumbnail_url="/media/images/0?size=64", left_rank=3, right_rank=1),
                              FailureItem(query_id=5, query_text="short", image_name="blue <b>", left_rank=8.5,
                                          right_rank=2)])


def test_failure_choices_are_numbered_on_the_page_and_label_ranks():
    assert failure_choices(_failures()) == [
        ("21. " + "x" * 67 + "...  [baseline: rank 3, aoq: rank 1]", 4),
        ("22. short  [baseline: rank 8.5, aoq: rank 2]", 5),
    ]
    images = _failures("i2t").model_copy(update={"items": [FailureItem(query_id=9, image_name="cat", left_rank=2,
                                                                         right_rank=1)]})
    assert failure_choices(images)[0][0] == "21. cat  [baseline: rank 2, aoq: rank 1]"


def test_failures_page_says_which_cases_of_how_many_and_the_rule():
    html = render_failures(_failures())
    assert "cases 21\u201322 of <b>45</b>" in html
    assert "Ranks of the test split (4 images), positives rule text, seed 0: identical caption texts" in html
    assert re.findall(r"<th>([^<]*)</th>", html) == ["#", "query caption", "its picture", "rank, baseline", "rank, aoq"]
    assert _srcs(html) == ["/media/images/0?size=64"] and _alts(html) == ["red square"]
    assert "<td>8.5</td>" in html
    empty = render_failures(_failures().model_copy(update={"items": []}))
    assert "none of <b>45</b> on this page" in empty and "<table" not in empty


def test_negatives_show_text_and_picture_of_every_item():
    caption = NegativesOut.model_validate({"model": "aoq", "kind": "caption", "id": 3, "text": "a <red> square",
                                          "image_url": "/media/images/1",
                                          "offline": [{"id": 9, "text": "cat", "image_url": "/media/images/9",
                                                       "rank": 1}],
                                          "online": [{"id": 2, "text": "dog", "image_url": "/media/images/2",
                                                      "score": 0.5}]})
    anchor, offline, online = render_negatives(caption)
    assert "training caption 3, <q>a &lt;red&gt; square</q>" in anchor and _srcs(anchor) == ["/media/images/1"]
    assert _srcs(offline) == ["/media/images/9"] and "mined #1</span>" in offline and 'class="aoq-name">cat<' in offline
    assert _srcs(online) == ["/media/images/2"] and "score 0.500</span>" in online
    image = NegativesOut.model_validate({"model": "aoq", "kind": "image", "id": 4, "text": "owl",
                                         "image_url": "/media/images/4",
                                         "offline": [{"id": 7, "text": "t1", "image_url": "/media/images/8",
                                                      "rank": 2}], "online": []})
    anchor, offline, online = render_negatives(image)
    assert "training image 4, <b>owl</b>" in anchor and _srcs(anchor) == ["/media/images/4"]
    assert '<li data-id="7"><img src="/media/images/8" alt="t1" title="t1"><span><span class="aoq-rank">mined #2</span> ' \
           '<span class="aoq-text">t1</span></span></li>' in offline
    assert "none" in online and "struck through" not in offline


def test_negatives_strike_through_what_the_filters_removed_and_name_the_filter():
    answer = NegativesOut.model_validate({
        "model": "aoq", "kind": "image", "id": 4, "text": "owl", "image_url": "/media/images/4",
        "filters": ["identity", "semantic"], "online": [],
        "offline": [{"id": 7, "text": "an owl", "image_url": "/media/images/4", "rank": 1, "removed_by": "semantic"},
                    {"id": 8, "text": "a cat", "image_url": "/media/images/5", "rank": 2}]})
    _, offline, _ = render_negatives(answer)
    assert "struck through: removed as a likely false negative (filters: identity, semantic)" in offline
    assert re.findall(r'<li( class="aoq-removed")? data-id="(\d+)"', offline) == [(' class="aoq-removed"', "7"), ("", "8")]
    assert offline.count("removed: ") == 1 and "removed: semantic</span>" in offline
    _, one, _ = render_negatives(answer.model_copy(update={"filters": ["identity"]}))
    assert "removed as a likely false negative (filter: identity)" in one
    cards = render_negatives(answer.model_copy(update={"kind": "caption"}))[1]  # image negatives: cards
    assert '<figure class="aoq-card aoq-removed" data-id="7">' in cards and '<figure class="aoq-card" data-id="8">' in cards


def test_negatives_mark_correct_matches_and_say_the_lists_were_not_filtered():
    answer = NegativesOut.model_validate({
        "model": "aoq", "kind": "caption", "id": 4, "text": "grinning face", "image_url": "/media/images/4",
        "online": [], "offline": [{"id": 7, "text": "grinning face", "image_url": "/media/images/7", "rank": 1,
                                   "correct": True},
                                  {"id": 8, "text": "cat", "image_url": "/media/images/8", "rank": 2}]})
    _, offline, _ = render_negatives(answer)
    assert "mined without false-negative filters" in offline and "struck through" not in offline
    assert offline.count("correct match</span>") == 1 and "a correct match (same caption text" in offline
    assert re.search(r'data-id="7">.*correct match</span>.*data-id="8"', offline)


def test_metrics_table_says_where_each_row_comes_from():
    html = render_metrics_table([_metrics("baseline", **METRICS), _metrics("aoq")])
    assert html.count("<tr>") == 3
    assert ("<td>baseline</td><td>test split (4 images), positives rule text, seed 0</td><td>full</td><td>40.0</td>"
            "<td>70.0</td><td>80.0</td><td>2.0</td><td>5.5</td><td>30.0</td><td>60.0</td><td>75.0</td><td>3.0</td>"
            "<td>7.2</td><td>355.0</td>") in html
    assert "<td>aoq</td><td colspan=\"13\">not evaluated</td>" in html
    assert "Positives rule text: identical caption texts are one answer" in html
    assert "Label-wise" not in html  # no model has labels


def test_metrics_table_adds_label_wise_rows_when_present():
    labels = {"k": 10, "n_labels": 6, "i2t": {"map_at_r": 0.5, "ndcg": 0.25},
              "t2i": {"map_at_r": None, "ndcg": 0.125}}
    html = render_metrics_table([MetricsOut.model_validate({"model": "goal", **METRICS, "labels": labels}),
                                 MetricsOut.model_validate({"model": "baseline", **METRICS})])
    assert "<th>i2t mAP@R</th>" in html and "<th>t2i NDCG@k</th>" in html
    assert ("<td>goal</td><td>6</td><td>50.0</td><td>25.0</td><td>n/a</td><td>12.5</td><td>10</td>") in html


def test_selection_line_labels_the_models_own_dev_figures():
    models = [ModelOut.model_validate(m) for m in MODELS]
    html = render_selection(models, ["baseline", "aoq"])
    assert ("baseline: rsum 171.6 (dev split (2 images), full protocol, positives rule text, seed 0) \u00b7 "
            "aoq: rsum 165.5") in html
    assert render_selection(models, []) == ""


# -- export and the address --------------------------------------------------------------------


def test_export_holds_both_columns_with_names_scores_and_marks():
    answer = CompareTextOut(query=RED0, left=_text("baseline"), right=_text("aoq"))
    rows = list(csv.reader(io.StringIO(comparison_csv(answer))))
    assert rows[0] == list(COLUMNS) and len(rows) == 9
    assert rows[1] == [RED0, "left", "baseline", "all", "none", "text", "1", "0.900000", "0", "flag: Japan", "1",
                       "train", "4", ""]
    assert rows[5][:10] == [RED0, "right", "aoq", "all", "none", "text", "1", "0.900000", "1", "red square"]
    images = CompareImageOut(left=_image("baseline"), right=_image("aoq"))
    rows = list(csv.reader(io.StringIO(comparison_csv(images))))
    assert rows[2][0] == "picture 0: red square" and rows[2][9:] == [CAPTIONS[0][0], "2", "test", "0", "0"]
    link = download_link(answer)
    data = re.search(r'href="data:text/csv;base64,([^"]+)"', link).group(1)
    assert base64.b64decode(data).decode() == comparison_csv(answer)
    assert 'download="aoq-red-square-number-0.csv"' in link
    assert file_name("Flag of Japan!") == "aoq-flag-of-japan.csv" and file_name("\u2764") == "aoq-query.csv"
    assert download_link(CompareImageOut(left=_image("baseline", None), right=_image("aoq", None))).count(
        'download="aoq-uploaded-picture.csv"') == 1


def test_the_address_round_trips_a_view_and_drops_what_does_not_parse():
    view = View(tab="t2i", query="flag of Japan", left="baseline", right="aoq", k=5, scope="test", normalise="qbnorm")
    assert view_query(view) == \
        "?tab=t2i&q=flag+of+Japan&left=baseline&right=aoq&k=5&scope=test&normalise=qbnorm"
    assert parse_view({"tab": "t2i", "q": "flag of Japan", "left": "baseline", "right": "aoq", "k": "5",
                       "scope": "test", "normalise": "qbnorm"}) == view
    assert parse_view({"tab": "i2t", "image": "812"}) == View(tab="i2t", image=812)
    assert parse_view({"tab": "i2t", "image": "812", "normalise": "invsoftmax"}) == \
        View(tab="i2t", image=812, normalise="invsoftmax")
    assert parse_view({"tab": "nope", "k": "1000", "image": "-3", "scope": "some", "q": "  ",
                       "normalise": "csls"}) == View()


# -- plots -------------------------------------------------------------------------------------


def test_curves_start_each_round_at_its_own_epoch_one():
    metrics = _metrics("aoq", curves=[
        {"epoch": 2, "round": 2, "i2t_r1": 3.0}, {"epoch": 1, "round": 2, "i2t_r1": 2.0},
        {"epoch": 2, "round": 1, "i2t_r1": 1.0}, {"epoch": 1, "round": 1, "i2t_r1": 0.5}],
        curves_measured={**EVALUATED, "split": "dev"})
    placed = plots.curve_positions(metrics.curves)
    assert [(x, p.round, p.epoch) for x, p in placed] == [(1, 1, 1), (2, 1, 2), (1, 2, 1), (2, 2, 2)]
    fig = plots.recall_curves_figure([metrics])
    lines = fig.axes[0].get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[1, 2], [1, 2]]
    assert [line.get_label() for line in lines] == ["aoq (round 1)", "aoq (round 2)"]
    assert fig.axes[0].get_title() == "image \u2192 text R@1, dev split"
    assert fig.axes[0].get_xlabel() == "epoch of the model's own training round"
    assert fig.axes[1].get_lines() == []  # no t2i values given


def test_histogram_shares_align_bins_across_models():
    a = _metrics("a", rank_histogram={"bins": ["1", "2-5"], "counts": [3, 1]}, measured=EVALUATED)
    b = _metrics("b", rank_histogram={"bins": ["1", ">5"], "counts": [1, 1]})
    bins, shares = plots.histogram_table([a, b, _metrics("c")])
    assert bins == ["1", "2-5", ">5"]
    assert shares == {"a": [75.0, 25.0, 0.0], "b": [50.0, 0.0, 50.0]}
    fig = plots.rank_histogram_figure([a, b])
    assert len(fig.axes[0].patches) == 6
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == bins
    assert fig.axes[0].get_title() == "Cross-retrieval rank histogram (test split, pair rule)"


def test_empty_plots_say_so():
    assert plots.recall_curves_figure([_metrics("a")]).axes[0].texts[0].get_text() == \
        "no training curves recorded"
    assert plots.rank_histogram_figure([]).axes[0].texts[0].get_text() == "no rank histogram recorded"


def test_each_column_header_names_its_normalisation():
    from aoq_ui.render import NORMALISE_LABELS

    plain = render_text_column(_text("baseline"), "Left: baseline")
    assert f'<div class="aoq-meta aoq-normalise">{NORMALISE_LABELS["none"]}</div>' in plain
    answer = _text("baseline")
    kept = answer.model_copy(update={"context": answer.context.model_copy(update={"normalise": "qbnorm"})})
    assert "ranked by QB-Norm: this query&#x27;s top-1 is no bank query&#x27;s top-1, raw order kept" in \
        render_text_column(kept, "Left: baseline")
    applied = answer.model_copy(update={"context": answer.context.model_copy(
        update={"normalise": "invsoftmax", "normalised": True})})
    assert "ranked by inverted softmax: log-normalised scores" in render_text_column(applied, "Left: baseline")


def test_the_hubness_switch_offers_every_normalisation_of_the_contract_once():
    from aoq.names import NORMALISATIONS
    from aoq_ui.render import NORMALISE_CHOICES

    assert NORMALISE_CHOICES == [("none", "none"), ("QB-Norm (dynamic inverted softmax)", "qbnorm"),
                                 ("inverted softmax", "invsoftmax")]
    assert [value for _, value in NORMALISE_CHOICES] == list(NORMALISATIONS)


def test_model_label_names_the_role_only_where_the_name_does_not():
    same, other = _models(("aoq-fn-identity", "aoq-fn-identity", True), ("mine", "baseline", True))
    assert model_label(same) == f"aoq-fn-identity ({same.loss}, {same.image_encoder})"
    assert model_label(other) == f"mine (baseline, {other.loss}, {other.image_encoder})"
