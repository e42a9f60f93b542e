"""Slides as plain records, laid out as an editable PowerPoint file or as a PDF: pure layout,
no model calls. :mod:`vit_demo.present.deck` decides what the slides say and show.

A :class:`Slide` has a title, an optional one-line subtitle, one or more rendered pictures
(side by side, as large as the slide allows) and speaker notes. :func:`write_pptx` writes a
16:9 PowerPoint file (python-pptx; title, subtitle, pictures, notes, and one PowerPoint
section per run of slides with the same ``section``); :func:`write_pdf` the same layout as a
PDF (:mod:`vit_demo.present.pdf`: text as vector, the pictures' PNG data embedded as it is), for
people without PowerPoint.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..viz.style import MUTED_COLOR, TEXT_COLOR
from . import pdf

FORMATS = ("pptx", "pdf")
SLIDE_W, SLIDE_H = 40 / 3, 7.5  # inches, 16:9 (PowerPoint's own widescreen size)
MARGIN = 0.45
TITLE_TOP, TITLE_H = 0.28, 0.75
SUBTITLE_TOP, SUBTITLE_H = 0.98, 0.42
BODY_TOP = 1.5  # pictures go between here and the bottom margin
GAP = 0.3


@dataclass
class Slide:
    """One slide: what it says and shows, independent of the file format."""

    title: str
    pictures: list[Image.Image]  # rendered figures, side by side
    notes: str  # speaker notes
    section: str
    subtitle: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    columns: list[float] | None = None  # share of the width for each picture (default: by aspect)


# ----------------------------------------------------------------------------- layout


def picture_boxes(sizes: Sequence[tuple[int, int]], columns: Sequence[float] | None = None
                  ) -> list[tuple[float, float, float, float]]:
    """(left, top, width, height) in inches for pictures of ``sizes`` (w, h) side by side,
    as large as the body of the slide allows, centred, aspect kept. ``columns``: each
    picture's share of the width instead (each then fits its own column)."""
    area_w, area_h = SLIDE_W - 2 * MARGIN, SLIDE_H - BODY_TOP - MARGIN
    if columns is not None:
        shares = np.asarray(columns, dtype=float) / sum(columns)
        out, x = [], MARGIN
        for (w, h), share in zip(sizes, shares):
            cw = share * area_w - GAP * (len(sizes) - 1) / len(sizes)
            bh = min(area_h, cw * h / w)
            bw = bh * w / h
            out.append((x + (cw - bw) / 2, BODY_TOP + (area_h - bh) / 2, bw, bh))
            x += cw + GAP
        return out
    aspects = [w / h for w, h in sizes]
    h = min(area_h, (area_w - GAP * (len(sizes) - 1)) / sum(aspects))
    total = sum(a * h for a in aspects) + GAP * (len(sizes) - 1)
    x = MARGIN + (area_w - total) / 2
    y = BODY_TOP + (area_h - h) / 2
    boxes = []
    for a in aspects:
        boxes.append((x, y, a * h, h))
        x += a * h + GAP
    return boxes


def _png(img: Image.Image) -> io.BytesIO:
    if "png" in img.info:
        return io.BytesIO(img.info["png"])
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=2)
    buf.seek(0)
    return buf


def write_pptx(slides: Sequence[Slide], path: str | Path) -> Path:
    """An editable 16:9 PowerPoint file: title, subtitle, picture(s) and notes per slide, one
    section per image."""
    from pptx import Presentation
    from pptx.dml.color import RGBColor
    from pptx.util import Emu, Inches, Pt

    prs = Presentation()
    prs.slide_width, prs.slide_height = Emu(12192000), Emu(6858000)  # = SLIDE_W x SLIDE_H inches
    layout = prs.slide_layouts[5]  # "Title Only"
    for s in slides:
        sl = prs.slides.add_slide(layout)
        title = sl.shapes.title
        title.left, title.top, title.width, title.height = (Inches(MARGIN), Inches(TITLE_TOP),
                                                            Inches(SLIDE_W - 2 * MARGIN), Inches(TITLE_H))
        title.text = s.title
        para = title.text_frame.paragraphs[0]
        para.font.size, para.font.bold = Pt(30), True
        para.font.color.rgb = RGBColor(0x22, 0x22, 0x22)
        para.alignment = 1  # left
        if s.subtitle:
            box = sl.shapes.add_textbox(Inches(MARGIN), Inches(SUBTITLE_TOP), Inches(SLIDE_W - 2 * MARGIN),
                                        Inches(SUBTITLE_H))
            box.text_frame.word_wrap = True
            box.text_frame.text = s.subtitle
            f = box.text_frame.paragraphs[0].font
            f.size, f.color.rgb = Pt(15), RGBColor(0x66, 0x66, 0x66)
        for img, (x, y, w, h) in zip(s.pictures, picture_boxes([p.size for p in s.pictures], s.columns)):
            sl.shapes.add_picture(_png(img), Inches(x), Inches(y), Inches(w), Inches(h))
        sl.notes_slide.notes_text_frame.text = s.notes
    _add_sections(prs, [s.section for s in slides])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prs.save(path)
    return path


def _add_sections(prs, sections: Sequence[str]) -> None:
    """PowerPoint sections (the p14 extension python-pptx does not model): consecutive slides
    with the same section name form one section."""
    from lxml import etree
    from pptx.oxml.ns import qn

    p14 = "http://schemas.microsoft.com/office/powerpoint/2010/main"
    ids = [sld.get("id") for sld in prs.slides._sldIdLst]
    ext_lst = prs.part._element.find(qn("p:extLst"))
    if ext_lst is None:
        ext_lst = etree.SubElement(prs.part._element, qn("p:extLst"))
    ext = etree.SubElement(ext_lst, qn("p:ext"), uri="{521415D9-36F7-43E2-AB2F-B90AF26B5E84}")
    lst = etree.SubElement(ext, f"{{{p14}}}sectionLst", nsmap={"p14": p14})
    current, ids_el = None, None
    for name, sid in zip(sections, ids):
        if name != current:
            sec = etree.SubElement(lst, f"{{{p14}}}section", name=name, id="{" + str(uuid.uuid4()).upper() + "}")
            ids_el = etree.SubElement(sec, f"{{{p14}}}sldIdLst")
            current = name
        etree.SubElement(ids_el, f"{{{p14}}}sldId", id=sid)


def write_pdf(slides: Sequence[Slide], path: str | Path) -> Path:
    """The same slides as a PDF: one 16:9 page per slide, the layout of :func:`write_pptx`, text
    as vector text (Helvetica), the pictures at full resolution, embedded without re-encoding
    (:mod:`vit_demo.present.pdf`)."""
    pt = 72.0  # points per inch
    width = (SLIDE_W - 2 * MARGIN) * pt
    pages = []
    for k, s in enumerate(slides):
        size = 28.0
        while pdf.text_width(s.title, size, "bold") > width and size > 16:  # a long title: smaller, one line
            size -= 1
        texts = [pdf.Text(s.title, MARGIN * pt, (TITLE_TOP + 0.08) * pt, size, TEXT_COLOR, "bold")]
        for i, line in enumerate(pdf.wrap(s.subtitle, 14, width)[:2]):
            texts.append(pdf.Text(line, MARGIN * pt, (SUBTITLE_TOP + 0.05) * pt + i * 16.5, 14, MUTED_COLOR))
        texts.append(pdf.Text(f"{k + 1} / {len(slides)}", (SLIDE_W - MARGIN) * pt, (SLIDE_H - 0.4) * pt, 10,
                              MUTED_COLOR, align="right"))
        pictures = [pdf.PlacedImage(img, tuple(v * pt for v in box))
                    for img, box in zip(s.pictures, picture_boxes([p.size for p in s.pictures], s.columns))]
        pages.append(pdf.Page(texts, pictures))
    return pdf.write(pages, path, (SLIDE_W * pt, SLIDE_H * pt), slides[0].title if slides else "")


def write(slides: Sequence[Slide], path: str | Path, fmt: str | None = None) -> Path:
    fmt = (fmt or Path(path).suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ValueError(f"{Path(path).name}: decks are .pptx or .pdf, not {fmt!r}")
    return write_pptx(slides, path) if fmt == "pptx" else write_pdf(slides, path)


