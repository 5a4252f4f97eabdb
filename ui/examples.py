"""Example queries for the page from a YAML file (``aoq ui --examples``): free text, grouped, each
with the answer it intends.

The file maps a group name ("skin tone", "gender", ...) to a list of queries. A query is either a
string, which is itself a caption of the catalogue (its own intended answer), or a one-entry
mapping ``query: intended caption`` (``crossed fingers with dark skin tone: "crossed fingers: dark
skin tone"``), or ``query: null`` for free text with no intended answer, judged by eye. The page
shows them as clickable examples; the intended caption's pictures are the correct answers, by
the model's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


class ExamplesError(ValueError):
    """The examples file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ExampleQuery:
    """One free-text example, its group and the caption it intends (None: judge by eye)."""

    group: str
    text: str
    intends: str | None = None


def _query(group: str, entry: object) -> ExampleQuery | None:
    """An entry of a group's list, or None when it is not one of the three forms."""
    if isinstance(entry, str) and entry.strip():
        return ExampleQuery(group, entry.strip(), entry.strip())
    if isinstance(entry, dict) and len(entry) == 1:
        (text, intends), = entry.items()
        if isinstance(text, str) and text.strip() and (intends is None or isinstance(intends, str) and intends.strip()):
            return ExampleQuery(group, text.strip(), intends.strip() if intends else None)
    return None


def load_example_queries(path: str | Path) -> list[ExampleQuery]:
    """The queries of ``path`` in file order.

    Raises:
        ExamplesError: the file is missing, not YAML, or not a mapping of names to lists of
            queries (strings, or one-entry mappings of a query to its intended caption or null).
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
        parsed = [_query(str(group), q) for q in queries] if isinstance(queries, list) else [None]
        if not parsed or None in parsed:
            raise ExamplesError(f"{path}: group {group!r} must be a list of non-empty strings or "
                                "'query: intended caption' entries")
        out += parsed
    return out
