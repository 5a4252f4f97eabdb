"""End to end in a real Chromium: the real search service (tiny synthetic catalogue) and the
comparison UI on 127.0.0.1, driven with Selenium as a user would.

Saves screenshots to ``artifacts/browser/`` (``AOQ_ARTIFACTS_DIR`` overrides); with
``AOQ_UPDATE_SCREENSHOT=1`` the text-to-image one also replaces ``docs/screenshot.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from PIL import Image

from aoq.net import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (install them with `make system-deps`)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from tests.backend_helpers import build_service_fixture, run_server  # noqa: E402
from ui.app import build_app, launch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                  "--window-size=1400,1300"]
WAIT_S = 60
LOADED_IMAGES_JS = """
return Array.from(document.querySelectorAll(arguments[0]))
    .map(img => img.complete ? img.naturalWidth : 0);
"""




def _artifacts() -> Path:
    path = Path(os.environ.get("AOQ_ARTIFACTS_DIR", REPO / "artifacts")) / "browser"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory) -> Iterator[str]:
    fixture = build_service_fixture(tmp_path_factory.mktemp("service"))
    with run_server(fixture.settings()) as url:
        yield url


def _serve_ui(url: str):
    demo = build_app(url, concurrency=2)
    port = free_port()
    launch(demo, "127.0.0.1", port, block=False)
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def ui_url(backend_url) -> Iterator[str]:
    demo, url = _serve_ui(backend_url)
    try:
        yield url
    finally:
        demo.close()


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="aoq-chromium-")
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    chrome = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    chrome.set_page_load_timeout(WAIT_S)
    try:
        yield chrome
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _open(driver, url: str) -> None:
    """Load the page and wait for the status line the page-load event renders (not for any text:
    Gradio shows a progress timer in the element while the event runs)."""
    driver.get(url)
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#status .aoq-meta, #status .aoq-error"))


def _tab(driver, name: str) -> None:
    for button in driver.find_elements(By.CSS_SELECTOR, "button[role=tab]"):
        if button.text.strip() == name:
            button.click()
            return
    raise AssertionError(f"no tab named {name!r}")


def _loaded_widths(driver, selector: str) -> list[int]:
    return driver.execute_script(LOADED_IMAGES_JS, selector)


def _requested_hosts(driver) -> set[str]:
    hosts = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = urlparse(message["params"]["request"]["url"])
            if url.scheme in ("http", "https", "ws", "wss"):
                hosts.add(url.hostname)
    return hosts


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
    _open(driver, ui_url)
    status = driver.find_element(By.ID, "status").text
    assert all(name in status for name in ("aoq", "baseline", "pixels")) and "unavailable" not in status, status

    box = driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea")
    box.send_keys(query)
    driver.find_element(By.ID, "t2i-search").click()

    cards = {side: f"#t2i-{side} .aoq-card img" for side in ("left", "right")}
    WebDriverWait(driver, WAIT_S).until(
        lambda d: all(len(w) == 5 and all(w) for w in (_loaded_widths(d, s) for s in cards.values())))
    left, right = (driver.find_element(By.ID, f"t2i-{side}").text for side in ("left", "right"))
    assert left.startswith("Left: baseline\n") and "ground-truth image at rank " in left and "\n#5 " in left
    assert right.startswith("Right: aoq\n") and "ground-truth image at rank " in right and "\n#5 " in right

    shot = _artifacts() / "text-to-image.png"
    assert driver.save_screenshot(str(shot)), shot
    if os.environ.get("AOQ_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, REPO / "docs" / "screenshot.png")
    # Nothing in the page came from outside the machine: no fonts, CDN scripts or telemetry.
    assert _requested_hosts(driver) <= {"127.0.0.1"}


def test_gallery_image_and_upload_show_captions_in_both_columns(driver, ui_url, tmp_path):
    _open(driver, ui_url)
    _tab(driver, "Image to text")
    thumbs = WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#i2t-gallery button.thumbnail-item"))
    thumbs[0].click()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: all(len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{s} li")) == 5 for s in ("left", "right")))
    left = driver.find_element(By.ID, "i2t-left").text
    assert left.startswith("Left: baseline\n") and "ground-truth caption at rank " in left
    assert all(_loaded_widths(driver, ".aoq-query img"))
    driver.save_screenshot(str(_artifacts() / "image-to-text.png"))

    # An uploaded picture goes through Gradio (saved as PNG) to the backend's featuriser.
    picture = tmp_path / "upload.jpg"
    Image.new("RGB", (48, 48), (200, 30, 30)).save(picture)
    driver.find_element(By.CSS_SELECTOR, "#i2t-upload input[type=file]").send_keys(str(picture))
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#i2t-upload img"))
    driver.find_element(By.ID, "i2t-upload-search").click()

    def upload_answered(d) -> bool:
        columns = [d.find_element(By.ID, f"i2t-{side}") for side in ("left", "right")]
        return "Query: uploaded image" in d.page_source and all(
            "no ground truth (free query)" in c.text and len(c.find_elements(By.TAG_NAME, "li")) == 5
            for c in columns)

    WebDriverWait(driver, WAIT_S).until(upload_answered)


def test_backend_down_is_a_message_in_the_page(driver):
    dead = f"http://127.0.0.1:{free_port()}"
    demo, url = _serve_ui(dead)
    try:
        _open(driver, url)
        status = driver.find_element(By.ID, "status").text
        assert status.startswith(f"Search service unavailable: The search service at {dead} is not reachable")
        driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea").send_keys("a red circle")
        driver.find_element(By.ID, "t2i-search").click()
        WebDriverWait(driver, WAIT_S).until(lambda d: "Pick a model for each column" in d.page_source)
        assert "Traceback" not in driver.page_source
    finally:
        demo.close()
