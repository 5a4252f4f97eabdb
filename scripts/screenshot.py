"""The README's screenshot: a view of a running comparison UI (``make demo``) in the system
Chromium, once its pictures have loaded and its events have ended.

    .venv/bin/python scripts/screenshot.py --ui http://127.0.0.1:7860 \\
        --view '?tab=t2i&q=flag+of+Japan&k=5' --out docs/screenshot.png
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

PICTURES_LOADED = """
const images = Array.from(document.querySelectorAll(arguments[0]));
return images.length > 0 && images.every(img => img.complete && img.naturalWidth > 0);
"""
#: Gradio dims an output while its event runs; the picture is taken once none is.
EVENTS_DONE = "return document.querySelectorAll('.wrap.pending, .wrap.generating, .wrap.translucent').length === 0;"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ui", default="http://127.0.0.1:7860", help="the running UI")
    parser.add_argument("--view", required=True, help="the page address's query (?tab=...&q=...)")
    parser.add_argument("--out", default="docs/screenshot.png")
    parser.add_argument("--size", default="1400,1480", help="window width,height in pixels")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = parser.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = args.chromium
    profile = tempfile.mkdtemp(prefix="aoq-screenshot-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={args.size}",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(args.chromedriver), options=options)
    try:
        driver.get(args.ui.rstrip("/") + "/" + args.view)
        tab = "i2t" if "tab=i2t" in args.view else "t2i"
        columns = f"#{tab}-left img, #{tab}-right img"
        WebDriverWait(driver, 120).until(lambda d: d.execute_script(PICTURES_LOADED, columns)
                                         and d.execute_script(EVENTS_DONE))
        driver.save_screenshot(args.out)
        print(f"saved {args.out}")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
