"""The current comparison as a file the browser downloads: both columns as CSV rows, carried in
the page as a ``data:`` link, so the UI writes no file of its own. Each row says which query,
scope, hubness correction and model it comes from, and the file is named after the query."""

from __future__ import annotations

import base64
import csv
import io
import re
from html import escape

from aoq_serve.schemas import CompareImageOut, CompareTextOut

COLUMNS = ("query", "column", "model", "scope", "hubness", "positives", "rank", "score", "correct", "name_or_text",
           "copies", "split", "image_id", "caption_id")
#: the longest query part of a file name, in characters
NAME_CHARS = 60


def query_label(answer: CompareTextOut | CompareImageOut) -> str:
    """The query in words: its text, ``picture 812: flag: Japan``, or ``uploaded picture``."""
    if isinstance(answer, CompareTextOut):
        return answer.query
    query = answer.left.query
    return "uploaded picture" if query is None else f"picture {query.image_id}: {query.name}"


def file_name(query: str) -> str:
    """``aoq-<the query's letters and digits, dashed>.csv`` (``aoq-flag-of-japan.csv``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", query.lower()).strip("-")[:NAME_CHARS].strip("-")
    return f"aoq-{slug or 'query'}.csv"


def comparison_csv(answer: CompareTextOut | CompareImageOut) -> str:
    """Every listed result of both columns: the query, scope, hubness correction and model, then
    rank, score, whether correct, name or text, split, ids."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    query = query_label(answer)
    for side in ("left", "right"):
        column = getattr(answer, side)
        context = column.context
        for hit in column.results:
            text, copies, caption = (hit.name, 1, "") if isinstance(answer, CompareTextOut) else \
                (hit.text, hit.copies, hit.caption_id)
            writer.writerow([query, side, column.model, context.scope, context.normalise, context.positives, hit.rank,
                             f"{hit.score:.6f}", int(hit.is_ground_truth), text, copies, hit.split, hit.image_id,
                             caption])
    return out.getvalue()


def download_link(answer: CompareTextOut | CompareImageOut) -> str:
    """An ``<a download>`` holding the comparison's CSV, named after the query."""
    data = base64.b64encode(comparison_csv(answer).encode("utf-8")).decode("ascii")
    name = file_name(query_label(answer))
    return (f'<a class="aoq-export" download="{escape(name)}" href="data:text/csv;base64,{data}">'
            f"download this comparison ({escape(name)})</a>")
