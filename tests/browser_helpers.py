"""Driving the comparison page in the system Chromium with Selenium, for the browser tests:
starting the browser and the UI, waiting for what a user waits for, reading what the page
requested. Importing it skips the importing module when Chromium or Selenium is missing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from aoq.net import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (install them with `make system-deps`)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from aoq_ui.app import build_app, launch  # noqa: E402
from aoq_ui.client import BackendClient  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                  "--window-size=1400,1300"]
WAIT_S = 60
LOADED_IMAGES_JS = """
return Array.from(document.querySelectorAll(arguments[0]))
    .map(img => img.complete ? img.naturalWidth : 0);
"""


def artifacts() -> Path:
    path = Path(os.environ.get("AOQ_ARTIFACTS_DIR", REPO / "artifacts")) / "browser"
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(driver, name: str, docs_name: str | None = None, scroll_to: str = "tabs") -> Path:
    """Save the page, scrolled to the element ``scroll_to``, under artifacts/browser/; with
    ``AOQ_UPDATE_SCREENSHOT=1`` also as ``docs/<docs_name>``."""
    driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", scroll_to)
    shot = artifacts() / f"{name}.png"
    assert driver.save_screenshot(str(shot)), shot
    if docs_name and os.environ.get("AOQ_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, REPO / "docs" / docs_name)
    return shot


def serve_ui(backend_url: str, **options):
    """The comparison page for ``backend_url`` on a free port: (the Gradio app, its URL)."""
    client = BackendClient(backend_url)
    demo = build_app(client, concurrency=2, **options)
    port = free_port()
    launch(demo, client, "127.0.0.1", port, block=False)
    return demo, f"http://127.0.0.1:{port}/"


def chromium(downloads: Path) -> Iterator:
    """A headless Chromium that logs its network requests and saves downloads in ``downloads``."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="aoq-chromium-")
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    chrome = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    chrome.set_page_load_timeout(WAIT_S)
    chrome.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        yield chrome
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver, condition, timeout: float = WAIT_S):
    return WebDriverWait(driver, timeout).until(condition)


def open_page(driver, url: str) -> None:
    """Load the page and wait for the status line the page-load event renders (not for any text:
    Gradio shows a progress timer in the element while the event runs)."""
    driver.get(url)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#status .aoq-meta, #status .aoq-error"))


def tab(driver, name: str) -> None:
    for button in driver.find_elements(By.CSS_SELECTOR, "button[role=tab]"):
        if button.text.strip() == name:
            button.click()
            return
    raise AssertionError(f"no tab named {name!r}")


def set_scope(driver, label: str) -> None:
    """Pick a search scope by its label (the radio above the tabs)."""
    next(e for e in driver.find_elements(By.CSS_SELECTOR, "#scope label") if e.text.strip() == label).click()


def set_k(driver, k: int) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "#top-k input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(k), Keys.ENTER)


def type_query(driver, text: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea")
    box.clear()  # the page opens with an example in the box
    box.send_keys(text)
    driver.find_element(By.ID, "t2i-search").click()


def loaded_widths(driver, selector: str) -> list[int]:
    return driver.execute_script(LOADED_IMAGES_JS, selector)


def columns_loaded(driver, prefix: str, k: int) -> bool:
    """Both columns of a text view show ``k`` pictures, every one loaded."""
    widths = [loaded_widths(driver, f"#{prefix}-{side} .aoq-card img") for side in ("left", "right")]
    return all(len(w) == k and all(w) for w in widths)


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def no_error_shown(driver) -> None:
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".aoq-error, [data-testid='toast-body']")
              if e.is_displayed()]
    assert not errors, errors
    assert "Traceback" not in driver.page_source


def requested(driver) -> list[str]:
    """The URLs the page requested since the last call (http, https, ws, wss)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if urlparse(url).scheme in ("http", "https", "ws", "wss"):
                urls.append(url)
    return urls


def announced(driver) -> list[str]:
    """What the page's live regions said since :func:`listen_to_live_regions` (screen readers)."""
    return driver.execute_script("return window.__said || []")


def listen_to_live_regions(driver) -> None:
    driver.execute_script(
        "window.__said = []; new MutationObserver(() => document.querySelectorAll('[aria-live]').forEach("
        "e => { const t = e.textContent.trim(); if (t) window.__said.push(t); })).observe(document.body, "
        "{subtree: true, childList: true, characterData: true});")


__all__ = ["By", "Keys"]
