"""The import rule of the tree (docs/architecture.md): the core library ``aoq`` is imported by the
apps (``aoq_train``, ``aoq_serve``, ``aoq_ui``) and the command (``aoq_cli``), never the other
way; the service never imports training code; the UI speaks HTTP only (it may read the REST
contract, ``aoq_serve.schemas``); nothing imports the command. Read from the source, lazy
imports inside functions included; the UI's own rule (and a fresh-interpreter check that it
loads neither torch nor FAISS) is tests/test_ui_imports.py.

Packages are imported by their installed names only: a source folder's own name (``training``,
``backend``, ``ui``, ``cli``) resolves only from the repository root, and would load a second copy
of every module it reaches."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.layout import package_folders

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = package_folders()
APPS = tuple(p for p in FOLDERS if p != "aoq")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _files(package: str) -> list[Path]:
    return sorted((ROOT / FOLDERS[package]).rglob("*.py"))


def violations(files: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    out = []
    for path in files:
        for name in sorted(imported_modules(path)):
            if any(_under(name, f) for f in forbidden) and not any(_under(name, a) for a in allowed):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.append(f"{shown} imports {name}")
    return out


def _everything() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*.py")) if not p.relative_to(ROOT).parts[0].startswith(".")]


RULES = {
    "core (aoq)": (_files("aoq"), APPS, ()),
    "training (aoq_train)": (_files("aoq_train"), ("aoq_serve", "aoq_ui", "aoq_cli"), ()),
    "service (aoq_serve)": (_files("aoq_serve"), ("aoq_train", "aoq_ui", "aoq_cli"), ()),
    "service contract (aoq_serve.schemas, what the UI reads)": (
        [ROOT / FOLDERS["aoq_serve"] / "schemas.py"], ("aoq", "aoq_serve", "torch", "faiss", "numpy", "fastapi"),
        ("aoq.names",)),
    "installed names only": (_everything(), tuple(f for p, f in FOLDERS.items() if p != f), ()),
    "benchmarks use no test code": (sorted((ROOT / "benchmarks").rglob("*.py")), ("tests",), ()),
    "a test module imports no other test module (shared helpers live in helper modules)": (
        sorted((ROOT / "tests").rglob("*.py")), tuple(f"tests.{p.stem}" for p in (ROOT / "tests").glob("test_*.py")),
        ()),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_import_rule(rule: str) -> None:
    files, forbidden, allowed = RULES[rule]
    assert files, f"{rule}: no files found"
    assert violations(files, forbidden, allowed) == []


#: the largest a module may grow before it is split by what it holds
MAX_MODULE_LINES = 450


def test_no_module_is_over_the_size_cap() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _everything()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_every_source_folder_is_an_installed_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}
    assert packages == set(FOLDERS.values())


def test_the_checker_sees_lazy_imports_and_honours_exceptions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\n\ndef f():\n    from aoq_train.mining import driver\n    import aoq_serve.schemas\n")
    assert imported_modules(module) == {"json", "aoq_train.mining", "aoq_train.mining.driver", "aoq_serve.schemas"}
    assert violations([module], ("aoq_train", "aoq_serve"), ("aoq_serve.schemas",)) == [
        f"{module} imports aoq_train.mining",
        f"{module} imports aoq_train.mining.driver",
    ]
