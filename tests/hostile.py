"""Build a corpus of hostile and unusual files in code: nothing downloaded, nothing committed.

Images: :func:`build_images` writes every case into a folder and returns ``{name: path}``;
the expensive ones (:func:`png_bomb`, :func:`large_jpeg`) are separate so a test can build
them once per session. Checkpoints: small helpers that write malicious pickles and broken
safetensors files. Every file is deterministic (fixed seeds, fixed content).
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

# ----------------------------------------------------------------------------- PNG by hand


def png_chunk(ctype: bytes, data: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk: length, type, data, CRC (the correct CRC unless ``crc`` is given)."""
    good = zlib.crc32(ctype + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", good if crc is None else crc)


def png_file(width: int, height: int, bit_depth: int, color_type: int, idat: bytes,
             ihdr_crc: int | None = None) -> bytes:
    """A PNG with the given IHDR fields and an (already compressed) IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    chunks = png_chunk(b"IHDR", ihdr, ihdr_crc) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def png_bomb(width: int = 30_000, height: int = 30_000) -> bytes:
    """A real decompression bomb: a 1-bit greyscale PNG of ``width`` x ``height`` zero pixels.

    About 0.5 MB on disk for 30000x30000 (900 MP: 2.7 GB as RGB). Every row is present, so a
    decoder that trusted the header would really allocate and inflate all of it.
    """
    row = b"\0" * (1 + (width + 7) // 8)  # filter byte + packed bits
    co = zlib.compressobj(1)
    parts, block = [], row * 1000
    for _ in range(height // 1000):
        parts.append(co.compress(block))
    parts += [co.compress(row * (height % 1000)), co.flush()]
    return png_file(width, height, 1, 0, b"".join(parts))


def png_header_only(width: int, height: int) -> bytes:
    """An 8-bit RGB PNG header declaring ``width`` x ``height`` with one row of data."""
    return png_file(width, height, 8, 2, zlib.compress(b"\0" * (1 + 3 * width)))


def gif_header_bomb(width: int = 65_535, height: int = 65_535) -> bytes:
    """A tiny GIF whose logical screen and frame declare ``width`` x ``height`` (4.3 GP)."""
    head = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    frame = b"," + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame + b";"


def jpeg_header_bomb(width: int = 65_000, height: int = 65_000) -> bytes:
    """A small valid JPEG whose SOF marker is patched to declare ``width`` x ``height``."""
    data = bytearray(_jpeg(Image.new("RGB", (16, 16), (10, 200, 30))))
    i = data.find(b"\xff\xc0")  # SOF0: FFC0, length(2), precision(1), height(2), width(2)
    struct.pack_into(">HH", data, i + 5, height, width)
    return bytes(data)


# ----------------------------------------------------------------------------- pictures


def quadrants(w: int = 96, h: int = 64) -> Image.Image:
    """An asymmetric RGB picture: red, green / blue, white quadrants (top-left first)."""
    a = np.empty((h, w, 3), np.uint8)
    a[: h // 2, : w // 2] = (255, 0, 0)
    a[: h // 2, w // 2 :] = (0, 255, 0)
    a[h // 2 :, : w // 2] = (0, 0, 255)
    a[h // 2 :, w // 2 :] = (255, 255, 255)
    return Image.fromarray(a)


QUADRANT_COLOURS = {"tl": (255, 0, 0), "tr": (0, 255, 0), "bl": (0, 0, 255), "br": (255, 255, 255)}


def quadrant_means(img: Image.Image) -> dict[str, np.ndarray]:
    """Mean colour of the inner half of each quadrant (away from edges and JPEG ringing)."""
    a = np.asarray(img.convert("RGB"), dtype=np.float64)
    h, w = a.shape[:2]
    qh, qw = h // 2, w // 2
    def inner(y, x):  # noqa: E306
        return a[y + qh // 4 : y + qh - qh // 4, x + qw // 4 : x + qw - qw // 4].reshape(-1, 3).mean(0)
    return {"tl": inner(0, 0), "tr": inner(0, qw), "bl": inner(qh, 0), "br": inner(qh, qw)}


def columns_strip(w: int = 3, h: int = 5000) -> Image.Image:
    """A very tall, very narrow picture: a red, a green and a blue column (w=3)."""
    a = np.zeros((h, w, 3), np.uint8)
    for x in range(w):
        a[:, x, x % 3] = 255
    return Image.fromarray(a)


def _jpeg(img: Image.Image, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, "JPEG", quality=kw.pop("quality", 95), **kw)
    return b.getvalue()


def _png(img: Image.Image, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, "PNG", **kw)
    return b.getvalue()


def exif_rotated_jpeg(upright: Image.Image, orientation: int) -> bytes:
    """A JPEG whose stored pixels are ``upright`` turned so that EXIF ``orientation`` (6 or 8)
    tells a viewer to turn them back: a correct loader returns ``upright``."""
    # orientation 6: "rotate 90 CW to view" -> store it turned 90 CCW; 8 is the mirror case
    stored = upright.transpose(Image.Transpose.ROTATE_90 if orientation == 6 else Image.Transpose.ROTATE_270)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _jpeg(stored, exif=exif.tobytes())


def grey16() -> Image.Image:
    """16-bit greyscale: a horizontal ramp over the whole 0..65535 range (mode I;16)."""
    ramp = np.linspace(0, 65535, 256).round().astype(np.uint16)
    return Image.fromarray(np.tile(ramp, (32, 1)))


def dark_grey16() -> Image.Image:
    """16-bit greyscale that only uses 0..255 of 65535: nearly black to any viewer."""
    return Image.fromarray(np.tile(np.arange(256, dtype=np.uint16), (32, 1)))


def rgba_half() -> Image.Image:
    """RGBA, left half opaque red, right half fully transparent (its colour is blue)."""
    a = np.zeros((32, 64, 4), np.uint8)
    a[:, :32] = (255, 0, 0, 255)
    a[:, 32:] = (0, 0, 255, 0)
    return Image.fromarray(a)


def palette_transparent() -> Image.Image:
    """Palette image: index 0 (green) is transparent, index 1 is red; left half transparent."""
    img = Image.new("P", (64, 32), 0)
    img.putpalette([0, 255, 0, 255, 0, 0] + [0, 0, 0] * 254)
    img.paste(1, (32, 0, 64, 32))
    img.info["transparency"] = 0
    return img


def animated_gif() -> bytes:
    """Three frames: red, green, blue (the first frame is red)."""
    frames = [Image.new("RGB", (40, 30), c).convert("P") for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return b.getvalue()


def tiff_pages(n: int, side: int = 16) -> bytes:
    """A TIFF of ``n`` pages, each a ``side`` x ``side`` grey picture, all pointing at the same
    pixels: 102 bytes a page (Pillow's count of them grows with the square of ``n``)."""
    pixels = bytes(range(256)) * (side * side // 256 + 1)
    out = bytearray(b"II*\x00" + struct.pack("<I", 8 + side * side) + pixels[:side * side])
    pos = len(out)
    for i in range(n):
        nxt = pos + 2 + 8 * 12 + 4 if i < n - 1 else 0
        tags = [(256, 3, 1, side), (257, 3, 1, side), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
                (273, 4, 1, 8), (278, 3, 1, side), (279, 4, 1, side * side)]
        out += struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags) + struct.pack("<I", nxt)
        pos = nxt
    return bytes(out)


def truncated_jpeg(keep: float = 0.6) -> bytes:
    rng = np.random.default_rng(0)  # noise: compressed data spread over the whole file
    data = _jpeg(Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)))
    return data[: int(len(data) * keep)]


def png_bad_header_crc() -> bytes:
    """A valid picture whose IHDR chunk has a wrong CRC."""
    data = bytearray(_png(quadrants()))
    data[29:33] = bytes(b ^ 0xFF for b in data[29:33])  # 8 signature + 4 len + 4 type + 13 data
    return bytes(data)


def png_corrupt_idat() -> bytes:
    """A valid PNG whose compressed IDAT bytes are scrambled (the CRC is left stale)."""
    data = bytearray(_png(quadrants()))
    i = data.find(b"IDAT") + 4
    for j in range(i + 8, i + 40):
        data[j] ^= 0x5A
    return bytes(data)


def png_bad_idat_crc() -> bytes:
    """A valid PNG whose IDAT data is intact but whose CRC is wrong."""
    data = bytearray(_png(quadrants()))
    i = data.find(b"IDAT")
    n = struct.unpack(">I", data[i - 4 : i])[0]
    data[i + 4 + n] ^= 0xFF
    return bytes(data)


def large_jpeg(path: Path, w: int = 8000, h: int = 6000) -> Path:
    """A large but legitimate photo-sized JPEG: red ramps left to right, green top to bottom."""
    a = np.empty((h, w, 3), np.uint8)
    a[..., 0] = np.linspace(0, 255, w).astype(np.uint8)[None, :]
    a[..., 1] = np.linspace(0, 255, h).astype(np.uint8)[:, None]
    a[..., 2] = 128
    path.write_bytes(_jpeg(Image.fromarray(a), quality=85))
    return path


# Cases that must be refused with ImageError, and cases that must load.
BAD = ("zero_byte.jpg", "text.jpg", "truncated.jpg", "bad_header_crc.png", "corrupt_idat.png",
       "bomb_header_9000.png", "bomb_gif.gif", "bomb_jpeg.jpg", "html.png")
GOOD = ("one_pixel.png", "strip_3x5000.png", "grey.jpg", "grey16.png", "dark_grey16.png", "rgba.png",
        "palette_transparent.png", "palette_transparent.gif", "cmyk.jpg", "exif6.jpg", "exif8.jpg",
        "animated.gif", "lossless.webp", "lossy.webp", "la.png", "bilevel.png", "grey16.tif")


def build_images(root: str | os.PathLike) -> dict[str, Path]:
    """Write every cheap image case (BAD and GOOD) into ``root``; return ``{name: path}``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    q = quadrants()
    files: dict[str, bytes] = {
        "zero_byte.jpg": b"",
        "text.jpg": b"This is not a picture, it is a text file with a .jpg name.\n" * 3,
        "html.png": b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n",
        "truncated.jpg": truncated_jpeg(),
        "bad_header_crc.png": png_bad_header_crc(),
        "corrupt_idat.png": png_corrupt_idat(),
        "bad_idat_crc.png": png_bad_idat_crc(),
        "bomb_header_9000.png": png_header_only(9000, 9000),  # 81 MP: under PIL's limit, over ours
        "bomb_gif.gif": gif_header_bomb(),
        "bomb_jpeg.jpg": jpeg_header_bomb(),
        "one_pixel.png": _png(Image.new("RGB", (1, 1), (200, 30, 60))),
        "strip_3x5000.png": _png(columns_strip()),
        "grey.jpg": _jpeg(Image.linear_gradient("L")),
        "grey16.png": _png(grey16()),
        "dark_grey16.png": _png(dark_grey16()),
        "grey16.tif": _tiff(grey16()),
        "rgba.png": _png(rgba_half()),
        "palette_transparent.png": _png(palette_transparent(), transparency=0),
        "palette_transparent.gif": _gif(palette_transparent()),
        "cmyk.jpg": _jpeg(_cmyk_quadrants()),
        "exif6.jpg": exif_rotated_jpeg(q, 6),
        "exif8.jpg": exif_rotated_jpeg(q, 8),
        "animated.gif": animated_gif(),
        "lossless.webp": _webp(q, lossless=True),
        "lossy.webp": _webp(q, quality=90),
        "la.png": _png(Image.merge("LA", (Image.new("L", (32, 32), 0), Image.linear_gradient("L").resize((32, 32))))),
        "bilevel.png": _png(Image.new("1", (33, 17), 1)),
    }
    out = {}
    for name, data in files.items():
        (root / name).write_bytes(data)
        out[name] = root / name
    return out


def _cmyk_quadrants() -> Image.Image:
    """quadrants() in CMYK: red (0,255,255,0), green (255,0,255,0), blue (255,255,0,0), white 0."""
    return quadrants().convert("CMYK")


def _tiff(img: Image.Image) -> bytes:
    b = io.BytesIO()
    img.save(b, "TIFF")
    return b.getvalue()


def _gif(img: Image.Image) -> bytes:
    b = io.BytesIO()
    img.save(b, "GIF", transparency=0)
    return b.getvalue()


def _webp(img: Image.Image, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, "WEBP", **kw)
    return b.getvalue()


# ----------------------------------------------------------------------------- checkpoints


class _RunsCode:
    """Pickles to a call of ``func(*args)``: what a malicious checkpoint smuggles in."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def marker_payloads(marker: Path) -> dict[str, object]:
    """Objects that, when unpickled, create ``marker`` (by a shell command or by exec)."""
    return {
        "os_system": _RunsCode(os.system, f"touch '{marker}'"),
        "exec": _RunsCode(builtins.exec, f"open({str(marker)!r}, 'w').write('pwned')"),
    }


def malicious_checkpoints(root: str | os.PathLike, marker: Path) -> dict[str, Path]:
    """Checkpoint files whose pickle would create ``marker`` when loaded unsafely:
    torch.save zip archives (.pth/.bin/.pt/.ckpt, payload next to real tensors) and plain
    pickles of several protocols."""
    import torch

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    pay = marker_payloads(marker)
    out: dict[str, Path] = {}
    w = torch.zeros(3)
    torch.save({"state_dict": {"head.weight": w}, "extra": pay["os_system"]}, root / "zip_system.pth")
    torch.save({"head.weight": w, "x": pay["exec"]}, root / "zip_exec.bin")
    torch.save(pay["os_system"], root / "zip_toplevel.pt")
    torch.save({"model": {"head.weight": w}, "hook": pay["exec"]}, root / "zip_nested.ckpt")
    for proto in (0, 2, 4):
        p = root / f"raw_p{proto}.pth"
        p.write_bytes(pickle.dumps({"head.weight": [0.0], "x": pay["os_system"]}, protocol=proto))
    for name in ("zip_system.pth", "zip_exec.bin", "zip_toplevel.pt", "zip_nested.ckpt",
                 "raw_p0.pth", "raw_p2.pth", "raw_p4.pth"):
        out[name] = root / name
    return out


def truncated_copy(src: Path, dst: Path, keep: int) -> Path:
    """The first ``keep`` bytes of ``src`` (a negative ``keep`` drops that many from the end)."""
    data = src.read_bytes()
    dst.write_bytes(data[:keep])
    return dst
