"""The page's shared controls and the side-by-side view every comparing tab shows.

Above the tabs: the two model pickers, top k and the search scope (``Shared``), which every tab
reads. In the text-to-image and image-to-text tabs: the hubness correction switch (none, QB-Norm,
inverted softmax; docs/serving.md, Hubness correction), sent as the compare calls' ``normalise``.
The failure cases tab has none: its cases and ranks are the evaluation's, on raw scores, so its
view always asks for ``none``. Changing a setting runs the shown query again.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from aoq_serve.schemas import MAX_K
from aoq_ui import handlers
from aoq_ui.client import BackendClient
from aoq_ui.render import NORMALISE_CHOICES, SCOPE_LABELS

DEFAULT_K = 5
DEFAULT_NORMALISE = "none"
#: where the correction is principled, under the switch (the service refuses it elsewhere)
NORMALISE_INFO = ("only with the scope 'test split only': the whole catalogue holds the training split, the "
                  "correction's own bank, which it would push down, so the service refuses it there")


@dataclass(frozen=True)
class Shared:
    """What every tab reads: the client, the model pickers, top k and the scope above the tabs."""

    api: BackendClient
    left: gr.Dropdown
    right: gr.Dropdown
    top_k: gr.Slider
    scope: gr.Radio

    @property
    def settings(self) -> list[gr.components.Component]:
        return [self.left, self.right, self.top_k, self.scope]


def shared_settings(client: BackendClient) -> Shared:
    """The row of settings above the tabs."""
    with gr.Row():
        left = gr.Dropdown(label="Left model", choices=[], elem_id="left-model", scale=2)
        right = gr.Dropdown(label="Right model", choices=[], elem_id="right-model", scale=2)
        top_k = gr.Slider(1, MAX_K, value=DEFAULT_K, step=1, label="top k", elem_id="top-k", scale=1)
        scope = gr.Radio([(label, value) for value, label in SCOPE_LABELS.items()], value="all",
                         label="Search scope", elem_id="scope", scale=2)
    return Shared(client, left, right, top_k, scope)


def normalise_dropdown(prefix: str, scale: int = 2) -> gr.Dropdown:
    """The hubness correction switch of a tab (``<prefix>-normalise``), default none."""
    return gr.Dropdown(NORMALISE_CHOICES, value=DEFAULT_NORMALISE, label="Hubness correction",
                       info=NORMALISE_INFO, elem_id=f"{prefix}-normalise", scale=scale)


@dataclass(frozen=True)
class SideBySide:
    """A side-by-side view: its query line, two columns, the query they show, and the hubness
    correction it asks for (a tab's switch, or a fixed ``none``)."""

    query: gr.HTML
    left: gr.HTML
    right: gr.HTML
    last: gr.State
    normalise: gr.Dropdown | gr.State

    @property
    def outputs(self) -> list[gr.components.Component]:
        return [self.query, self.left, self.right, self.last]


def side_by_side(prefix: str, query_id: str | None = None, normalise: gr.Dropdown | None = None) -> SideBySide:
    """The query line and the two columns of a tab; without a switch it ranks by raw scores."""
    query = gr.HTML(elem_id=query_id or f"{prefix}-query-line")
    with gr.Row(equal_height=False):
        left = gr.HTML(elem_id=f"{prefix}-left")
        right = gr.HTML(elem_id=f"{prefix}-right")
    return SideBySide(query, left, right, gr.State({}), normalise or gr.State(DEFAULT_NORMALISE))


def rerun(api: BackendClient, last: handlers.LastQuery, left: str | None, right: str | None, k: int, scope: str,
          normalise: str) -> list:
    """A view's outputs after its query ran again with new settings; left as they are when the
    view shows no query."""
    columns = handlers.run_last(api, last, left, right, k, scope, normalise)
    return [*columns, last] if columns else [gr.update()] * 4


def rerun_on_switch(shared: Shared, view: SideBySide) -> None:
    """Run a view's query again when its hubness correction switch changes."""

    def on_switch(last, left, right, k, scope, normalise):
        return rerun(shared.api, last, left, right, k, scope, normalise)

    view.normalise.input(on_switch, [view.last, *shared.settings, view.normalise], view.outputs,
                         trigger_mode="always_last")
