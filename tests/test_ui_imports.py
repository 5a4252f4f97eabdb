"""The UI talks HTTP only: it imports neither the core library (aoq) but the names the contract
spells its literals with (aoq.names), nor the training app, the CLI, nor any service module but
the pydantic contract (aoq_serve.schemas), and never loads torch or FAISS, so it installs and
starts without them."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import aoq_ui

UI_DIR = Path(aoq_ui.__file__).parent
ALLOWED_SERVICE = {"aoq_serve", "aoq_serve.schemas"}
#: what the contract loads of the core library: its package and the module of names.
ALLOWED_CORE = {"aoq", "aoq.names"}
HEAVY = ("torch", "faiss")


def _ui_modules() -> list[str]:
    return sorted(f"aoq_ui.{m.name}" for m in pkgutil.walk_packages([str(UI_DIR)]))


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _forbidden(module: str) -> bool:
    top = module.split(".")[0]
    if top == "aoq_serve":
        return module not in ALLOWED_SERVICE
    if top == "aoq":
        return module not in ALLOWED_CORE
    return top in ("aoq", "aoq_train", "aoq_cli", *HEAVY)


def test_the_ui_modules_are_found():
    assert {"aoq_ui.app", "aoq_ui.client", "aoq_ui.handlers", "aoq_ui.plots", "aoq_ui.render"} <= set(_ui_modules())


def test_no_ui_file_imports_the_library_training_cli_or_service():
    bad = {path.name: sorted(m for m in _imports(path) if _forbidden(m)) for path in sorted(UI_DIR.rglob("*.py"))}
    assert {name: mods for name, mods in bad.items() if mods} == {}


def test_the_forbidden_rule_itself():
    assert [_forbidden(m) for m in ("aoq_serve.schemas", "aoq_serve", "aoq_serve.app", "aoq_cli.main", "aoq.config",
                                    "aoq_train.mining", "torch.nn", "faiss", "gradio", "aoq_ui.client",
                                    "aoq.names")] == [
        False, False, True, True, True, True, True, True, False, False, False]


def test_importing_every_ui_module_loads_no_torch_faiss_or_service_internals():
    """In a fresh interpreter, so what other tests imported does not hide a new dependency."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {_ui_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'faiss', 'aoq', 'aoq_train', 'aoq_serve', 'aoq_cli'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=UI_DIR.parent, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == sorted(ALLOWED_SERVICE | ALLOWED_CORE)
