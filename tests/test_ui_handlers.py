"""The page's events against a fake search service (tests/ui_fake_backend.py), error paths
included: what each returns for the query line and the two columns."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlsplit

from tests.ui_fake_backend import CAPTIONS, MODELS, FakeBackend
from aoq_ui import handlers
from aoq_ui.render import TICK

RED0 = CAPTIONS[0][0]


def _share(html: str) -> dict[str, list[str]]:
    href = re.search(r'<a class="aoq-share" href="([^"]+)"', html).group(1)
    return parse_qs(urlsplit(href.replace("&amp;", "&")).query)


def test_load_page_fills_models_examples_and_the_catalogue_line():
    page = handlers.load_page(FakeBackend().client())
    assert (page.left, page.right) == ("baseline", "aoq")
    assert page.model_choices == [("baseline (max_violation, vse)", "baseline"),
                                  ("aoq (adaptive_offline_quintuplet, vse)", "aoq")]
    # the fake's examples: the first 12 captions, those of the twins twice, each text offered once
    assert [c.id for c in page.example_captions] == [0, 1, 2, 3, 4, 10, 11]
    assert page.train_picks[0] == (f"caption 100: {RED0}", "caption:100")
    assert page.train_picks[-1] == ("image 103: yellow square", "image:103")
    assert "aoq-error" not in page.status_html and "models: baseline, aoq" in page.status_html
    assert "6 pictures and 30 captions in 2 split(s) (train 2 \u00b7 test 4)" in page.status_html


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


def test_search_text_side_by_side_with_a_link_to_the_view_and_an_export():
    fake = FakeBackend()
    query, left, right = handlers.search_text(fake.client(), f"  {RED0} ", "baseline", "aoq", 4, "all")
    assert "first correct image at <b>#3</b>" in left and left.count(TICK) == 2
    assert "first correct image at <b>#1</b>" in right and right.count(TICK) == 2
    assert "<h4>Left: baseline</h4>" in left and "<h4>Right: aoq</h4>" in right
    assert _share(query) == {"tab": ["t2i"], "q": [RED0], "left": ["baseline"], "right": ["aoq"], "k": ["4"],
                             "scope": ["all"], "normalise": ["none"]}
    assert 'download="aoq-red-square-number-0.csv" href="data:text/csv;base64,' in query


def test_search_text_checks_input_before_calling():
    fake = FakeBackend()
    assert handlers.search_text(fake.client(), "   ", "baseline", "aoq", 3)[0] == \
        '<div class="aoq-notice">Type a query or pick an example.</div>'
    message, left, right = handlers.search_text(fake.client(), "q", None, "aoq", 3)
    assert "Pick a model for each column" in message and (left, right) == ("", "")
    assert fake.requests == []


def test_a_failed_search_replaces_the_results():
    message, left, right = handlers.search_text(FakeBackend().client(), "q", "baseline", "gone", 3)
    assert message == ('<div class="aoq-error" role="alert"><b>Rejected by the search service:</b> '
                       "unknown model &#x27;gone&#x27;; known: [&#x27;baseline&#x27;, &#x27;aoq&#x27;]</div>")
    assert (left, right) == ("", "")
    down = handlers.search_text(FakeBackend(down=True).client(), "q", "baseline", "aoq", 3)
    assert "Search service unavailable" in down[0] and down[1:] == ("", "")


def test_search_image_from_the_gallery_and_an_upload(tmp_path):
    client = FakeBackend().client()
    query, left, right = handlers.search_image(client, "baseline", "aoq", 5, "test", image_id=0,
                                               image_url="/media/images/0")
    assert re.findall(r'<img class="aoq-queryimg" src="([^"]+)"', query) == ["/media/images/0"]
    assert left.count(TICK) == 3 and right.count(TICK) == 4
    assert _share(query) == {"tab": ["i2t"], "image": ["0"], "left": ["baseline"], "right": ["aoq"], "k": ["5"],
                             "scope": ["test"], "normalise": ["none"]}
    upload = tmp_path / "mine.png"
    upload.write_bytes(b"\x89PNG")
    query, left, _ = handlers.search_image(client, "baseline", "aoq", 5, upload=upload)
    assert "uploaded picture mine.png" in query and "data:image/png;base64,iVBORw==" in query
    assert "aoq-share" not in query and "aoq-uploaded-picture.csv" in query  # an upload cannot be linked, only exported
    assert handlers.search_image(client, "baseline", "aoq", 5)[0] == \
        '<div class="aoq-notice">Click a picture of the gallery or upload one.</div>'


def test_a_bad_upload_shows_the_services_message_and_clears_the_columns(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_text("not a picture")
    message, left, right = handlers.search_image(FakeBackend().client(), "baseline", "aoq", 5, upload=bad)
    assert "Rejected by the search service:</b> the uploaded file is not an image Pillow can read" in message
    assert (left, right) == ("", "")


def test_run_last_repeats_a_views_query_with_new_settings():
    fake = FakeBackend()
    client = fake.client()
    assert handlers.run_last(client, {}, "baseline", "aoq", 5, "all") is None
    query, left, _ = handlers.run_last(client, {"text": RED0}, "baseline", "aoq", 2, "test")
    assert left.count("aoq-card") == 2 and "scope: test split only" in query
    _, left, _ = handlers.run_last(client, {"image_id": 1, "image_url": "/media/images/1"}, "baseline", "aoq", 3,
                                   "all")
    assert left.count("<li") == 3
    assert [r.url.path for r in fake.requests] == ["/compare/text", "/compare/image"]


def _normalise_lines(html: str) -> list[str]:
    return re.findall(r'<div class="aoq-meta aoq-normalise">([^<]*)</div>', html)


def test_the_hubness_switch_goes_to_both_compares_their_headers_and_the_link(tmp_path):
    fake = FakeBackend()
    client = fake.client()
    query, left, right = handlers.search_text(client, RED0, "baseline", "aoq", 3, "test", "qbnorm")
    assert json.loads(fake.requests[-1].content)["normalise"] == "qbnorm"
    kept = "ranked by QB-Norm: this query&#x27;s top-1 is no bank query&#x27;s top-1, raw order kept"
    assert _normalise_lines(left) == _normalise_lines(right) == [kept]
    assert _share(query)["normalise"] == ["qbnorm"]
    query, left, right = handlers.search_image(client, "baseline", "aoq", 2, "test", "invsoftmax", image_id=1,
                                               image_url="/media/images/1")
    assert b'name="normalise"\r\n\r\ninvsoftmax' in fake.requests[-1].content
    assert _normalise_lines(left) == _normalise_lines(right) == ["ranked by inverted softmax: log-normalised scores"]
    assert _share(query) == {"tab": ["i2t"], "image": ["1"], "left": ["baseline"], "right": ["aoq"], "k": ["2"],
                             "scope": ["test"], "normalise": ["invsoftmax"]}
    upload = tmp_path / "mine.png"
    upload.write_bytes(b"\x89PNG")
    handlers.search_image(client, "baseline", "aoq", 2, "test", "qbnorm", upload=upload)
    assert b'name="normalise"\r\n\r\nqbnorm' in fake.requests[-1].content
    # unset, a view ranks by raw scores
    _, left, _ = handlers.search_text(client, RED0, "baseline", "aoq", 3)
    assert json.loads(fake.requests[-1].content)["normalise"] == "none"
    assert _normalise_lines(left) == ["raw scores (no hubness correction)"]
    # the whole catalogue holds the bank's own split: the service's refusal takes the query line
    query, left, right = handlers.search_text(client, RED0, "baseline", "aoq", 3, "all", "qbnorm")
    assert "Rejected by the search service:</b> hubness correction &#x27;qbnorm&#x27; is refused in scope " \
           "&#x27;all&#x27;: it holds the train split" in query and (left, right) == ("", "")


def test_run_last_repeats_a_views_query_under_its_hubness_correction(tmp_path):
    fake = FakeBackend()
    client = fake.client()
    upload = tmp_path / "mine.png"
    upload.write_bytes(b"\x89PNG")
    for last in ({"text": RED0}, {"image_id": 1, "image_url": "/media/images/1"}, {"upload": str(upload)}):
        _, left, _ = handlers.run_last(client, last, "baseline", "aoq", 2, "test", "invsoftmax")
        assert _normalise_lines(left) == ["ranked by inverted softmax: log-normalised scores"]
        handlers.run_last(client, last, "baseline", "aoq", 2, "test")
    sent = [json.loads(r.content)["normalise"] if r.url.path == "/compare/text" else
            re.search(rb'name="normalise"\r\n\r\n(\w+)', r.content).group(1).decode() for r in fake.requests]
    assert sent == ["invsoftmax", "none"] * 3


def test_an_index_without_a_hubness_bank_shows_the_services_409_and_clears_the_columns():
    detail = ("model 'aoq': its index holds no hubness bank (built before normalisation existed); run aoq index "
              "again, or search with normalise none")
    fake = FakeBackend(fail={"/compare/text": (409, detail), "/compare/image": (409, detail)})
    for columns in (handlers.search_text(fake.client(), RED0, "baseline", "aoq", 3, "all", "qbnorm"),
                    handlers.search_image(fake.client(), "baseline", "aoq", 3, "all", "invsoftmax", image_id=1)):
        assert columns == ('<div class="aoq-error" role="alert"><b>Rejected by the search service:</b> model '
                           "&#x27;aoq&#x27;: its index holds no hubness bank (built before normalisation existed); "
                           "run aoq index again, or search with normalise none</div>", "", "")


def test_gallery_pages_filter_and_come_back_from_past_the_end():
    client = FakeBackend().client()
    pictures, page, line = handlers.gallery_page(client, "all", "", 0)
    assert [p.image_id for p in pictures] == list(range(6)) and page == 0
    assert "Pictures 1\u20136 of 6 in the whole catalogue (page 1 of 1)" in line
    pictures, page, line = handlers.gallery_page(client, "test", "red", 3)
    assert [p.name for p in pictures] == ["red square", "red square"] and page == 0
    assert "matching \u201cred\u201d" in line
    assert "No picture of the test split matching \u201cflag\u201d." in handlers.gallery_page(client, "test", "flag", 0)[2]


def test_failures_pages_then_show_each_direction():
    client = FakeBackend().client()
    summary, choices, listed, page = handlers.list_failures(client, "t2i", "baseline_only", 5, 1, "baseline", "aoq")
    assert "cases 6\u20136 of <b>7</b>" in summary and page == 1
    assert "it opens in the scope they were evaluated in (test split only, raw scores)" in summary
    assert choices == [(f"6. {RED0}  [baseline: rank 3, aoq: rank 1]", 0)]
    last = handlers.failure_query(listed, 0)
    assert {k: last[k] for k in ("text", "scope", "normalise")} == {"text": RED0, "scope": "test", "normalise": "none"}
    # opened in its own scope and raw scores, whatever the page's settings say
    query, left, right = handlers.run_last(client, last, "baseline", "aoq", 4, "all", "qbnorm")
    assert "Opened as evaluated: test split only, raw scores" in query and "baseline rank 3, aoq rank 1" in query
    assert "scope: test split only" in query and "raw scores (no hubness correction)" in left
    summary, _, _, page = handlers.list_failures(client, "i2t", "both", 5, 9, "baseline", "aoq")
    assert page == 1 and "cases 6\u20136" in summary  # past the end: the last page
    _, _, listed, _ = handlers.list_failures(client, "i2t", "both", 5, 0, "baseline", "aoq")
    assert {k: v for k, v in handlers.failure_query(listed, 2).items() if k.startswith("image")} == \
        {"image_id": 2, "image_url": "/media/images/2"}
    assert handlers.failure_query(listed, None) == {} == handlers.failure_query(None, 2)


def test_failures_error_clears_the_list():
    client = FakeBackend(fail={"/failures": (404, "no evaluation cache for model 'aoq'")}).client()
    summary, choices, listed, page = handlers.list_failures(client, "t2i", "both", 20, 0, "baseline", "aoq")
    assert "no evaluation cache for model &#x27;aoq&#x27;" in summary and (choices, listed, page) == ([], None, 0)


def test_negatives_handler_and_its_404():
    client = FakeBackend().client()
    anchor, offline, online = handlers.show_negatives(client, "caption", 3.0, "aoq", 5)
    assert "training caption 3" in anchor and "/media/images/3?size=64" in offline
    missing = FakeBackend(fail={"/negatives": (404, "no mined negatives are registered for model 'baseline'")})
    message = handlers.show_negatives(missing.client(), "caption", 3, "baseline", 5)[0]
    assert "Rejected by the search service:</b> no mined negatives are registered" in message
    assert "Enter a training caption" in handlers.show_negatives(client, "caption", None, "aoq", 5)[0]
    assert handlers.parse_train_pick("image:12") == ("image", 12)
    assert handlers.parse_train_pick("image:x") is None and handlers.parse_train_pick(None) is None


def test_metrics_handler_and_the_plot_notes():
    client = FakeBackend().client()
    models = client.models()
    table, curves, histogram = handlers.show_metrics(client, ["baseline", "aoq"], models)
    assert table.count("<td>full</td>") == 2 and "Checkpoints were selected on: baseline: rsum 171.6" in table
    assert len(curves.axes[0].get_lines()) == 2 and len(histogram.axes[0].patches) == 8
    table, curves, histogram = handlers.show_metrics(client, ["baseline", "nope"])
    assert "unknown model &#x27;nope&#x27;" in table and curves is None and histogram is None
    curves_note, histogram_note = handlers.plot_notes(models)
    assert curves_note.startswith("R@1 after each training epoch on the dev split")
    assert "of the test split" in histogram_note and "pair rule" in histogram_note
