"""How the UI names a re-ranker (a cross-attention model over another model's shortlist): its
column heading and its entry in the model pickers, from the REST answers alone."""

from __future__ import annotations

from aoq_serve.schemas import ModelOut, SearchImageOut, SearchTextOut
from aoq_ui.render import column_title, model_label, render_image_column, render_text_column
from tests.ui_fake_backend import CAPTIONS, MODELS, ORDERS_I2T, ORDERS_T2I, image_answer, text_answer

RED0 = CAPTIONS[0][0]
RERANK = {"kind": "bfan", "shortlist_by": "baseline", "shortlist_n": 100}


def _text(model: str, rerank: dict | None) -> SearchTextOut:
    answer = text_answer("baseline", RED0, ORDERS_T2I["baseline"], 4)
    return SearchTextOut.model_validate({**answer, "model": model, "context": {**answer["context"], "rerank": rerank}})


def test_a_reranker_column_names_the_kind_the_shortlist_and_its_model():
    assert column_title("Right", _text("bfan", RERANK)) == "Right: BFAN, re-ranking the top 100 of baseline"
    assert column_title("Left", _text("bfan-prob", RERANK)) == \
        "Left: BFAN, re-ranking the top 100 of baseline (bfan-prob)"
    assert column_title("Left", _text("aoq", None)) == "Left: aoq"
    html = render_text_column(_text("bfan", RERANK), column_title("Right", _text("bfan", RERANK)))
    assert "<h4>Right: BFAN, re-ranking the top 100 of baseline</h4>" in html


def test_an_image_column_of_a_reranker_is_named_the_same_way():
    answer = image_answer("baseline", 0, ORDERS_I2T["baseline"], 5)
    out = SearchImageOut.model_validate({**answer, "model": "scan",
                                         "context": {**answer["context"], "rerank": {**RERANK, "kind": "scan"}}})
    assert "<h4>Left: SCAN, re-ranking the top 100 of baseline</h4>" in render_image_column(out, column_title("Left", out))


def test_the_model_picker_says_what_a_reranker_reranks():
    card = ModelOut.model_validate({**MODELS[0], "name": "bfan", "image_encoder": "bfan", "shortlist_by": "baseline",
                                    "shortlist_n": 100})
    assert model_label(card) == "bfan (BFAN, re-ranking the top 100 of baseline)"
