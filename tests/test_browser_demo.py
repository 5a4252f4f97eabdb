"""The real demo in a real Chromium: pretrained EfficientNet-Lite0 + MiniLM with trained heads on
the quick emoji subset (the session's ``python -m aoq_cli.demo --quick`` run, tests/conftest.py:
120 emoji, the flag of Japan among them, in a temporary folder with its own feature cache), the
real service and the UI.

Checks what a newcomer would judge by eye: a common thing is found in the whole catalogue and the
test scope says where it went; every picture is named; twins are one answer and the marks agree
with the ranks; a bad upload shows the service's message in place of the results; a copied link
reopens the same view; the comparison downloads. Saves a screenshot of every tab under
``artifacts/browser/`` (``AOQ_UPDATE_SCREENSHOT=1`` also refreshes docs/ui-*.png).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from tests.backend_helpers import run_server
from tests.demo_helpers import demo_env
from tests.browser_helpers import (
    REPO,
    WAIT_S,
    By,
    announced,
    chromium,
    columns_loaded,
    listen_to_live_regions,
    no_error_shown,
    open_page,
    requested,
    screenshot,
    serve_ui,
    set_k,
    set_scope,
    tab,
    text,
    type_query,
    wait,
)
from aoq_ui.export import COLUMNS, file_name

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FREE_TEXT = "a yellow face wearing sunglasses"  # words no training caption of the subset has together
TAB_BUTTONS = {  # tab -> (main button, element whose content shows the button's answer, screenshot)
    "Text to image": ("t2i-search", "t2i-left", None),
    "Image to text": ("i2t-upload-search", "i2t-query", None),
    "Failure cases": ("failures-list", "failures-summary", "ui-failures.png"),
    "Offline negatives": ("negatives-show", "negatives-offline", "ui-negatives.png"),
    "Metrics": ("metrics-refresh", "metrics-table", "ui-metrics.png"),
}


@pytest.fixture(scope="module")
def emoji_demo(quick_demo) -> Iterator[tuple[str, str]]:
    """The quick demo's models (run once for the session, tests/conftest.py), served by the real
    service and the UI with the demo's example queries: (backend, UI) URLs."""
    from aoq_serve.config import Settings
    from aoq_ui.examples import load_example_queries

    root, first = quick_demo
    assert first.returncode == 0, first.stderr[-3000:]
    env = demo_env(root)
    run = root / "runs" / "demo-emoji-quick"
    settings = Settings(models_dir=run / "models", index_dir=run / "index", data_dir=root / "data",
                        reload_poll_s=0.0, port=0)
    previous = os.environ.get("AOQ_FEATURE_CACHE")
    os.environ["AOQ_FEATURE_CACHE"] = env["AOQ_FEATURE_CACHE"]  # the negatives read the demo's cache
    try:
        with run_server(settings) as backend:
            demo, ui = serve_ui(backend, example_queries=load_example_queries(REPO / "configs" / "emoji_queries.yaml"))
            try:
                yield backend, ui
            finally:
                demo.close()
    finally:
        if previous is None:
            os.environ.pop("AOQ_FEATURE_CACHE", None)
        else:
            os.environ["AOQ_FEATURE_CACHE"] = previous


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def driver(downloads):
    yield from chromium(downloads)


def _names(driver, prefix: str, side: str) -> list[str]:
    """The names under a text view's pictures, in rank order."""
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, f"#{prefix}-{side} .aoq-card .aoq-name")]


def _tiles(driver, prefix: str, side: str) -> list[tuple[int, str, str, bool]]:
    """(rank, name, alt text, ticked) of a text view's pictures."""
    out = []
    for card in driver.find_elements(By.CSS_SELECTOR, f"#{prefix}-{side} .aoq-card"):
        rank = int(re.search(r"#(\d+)", card.text).group(1))
        alt = card.find_element(By.TAG_NAME, "img").get_attribute("alt")
        out.append((rank, card.find_element(By.CSS_SELECTOR, ".aoq-name").text, alt,
                    "aoq-gt" in card.get_attribute("class")))
    return out


def _header_ranks(column: str) -> tuple[float, float | None]:
    """(rank in the searched scope, rank as evaluated) from a column's header."""
    in_list = float(re.search(r"first correct \w+ at #([\d.]+) of [\d,]+ searched", column).group(1))
    evaluated = re.search(r"rank ([\d.]+) among the test split's", column)
    return in_list, float(evaluated.group(1)) if evaluated else None


def _gallery_id(backend: str, name: str) -> int:
    found = httpx.get(f"{backend}/gallery", params={"scope": "test", "q": name, "limit": 10}).json()["images"]
    return next(i["image_id"] for i in found if i["name"] == name)


def test_flag_of_japan_is_found_in_the_catalogue_and_the_test_scope_says_where_it_is(driver, emoji_demo):
    backend, ui = emoji_demo
    open_page(driver, ui)
    status = text(driver, "status")
    assert re.search(r"Catalogue emoji: \d+ pictures and [\d,]+ captions in 3 split\(s\) \(train \d+ \u00b7 dev \d+ "
                     r"\u00b7 test \d+\)", status), status
    assert "Ground truth, ranks, failure cases and metrics: test split" in status and "positives rule text" in status
    type_query(driver, "flag of Japan")
    wait(driver, lambda d: "flag of Japan" in text(d, "t2i-query-line") and columns_loaded(d, "t2i", 5))
    for side in ("left", "right"):
        tiles = _tiles(driver, "t2i", side)
        assert "flag: Japan" in [name for _, name, _, _ in tiles], tiles
        assert all(name and alt == name for _, name, alt, _ in tiles)  # every picture named, for eyes and ears
        assert "train split" in text(driver, f"t2i-{side}")  # the flag is a training item, and marked so
    no_error_shown(driver)
    screenshot(driver, "emoji-text-to-image", "ui-text-to-image.png", "t2i-query-line")
    # the pictures came through the page's own server, and nothing from outside the machine
    urls = requested(driver)
    assert {urlparse(u).netloc for u in urls if "/images/" in u} == {urlparse(ui).netloc}
    assert {urlparse(u).hostname for u in urls} <= {"127.0.0.1"}

    set_scope(driver, "test split only")
    wait(driver, lambda d: "Searching the test split only" in text(d, "t2i-query-line") and columns_loaded(d, "t2i", 5))
    notice = text(driver, "t2i-query-line")
    assert "Outside it the whole catalogue has a higher-scoring item: \u201cflag: Japan\u201d (train split" in notice
    assert "train split" not in text(driver, "t2i-left") and "flag: Japan" not in _names(driver, "t2i", "left")
    screenshot(driver, "emoji-test-scope", scroll_to="t2i-query-line")


def test_twins_are_one_answer_and_the_marks_agree_with_the_ranks(driver, emoji_demo):
    backend, ui = emoji_demo
    # both vendors' sharks are in the test split: the text rule makes each a correct picture of "shark"
    open_page(driver, f"{ui}?tab=t2i&q=shark&k=12&scope=test")
    wait(driver, lambda d: columns_loaded(d, "t2i", 12))
    for side in ("left", "right"):
        tiles, column = _tiles(driver, "t2i", side), text(driver, f"t2i-{side}")
        assert [name for _, name, _, ticked in tiles if ticked] == ["shark", "shark"], tiles
        first = min(rank for rank, _, _, ticked in tiles if ticked)
        assert _header_ranks(column) == (first, first), column

    # each column holds the second shark, a twin: the "one drawing per name" switch is offered, and
    # it hides the twins in the page while the ranks still count them
    switch = driver.find_element(By.ID, "t2i-one-drawing")
    twins = driver.find_elements(By.CSS_SELECTOR, "#t2i-left .aoq-twin, #t2i-right .aoq-twin")
    assert switch.is_displayed() and twins and all(t.is_displayed() for t in twins)
    switch.find_element(By.TAG_NAME, "input").click()
    wait(driver, lambda d: not any(t.is_displayed() for t in twins))
    for side in ("left", "right"):
        cards = driver.find_elements(By.CSS_SELECTOR, f"#t2i-{side} .aoq-card")
        shown = [int(re.search(r"#(\d+)", c.text).group(1)) for c in cards if c.is_displayed()]
        hidden = [int(re.search(r"#(\d+)", c.get_attribute("textContent")).group(1)) for c in cards
                  if not c.is_displayed()]
        assert hidden and sorted(shown + hidden) == list(range(1, 13)), (shown, hidden)
        assert _names(driver, "t2i", side).count("shark") == 1  # the first shark stays

    shark = _gallery_id(backend, "shark")
    open_page(driver, f"{ui}?tab=i2t&image={shark}&k=12&scope=test")
    wait(driver, lambda d: all(len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{s} li")) == 12 for s in ("left", "right")))
    own = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#i2t-query ul li")]
    assert "shark" in own
    for side in ("left", "right"):
        rows = driver.find_elements(By.CSS_SELECTOR, f"#i2t-{side} li")
        texts = [re.sub(r"^#\d+ | \u00d7\d+| \u2714| \(score [\d.]+\)|only this column$", "", r.text) for r in rows]
        assert len(texts) == len(set(texts)), texts  # a caption text once, however many pictures carry it
        ticked = [(int(re.match(r"#(\d+)", r.text).group(1)), t) for r, t in zip(rows, texts)
                  if "aoq-gt" in (r.get_attribute("class") or "")]
        assert ticked and {t for _, t in ticked} <= set(own), ticked
        assert "\u00d74" in rows[texts.index("shark")].text  # two captions of each shark say "shark"
        assert _header_ranks(text(driver, f"i2t-{side}")) == (ticked[0][0], ticked[0][0])
        assert all(r.find_element(By.TAG_NAME, "img").get_attribute("alt") for r in rows)  # each with its picture
    no_error_shown(driver)
    screenshot(driver, "emoji-image-to-text", "ui-image-to-text.png", "i2t-query")


def test_a_bad_upload_shows_the_services_message_in_place_of_the_results(driver, emoji_demo, tmp_path):
    backend, ui = emoji_demo
    bad = tmp_path / "holiday.png"
    bad.write_text("a text file that says it is a picture\n")
    detail = httpx.post(f"{backend}/compare/image", data={"k": 3},
                        files={"file": (bad.name, bad.read_bytes(), "image/png")}).json()["detail"]
    open_page(driver, f"{ui}?tab=i2t&image={_gallery_id(backend, 'shark')}&k=3")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#i2t-left li")) == 3)
    driver.find_element(By.CSS_SELECTOR, "#i2t-upload input[type=file]").send_keys(str(bad))
    wait(driver, lambda d: ".png" in text(d, "i2t-upload"))
    driver.find_element(By.ID, "i2t-upload-search").click()
    wait(driver, lambda d: detail in text(d, "i2t-query"))
    assert text(driver, "i2t-query").startswith("Rejected by the search service: ")
    assert driver.find_elements(By.CSS_SELECTOR, "#i2t-left li, #i2t-right li") == []  # the old results are gone
    assert not [e for e in driver.find_elements(By.CSS_SELECTOR, "[data-testid='toast-body']") if e.is_displayed()]


def test_a_link_reopens_the_view_and_the_comparison_downloads(driver, emoji_demo, downloads):
    _, ui = emoji_demo
    open_page(driver, ui)
    listen_to_live_regions(driver)
    type_query(driver, FREE_TEXT)
    wait(driver, lambda d: FREE_TEXT in text(d, "t2i-query-line") and columns_loaded(d, "t2i", 5))
    set_k(driver, 7)  # changing k runs the query again
    wait(driver, lambda d: columns_loaded(d, "t2i", 7))
    # the same model on both sides is said
    driver.find_element(By.CSS_SELECTOR, "#right-model input").click()
    wait(driver, lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, "ul[role=listbox] li")
                                 if o.text.startswith("baseline")), None)).click()
    wait(driver, lambda d: "Both columns show the same model (baseline)" in text(d, "t2i-query-line"))
    wait(driver, lambda d: "right=baseline" in d.current_url)
    address = parse_qs(urlparse(driver.current_url).query)
    assert address == {"tab": ["t2i"], "q": [FREE_TEXT], "left": ["baseline"], "right": ["baseline"], "k": ["7"],
                       "scope": ["all"], "normalise": ["none"]}
    shown = {side: _names(driver, "t2i", side) for side in ("left", "right")}
    # Gradio's status line speaks when the event has ended, which may come after the columns show
    said = wait(driver, announced)
    assert not [s for s in said if "common." in s], said  # no untranslated keys read aloud

    link = driver.current_url
    open_page(driver, link)
    wait(driver, lambda d: columns_loaded(d, "t2i", 7))
    assert {side: _names(driver, "t2i", side) for side in ("left", "right")} == shown
    assert driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea").get_attribute("value") == FREE_TEXT

    driver.find_element(By.CSS_SELECTOR, "#t2i-query-line a.aoq-export").click()
    saved = downloads / file_name(FREE_TEXT)
    wait(driver, lambda d: saved.is_file() and saved.stat().st_size > 0, timeout=WAIT_S)
    rows = list(csv.reader(saved.open()))
    assert rows[0] == list(COLUMNS) and len(rows) == 1 + 2 * 7
    assert [r[9] for r in rows[1:8]] == shown["left"]
    assert {r[0] for r in rows[1:]} == {FREE_TEXT} and {r[4] for r in rows[1:]} == {"none"}


def test_real_demo_free_text_and_example_queries(driver, emoji_demo):
    _, ui = emoji_demo
    open_page(driver, ui)
    left = driver.find_element(By.CSS_SELECTOR, "#left-model input").get_attribute("value")
    assert "effnet_lite0" in left, left  # the pretrained image encoder serves this page
    type_query(driver, FREE_TEXT)
    wait(driver, lambda d: FREE_TEXT in text(d, "t2i-query-line") and columns_loaded(d, "t2i", 5))
    no_error_shown(driver)
    # A fine-grained example from configs/emoji_queries.yaml runs as free text too.
    example = "woman firefighter"
    button = next(b for b in driver.find_elements(By.CSS_SELECTOR, "#t2i-free-examples button")
                  if b.text.strip() == example)
    button.click()
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#t2i-query textarea").get_attribute("value") == example
         and example in text(d, "t2i-query-line") and columns_loaded(d, "t2i", 5))
    no_error_shown(driver)


def test_real_demo_upload_finds_captions_like_the_indexed_picture(driver, emoji_demo, tmp_path):
    backend, ui = emoji_demo
    # Through the API first: the upload of a gallery picture's file is featurised by the same
    # backbone and head as the index, so it ranks the captions as that picture does.
    image = httpx.get(f"{backend}/examples", params={"split": "test", "n": 1}).json()["images"][0]
    png = httpx.get(f"{backend}{urlparse(image['image_url']).path}").content
    by_id = httpx.post(f"{backend}/compare/image", data={"image_id": image["id"], "k": 5}).json()
    uploaded = httpx.post(f"{backend}/compare/image", data={"k": 5},
                          files={"file": ("picture.png", png, "image/png")}).json()
    for side in ("left", "right"):
        assert [r["text"] for r in uploaded[side]["results"]] == [r["text"] for r in by_id[side]["results"]]
        assert [r["score"] for r in uploaded[side]["results"]] == pytest.approx(
            [r["score"] for r in by_id[side]["results"]], abs=1e-4)

    picture = tmp_path / "upload.png"
    picture.write_bytes(png)
    open_page(driver, ui)
    tab(driver, "Image to text")
    driver.find_element(By.CSS_SELECTOR, "#i2t-upload input[type=file]").send_keys(str(picture))
    wait(driver, lambda d: ".png" in text(d, "i2t-upload"))
    driver.find_element(By.ID, "i2t-upload-search").click()
    wait(driver, lambda d: all(len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{side} li")) == 5
                               for side in ("left", "right")))
    assert "uploaded picture upload.png" in text(driver, "i2t-query")
    no_error_shown(driver)


def test_every_tab_answers_its_main_button_with_the_defaults(driver, emoji_demo):
    _, ui = emoji_demo
    open_page(driver, ui)
    for name, (button, answer, shot) in TAB_BUTTONS.items():
        tab(driver, name)
        if name == "Offline negatives":  # it starts on a training caption, not on an empty list
            pick = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#negatives-pick input").get_attribute("value"))
            assert pick.startswith("caption "), pick
        if name == "Failure cases":  # every case of both directions, five a page
            next(e for e in driver.find_elements(By.CSS_SELECTOR, "label") if e.text == "both wrong at rank 1").click()
            per_page = driver.find_element(By.CSS_SELECTOR, "#failures-per-page input[type=number]")
            per_page.clear()
            per_page.send_keys("5")
        driver.find_element(By.ID, button).click()
        wait(driver, lambda d: d.find_element(By.ID, answer).text.strip())
        no_error_shown(driver)
        if name == "Failure cases":
            summary = text(driver, "failures-summary")
            assert re.search(r"cases 1\u20135 of [\d,]+( \([\d,]+ queries[^)]*\))?\. Ranks of the test split "
                             r"\([\d,]+ images\), positives rule text", summary), summary
            assert len(driver.find_elements(By.CSS_SELECTOR, "#failures-summary td img")) == 5
            driver.find_element(By.ID, "failures-next").click()
            wait(driver, lambda d: "cases 6\u2013" in text(d, "failures-summary"))
        if name == "Metrics":
            wait(driver, lambda d: "R@1 after each training epoch on the dev split" in text(d, "metrics-curves-note")
                 and d.find_elements(By.CSS_SELECTOR, "#metrics-curves img, #metrics-curves svg"))
            assert "cross-retrieval rank" in text(driver, "metrics-histogram-note")
            assert "measured on" in text(driver, "metrics-table") and "Checkpoints were selected on" in \
                text(driver, "metrics-table")
        if shot:
            screenshot(driver, f"emoji-{name.lower().replace(' ', '-')}", shot)


def test_real_demo_negatives_read_cached_backbone_features(emoji_demo, monkeypatch):
    """No online-negatives request runs a backbone: the training split's features come from the
    cache training filled, and only the projection heads run (the service runs in this process)."""
    from aoq.models.pretrained import EffNetImageEncoder, MiniLMTextEncoder

    backend, _ = emoji_demo

    def refuse(*args, **kwargs):
        raise AssertionError("a backbone ran for /negatives")

    monkeypatch.setattr(EffNetImageEncoder, "backbone_features", refuse)
    monkeypatch.setattr(MiniLMTextEncoder, "backbone_features", refuse)
    train = httpx.get(f"{backend}/examples", params={"split": "train", "n": 2}).json()
    for kind, item in (("caption", train["captions"][1]["id"]), ("image", train["images"][1]["id"])):
        answer = httpx.get(f"{backend}/negatives", params={"kind": kind, "id": item, "model": "aoq", "n": 5})
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["online"]) == 5 and len(answer.json()["offline"]) == 5
