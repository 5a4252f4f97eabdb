"""Example queries for the page from a YAML file (``aoq ui --examples``): free text, grouped.

The file maps a group name ("skin tone", "gender", ...) to a list of query strings; the page
shows them as clickable examples that run through the models like typed text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


class ExamplesError(ValueError):
    """The examples file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ExampleQuery:
    """One free-text example and its group."""

    group: str
    text: str


def load_example_queries(path: str | Path) -> list[ExampleQuery]:
    """The queries of ``path`` in file order.

    Raises:
        ExamplesError: the file is missing, not YAML, or not a mapping of names to lists of strings.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ExamplesError(f"{path}: cannot read example queries ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise ExamplesError(f"{path}: expected a mapping of group names to lists of queries")
    out = []
    for group, queries in data.items():
        if not isinstance(queries, list) or not all(isinstance(q, str) and q.strip() for q in queries):
            raise ExamplesError(f"{path}: group {group!r} must be a list of non-empty strings")
        out += [ExampleQuery(str(group), q.strip()) for q in queries]
    return out
