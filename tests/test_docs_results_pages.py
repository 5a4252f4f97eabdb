"""A results page that ``aoq report`` writes ends with its hand-written notes (``<page>-notes.md``),
as the page writer appends them: a notes file edited after the page was generated must be carried
into the page (a page once kept its three-seed reading under five-seed tables)."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def notes_files() -> list[Path]:
    return sorted(DOCS.glob("*-notes.md"))


def stale_pages() -> list[str]:
    stale = []
    for notes in notes_files():
        page = notes.with_name(notes.name.removesuffix("-notes.md") + ".md")
        if not page.is_file() or not page.read_text().endswith("\n" + notes.read_text()):
            stale.append(page.name)
    return stale


def test_every_results_page_ends_with_its_current_notes() -> None:
    assert len(notes_files()) >= 4
    assert stale_pages() == []
