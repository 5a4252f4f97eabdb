"""No user document carries a placeholder where a measured figure or a text belongs (a result block
left as ``RESULT_PLACEHOLDER`` shipped once): every text file under docs/ and README.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".md", ".txt", ".rst", ".json", ".yaml", ".yml", ".csv"}
# a placeholder token: XYZ_PLACEHOLDER or PLACEHOLDER_XYZ, <placeholder>, {{...}}-style template slots, TODO/TBD/FIXME
PLACEHOLDER = re.compile(r"[A-Za-z0-9_]*PLACEHOLDER[A-Za-z0-9_]*|<placeholder>|\{\{[^}]*\}\}|\bTODO\b|\bTBD\b|\bFIXME\b",
                         re.IGNORECASE)


def documents() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
    return [ROOT / "README.md", *sorted(docs)]


def placeholders(text: str) -> list[str]:
    return PLACEHOLDER.findall(text)


def test_the_pattern_finds_the_tokens_it_is_for() -> None:
    assert placeholders("a\nRESULT_PLACEHOLDER\nb") == ["RESULT_PLACEHOLDER"]
    assert placeholders("see <placeholder> and {{ figure }}; TODO: measure") == ["<placeholder>", "{{ figure }}",
                                                                                 "TODO"]
    assert placeholders("RESULT precision=float32 identical_lists=1.0000 todos, mastodon") == []


def test_no_document_carries_a_placeholder() -> None:
    found = {str(p.relative_to(ROOT)): hits for p in documents() if (hits := placeholders(p.read_text()))}
    assert len(documents()) > 5
    assert found == {}
