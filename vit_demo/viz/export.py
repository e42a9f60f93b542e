"""Figures out of matplotlib: PNG at an exact pixel width, SVG or PDF, with the outer white
margin trimmed; or a PIL picture for the app and the slides."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
from PIL import Image

FIGURE_FORMATS = ("png", "svg", "pdf")


def renderer(fig: Figure):
    """The Agg renderer of ``fig`` (a canvas is attached when the figure has none)."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    return canvas.get_renderer()


def content_box(fig: Figure) -> Bbox:
    """The figure's drawn content in inches (after layout), plus a 0.12-inch margin, within the figure."""
    pad = 0.12
    r = renderer(fig)
    fig.draw_without_rendering()
    tight = fig.get_tightbbox(r)
    w, h = fig.get_size_inches()
    return Bbox.from_extents(max(0, tight.x0 - pad), max(0, tight.y0 - pad), min(w, tight.x1 + pad), min(h, tight.y1 + pad))


def save_figure(fig: Figure, path: str | Path, width_px: int = 2400) -> Path:
    """Write ``fig`` to ``path``; the suffix picks PNG, SVG or PDF.

    The outer white margin is trimmed. PNG: exactly ``width_px`` pixels wide (the dpi
    follows from the trimmed width in inches; keep it >= 2000 for slides). SVG / PDF are
    vector; the pictures inside them are embedded at that same resolution. Metadata dates
    are left out, so the same figure gives the same file.
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"{path.name}: unsupported figure format {fmt!r}; use .png, .svg or .pdf")
    box = content_box(fig)
    dpi = (int(width_px) + 0.25) / box.width  # a hair over, so truncation lands on width_px
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    fig.savefig(path, format=fmt, dpi=dpi, bbox_inches=box, facecolor=fig.get_facecolor(), metadata=metadata)
    return path


def render_png(fig: Figure, width_px: int = 1600, compress_level: int = 6) -> Image.Image:
    """``fig`` as an RGB picture ``width_px`` wide, its white margin trimmed (:func:`figure_to_image`).
    The PNG bytes stay in ``info["png"]``, so that a writer (the PowerPoint deck) can reuse them
    instead of encoding again; ``compress_level``: zlib's, lower is faster."""
    img = figure_to_image(fig, width_px)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=compress_level)
    img.info["png"] = buf.getvalue()
    return img


def figure_to_image(fig: Figure, width_px: int = 1600) -> Image.Image:
    """Render ``fig`` to an RGB PIL image ``width_px`` wide, margin trimmed (e.g. to show a
    figure in the app).

    One layout pass finds the content's box, then ONE draw at the dpi that makes the box
    ``width_px`` wide, cropped to the box (``savefig(bbox_inches=...)`` draws twice and encodes
    an alpha channel: 2-4x slower for a slide figure)."""
    box = content_box(fig)
    old_dpi = fig.dpi
    dpi = (int(width_px) + 0.25) / box.width
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    try:
        fig.set_dpi(dpi)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())
        height = rgba.shape[0]
        x0 = max(0, int(box.x0 * dpi))
        y0 = max(0, int(round(height - box.y1 * dpi)))
        y1 = min(height, int(round(height - box.y0 * dpi)))
        img = Image.fromarray(np.ascontiguousarray(rgba[y0:y1, x0 : x0 + int(width_px), :3]))
    finally:
        fig.set_dpi(old_dpi)
    return img
