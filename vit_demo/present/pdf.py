"""A small PDF writer for slides: pages of text lines (the PDF's own Helvetica, as vector text)
and PNG pictures embedded as they are.

Why not matplotlib's PDF backend (what the deck used before): it decodes every picture and
compresses it again (zlib level 6), 3 of the 15 CPU-seconds of a one-image deck. A PNG's
image data IS what a PDF's ``FlateDecode`` filter with PNG predictors reads, so the bytes
:func:`vit_demo.viz.render_png` already made for the PowerPoint file go into the PDF unchanged.
Text uses the 14 standard fonts every PDF viewer has (Helvetica), in WinAnsi encoding (the
typographic quotes, dashes, "·" and "×" included); its widths come from the font's metrics,
which matplotlib ships (``fonts/afm``), so that lines can be fitted and wrapped.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import matplotlib
from PIL import Image

FONTS = {"regular": ("Helvetica", "phvr8a.afm"), "bold": ("Helvetica-Bold", "phvb8a.afm")}
# glyphs beyond ASCII that slides use, by their PostScript names (for the widths)
GLYPH_NAMES = {"“": "quotedblleft", "”": "quotedblright", "‘": "quoteleft", "’": "quoteright", "·": "periodcentered",
               "×": "multiply", "–": "endash", "—": "emdash", "…": "ellipsis", "•": "bullet", "é": "eacute", "°": "degree"}


@dataclass
class Text:
    """One line of text: its left end at (x, y) in points from the page's top-left corner (y: the
    top of the line), ``size`` in points, ``weight`` "regular" or "bold", ``align`` left / right."""

    text: str
    x: float
    y: float
    size: float
    color: str = "#222222"
    weight: str = "regular"
    align: str = "left"


@dataclass
class PlacedImage:
    """A picture placed at (x, y, width, height) in points from the page's top-left corner."""

    image: Image.Image
    box: tuple[float, float, float, float]


@dataclass
class Page:
    texts: list[Text] = field(default_factory=list)
    pictures: list[PlacedImage] = field(default_factory=list)


@cache
def _widths(weight: str) -> dict[str, int]:
    """Glyph widths (thousandths of the font size) by character, from the font's AFM file."""
    path = Path(matplotlib.get_data_path()) / "fonts" / "afm" / FONTS[weight][1]
    by_code, by_name = {}, {}
    for line in path.read_text(encoding="latin-1").splitlines():
        if not line.startswith("C "):
            continue
        fields = dict(part.strip().split(" ", 1) for part in line.split(";") if " " in part.strip())
        by_name[fields.get("N", "")] = int(float(fields["WX"]))
        code = int(fields["C"])
        if 32 <= code < 127:
            by_code[chr(code)] = int(float(fields["WX"]))
    return by_code | {ch: by_name[n] for ch, n in GLYPH_NAMES.items() if n in by_name}


def text_width(text: str, size: float, weight: str = "regular") -> float:
    """Width in points of ``text`` set in Helvetica (bold) at ``size``."""
    w = _widths(weight)
    return sum(w.get(ch, 556) for ch in text) * size / 1000


def wrap(text: str, size: float, width: float) -> list[str]:
    """``text`` broken at spaces into lines at most ``width`` points wide (regular Helvetica)."""
    lines: list[str] = []
    for word in text.split():
        if lines and text_width(f"{lines[-1]} {word}", size) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def _literal(text: str) -> bytes:
    """A PDF string literal in WinAnsi encoding (characters it lacks become "?")."""
    raw = text.encode("cp1252", errors="replace")
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def _rgb(color: str) -> str:
    c = color.lstrip("#")
    return " ".join(f"{int(c[i:i + 2], 16) / 255:.3f}" for i in (0, 2, 4))


def png_stream(img: Image.Image) -> tuple[bytes, int, int]:
    """(zlib data of the PNG's image, width, height) for an 8-bit RGB picture: the PNG bytes in
    ``img.info["png"]`` when they are such a PNG (no work), else the picture encoded once."""
    data = img.info.get("png") if img.mode == "RGB" else None
    if data is None or data[25:29] != bytes([8, 2, 0, 0]) or data[29] != 0:  # bit depth, colour type, ..., interlace
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="PNG", compress_level=2)
        data = buf.getvalue()
    out, pos = [], 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            out.append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    w, h = struct.unpack(">II", data[16:24])
    return b"".join(out), w, h


def _content(page: Page, height: float) -> bytes:
    """A page's drawing operators: pictures first (``/Im1``...), then the text over them."""
    ops = []
    for k, p in enumerate(page.pictures):
        x, y, w, h = p.box
        ops.append(f"q {w:.2f} 0 0 {h:.2f} {x:.2f} {height - y - h:.2f} cm /Im{k + 1} Do Q".encode())
    for t in page.texts:
        font = "F2" if t.weight == "bold" else "F1"
        x = t.x - (text_width(t.text, t.size, t.weight) if t.align == "right" else 0)
        baseline = height - t.y - 0.75 * t.size  # Helvetica's ascender: 0.72-0.75 em
        ops.append(f"BT /{font} {t.size:.2f} Tf {_rgb(t.color)} rg {x:.2f} {baseline:.2f} Td ".encode()
                   + _literal(t.text) + b" Tj ET")
    return b"\n".join(ops)


def write(pages: Sequence[Page], path: str | Path, size: tuple[float, float], title: str = "") -> Path:
    """Write ``pages`` (each ``size`` = (width, height) in points) as a PDF file."""
    width, height = size
    objects: list[bytes] = []  # object k + 1 is objects[k]

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    def stream(head: str, data: bytes) -> int:
        return add(f"<< {head} /Length {len(data)} >>\nstream\n".encode() + data + b"\nendstream")

    fonts = {f"F{i + 1}": add(f"<< /Type /Font /Subtype /Type1 /BaseFont /{FONTS[w][0]} "
                               "/Encoding /WinAnsiEncoding >>".encode()) for i, w in enumerate(("regular", "bold"))}
    pages_id = len(objects) + 1 + sum(1 + len(p.pictures) + 1 for p in pages)  # reserved: after every page's objects
    kids = []
    for page in pages:
        xobjects = []
        for k, pic in enumerate(page.pictures):
            data, w, h = png_stream(pic.image)
            pic_id = stream(f"/Type /XObject /Subtype /Image /Width {w} /Height {h} /ColorSpace /DeviceRGB "
                            f"/BitsPerComponent 8 /Filter /FlateDecode /DecodeParms << /Predictor 15 /Colors 3 "
                            f"/BitsPerComponent 8 /Columns {w} >>", data)
            xobjects.append(f"/Im{k + 1} {pic_id} 0 R")
        content_id = stream("/Filter /FlateDecode", zlib.compress(_content(page, height), 6))
        font_refs = " ".join(f"/{n} {i} 0 R" for n, i in fonts.items())
        kids.append(add(f"<< /Type /Page /Parent {pages_id} 0 R /MediaBox [0 0 {width:.2f} {height:.2f}] "
                        f"/Resources << /Font << {font_refs} >> /XObject << {' '.join(xobjects)} >> >> "
                        f"/Contents {content_id} 0 R >>".encode()))
    if add(f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>".encode()) != pages_id:
        raise RuntimeError("PDF object numbering went wrong")  # a bug here, never the user's
    catalog = add(f"<< /Type /Catalog /Pages {pages_id} 0 R >>".encode())
    utf16 = ("\ufeff" + title).encode("utf-16-be").hex()  # the document title in any script
    info = add(f"<< /Title <{utf16}> /Producer (vit_demo) >>".encode())
    return _save(objects, catalog, info, Path(path))


def _save(objects: list[bytes], catalog: int, info: int, path: Path) -> Path:
    """The file: header, the objects, the cross-reference table and the trailer."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for k, body in enumerate(objects):
        offsets.append(len(out))
        out += f"{k + 1} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root {catalog} 0 R /Info {info} 0 R >>\n"
            f"startxref\n{xref}\n%%EOF\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path
