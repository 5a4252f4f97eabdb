"""The page's view in its address: which tab, which query (text or gallery image id), which
two models, how many results, which scope and which hubness correction ranked them, so that a
link reproduces what was on screen.

``?tab=t2i&q=flag+of+Japan&left=baseline&right=aoq&k=5&scope=all&normalise=qbnorm`` or
``?tab=i2t&image=812``.
Values that do not parse are dropped, never an error: a shared link should open the page
anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from aoq.names import NORMALISATIONS
from aoq_serve.schemas import MAX_ID, MAX_K, MAX_QUERY_CHARS

TABS = ("t2i", "i2t", "failures", "negatives", "metrics")
SCOPES = ("all", "test")


@dataclass(frozen=True)
class View:
    tab: str = "t2i"
    query: str | None = None
    image: int | None = None
    left: str | None = None
    right: str | None = None
    k: int | None = None
    scope: str | None = None
    normalise: str | None = None


def _int(value: str | None, low: int, high: int) -> int | None:
    if value is None or not value.isdigit():
        return None
    number = int(value)
    return number if low <= number <= high else None


def parse_view(params: Mapping[str, str]) -> View:
    """The view a page address asks for."""
    query = (params.get("q") or "").strip()[:MAX_QUERY_CHARS] or None
    return View(
        tab=params.get("tab") if params.get("tab") in TABS else "t2i",
        query=query,
        image=_int(params.get("image"), 0, MAX_ID),
        left=params.get("left") or None,
        right=params.get("right") or None,
        k=_int(params.get("k"), 1, MAX_K),
        scope=params.get("scope") if params.get("scope") in SCOPES else None,
        normalise=params.get("normalise") if params.get("normalise") in NORMALISATIONS else None,
    )


def view_query(view: View) -> str:
    """The address (``?...``) of a view; unset fields are left out."""
    fields = {"tab": view.tab, "q": view.query, "image": view.image, "left": view.left, "right": view.right,
              "k": view.k, "scope": view.scope, "normalise": view.normalise}
    return "?" + urlencode({k: v for k, v in fields.items() if v is not None})
