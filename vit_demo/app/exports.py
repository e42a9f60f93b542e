"""Slide exports: every tab's "⬇ PNG for slides" button and file, and where the PNGs go.

A tab lays out a button and a file with :func:`export_row`, writes its figure with
:func:`save` (2400 px wide, matplotlib) and attaches the button with :func:`wire_export`.
"""

from __future__ import annotations

import re
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr

from .. import viz
from .common import friendly
from .context import Component, Context
from .workspace import fresh, trim, workspace

EXPORT = "⬇ PNG for slides (2400 px)"
EXPORT_WIDTH = 2400  # px: slide resolution of every downloadable figure
EXPORT_AGE_S = 3600  # an export is there to be downloaded now: files older than an hour go


def export_dir() -> Path:
    """A new folder (random name) for one export, in the app's export folder; the folder is kept
    within the app's disk budget for exports (``--exports-mb``: the oldest files go first) and
    files older than an hour go."""
    ws = workspace()
    trim(ws.exports, ws.exports_budget, max_age_s=EXPORT_AGE_S)
    return fresh(ws.exports)


def within_budget() -> None:
    """After writing an export: the oldest ones go while the folder is over its budget."""
    ws = workspace()
    trim(ws.exports, ws.exports_budget)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "image"


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))


def save(fig, name: str, width: int = EXPORT_WIDTH) -> Path:
    """Write ``fig`` as ``<slug of name>.png`` in the export folder (atomically)."""
    out = export_dir() / f"{slug(name)}.png"
    tmp = Path(tempfile.mkstemp(dir=out.parent, suffix=".png")[1])
    viz.save_figure(fig, tmp, width)
    tmp.replace(out)
    within_budget()
    return out


def export_row(file_id: str | None = None) -> tuple[Component, Component]:
    """The export button and the (hidden until used) file it fills."""
    with gr.Row(elem_classes="export-row"):
        btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
        out = gr.File(visible=False, show_label=False, height=60, elem_id=file_id)
    return btn, out


def wire_export(ctx: Context, btn: Component, out: Component, extra: list[Component], fn: Callable[..., Any]) -> None:
    """On a click: ``fn(session, *values of extra)`` -> a PNG path, shown in ``out``."""

    @friendly
    def on_export(*args):
        *rest, sess = args
        sess = ctx.session(sess)
        if not sess.ready:
            raise gr.Error("Upload an image first.", print_exception=False)
        return gr.update(value=str(fn(sess, *rest)), visible=True)

    btn.click(on_export, [*extra, ctx.state], [out], api_visibility="private", show_progress="minimal",
              preprocess=False, **ctx.slow)
