"""docker compose, for real: the images built, the stack up with PostgreSQL, answered through the
published ports on 127.0.0.1, and the page loaded in Chromium.

Needs a Docker engine (``scripts/docker-engine.sh`` starts Debian's ``dockerd`` as root when none
answers, and the module stops that daemon again when it is done) and docker-compose; skipped where
neither can be had. ``scripts/docker-base.sh`` makes the base image and the build inputs; both, and
the images' build, run in the background from the start of the session while the rest of the
suite runs, and this module runs last (``tests/compose_prebuild.py``). The stack runs the tiny demo (``docker/quick.yml``) under its
own project name on free ports; ``down --volumes`` removes its containers, network and volumes
afterwards, while the current images and their layers stay, so a second run of the same tree
rebuilds little; the project's images a rebuild left untagged (every earlier generation, each
carrying a whole virtual environment) are pruned by their label, so repeated runs do not fill the
disk.
Phase times go to ``artifacts/compose/timings.json`` and the services' logs to ``logs.txt``
(``AOQ_ARTIFACTS_DIR`` overrides the folder).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.compose_prebuild import FILES, finish, prebuild

pytestmark = [pytest.mark.slow, pytest.mark.browser]

REPO = Path(__file__).resolve().parents[1]
UP_TIMEOUT_S = 900
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60
# set on the base stage of both Dockerfiles, so every image built from them carries it
PROJECT_LABEL = "io.aoq.project=aoq-retrieval"


@dataclass
class Stack:
    """A running compose project and where its published ports answer."""

    compose: list[str]
    env: dict[str, str]
    backend_url: str
    ui_url: str
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*self.compose, *args], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _artifacts() -> Path:
    path = Path(os.environ.get("AOQ_ARTIFACTS_DIR", REPO / "artifacts")) / "compose"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check(out: subprocess.CompletedProcess, what: str) -> None:
    assert out.returncode == 0, f"{what} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


def _wait_healthy(stack: Stack, service: str, timeout: float) -> None:
    """Poll the service's health status until Docker reports it healthy."""
    deadline = time.monotonic() + timeout
    container = stack.run("ps", "-q", service).stdout.strip()
    assert container, f"no {service} container"
    status = ""
    while time.monotonic() < deadline:
        state = json.loads(subprocess.run(["docker", "inspect", "-f", "{{json .State}}", container],
                                          capture_output=True, text=True, timeout=30).stdout)
        status = state.get("Health", {}).get("Status", "")
        if status == "healthy":
            return
        assert state["Running"], f"{service} exited ({state['ExitCode']})"
        time.sleep(2)
    raise AssertionError(f"{service} not healthy after {timeout:.0f} s (last status {status!r})")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    prepared = prebuild()
    prepared.wait()
    if prepared.skip:
        pytest.skip(prepared.skip)
    assert prepared.failure is None, prepared.failure
    try:
        yield from _stack(prepared.timings)
    finally:
        # the suite stops every daemon it starts (here, not only at the session's end, so the
        # tests after this module run without it)
        finish()


def _stack(timings: dict[str, float]) -> Iterator[Stack]:
    start = time.monotonic()
    backend_port, ui_port = _free_port(), _free_port()
    env = {**os.environ, "AOQ_BIND": "127.0.0.1", "AOQ_BACKEND_PORT": str(backend_port),
           "AOQ_UI_PORT": str(ui_port), "AOQ_PUBLIC_BACKEND_URL": f"http://127.0.0.1:{backend_port}"}
    env.pop("AOQ_ADMIN_TOKEN", None)
    stack = Stack(["docker-compose", "--project-name", f"aoqtest{os.getpid()}", *FILES], env,
                  f"http://127.0.0.1:{backend_port}", f"http://127.0.0.1:{ui_port}/", timings)
    try:
        mark = time.monotonic()
        # `up` starts each service once its dependencies' conditions hold (db healthy, init done,
        # backend healthy), so it returns after the backend's health check has passed
        _check(stack.run("up", "--detach", timeout=UP_TIMEOUT_S), "docker-compose up")
        _wait_healthy(stack, "ui", timeout=180)
        timings["up_s"] = time.monotonic() - mark
        yield stack
    finally:
        logs = stack.run("logs", "--no-color", "--timestamps", timeout=120)
        (_artifacts() / "logs.txt").write_text(logs.stdout + logs.stderr)
        mark = time.monotonic()
        down = stack.run("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout=300)
        timings["down_s"] = time.monotonic() - mark
        timings["stack_s"] = time.monotonic() - start
        (_artifacts() / "timings.json").write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}))
        _check(down, "docker-compose down")
        prune = subprocess.run(["docker", "image", "prune", "--force", "--filter", f"label={PROJECT_LABEL}"],
                               capture_output=True, text=True, timeout=300)
        _check(prune, "docker image prune")


def test_ports_are_published_on_loopback_only(stack):
    for service, port in (("backend", 8000), ("ui", 7860)):
        out = stack.run("port", service, str(port))
        _check(out, f"docker-compose port {service}")
        expected = stack.backend_url if service == "backend" else stack.ui_url.rstrip("/")
        assert out.stdout.strip() == expected.removeprefix("http://")


def test_compare_text_through_the_published_port(stack):
    health = httpx.get(f"{stack.backend_url}/health", timeout=10).json()
    assert health["status"] == "ok", health
    caption = httpx.get(f"{stack.backend_url}/examples", params={"split": "test", "n": 1},
                        timeout=10).json()["captions"][0]
    response = httpx.post(f"{stack.backend_url}/compare/text", json={"query": caption["text"], "k": 5}, timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    for side in ("left", "right"):
        answer = body[side]
        assert answer["caption_id"] == caption["id"]
        assert [r["rank"] for r in answer["results"]] == [1, 2, 3, 4, 5]
        assert answer["ground_truth_ids"] == [caption["image_id"]]
    assert {body["left"]["model"], body["right"]["model"]} == {"baseline", "aoq"}


def test_the_catalogue_lives_in_postgres(stack):
    datasets = httpx.get(f"{stack.backend_url}/datasets", timeout=10).json()
    out = stack.run("exec", "-T", "db", "psql", "--host=/tmp", "--username=aoq", "--dbname=aoq", "-Atc",
                    "SELECT name, (SELECT count(*) FROM captions c WHERE c.dataset_id = d.id) FROM datasets d")
    _check(out, "psql in the db container")
    rows = {name: int(n) for name, n in (line.split("|") for line in out.stdout.split())}
    assert rows == {d["name"]: d["n_captions"] for d in datasets}
    assert all(n > 0 for n in rows.values())


@pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                    reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (make system-deps)")
def test_the_page_answers_a_query_in_chromium(stack):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    query = httpx.get(f"{stack.backend_url}/examples", params={"split": "test", "n": 1},
                      timeout=10).json()["captions"][0]["text"]
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="aoq-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--window-size=1400,1300", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.get(stack.ui_url)
        WebDriverWait(driver, WAIT_S).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#status .aoq-meta, #status .aoq-error"))
        status = driver.find_element(By.ID, "status").text
        assert "aoq" in status and "baseline" in status and "unavailable" not in status, status
        driver.find_element(By.CSS_SELECTOR, "#t2i-query textarea").send_keys(query)
        driver.find_element(By.ID, "t2i-search").click()
        # the thumbnails load from the backend's published port (--public-backend-url)
        widths = "return Array.from(document.querySelectorAll(arguments[0])).map(i => i.complete ? i.naturalWidth : 0);"
        WebDriverWait(driver, WAIT_S).until(lambda d: all(
            len(w) == 5 and all(w) for w in (d.execute_script(widths, f"#t2i-{side} .aoq-card img")
                                             for side in ("left", "right"))))
        assert driver.save_screenshot(str(_artifacts() / "ui.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
