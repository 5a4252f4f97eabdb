"""The pieces of the comparison that read themselves (ui/render.py, ui/render_analysis.py,
ui/seeds.py): the verdict line, results only one column lists, results as links to the search by
them, twin drawings marked for the "one drawing per name" switch, and the served seed beside the
multi-seed result."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from aoq_serve.schemas import MetricsOut, ModelOut, SearchImageOut, SearchTextOut
from aoq_ui.render import render_image_column, render_text_column, render_text_query
from aoq_ui.render_analysis import render_seed_note
from aoq_ui.seeds import ResultsError, load_seed_summary
from aoq_ui.state import View
from tests.ui_fake_backend import CAPTIONS, METRICS, MODELS, ORDERS_I2T, ORDERS_T2I, image_answer, text_answer

RED0 = CAPTIONS[0][0]


def _text(model: str, query: str = RED0, k: int = 4, scope: str = "all") -> SearchTextOut:
    return SearchTextOut.model_validate(text_answer(model, query, ORDERS_T2I[model], k, scope))


def _image(model: str, image_id: int | None = 0, k: int = 5) -> SearchImageOut:
    return SearchImageOut.model_validate(image_answer(model, image_id, ORDERS_I2T[model], k))


def test_a_rank_inside_a_shown_row_of_copies_is_among_the_shown():
    # five rows, ranks 1, 2, 4, 6, 7 with copies 1, 2, 2, 1, 2: the list covers ranks 1 to 8
    answer = _image("baseline")
    inside = render_image_column(answer.model_copy(update={"scope_rank": 8}), "Left: baseline")
    beyond = render_image_column(answer.model_copy(update={"scope_rank": 9}), "Left: baseline")
    assert "at <b>#8</b> of 30 searched, among the 5 shown" in inside
    assert "at <b>#9</b> of 30 searched, not among the 5 shown" in beyond


def test_the_verdict_line_reads_the_comparison_and_names_the_intended_answer():
    html = render_text_query(_text("baseline"), _text("aoq"))
    assert ("<b>Verdict:</b> first correct answer baseline #3, aoq #1, of 2 correct in the whole catalogue (all "
            "splits), 4 shown.") in html
    answer = lambda model: SearchTextOut.model_validate(  # noqa: E731
        text_answer(model, "a red one", ORDERS_T2I[model], 4, intended=RED0))
    html = render_text_query(answer("baseline"), answer("aoq"))
    assert f"Verdict:</b> intended answer \u201c{RED0}\u201d; first correct answer baseline #3, aoq #1, of 2 " in html


def test_results_only_one_column_lists_are_marked():
    left, right = _text("baseline", k=3), _text("aoq", k=3)  # baseline 4, 2, 0; aoq 0, 2, 1
    marked = lambda html: re.findall(r'<figure class="aoq-card[^"]*" data-image-id="(\d+)".*?</figure>', html)  # noqa: E731
    only = lambda html: [i for i, f in zip(marked(html), re.findall(r"<figure.*?</figure>", html))  # noqa: E731
                         if "only this column" in f]
    assert only(render_text_column(left, "L", right)) == ["4"] and only(render_text_column(right, "R", left)) == ["1"]
    assert "only this column" not in render_text_column(left, "L")
    html = render_image_column(_image("baseline"), "L", _image("aoq"))
    rows = re.findall(r'<li[^>]*data-caption-id="(\d+)".*?</li>', html)
    assert [r for r, li in zip(rows, re.findall(r"<li.*?</li>", html)) if "only this column" in li] == ["22"]


def test_a_result_links_to_the_search_by_it_and_twin_drawings_are_marked():
    settings = View(tab="t2i", query=RED0, left="baseline", right="aoq", k=4, scope="test", normalise="none")
    html = render_text_column(_text("aoq"), "R", search_by=settings)  # aoq: 0, 2, 1, 3 (0 and 1 are twins)
    links = re.findall(r'<a href="([^"]+)" class="aoq-search-by"', html)
    assert links[0] == "?tab=i2t&amp;image=0&amp;left=baseline&amp;right=aoq&amp;k=4&amp;scope=test&amp;normalise=none"
    assert re.findall(r'class="aoq-card[^"]*aoq-twin[^"]*" data-image-id="(\d+)"', html) == ["1"]
    assert html.count('class="aoq-enlarge" href="/images/') == 4
    rows = render_image_column(_image("aoq"), "R", search_by=replace(settings, tab="i2t", query=None))
    assert '<a class="aoq-search-by" title="search by this caption" href="?tab=t2i&amp;q=red+square+number+0&amp;' \
           "left=baseline" in rows


def test_the_metrics_tab_puts_the_served_seed_beside_the_multi_seed_result(tmp_path):
    page = tmp_path / "results.md"
    page.write_text("| method | rsum | \u0394 rsum vs baseline [95% CI] |\n|---|---:|---:|\n"
                    "| Baseline (VSE++ max violation) | 178.9 \u00b1 8.1 | \u2014 |\n"
                    "| AdapOffQuin (Eq. 5, AOQ) | 182.9 \u00b1 11.0 | +4.0 [-1.3, +9.3] (n=2) |\n\n"
                    "| seed | baseline | aoq |\n|---|---:|---:|\n| seed0 | 167.3 | 178.0 |\n| seed1 | 166.0 | 156.4 |\n")
    summary = load_seed_summary(page)
    assert (summary.baseline_rsum, summary.aoq_rsum, summary.difference) == \
        ("178.9 \u00b1 8.1", "182.9 \u00b1 11.0", "+4.0 [-1.3, +9.3] (n=2)")
    assert summary.per_seed == {0: (167.3, 178.0), 1: (166.0, 156.4)}
    models = [ModelOut.model_validate(m) for m in MODELS]
    served = [MetricsOut.model_validate({**METRICS, "model": m}) for m in ("baseline", "aoq")]
    html = render_seed_note(summary, served, models)
    assert ("The demo serves one seed (0): baseline rsum 355.0, AOQ 355.0, AOQ \u2212 baseline +0.0. Over 2 seeds "
            "(results.md): baseline rsum 178.9 \u00b1 8.1, AOQ 182.9 \u00b1 11.0; AOQ \u2212 baseline +4.0 [-1.3, "
            "+9.3] (n=2), a paired 95% interval over the seeds. One seed can be far from the mean: per seed, AOQ "
            "\u2212 baseline ran from \u22129.6 to +10.7") in html
    assert render_seed_note(None, served, models) == ""
    repo = Path(__file__).resolve().parents[1]
    assert len(load_seed_summary(repo / "docs" / "results-emoji.md").per_seed) >= 2  # the demo's page parses
    (tmp_path / "other.md").write_text("# no tables\n")
    with pytest.raises(ResultsError, match="other.md: no baseline and AOQ rows"):
        load_seed_summary(tmp_path / "other.md")


def test_an_intended_answer_the_catalogue_lacks_is_judged_by_eye():
    answer = lambda model: SearchTextOut.model_validate(  # noqa: E731
        text_answer(model, "a purple thing", ORDERS_T2I[model], 4, intended="purple circle"))
    html = render_text_query(answer("baseline"), answer("aoq"))
    assert ("<b>Free text: judge by eye.</b> Its intended answer \u201cpurple circle\u201d is no caption of this "
            "catalogue") in html and "Verdict" not in html
