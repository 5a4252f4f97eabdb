"""The installed packages and their source folders, read from setup.py (the one place they are
spelled), for the tests of the tree's layout."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def package_folders() -> dict[str, str]:
    """``{installed package: folder}``, the ``FOLDERS`` literal of setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["FOLDERS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py defines no FOLDERS")
