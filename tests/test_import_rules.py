"""The import rule of the tree (docs/architecture.md): the core library ``aoq`` is imported by the
training app and the service, never the other way; the service never imports training code; the
UI speaks HTTP only (it may read the REST contract, ``backend.schemas``); no library module
imports the CLI. Read from the source, lazy imports inside functions included; the UI's own rule
(and a fresh-interpreter check that it loads neither torch nor FAISS) is tests/test_ui_imports.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


def _files(package: str, exclude: str | None = None) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    return [f for f in files if exclude is None or not f.is_relative_to(ROOT / exclude)]


def violations(files: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    out = []
    for path in files:
        for name in sorted(imported_modules(path)):
            if any(_under(name, f) for f in forbidden) and not any(_under(name, a) for a in allowed):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                out.append(f"{shown} imports {name}")
    return out


RULES = {
    "core (aoq, without aoq.cli)": (_files("aoq", exclude="aoq/cli"), ("training", "backend", "ui", "aoq.cli"), ()),
    "training": (_files("training"), ("backend", "ui", "aoq.cli"), ()),
    "backend": (_files("backend"), ("training", "ui", "aoq.cli"), ()),
    "backend.schemas (the contract the UI reads)": (
        [ROOT / "backend" / "schemas.py"], ("aoq", "backend", "torch", "faiss", "numpy", "fastapi"), ("aoq.names",)),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_import_rule(rule: str) -> None:
    files, forbidden, allowed = RULES[rule]
    assert files, f"{rule}: no files found"
    assert violations(files, forbidden, allowed) == []


def test_the_checker_sees_lazy_imports_and_honours_exceptions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\n\ndef f():\n    from training.mining import driver\n    import backend.schemas\n")
    assert imported_modules(module) == {"json", "training.mining", "training.mining.driver", "backend.schemas"}
    assert violations([module], ("training", "backend"), ("backend.schemas",)) == [
        f"{module} imports training.mining",
        f"{module} imports training.mining.driver",
    ]
