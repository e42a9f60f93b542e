"""What every result of the Python API shares: it draws itself in Jupyter (``_repr_png_``,
``_repr_html_``), gives a matplotlib figure to compose (:meth:`Drawable.figure`) and saves it at
slide resolution (:meth:`Drawable.save`: 2400 px, what the app's "PNG for slides" buttons write).

The pictures come from :mod:`vit_demo.viz`: the app's fast renderers for the inline picture and the
figure functions of the command line and the app's exports for :meth:`~Drawable.figure`; nothing is
drawn here."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from .. import viz

SLIDE_WIDTH = 2400  # px: the app's "PNG for slides" (vit_demo.app.exports.EXPORT_WIDTH)
CMAP, ALPHA = "inferno", 0.6  # the app's default colormap and opacity


class Drawable:
    """The display protocol of the results (a mix-in of their dataclasses)."""

    def render(self) -> Image.Image:
        """The result as one RGB picture, as the app shows it."""
        raise NotImplementedError

    def figure(self) -> Figure:
        """The result as a matplotlib figure (to compose, or to save)."""
        raise NotImplementedError

    def html_details(self) -> str:
        """HTML shown under the picture in a notebook (a table), or ""."""
        return ""

    def save(self, path: str | Path, width: int = SLIDE_WIDTH) -> Path:
        """Write :meth:`figure` to ``path`` (PNG ``width`` px wide, or .svg / .pdf); the path written."""
        return viz.save_figure(self.figure(), path, width_px=width)

    def _repr_png_(self) -> bytes:
        return png_bytes(self.render())

    def _repr_html_(self) -> str:
        return img_tag(self.render()) + self.html_details()


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


def img_tag(img: Image.Image) -> str:
    data = base64.b64encode(png_bytes(img)).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def stacked(pictures: Sequence[Image.Image]) -> Image.Image:
    """Pictures one under the other on white, left-aligned, 12 pixels apart."""
    gap = 12
    w = max(p.width for p in pictures)
    out = Image.new("RGB", (w, sum(p.height for p in pictures) + gap * (len(pictures) - 1)), "white")
    y = 0
    for p in pictures:
        out.paste(p.convert("RGB"), (0, y))
        y += p.height + gap
    return out


def beside(pictures: Sequence[Image.Image]) -> Image.Image:
    """Pictures side by side on white, centred on one line, 16 pixels apart."""
    gap = 16
    h = max(p.height for p in pictures)
    out = Image.new("RGB", (sum(p.width for p in pictures) + gap * (len(pictures) - 1), h), "white")
    x = 0
    for p in pictures:
        out.paste(p.convert("RGB"), (x, (h - p.height) // 2))
        x += p.width + gap
    return out


def picture_figure(img: Image.Image, title: str | None = None) -> Figure:
    """A rendered picture in a figure of its own (for results whose picture has no matplotlib twin)."""
    fig = Figure(figsize=(img.width / 100, img.height / 100 + (0.5 if title else 0)), facecolor="white",
                 layout="constrained")
    ax = fig.add_subplot()
    ax.imshow(np.asarray(img))
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=viz.TITLE_SIZE, color=viz.TEXT_COLOR, fontweight="bold")
    return fig


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A small HTML table; floats with three decimals."""
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))  # noqa: E731
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def topk_table(predictions: Sequence[Mapping[str, Any]]) -> str:
    return table(["class", "label", "probability"],
                 [(p["index"], p["label"], f"{p['prob'] * 100:.1f}%") for p in predictions])
