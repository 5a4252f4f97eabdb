"""End to end in a real Chromium: the real search service (tiny synthetic catalogue) and the
comparison UI on 127.0.0.1, driven with Selenium as a user would.

Saves screenshots to ``artifacts/browser/`` (``AOQ_ARTIFACTS_DIR`` overrides); with
``AOQ_UPDATE_SCREENSHOT=1`` the text-to-image one also replaces ``docs/screenshot.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
from aoq_ui.app import build_app, launch  # noqa: E402

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
    box.clear()  # the page opens with the first example caption in the box
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


# --- The real demo: pretrained encoders on a small emoji subset (the `--quick` demo models) ---

FREE_TEXT = "a yellow face wearing sunglasses"  # words no training caption of the subset has together
TAB_BUTTONS = {  # tab -> (main button, element whose content shows the button's answer)
    "Text to image": ("t2i-search", "t2i-left"),
    "Image to text": ("i2t-upload-search", "i2t-query"),
    "Failure cases": ("failures-list", "failures-summary"),
    "Offline negatives": ("negatives-show", "negatives-offline"),
    "Metrics": ("metrics-refresh", "metrics-table"),
}


@pytest.fixture(scope="module")
def emoji_demo(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """``python -m aoq_cli.demo --quick --prepare-only`` in a temporary folder (its own feature
    cache), then the real service and the UI with the demo's example queries: (backend, UI) URLs."""
    from aoq.data.dataset import DataError
    from aoq_serve.config import Settings
    from aoq_train.datasets.emoji.sources import locate_sources
    from aoq_ui.examples import load_example_queries

    try:
        locate_sources()
    except DataError as exc:
        pytest.skip(f"emoji sources missing (make data-deps): {exc}")
    root = tmp_path_factory.mktemp("emoji-demo")
    env = {**os.environ, "AOQ_DATA_DIR": str(root / "data"), "AOQ_RUNS_DIR": str(root / "runs"),
           "AOQ_FEATURE_CACHE": str(root / "features")}
    env.pop("AOQ_CATALOGUE_URL", None)
    prepared = subprocess.run([sys.executable, "-m", "aoq_cli.demo", "--quick", "--prepare-only"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=900)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    run = root / "runs" / "demo-emoji-quick"
    settings = Settings(models_dir=run / "models", index_dir=run / "index", data_dir=root / "data",
                        reload_poll_s=0.0, port=0)
    previous = os.environ.get("AOQ_FEATURE_CACHE")
    os.environ["AOQ_FEATURE_CACHE"] = env["AOQ_FEATURE_CACHE"]  # the negatives read the demo's cache
    try:
        with run_server(settings) as backend:
            demo = build_app(backend, concurrency=2,
                             example_queries=load_example_queries(REPO / "configs" / "emoji_queries.yaml"))
            port = free_port()
            launch(demo, "127.0.0.1", port, block=False)
            try:
                yield backend, f"http://127.0.0.1:{port}/"
            finally:
                demo.close()
    finally:
        if previous is None:
            os.environ.pop("AOQ_FEATURE_CACHE", None)
        else:
            os.environ["AOQ_FEATURE_CACHE"] = previous


def _no_error_shown(driver) -> None:
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".aoq-error, [data-testid='toast-body']")
              if e.is_displayed()]
    assert not errors, errors
    assert "Traceback" not in driver.page_source


def test_real_demo_free_text_and_example_queries(driver, emoji_demo):
    _, ui = emoji_demo
    _open(driver, ui)
    status = driver.find_element(By.ID, "status").text
    assert "aoq" in status and "baseline" in status and "unavailable" not in status, status
    left = driver.find_element(By.CSS_SELECTOR, "#left-model input").get_attribute("value")
    assert "effnet_lite0" in left, left  # the pretrained image encoder serves this page
    box = driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea")
    box.clear()
    box.send_keys(FREE_TEXT)
    driver.find_element(By.ID, "t2i-search").click()
    cards = {side: f"#t2i-{side} .aoq-card img" for side in ("left", "right")}
    WebDriverWait(driver, WAIT_S).until(
        lambda d: FREE_TEXT in d.page_source
        and all(len(w) == 5 and all(w) for w in (_loaded_widths(d, s) for s in cards.values())))
    _no_error_shown(driver)

    # A fine-grained example from configs/emoji_queries.yaml runs as free text too.
    example = "woman firefighter"
    button = next(b for b in driver.find_elements(By.CSS_SELECTOR, "#t2i-free-examples button")
                  if b.text.strip() == example)
    button.click()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "#t2i-query textarea").get_attribute("value") == example
        and all(len(w) == 5 and all(w) for w in (_loaded_widths(d, s) for s in cards.values())))
    _no_error_shown(driver)
    driver.save_screenshot(str(_artifacts() / "emoji-text-to-image.png"))


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
        # Texts, not ids: both vendors' pictures of an emoji share captions, which score the same.
        assert [r["text"] for r in uploaded[side]["results"]] == [r["text"] for r in by_id[side]["results"]]
        assert [r["score"] for r in uploaded[side]["results"]] == pytest.approx(
            [r["score"] for r in by_id[side]["results"]], abs=1e-4)

    picture = tmp_path / "upload.png"
    picture.write_bytes(png)
    _open(driver, ui)
    _tab(driver, "Image to text")
    driver.find_element(By.CSS_SELECTOR, "#i2t-upload input[type=file]").send_keys(str(picture))
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#i2t-upload img"))
    driver.find_element(By.ID, "i2t-upload-search").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: all(
        len(d.find_elements(By.CSS_SELECTOR, f"#i2t-{side} li")) == 5 for side in ("left", "right")))
    _no_error_shown(driver)


def test_every_tab_answers_its_main_button_with_the_defaults(driver, emoji_demo):
    _, ui = emoji_demo
    _open(driver, ui)
    for tab, (button, answer) in TAB_BUTTONS.items():
        _tab(driver, tab)
        if tab == "Offline negatives":  # it starts on a training caption, not on an empty list
            pick = WebDriverWait(driver, WAIT_S).until(
                lambda d: d.find_element(By.CSS_SELECTOR, "#negatives-pick input").get_attribute("value"))
            assert pick.startswith("caption "), pick
        driver.find_element(By.ID, button).click()
        WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element(By.ID, answer).text.strip())
        _no_error_shown(driver)


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
