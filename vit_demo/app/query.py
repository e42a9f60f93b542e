"""The query patch, which every tab shares: a click on a picture of the input makes the patch under
it the session's query (:attr:`Session.query`), and every section redraws what follows it
(:meth:`Section.show_query`, reading its ``query_inputs`` and writing its ``query_outputs``).

A tab wires the clicks on its own pictures with :func:`wire_query_click`: the Patches tab its
patch grid, the Attention tab its query picker and its single-head map, the Step inside tab the
grid of its first step. Nothing here knows a tab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from .. import viz
from ..analysis import Analysis
from .common import friendly
from .context import Component, Context, union, values
from .session import Session

SizeFn = Callable[[Analysis, dict[Component, Any]], "tuple[int, int] | None"]
"""(analysis, the sections' ``query_inputs`` values) -> the clicked picture's (width, height)
showing the model input, or None when a click on it picks no patch (e.g. a grid of heads)."""


def query_inputs(ctx: Context) -> list[Component]:
    """What the sections' :meth:`~Section.show_query` read, each once."""
    return union(s.query_inputs for s in ctx.sections)


def set_query(ctx: Context, sess: Session, query: int, vals: dict[Component, Any]) -> dict:
    """Make patch ``query`` the session's query: every section's redraw, and the session."""
    sess.query = query
    lm = ctx.model(sess)
    out: dict = {ctx.state: sess}
    for s in ctx.sections:
        out.update(s.show_query(sess, lm, query, vals))
    return out


def clicked_patch(a: Analysis, evt: Any, size: tuple[int, int] | None) -> int | None:
    """The patch under a click (``evt.index``: its pixel) on a picture whose top left ``size``
    shows the model input; None off it (the colour bar under a map, what a step's picture shows
    beside the grid) or when ``size`` is None."""
    index = getattr(evt, "index", None)
    if size is None or not isinstance(index, (list, tuple)) or len(index) != 2:
        return None
    x, y = float(index[0]), float(index[1])
    if not (y < size[1] and x < size[0]):
        return None
    return viz.patch_index_at(x, y, size, a.layout.grid)


def wire_query_click(ctx: Context, picture: Component, size_of: SizeFn) -> None:
    """A click on ``picture`` (a picture of the model input, ``size_of`` its size) makes the patch
    under it the query (call in a section's :meth:`~Section.wire`: every section is laid out)."""
    inputs = query_inputs(ctx)
    outputs = union([[ctx.state], *(s.query_outputs for s in ctx.sections)])

    @friendly
    def on_query_click(evt: gr.SelectData, sess: Any, *args: Any) -> Any:
        sess = ctx.session(sess)
        if not sess.ready:
            return gr.skip()
        a, vals = sess.analysis, values(inputs, args)
        q = clicked_patch(a, evt, size_of(a, vals))
        return gr.skip() if q is None else set_query(ctx, sess, q, vals)

    picture.select(on_query_click, [ctx.state, *inputs], outputs, api_visibility="private",
                   trigger_mode="always_last", show_progress="hidden", preprocess=False)
