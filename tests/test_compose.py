"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

``docker-compose config`` validates and normalises the compose file; the tests then check that
every service has what it needs (health checks, start-up order, volumes, matching settings), that
the commands it runs parse with the project's own argument parsers, that the health-check
one-liners work against a real HTTP server, and that the image installs the project with exactly
the steps of ``make setup`` (the recipe CI runs) from files it actually copies.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from setuptools.config.pyprojecttoml import read_configuration
from sqlalchemy.engine import make_url

from tests.layout import package_folders

REPO = Path(__file__).resolve().parents[1]
SERVICES = {"db", "init", "backend", "ui"}


#: the settings the compose file reads from the shell (its ${...} variables)
COMPOSE_VARIABLES = ("AOQ_BASE_IMAGE", "AOQ_BIND", "AOQ_BACKEND_PORT", "AOQ_UI_PORT", "AOQ_PUBLIC_BACKEND_URL",
                     "AOQ_ADMIN_TOKEN")


def _config(*files: str, **settings: str) -> dict:
    """The compose files as ``docker-compose config`` merges and normalises them, with ``settings``
    as the only compose variables set in the shell."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (make system-deps installs it); docker-compose.yml not validated")
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_VARIABLES} | settings
    argv = [binary, *(a for f in files for a in ("-f", str(REPO / f))), "config"]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"docker-compose config rejects {' + '.join(files)}:\n{out.stderr}"
    return yaml.safe_load(out.stdout)


@pytest.fixture(scope="module")
def compose() -> dict:
    """docker-compose.yml with every setting at its default."""
    return _config("docker-compose.yml")


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    return dict(env) if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def _mounts(service: dict) -> dict[str, str]:
    """Container path -> named volume."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        mounts[target] = source
    return mounts


def _volume_of(service: dict, path: str) -> str | None:
    """The named volume a container path lies in, if any."""
    for target, source in _mounts(service).items():
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source
    return None


def _ports(service: dict) -> set[tuple[str, int, int]]:
    """(host address, published port, container port) of each published port."""
    ports = set()
    for port in service.get("ports", []):
        if isinstance(port, str):  # docker-compose 1.x: "127.0.0.1:8000:8000/tcp"
            host_ip, published, target = port.split("/")[0].rsplit(":", 2)
        else:
            host_ip, published, target = port.get("host_ip", ""), port["published"], port["target"]
        ports.add((host_ip, int(published), int(target)))
    return ports


def _command(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _parse(command_module: str, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with an ``aoq`` sub-command's own parser (SystemExit on an unknown flag)."""
    module = __import__(f"aoq_cli.{command_module}", fromlist=["add_arguments"])
    parser = argparse.ArgumentParser(prog=f"aoq {command_module}", exit_on_error=False)
    module.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_four_services_and_their_volumes(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    assert {"pgdata", "data", "runs"} <= set(compose["volumes"])
    for name in ("init", "backend", "ui"):
        build = services[name]["build"]
        assert Path(build["context"]).resolve() == REPO and build.get("dockerfile", "Dockerfile") == "Dockerfile"
    # a service that dies comes back (the kill -9 restart of tests/test_reliability.py); init runs once
    assert {n: str(services[n].get("restart", "no")) for n in SERVICES} == {
        "db": "unless-stopped", "init": "no", "backend": "unless-stopped", "ui": "unless-stopped"}
    # one image for the three, so it is built once
    assert len({services[n]["image"] for n in ("init", "backend", "ui")}) == 1


def test_db_is_postgres_built_on_the_same_base_with_a_volume_and_a_health_check(compose):
    services = compose["services"]
    db = services["db"]
    # Docker Hub may be unreachable: PostgreSQL is built from Debian's package on the project's base
    assert Path(db["build"]["context"]).resolve() == REPO / "docker" / "postgres"
    assert db["build"]["args"]["BASE_IMAGE"] == services["backend"]["build"]["args"]["BASE_IMAGE"]
    dockerfile = (REPO / "docker" / "postgres" / "Dockerfile").read_text()
    assert "PGDATA=/var/lib/postgresql/data" in dockerfile
    assert _mounts(db) == {"/var/lib/postgresql/data": "pgdata"}
    # the settings of the official image, read by the entry point that makes the cluster
    env = _env(db)
    entrypoint = (REPO / "docker" / "postgres" / "entrypoint.sh").read_text()
    assert {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"} == set(env)
    assert all(f"${{{key}" in entrypoint for key in env)
    test = db["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pg_isready"]
    assert f"-U {env['POSTGRES_USER']}" in " ".join(test) and f"-d {env['POSTGRES_DB']}" in " ".join(test)
    assert "--host=127.0.0.1" in test  # over TCP, as the other services connect


def test_init_and_backend_share_settings_volumes_and_the_db(compose):
    services = compose["services"]
    db_env = _env(services["db"])
    init, backend = services["init"], services["backend"]
    assert _command(init) == ["python", "-m", "aoq_cli.demo", "--prepare-only"]
    assert str(init.get("restart", "no")) == "no"  # one shot
    assert init["depends_on"] == {"db": {"condition": "service_healthy"}}
    for service in (init, backend):
        env = _env(service)
        url = make_url(env["AOQ_CATALOGUE_URL"])
        assert url.drivername == "postgresql+psycopg"  # the driver make setup installs
        assert (url.host, url.port or 5432) == ("db", 5432)
        assert (url.username, url.password, url.database) == (
            db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"], db_env["POSTGRES_DB"])
        assert _volume_of(service, env["AOQ_DATA_DIR"]) == "data"
        for key in ("AOQ_RUNS_DIR", "AOQ_MODELS_DIR", "AOQ_INDEX_DIR"):
            assert _volume_of(service, env[key]) == "runs", key
    # what init prepares is exactly what the backend serves
    keys = ("AOQ_CATALOGUE_URL", "AOQ_DATA_DIR", "AOQ_RUNS_DIR", "AOQ_MODELS_DIR", "AOQ_INDEX_DIR")
    assert {k: _env(init)[k] for k in keys} == {k: _env(backend)[k] for k in keys}
    assert _mounts(init) == _mounts(backend)


def test_backend_serves_the_folders_the_demo_prepares(compose):
    from aoq_cli.demo import SYNTH_FULL, demo_config

    env = _env(compose["services"]["backend"])
    # `python -m aoq_cli.demo --prepare-only` (init) follows AOQ_DATA_DIR / AOQ_RUNS_DIR
    assert env["AOQ_DEMO_DATASET"] == "synth"
    run_dir = demo_config(SYNTH_FULL, Path(env["AOQ_DATA_DIR"]), Path(env["AOQ_RUNS_DIR"])).run_dir
    assert Path(env["AOQ_MODELS_DIR"]) == run_dir / "models"
    assert Path(env["AOQ_INDEX_DIR"]) == run_dir / "index"


def test_backend_starts_after_db_and_init_and_is_published_on_loopback(compose):
    backend = compose["services"]["backend"]
    assert backend["depends_on"] == {"db": {"condition": "service_healthy"},
                                     "init": {"condition": "service_completed_successfully"}}
    command = _command(backend)
    assert command[:2] == ["aoq", "serve"]
    args = _parse("serve", command[2:])
    # all interfaces of the container, which the host publishes on 127.0.0.1 only
    assert args.host == "0.0.0.0" and args.port == 8000
    assert _ports(backend) == {("127.0.0.1", 8000, 8000)}


def test_ui_starts_after_a_healthy_backend_and_rewrites_urls_for_the_browser(compose):
    ui = compose["services"]["ui"]
    assert ui["depends_on"] == {"backend": {"condition": "service_healthy"}}
    command = _command(ui)
    assert command[:2] == ["aoq", "ui"]
    args = _parse("ui", command[2:])
    assert args.backend == "http://backend:8000"  # the service name on the compose network
    assert args.public_backend_url == "http://localhost:8000"  # what the host's browser reaches
    assert args.host == "0.0.0.0" and args.port == 7860
    assert _ports(ui) == {("127.0.0.1", 7860, 7860)}
    assert not _mounts(ui)  # the UI talks to the backend over HTTP only


def test_exposing_the_stack_is_a_matter_of_settings():
    exposed = _config("docker-compose.yml", AOQ_BIND="0.0.0.0", AOQ_BACKEND_PORT="9000", AOQ_UI_PORT="9001",
                      AOQ_PUBLIC_BACKEND_URL="http://search.example:9000", AOQ_ADMIN_TOKEN="s3cret")
    services = exposed["services"]
    assert _ports(services["backend"]) == {("0.0.0.0", 9000, 8000)}
    assert _ports(services["ui"]) == {("0.0.0.0", 9001, 7860)}
    assert _parse("ui", _command(services["ui"])[2:]).public_backend_url == "http://search.example:9000"
    assert _env(services["backend"])["AOQ_ADMIN_TOKEN"] == "s3cret"


def test_the_admin_token_is_passed_on_only_when_set(compose):
    # a null value: docker-compose takes it from the shell, and leaves it out when the shell has none
    assert _env(compose["services"]["backend"])["AOQ_ADMIN_TOKEN"] is None


def test_quick_variant_serves_the_folders_the_quick_demo_prepares(compose):
    from aoq_cli.demo import SYNTH_QUICK, demo_config

    quick = _config("docker-compose.yml", "docker/quick.yml")["services"]
    assert _command(quick["init"]) == [*_command(compose["services"]["init"]), "--quick"]
    env = _env(quick["backend"])
    run_dir = demo_config(SYNTH_QUICK, Path(env["AOQ_DATA_DIR"]), Path(env["AOQ_RUNS_DIR"])).run_dir
    assert (Path(env["AOQ_MODELS_DIR"]), Path(env["AOQ_INDEX_DIR"])) == (run_dir / "models", run_dir / "index")
    # only those two settings differ from the full stack
    full = _env(compose["services"]["backend"])
    assert {k for k in env if env[k] != full[k]} == {"AOQ_MODELS_DIR", "AOQ_INDEX_DIR"}


@pytest.mark.parametrize("name", ["init", "backend", "ui"])
def test_every_project_command_parses(compose, name):
    command = _command(compose["services"][name])
    if command[:3] == ["python", "-m", "aoq_cli.demo"]:
        out = subprocess.run([sys.executable, "-m", "aoq_cli.demo", "--help"], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "--prepare-only" in out.stdout, out.stderr
    else:
        assert command[0] == "aoq"
        _parse(command[1], command[2:])


class _Health(http.server.BaseHTTPRequestHandler):
    body: bytes = b"{}"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _http_server(body: dict) -> Iterator[int]:
    handler = type("Handler", (_Health,), {"body": json.dumps(body).encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _run_check(test: list[str], port: int, container_port: int) -> int:
    """Run a ``CMD`` health check here, against ``port`` instead of the container's port."""
    assert test[0] == "CMD" and test[1] == "python", "slim images have python, not curl"
    argv = [sys.executable, *[a.replace(f":{container_port}/", f":{port}/") for a in test[2:]]]
    assert argv != [sys.executable, *test[2:]], f"the check does not query port {container_port}"
    return subprocess.run(argv, capture_output=True, timeout=30).returncode


@pytest.mark.slow
def test_backend_health_check_passes_only_when_a_model_is_served(compose):
    test = compose["services"]["backend"]["healthcheck"]["test"]
    assert any("/health" in part for part in test)
    with _http_server({"status": "ok", "models": ["baseline", "aoq"]}) as port:
        assert _run_check(test, port, 8000) == 0
    with _http_server({"status": "degraded", "models": []}) as port:
        assert _run_check(test, port, 8000) != 0
    with _http_server({}) as port:
        closed = port
    assert _run_check(test, closed, 8000) != 0  # nothing listening


@pytest.mark.slow
def test_ui_health_check_needs_the_page(compose):
    test = compose["services"]["ui"]["healthcheck"]["test"]
    with _http_server({}) as port:
        assert _run_check(test, port, 7860) == 0
    with _http_server({}) as port:
        closed = port
    assert _run_check(test, closed, 7860) != 0


# ----------------------------------------------------------------------------- the image


def _dockerfile(path: Path = REPO / "Dockerfile") -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def _make_recipe(target: str) -> tuple[list[str], list[str]]:
    """Prerequisites and recipe lines of a Makefile target (one level: setup -> $(STAMP))."""
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, f"Makefile has no {target} target"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def _commands(run: str) -> list[list[str]]:
    """The simple commands of a RUN line, each without its leading ``VAR=value`` assignments."""
    commands = []
    for segment in re.split(r"&&|\|\||;", run):
        words = shlex.split(segment)
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if words:
            commands.append(words)
    return commands


def test_the_image_installs_with_make_setup_only():
    commands = [c for instruction, args in _dockerfile() if instruction == "RUN" for c in _commands(args)]
    programs = [Path(c[0]).name for c in commands]
    assert [c for c, p in zip(commands, programs) if p == "make"] == [["make", "setup"]]
    # nothing installs Python packages behind make's back
    python_installs = [c for c, p in zip(commands, programs) if p in ("pip", "pip3", "uv", "poetry", "conda")
                       or (p.startswith("python") and "pip" in c)]
    assert python_installs == []


def test_ci_runs_the_same_setup_recipe():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.M)
    test_prereqs, _ = _make_recipe("test")
    assert "setup" in test_prereqs
    setup_prereqs, recipe = _make_recipe("setup")
    assert recipe == [] and setup_prereqs == ["$(STAMP)"]
    _, install = _make_recipe("$(STAMP)")
    # flags such as --no-compile may sit between `install` and the packages
    installs = [line.split() for line in install if "pip install" in line]
    assert any('"$(TORCH_PIN)"' in words for words in installs)
    assert any(words[-2:] == ["-e", '".[all,test]"'] for words in installs)


def _stages(path: Path = REPO / "Dockerfile") -> list[tuple[str, list[tuple[str, str]]]]:
    """(FROM arguments, instructions) of each build stage; ARGs before the first FROM dropped."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for instruction, args in _dockerfile(path):
        if instruction == "FROM":
            stages.append((args, []))
        elif stages:
            stages[-1][1].append((instruction, args))
    return stages


def _copied(instructions: list[tuple[str, str]] | None = None) -> set[str]:
    """Repository paths copied from the build context (sources of COPY lines without --from)."""
    copied = set()
    for instruction, args in _dockerfile() if instructions is None else instructions:
        words = shlex.split(args)
        if instruction == "COPY" and not any(w.startswith("--from") for w in words):
            parts = [p for p in words if not p.startswith("--")]
            copied.update(p.rstrip("/") for p in parts[:-1])
    return copied


def test_base_image_is_one_build_argument_everywhere(compose):
    default = "aoq-base:bookworm"
    for dockerfile in (REPO / "Dockerfile", REPO / "docker" / "postgres" / "Dockerfile"):
        assert _dockerfile(dockerfile)[0] == ("ARG", f"BASE_IMAGE={default}"), dockerfile
        assert _stages(dockerfile)[0][0].split()[0] == "${BASE_IMAGE}"
    # later stages build on earlier ones, never on another image
    names = [args.split()[-1] for args, _ in _stages() if " AS " in args.upper()]
    assert all(args.split()[0] in names for args, _ in _stages()[1:])
    for service in compose["services"].values():
        assert service["build"]["args"] == {"BASE_IMAGE": default}
    assert f"AOQ_BASE_IMAGE:-{default}" in (REPO / "scripts" / "docker-base.sh").read_text()
    assert _config("docker-compose.yml", AOQ_BASE_IMAGE="python:3.11-slim")["services"]["ui"]["build"]["args"] == {
        "BASE_IMAGE": "python:3.11-slim"}


def test_both_images_carry_the_label_the_run_test_prunes_by():
    # the first stage's label reaches every later stage, so stale generations of both are found
    labels = [[args for ins, args in _stages(dockerfile)[0][1] if ins == "LABEL"]
              for dockerfile in (REPO / "Dockerfile", REPO / "docker" / "postgres" / "Dockerfile")]
    assert labels[0] == labels[1] == ["io.aoq.project=aoq-retrieval"]
    assert 'PROJECT_LABEL = "io.aoq.project=aoq-retrieval"' in (REPO / "tests" / "test_compose_run.py").read_text()


def test_build_inputs_stay_in_the_build_stage():
    stages = _stages()
    setup = [i for i, (_, instructions) in enumerate(stages)
             if any(ins == "RUN" and ["make", "setup"] in _commands(args) for ins, args in instructions)]
    assert len(setup) == 1 and setup[0] < len(stages) - 1
    build_stage = stages[setup[0]][1]
    assert "docker/local" in _copied(build_stage)
    # pip reads the settings scripts/docker-base.sh writes there (CA bundle, the CPU torch wheel)
    make_setup = next(args for ins, args in build_stage if ins == "RUN" and ["make", "setup"] in _commands(args))
    assert "PIP_CONFIG_FILE=/tmp/aoq-build/pip.conf" in make_setup
    # the final image takes /app from the build stage and nothing from the build context
    final = stages[-1][1]
    assert _copied(final) == set()
    build_name = stages[setup[0]][0].split()[-1]
    assert ("COPY", f"--from={build_name} /app /app") in final


def test_the_image_copies_everything_make_setup_needs():
    copied = _copied()
    project = read_configuration(REPO / "pyproject.toml", expand=False)  # tomllib is 3.11+ only
    assert {"pyproject.toml", "setup.py", "Makefile", project["project"]["readme"]} <= copied
    # every folder setup.py installs, with its package data
    folders = set(package_folders().values())
    assert folders and folders <= copied, folders - copied
    assert {p.name for p in REPO.iterdir() if (p / "__init__.py").is_file()} <= folders
    for package in project.get("tool", {}).get("setuptools", {}).get("package-data", {}):
        assert package_folders()[package.split(".")[0]] in copied, f"package data of {package} is not copied"
    # the demo reads its experiment configs
    assert "configs" in copied and list((REPO / "configs").glob("*.yaml"))


def test_dockerignore_keeps_the_venv_and_data_out_but_not_what_is_copied():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {".venv", "data", "runs", ".git"} <= set(patterns)
    for path in _copied():
        assert not any(fnmatch.fnmatch(path, pat) for pat in patterns), f"{path} is copied but .dockerignore drops it"
