"""Numbers as pictures, fast (numpy + PIL): a vector as a strip of coloured cells, a matrix as an
image, a map over a patch grid with its numbers, bars, a line chart, a card of text. The pieces the
step-through's pictures (:mod:`~vit_demo.viz.steps`) are built from; every size is multiplied by a
:class:`Pen`'s scale (1: the app, 2: a slide).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from .arrays import as_array
from .style import HIGHLIGHT_RGB, colorize, text_font, text_width

INK, MUTED, RULE, EMPTY = (34, 34, 34), (102, 102, 102), (200, 200, 200), (225, 225, 225)
DIVERGING = "RdBu_r"  # signed numbers: blue below 0, white at 0, red above


class Pen:
    """Sizes at a scale: ``pen(12)`` pixels, ``pen.font(14, bold)`` a font of 14 scaled pixels."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = float(scale)

    def __call__(self, n: float) -> int:
        return max(1, round(n * self.scale))

    def font(self, size: float, bold: bool = False):
        return text_font(self(size), bold)


def signed_colours(values: np.ndarray, limit: float | None = None) -> np.ndarray:
    """uint8 RGB of signed ``values`` in :data:`DIVERGING` colours, on a scale symmetric about 0
    (``limit``: the largest |value|)."""
    v = as_array(values)
    m = float(np.nanmax(np.abs(v))) if limit is None else float(limit)
    return colorize(0.5 + 0.5 * v / (m if m > 0 else 1.0), DIVERGING)


def matrix_image(m: np.ndarray, size: tuple[int, int], limit: float | None = None) -> Image.Image:
    """A matrix [rows, cols] of signed numbers as a ``size`` (width, height) picture, each number a
    flat cell in :data:`DIVERGING` colours (resampled by nearest; more numbers than pixels: every k-th
    row or column shown)."""
    a = as_array(m)
    a = a.reshape(1, -1) if a.ndim == 1 else a
    w, h = size
    rows = np.minimum((np.arange(h) + 0.5) * a.shape[0] / h, a.shape[0] - 1).astype(int)
    cols = np.minimum((np.arange(w) + 0.5) * a.shape[1] / w, a.shape[1] - 1).astype(int)
    return Image.fromarray(signed_colours(a[rows][:, cols], limit))


def strip_image(values: np.ndarray, size: tuple[int, int], limit: float | None = None, vertical: bool = False
                ) -> Image.Image:
    """A vector as a strip of coloured cells, ``size`` (width, height), left to right (or top to bottom)."""
    v = as_array(values).reshape(-1)
    return matrix_image(v[:, None] if vertical else v[None, :], size, limit)


def framed(img: Image.Image, width: int = 1) -> Image.Image:
    """``img`` with a grey frame ``width`` pixels wide, drawn in place."""
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, img.width - 1, img.height - 1), outline=(136, 136, 136), width=width)
    return img


def grid_map_image(values: np.ndarray, cell: int, cmap: str = "inferno", mark: int | None = None,
                   numbers: bool = True, pen: Pen | None = None) -> Image.Image:
    """A map [gh, gw] as flat cells of ``cell`` pixels, coloured by value (its own min..max; NaN:
    grey, no number), each cell's number written when it fits (``numbers``), ``mark`` (a row-major
    index) outlined in cyan."""
    pen = pen or Pen()
    a = as_array(values)
    gh, gw = a.shape
    ok = np.isfinite(a)
    lo, hi = (float(a[ok].min()), float(a[ok].max())) if ok.any() else (0.0, 1.0)
    colours = colorize(np.where(ok, (a - lo) / (hi - lo if hi > lo else 1.0), 0), cmap)
    colours[~ok] = EMPTY
    img = Image.fromarray(colours).resize((gw * cell, gh * cell), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(img)
    font = text_font(max(7, int(cell * 0.3)))
    if numbers and cell >= pen(26):
        for (r, c), x in np.ndenumerate(a):
            if np.isfinite(x):
                light = int(colours[r, c].astype(int).sum()) < 380
                draw.text(((c + 0.5) * cell, (r + 0.5) * cell), f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}", font=font,
                          fill=(255, 255, 255) if light else INK, anchor="mm")
    if mark is not None:
        r, c = divmod(mark, gw)
        draw.rectangle((c * cell, r * cell, (c + 1) * cell - 1, (r + 1) * cell - 1), outline=(0, 0, 0), width=pen(4))
        draw.rectangle((c * cell + 1, r * cell + 1, (c + 1) * cell - 2, (r + 1) * cell - 2), outline=HIGHLIGHT_RGB,
                       width=pen(2))
    return img


def wrapped(text: str, font, width: int) -> list[str]:
    """``text`` in lines no wider than ``width`` pixels with ``font``."""
    chars = max(8, int(width / max(1, text_width("n", font))))
    lines = textwrap.wrap(text, chars)
    while chars > 8 and any(text_width(line, font) > width for line in lines):
        chars -= 2
        lines = textwrap.wrap(text, chars)
    return lines


def card_image(title: str, text: str, width: int, pen: Pen) -> Image.Image:
    """A step the model does not have: its title and what the model does instead, on a grey card."""
    font, bold = pen.font(16), pen.font(19, bold=True)
    lines = wrapped(text, font, width - pen(60))
    img = Image.new("RGB", (width, pen(110) + len(lines) * pen(24)), (246, 246, 246))
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, width - 1, img.height - 1), outline=RULE, width=pen(2))
    draw.text((pen(30), pen(30)), title, font=bold, fill=INK)
    for i, line in enumerate(lines):
        draw.text((pen(30), pen(72) + i * pen(24)), line, font=font, fill=MUTED)
    return img


def bars_image(labels: Sequence[str], values: Sequence[float], width: int, pen: Pen, text: Sequence[str] | None = None,
               highlight: int | None = 0) -> Image.Image:
    """Horizontal bars, one a row: label, bar (its length the value over the largest), its text."""
    font, bold = pen.font(15), pen.font(15, bold=True)
    label_w = min(width // 2, max(text_width(s, bold) for s in labels) + pen(12))
    tail = max(text_width(t, font) for t in (text or [f"{v:.2f}" for v in values])) + pen(16)
    row = pen(34)
    img = Image.new("RGB", (width, row * len(labels) + pen(8)), "white")
    draw = ImageDraw.Draw(img)
    top = max(values) if len(values) and max(values) > 0 else 1.0
    room = max(pen(40), width - label_w - tail)
    for i, (lab, val) in enumerate(zip(labels, values)):
        y = pen(4) + i * row
        draw.text((label_w - pen(8), y + row / 2), lab, font=bold if i == highlight else font, fill=INK, anchor="rm")
        w = max(1, round(room * max(0.0, float(val)) / top))
        draw.rectangle((label_w, y + pen(6), label_w + w, y + row - pen(6)), fill=(31, 119, 180) if i == highlight
                       else (158, 194, 224))
        draw.text((label_w + w + pen(6), y + row / 2), text[i] if text else f"{val:.2f}", font=font, fill=MUTED,
                  anchor="lm")
    return img


def line_chart_image(ys: Sequence[float], size: tuple[int, int], pen: Pen, xlabels: Sequence[str],
                     highlight: int | None = None, ylabel: str = "", ymax: float | None = None,
                     notes: Sequence[str] | None = None) -> Image.Image:
    """Points joined by lines over evenly spaced x labels (``highlight``: one point ringed), a y axis
    from 0 to ``ymax`` (default the largest y), ``notes``: a short word under each point, turned."""
    w, h = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font, small = pen.font(13), pen.font(12)
    left, right, top = pen(64), pen(20), pen(34) if ylabel else pen(16)
    bottom = pen(34) + (pen(120) if notes else 0)
    top_v = float(ymax if ymax is not None else max(max(ys), 1e-9))
    xs = [left + (w - left - right) * (i + 0.5) / len(ys) for i in range(len(ys))]
    yy = [h - bottom - (h - bottom - top) * float(y) / top_v for y in ys]
    draw.line((left, top, left, h - bottom, w - right, h - bottom), fill=RULE, width=pen(1))
    for frac in (0.0, 0.5, 1.0):
        y = h - bottom - (h - bottom - top) * frac
        draw.text((left - pen(6), y), f"{top_v * frac:.2g}", font=small, fill=MUTED, anchor="rm")
    if ylabel:
        draw.text((pen(4), top - pen(12)), ylabel, font=small, fill=MUTED, anchor="ld")
    draw.line(list(zip(xs, yy)), fill=(31, 119, 180), width=pen(3))
    for i, (x, y) in enumerate(zip(xs, yy)):
        r = pen(7) if i == highlight else pen(4)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=HIGHLIGHT_RGB if i == highlight else (31, 119, 180),
                     outline=(0, 0, 0) if i == highlight else None)
        draw.text((x, h - bottom + pen(12)), xlabels[i], font=font, fill=INK, anchor="mm")
        if notes:
            img.paste(turned_text(notes[i], small, pen(116)), (round(x - pen(8)), h - bottom + pen(26)))
    return img


def turned_text(text: str, font, length: int) -> Image.Image:
    """``text`` written bottom to top (turned 90 degrees), cut to ``length`` pixels."""
    while text_width(text, font) > length and len(text) > 3:
        text = text[:-2].rstrip() + "…"
    tile = Image.new("RGB", (length, font.size + 4), "white")
    ImageDraw.Draw(tile).text((length, 2), text, font=font, fill=INK, anchor="ra")
    return tile.rotate(90, expand=True)


def stack(pictures: Sequence[Image.Image], gap: int = 12, horizontal: bool = False) -> Image.Image:
    """Pictures one under the other (or side by side, centred) on white."""
    if horizontal:
        h = max(p.height for p in pictures)
        out = Image.new("RGB", (sum(p.width for p in pictures) + gap * (len(pictures) - 1), h), "white")
        x = 0
        for p in pictures:
            out.paste(p, (x, (h - p.height) // 2))
            x += p.width + gap
        return out
    w = max(p.width for p in pictures)
    out = Image.new("RGB", (w, sum(p.height for p in pictures) + gap * (len(pictures) - 1)), "white")
    y = 0
    for p in pictures:
        out.paste(p, ((w - p.width) // 2, y))
        y += p.height + gap
    return out


def label_image(text: str, pen: Pen, size: float = 14, bold: bool = False, colour: tuple[int, int, int] = INK,
                width: int | None = None) -> Image.Image:
    """One line of text as a picture (``width``: at least that wide, the text centred)."""
    font = pen.font(size, bold)
    w = max(width or 0, text_width(text, font) + pen(4))
    img = Image.new("RGB", (w, font.size + pen(8)), "white")
    ImageDraw.Draw(img).text((w / 2, img.height / 2), text, font=font, fill=colour, anchor="mm")
    return img
