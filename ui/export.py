"""The current comparison as a file the browser downloads: both columns as CSV rows, carried in
the page as a ``data:`` link, so the UI writes no file of its own."""

from __future__ import annotations

import base64
import csv
import io
from html import escape

from aoq_serve.schemas import CompareImageOut, CompareTextOut

COLUMNS = ("column", "model", "scope", "positives", "rank", "score", "correct", "name_or_text", "copies", "split",
           "image_id", "caption_id")
EXPORT_NAME = "comparison.csv"


def comparison_csv(answer: CompareTextOut | CompareImageOut) -> str:
    """Every listed result of both columns: rank, score, whether correct, name or text, split, ids."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for side in ("left", "right"):
        column = getattr(answer, side)
        context = column.context
        for hit in column.results:
            text, copies, caption = (hit.name, 1, "") if isinstance(answer, CompareTextOut) else \
                (hit.text, hit.copies, hit.caption_id)
            writer.writerow([side, column.model, context.scope, context.positives, hit.rank, f"{hit.score:.6f}",
                             int(hit.is_ground_truth), text, copies, hit.split, hit.image_id, caption])
    return out.getvalue()


def download_link(answer: CompareTextOut | CompareImageOut) -> str:
    """An ``<a download>`` holding the comparison's CSV."""
    data = base64.b64encode(comparison_csv(answer).encode("utf-8")).decode("ascii")
    return (f'<a class="aoq-export" download="{EXPORT_NAME}" href="data:text/csv;base64,{data}">'
            f"download this comparison ({escape(EXPORT_NAME)})</a>")
