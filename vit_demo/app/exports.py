"""Slide exports: every tab's "⬇ PNG for slides" buttons, and where the PNGs go.

A tab lays out a button (and the hidden file that carries the PNG to the browser) with
:func:`export_row`, writes its figure with :func:`save` (2400 px wide, matplotlib) and attaches
the button with :func:`wire_export`. ONE click downloads: the button greys out ("Preparing the
PNG…"), the figure is drawn, and the browser saves it at once (a few lines of JavaScript click
the file's link; no file box to click a second time). The buttons are off until there is an
image (:attr:`Section.exports`).
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
from .server.workspace import fresh, trim, workspace

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


# Runs in the browser once the PNG is made: download it (the hidden gr.File holds its URL and name).
DOWNLOAD_JS = """(f) => {
  if (!f || !f.url) return;
  const a = document.createElement("a");
  a.href = f.url; a.download = f.orig_name || "figure.png";
  document.body.appendChild(a); a.click(); a.remove();
}"""


def export_row(file_id: str | None = None, label: str = EXPORT, elem_id: str | None = None,
               min_width: int = 200) -> tuple[Component, Component]:
    """The export button (off until an image is analysed) and the hidden file it fills."""
    with gr.Row(elem_classes="export-row"):
        btn = gr.Button(label, size="sm", scale=0, min_width=min_width, interactive=False, elem_id=elem_id,
                        elem_classes="export-btn")
    out = gr.File(visible=False, elem_id=file_id)
    return btn, out


def wire_export(ctx: Context, btn: Component, out: Component, extra: list[Component], fn: Callable[..., Any],
                label: str = EXPORT) -> None:
    """On a click: ``fn(session, *values of extra)`` -> a PNG path, downloaded by the browser."""

    @friendly
    def on_export(*args):
        *rest, sess = args
        sess = ctx.session(sess)
        if not sess.ready:
            raise gr.Error("Upload an image first.", print_exception=False)
        return str(fn(sess, *rest))

    busy = btn.click(lambda: gr.update(interactive=False, value="Preparing the PNG…"), None, [btn], queue=False,
                     api_visibility="private", show_progress="hidden")
    made = busy.then(on_export, [*extra, ctx.state], [out], api_visibility="private", show_progress="hidden",
                     preprocess=False, **ctx.slow)
    made.then(lambda: gr.update(interactive=True, value=label), None, [btn], queue=False, api_visibility="private",
              show_progress="hidden")
    made.success(None, [out], None, js=DOWNLOAD_JS, api_visibility="private")
