"""The start-up check of the catalogue: the service refuses to start on a catalogue that is
missing, damaged or not written by ``aoq index``, with one line that names it and says how to
rebuild it, instead of a traceback or a silently created empty catalogue.

- SQLite: the file must exist (the service never creates it) and pass ``PRAGMA quick_check``
  (the b-tree structure of every page; a truncated or bit-flipped file fails it or cannot be
  opened at all).
- Both backends: every table ``aoq index`` writes exists, and each catalogued split holds as many
  image and caption rows as it recorded when it was registered.

The content itself (caption text and ids of a gallery) is checked per model against the digest in
its index manifest when the models are loaded (:mod:`aoq_serve.registry`).
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError

from aoq_serve.config import Settings
from aoq_serve.store.catalogue import CatalogueError
from aoq_serve.store.db import Base, Caption, DatasetSplit, Image, make_engine


def rebuild_hint(settings: Settings) -> str:
    """The ``aoq index`` command that writes this service's catalogue and indexes."""
    hint = f"aoq index --models-dir {settings.models_dir} --data-dir {settings.data_dir} --out {settings.index_dir}"
    if settings.catalogue_url:
        hint += f" --catalogue {make_url(settings.catalogue_url).render_as_string(hide_password=True)}"
    return hint


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for other backends and in-memory databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def report_path(path: Path) -> Path:
    """Where the full ``PRAGMA quick_check`` report of a failing catalogue file is written."""
    return path.with_name(path.name + ".quick_check.txt")


def _write_report(path: Path, lines: list[str]) -> str:
    """Write the full report beside the catalogue (else in the temporary folder); its path."""
    text = "\n".join(lines) + "\n"
    for target in (report_path(path), Path(tempfile.gettempdir()) / f"aoq-{report_path(path).name}"):
        try:
            target.write_text(text, encoding="utf-8")
            return str(target)
        except OSError:
            continue
    return "not written (no writable folder)"


def _quick_check(path: Path) -> str | None:
    """None when the SQLite file passes ``PRAGMA quick_check``, else what is wrong (one line).

    SQLite reports up to 100 problems, and one row may hold many lines: the line names the first
    problem and the number of lines, and the whole report goes to a file beside the catalogue."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
    except sqlite3.Error as exc:
        return f"cannot be opened ({exc})"
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        return f"is not a readable SQLite database ({exc})"
    finally:
        conn.close()
    if rows == [("ok",)]:
        return None
    lines = [line for row in rows for line in str(row[0]).splitlines() if line.strip()]
    problems = [line for line in lines if not line.startswith("***")] or lines
    return (f"fails PRAGMA quick_check ({len(problems)} problem(s), first: {problems[0].strip()}; "
            f"full report: {_write_report(path, lines)})")


def row_count_problem(conn: Connection) -> str | None:
    """None when every catalogued split holds as many image and caption rows as it recorded when
    it was registered, else the first difference (one line). One indexed COUNT per table and split:
    cheap enough for the service to repeat while serving (a deleted row is found, not served as a
    short answer)."""
    for split in conn.execute(select(DatasetSplit)).all():
        for table, expected in ((Image, split.n_images), (Caption, split.n_captions)):
            found = conn.scalar(select(func.count()).select_from(table).where(
                table.dataset_id == split.dataset_id, table.split == split.name))
            if found != expected:
                return (f"split {split.name!r} of dataset {split.dataset_id} has {found} {table.__tablename__} "
                        f"rows but recorded {expected} (rows deleted or added behind aoq index)")
    return None


def check_catalogue(settings: Settings) -> None:
    """Refuse a catalogue the service cannot trust.

    Raises:
        CatalogueError: one line naming the catalogue, the problem and the rebuild command.
    """
    url = settings.catalogue()
    path = sqlite_path(url)
    where = str(path) if path is not None else make_url(url).render_as_string(hide_password=True)
    rebuild = rebuild_hint(settings)
    if path is not None:
        if not path.is_file():
            raise CatalogueError(f"catalogue {where} is missing; build it with: {rebuild}")
        problem = _quick_check(path)
        if problem is not None:
            raise CatalogueError(f"catalogue {where} {problem}; move it away and rebuild it with: {rebuild}")
    engine = make_engine(url, create=False)
    try:
        with engine.connect() as conn:
            missing = sorted(set(Base.metadata.tables) - set(inspect(conn).get_table_names()))
            if missing:
                raise CatalogueError(f"catalogue {where} has no table {', '.join(missing)}: it was not written by "
                                     f"aoq index or is damaged; rebuild it with: {rebuild}")
            problem = row_count_problem(conn)
            if problem is not None:
                raise CatalogueError(f"catalogue {where}: {problem}; rebuild it with: {rebuild}")
    except SQLAlchemyError as exc:
        first = str(exc.orig if getattr(exc, "orig", None) is not None else exc).strip().splitlines()[0]
        raise CatalogueError(f"catalogue {where} cannot be read ({first}); rebuild it with: {rebuild}") from None
    finally:
        engine.dispose()
