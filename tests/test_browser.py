"""End to end in a real Chromium: the real search service (tiny synthetic catalogue) and the
comparison UI on 127.0.0.1, driven with Selenium as a user would. The real demo models have
their own module (tests/test_browser_demo.py).

Saves screenshots to ``artifacts/browser/`` (``AOQ_ARTIFACTS_DIR`` overrides).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import re

import httpx
import pytest
from PIL import Image

from aoq.net import free_port
from aoq_ui.examples import ExampleQuery
from tests.backend_helpers import build_service_fixture, run_server
from tests.browser_helpers import (
    By,
    chromium,
    columns_loaded,
    loaded_widths,
    open_page,
    requested,
    screenshot,
    serve_ui,
    set_scope,
    tab,
    text,
    type_query,
    wait,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory) -> Iterator[str]:
    fixture = build_service_fixture(tmp_path_factory.mktemp("service"))
    with run_server(fixture.settings()) as url:
        yield url


#: a showcased free-text example of the synthetic catalogue, judged by the test caption it intends
SHOWCASE = "the picture my words describe"


@pytest.fixture(scope="module")
def ui_url(backend_url) -> Iterator[str]:
    intended = httpx.get(f"{backend_url}/examples", params={"split": "test", "n": 1}).json()["captions"][0]["text"]
    demo, url = serve_ui(backend_url, example_queries=[ExampleQuery("showcase", SHOWCASE, intended)])
    try:
        yield url
    finally:
        demo.close()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    yield from chromium(tmp_path_factory.mktemp("downloads"))


def _showcase_query(backend_url: str) -> str:
    """A test caption that AOQ ranks right and the baseline wrong, if any (as in paper Fig. 5);
    else the first example caption."""
    failures = httpx.get(f"{backend_url}/failures",
                         params={"direction": "t2i", "which": "baseline_only", "limit": 1}).json()
    if failures["items"]:
        return failures["items"][0]["query_text"]
    return httpx.get(f"{backend_url}/examples", params={"split": "test", "n": 1}).json()["captions"][0]["text"]


def test_text_query_shows_images_in_both_columns(driver, ui_url, backend_url):
    query = _showcase_query(backend_url)
    open_page(driver, ui_url)
    status = text(driver, "status")
    assert all(name in status for name in ("aoq", "baseline", "pixels")) and "unavailable" not in status, status
    assert "Catalogue synth: 40 pictures and 200 captions in 3 split(s) (train 24 \u00b7 dev 4 \u00b7 test 12)" in status

    type_query(driver, query)
    wait(driver, lambda d: columns_loaded(d, "t2i", 5))
    left, right = text(driver, "t2i-left"), text(driver, "t2i-right")
    for column, title in ((left, "Left: baseline\n"), (right, "Right: aoq\n")):
        assert column.startswith(title) and "40 images searched" in column and "\n#5 " in column
        assert "among the test split's images, as evaluated" in column
    screenshot(driver, "text-to-image", scroll_to="t2i-query-line")
    assert "raw scores (no hubness correction)" in left
    # the "one drawing per name" switch is offered only while a column holds a twin
    twins = driver.find_elements(By.CSS_SELECTOR, "#t2i-left .aoq-twin, #t2i-right .aoq-twin")
    assert driver.find_element(By.ID, "t2i-one-drawing").is_displayed() == bool(twins)

    # The hubness correction switch (principled in the test split, which leaves the bank out)
    # ranks both columns again and goes into the link to the view.
    set_scope(driver, "test split only")
    wait(driver, lambda d: "12 images searched" in text(d, "t2i-left"))
    driver.find_element(By.CSS_SELECTOR, "#t2i-normalise input").click()
    wait(driver, lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, "ul[role=listbox] li")
                                 if o.text.strip() == "inverted softmax"), None)).click()
    wait(driver, lambda d: all("ranked by inverted softmax: log-normalised scores" in text(d, f"t2i-{side}")
                               for side in ("left", "right")))
    wait(driver, lambda d: "normalise=invsoftmax" in d.current_url)
    open_page(driver, driver.current_url)  # the link reopens the view with its switch set
    wait(driver, lambda d: "ranked by inverted softmax" in text(d, "t2i-left"))
    assert driver.find_element(By.CSS_SELECTOR, "#t2i-normalise input").get_attribute("value") == "inverted softmax"
    # Nothing in the page came from outside the machine: no fonts, CDN scripts or telemetry; and
    # the pictures came through the page's own server, not the service's port.
    urls = requested(driver)
    assert {urlparse(u).hostname for u in urls} <= {"127.0.0.1"}
    pictures = {urlparse(u).netloc for u in urls if "/images/" in u}
    assert pictures == {urlparse(ui_url).netloc}


def test_gallery_image_and_upload_show_captions_in_both_columns(driver, ui_url, tmp_path):
    open_page(driver, ui_url)
    tab(driver, "Image to text")
    thumbs = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#i2t-gallery button.thumbnail-item"))
    assert "Pictures 1\u201324 of 40 in the whole catalogue (page 1 of 2)" in text(driver, "i2t-page")
    thumbs[0].click()
    wait(driver, lambda d: all(len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{s} li")) == 5 for s in ("left", "right")))
    left = text(driver, "i2t-left")
    assert left.startswith("Left: baseline\n") and "200 captions searched" in left
    assert all(loaded_widths(driver, "#i2t-query img"))
    screenshot(driver, "image-to-text", scroll_to="i2t-query")

    # An uploaded picture goes as it is (no decoding in the page's server) to the service's featuriser.
    picture = tmp_path / "upload.jpg"
    Image.new("RGB", (48, 48), (200, 30, 30)).save(picture)
    driver.find_element(By.CSS_SELECTOR, "#i2t-upload input[type=file]").send_keys(str(picture))
    wait(driver, lambda d: ".jpg" in text(d, "i2t-upload"))
    driver.find_element(By.ID, "i2t-upload-search").click()

    def upload_answered(d) -> bool:
        return "uploaded picture upload.jpg" in text(d, "i2t-query") and all(
            len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{side} li")) == 5 for side in ("left", "right"))

    wait(driver, upload_answered)
    assert "An uploaded picture: no caption of the catalogue is marked correct." in text(driver, "i2t-query")


def _pick(driver, element_id: str, label_start: str) -> str:
    """Open a dropdown and pick the first option whose label starts so; returns the label."""
    driver.find_element(By.CSS_SELECTOR, f"#{element_id} input").click()
    option = wait(driver, lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, "ul[role=listbox] li")
                                          if o.text.strip().startswith(label_start)), None))
    label = option.text.strip()
    option.click()
    return label


def test_a_showcased_example_reads_itself_and_a_result_searches_by_itself(driver, ui_url, backend_url):
    intended = httpx.get(f"{backend_url}/examples", params={"split": "test", "n": 1}).json()["captions"][0]["text"]
    open_page(driver, ui_url)
    next(b for b in driver.find_elements(By.CSS_SELECTOR, "#t2i-free-examples button") if b.text == SHOWCASE).click()
    wait(driver, lambda d: columns_loaded(d, "t2i", 5) and "Verdict" in text(d, "t2i-query-line"))
    line = text(driver, "t2i-query-line")
    verdict = next(v for v in line.splitlines() if v.startswith("Verdict"))
    assert verdict.startswith(f"Verdict: intended answer \u201c{intended}\u201d; first correct answer baseline #")
    assert "correct in the whole catalogue (all splits), 5 shown." in verdict
    assert "judge by eye" not in line
    screenshot(driver, "showcased-example", scroll_to="t2i-query-line")

    # A picture of a column is a link: it opens the image-to-text view searching by that picture.
    card = driver.find_element(By.CSS_SELECTOR, "#t2i-right .aoq-card")
    image_id = card.get_attribute("data-image-id")
    card.find_element(By.CSS_SELECTOR, "a.aoq-search-by").click()
    wait(driver, lambda d: f"image={image_id}" in d.current_url and all(
        len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{s} li")) == 5 for s in ("left", "right")))
    assert f"Query: picture {image_id}" in text(driver, "i2t-query")
    screenshot(driver, "search-by-a-result", scroll_to="i2t-query")

    # The hubness correction in the whole catalogue (which holds the bank's own training split)
    # is refused, and the service's reason takes the query line where the eye is.
    tab(driver, "Text to image")
    type_query(driver, intended)
    wait(driver, lambda d: columns_loaded(d, "t2i", 5))
    assert "whole catalogue holds the training split" in text(driver, "t2i-normalise")
    _pick(driver, "t2i-normalise", "inverted softmax")
    wait(driver, lambda d: "refused in scope 'all'" in text(d, "t2i-query-line"))
    assert text(driver, "t2i-query-line").startswith(
        "Rejected by the search service: hubness correction 'invsoftmax' is refused in scope 'all': it holds the "
        "train split")
    assert text(driver, "t2i-left") == text(driver, "t2i-right") == ""
    screenshot(driver, "hubness-refused", scroll_to="t2i-query-line")
    set_scope(driver, "test split only")  # where it is principled, it ranks
    wait(driver, lambda d: "ranked by inverted softmax" in text(d, "t2i-left"))


def test_a_failure_case_opens_with_the_ranks_of_its_row(driver, ui_url, backend_url):
    listed = {w: httpx.get(f"{backend_url}/failures", params={"which": w, "limit": 1}).json()["total"]
              for w in ("baseline_only", "both")}
    which = "baseline_only" if listed["baseline_only"] else "both"
    open_page(driver, ui_url)
    tab(driver, "Failure cases")
    if which == "both":
        next(e for e in driver.find_elements(By.CSS_SELECTOR, "label") if e.text.strip() == "both wrong at rank 1").click()
    driver.find_element(By.ID, "failures-list").click()
    wait(driver, lambda d: "Pick one below" in text(d, "failures-summary"))
    label = _pick(driver, "failures-case", "1. ")
    left_rank, right_rank = re.search(r"\[baseline: rank ([\d.]+), aoq: rank ([\d.]+)\]", label).groups()
    wait(driver, lambda d: columns_loaded(d, "failures", 5))
    query = text(driver, "failures-query-line")
    assert f"Opened as evaluated: test split only, raw scores (no hubness correction); the list gave baseline rank " \
           f"{left_rank}, aoq rank {right_rank}." in query and "scope: test split only" in query
    for side, rank in (("left", left_rank), ("right", right_rank)):
        assert f"first correct image at #{rank} of 12 searched" in text(driver, f"failures-{side}")
    screenshot(driver, "failure-case", scroll_to="failures-query-line")


def test_backend_down_is_a_message_in_the_page(driver):
    dead = f"http://127.0.0.1:{free_port()}"
    demo, url = serve_ui(dead)
    try:
        open_page(driver, url)
        status = text(driver, "status")
        assert status.startswith(f"Search service unavailable: The search service at {dead} is not reachable")
        type_query(driver, "a red circle")
        wait(driver, lambda d: "Pick a model for each column" in d.page_source)
        assert "Traceback" not in driver.page_source
    finally:
        demo.close()
