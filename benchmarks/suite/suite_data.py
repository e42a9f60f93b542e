"""Data sets for the training recipe suite (``bench_train.py suite``), each an ImageFolder made
offline, none of them the project's own shape generator except ``shapes``:

- ``shapes``    the project's hard shapes (``python -m vit_demo data shapes``), the recipe's old home;
- ``blobs``     a second shape generator written to differ: one filled shape (ellipse, rectangle,
                triangle, plus) on a noisy background, random colours and polarity, no textures;
- ``outlines``  outlined shapes (ring, frame, chevron, zigzag) among other outlines that belong to
                no class, on gradient or checkered backgrounds;
- ``digits``    scikit-learn's handwritten digits (1,797 real 8x8 greyscale scans, 10 classes);
- ``digits28``  handwriting-like digits at 28 x 28 of the suite's own making (pen strokes of several
                ways to write each digit and font glyphs, slant, elastic distortion, position, noise:
                ``digits28.py``; 10 x 600): the size and kind of real handwriting scans;
- ``glyphs``    letters rendered from matplotlib's DejaVu fonts (sans, serif, mono; bold, oblique),
                rotated, scaled, shifted, blurred and noised: 10 classes;
- ``textures``  procedural textures (stripes, checks, dots, waves, cross-hatch, speckle) at random
                scales, angles and colours: 6 classes where no object has a shape.

    from suite_data import MAKERS; MAKERS["digits"](Path("DIR"), scale=1.0)

``scale`` multiplies the pictures per class (the suite runs at 1.0; CI at a toy size).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont


def _save(dest: Path, cls: str, i: int, pic: Image.Image) -> None:
    (dest / cls).mkdir(parents=True, exist_ok=True)
    pic.save(dest / cls / f"{cls}_{i:05d}.png")


def _colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Background and foreground colours at least 60 apart in luminance, either lighter."""
    while True:
        bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        lum = np.array([0.299, 0.587, 0.114])
        if abs(float(lum @ bg) - float(lum @ fg)) >= 60:
            return tuple(int(v) for v in bg), tuple(int(v) for v in fg)


def _noisy(pic: Image.Image, rng: np.random.Generator, sigma: tuple[float, float] = (5, 25)) -> Image.Image:
    a = np.asarray(pic, dtype=np.float32)
    a = a + rng.normal(0, rng.uniform(*sigma), a.shape)
    return Image.fromarray(np.clip(a.round(), 0, 255).astype(np.uint8))


def _rot(pts: list[tuple[float, float]], cx: float, cy: float, a: float) -> list[tuple[float, float]]:
    c, s = math.cos(a), math.sin(a)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]


def blob_polygon(kind: str, r: float, rng: np.random.Generator) -> list[tuple[float, float]]:
    """A class's outline around (0, 0) with size ``r``: ellipse, rectangle, triangle, plus."""
    if kind == "ellipse":
        e = rng.uniform(0.45, 0.8)
        return [(r * math.cos(t), r * e * math.sin(t)) for t in np.linspace(0, 2 * math.pi, 40, endpoint=False)]
    if kind == "rectangle":
        e = rng.uniform(0.35, 0.7)
        return [(-r, -r * e), (r, -r * e), (r, r * e), (-r, r * e)]
    if kind == "triangle":
        return [(r * math.cos(t), r * math.sin(t)) for t in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    w = r * rng.uniform(0.25, 0.4)  # plus
    return [(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r), (-w, w), (-r, w), (-r, -w), (-w, -w)]


def make_blobs(dest: Path, scale: float = 1.0, seed: int = 11, size: int = 32) -> Path:
    """One filled shape of four classes on a plain noisy background (4 x 1000 at scale 1)."""
    rng = np.random.default_rng(seed)
    for cls in ("ellipse", "plus", "rectangle", "triangle"):
        for i in range(max(2, round(1000 * scale))):
            bg, fg = _colours(rng)
            s = 4
            canvas = Image.new("RGB", (size * s, size * s), bg)
            r = size * rng.uniform(0.2, 0.42)
            cx, cy = rng.uniform(r * 0.8, size - r * 0.8, 2)
            pts = _rot(blob_polygon(cls, r, rng), cx, cy, rng.uniform(0, 2 * math.pi))
            ImageDraw.Draw(canvas).polygon([(x * s, y * s) for x, y in pts], fill=fg)
            _save(dest, cls, i, _noisy(canvas.resize((size, size), Image.Resampling.BOX), rng))
    return dest


def _background(size: int, rng: np.random.Generator, bg: tuple[int, ...]) -> Image.Image:
    """A gradient or a checkerboard around ``bg``."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = np.array(bg, dtype=np.float32)
    if rng.uniform() < 0.5:
        a = rng.uniform(0, 2 * math.pi)
        f = (np.cos(a) * xx + np.sin(a) * yy)[..., None] * rng.uniform(-60, 60)
    else:
        k = rng.integers(3, 9)
        f = (((xx * k).astype(int) + (yy * k).astype(int)) % 2)[..., None] * rng.uniform(-40, 40)
    return Image.fromarray(np.clip(base + f, 0, 255).astype(np.uint8))


def _outline(kind: str, r: float) -> list[tuple[float, float]]:
    if kind == "ring":
        return [(r * math.cos(t), r * math.sin(t)) for t in np.linspace(0, 2 * math.pi, 33)]
    if kind == "frame":
        return [(-r, -r), (r, -r), (r, r), (-r, r), (-r, -r)]
    if kind == "chevron":
        return [(-r, -r * 0.6), (0, r * 0.6), (r, -r * 0.6)]
    return [(-r + 2 * r * k / 5, (-1) ** k * r * 0.5) for k in range(6)]  # zigzag


def make_outlines(dest: Path, scale: float = 1.0, seed: int = 12, size: int = 32) -> Path:
    """An outlined class shape among one or two outlines of no class (short lines, arcs) on a
    gradient or checkered background (4 x 800 at scale 1)."""
    rng = np.random.default_rng(seed)
    for cls in ("chevron", "frame", "ring", "zigzag"):
        for i in range(max(2, round(800 * scale))):
            bg, fg = _colours(rng)
            s = 4
            canvas = _background(size, rng, bg).resize((size * s, size * s), Image.Resampling.NEAREST)
            d = ImageDraw.Draw(canvas)
            for _ in range(rng.integers(1, 3)):  # clutter: a short line or a small arc
                x0, y0 = rng.uniform(0, size * s, 2)
                if rng.uniform() < 0.5:
                    d.line([(x0, y0), (x0 + rng.uniform(-30, 30), y0 + rng.uniform(-30, 30))], fill=fg, width=s)
                else:
                    d.arc([x0 - 12, y0 - 12, x0 + 12, y0 + 12], rng.uniform(0, 180), rng.uniform(200, 300), fill=fg, width=s)
            r = size * rng.uniform(0.22, 0.4)
            cx, cy = rng.uniform(r, size - r, 2)
            turn = rng.integers(0, 2) * math.pi / 2 if cls == "zigzag" else 0.0  # zigzags run either way
            pts = _rot(_outline(cls, r), cx, cy, rng.uniform(-0.5, 0.5) + turn)
            d.line([(x * s, y * s) for x, y in pts], fill=fg, width=int(s * rng.uniform(1.2, 2.2)), joint="curve")
            _save(dest, cls, i, _noisy(canvas.resize((size, size), Image.Resampling.BOX), rng, (3, 15)))
    return dest


def make_digits(dest: Path, scale: float = 1.0, seed: int = 0) -> Path:
    """scikit-learn's digits as 8x8 greyscale PNGs (all 1,797 at scale 1; a per-class share below)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(seed)
    counts: dict[int, int] = {}
    for i in rng.permutation(len(d.target)):
        t = int(d.target[i])
        if counts.get(t, 0) >= max(2, round(200 * scale)):
            continue
        counts[t] = counts.get(t, 0) + 1
        _save(dest, f"digit{t}", i, Image.fromarray((d.images[i] * 255 / 16).round().astype(np.uint8), "L"))
    return dest


def _font_files() -> list[Path]:
    import matplotlib

    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    names = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
             "DejaVuSerif-Bold.ttf", "DejaVuSansMono.ttf", "DejaVuSerif-Italic.ttf", "DejaVuSansMono-Bold.ttf")
    return [ttf / n for n in names if (ttf / n).is_file()]


def make_glyphs(dest: Path, scale: float = 1.0, seed: int = 13, size: int = 32) -> Path:
    """Ten letters (A B D E G K M R S X) in eight DejaVu faces, rotated by up to 20 degrees, scaled,
    shifted, blurred and noised, dark on light or light on dark (10 x 300 at scale 1)."""
    rng = np.random.default_rng(seed)
    fonts = _font_files()
    for cls in "ABDEGKMRSX":
        for i in range(max(2, round(300 * scale))):
            bg, fg = _colours(rng)
            big = size * 4
            font = ImageFont.truetype(str(fonts[rng.integers(len(fonts))]), int(big * rng.uniform(0.5, 0.8)))
            layer = Image.new("L", (big, big), 0)
            ImageDraw.Draw(layer).text((big / 2 + rng.uniform(-0.12, 0.12) * big, big / 2 + rng.uniform(-0.12, 0.12) * big),
                                       cls, fill=255, font=font, anchor="mm")
            layer = layer.rotate(rng.uniform(-20, 20), resample=Image.Resampling.BILINEAR)
            pic = Image.composite(Image.new("RGB", (big, big), fg), Image.new("RGB", (big, big), bg), layer)
            pic = pic.resize((size, size), Image.Resampling.BOX).filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.8)))
            _save(dest, cls, i, _noisy(pic, rng, (2, 14)))
    return dest


def _texture(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    a, f = rng.uniform(0, math.pi), rng.uniform(0.25, 0.9)
    u, v = np.cos(a) * xx + np.sin(a) * yy, -np.sin(a) * xx + np.cos(a) * yy
    if kind == "stripes":
        return (np.sin(u * f) > 0).astype(np.float32)
    if kind == "checks":
        return ((np.sin(u * f) > 0) ^ (np.sin(v * f) > 0)).astype(np.float32)
    if kind == "waves":
        return 0.5 + 0.5 * np.sin(u * f + 2.5 * np.sin(v * f * 0.5))
    if kind == "hatch":
        return np.maximum(np.abs(np.sin(u * f)) < 0.3, np.abs(np.sin(v * f)) < 0.3).astype(np.float32)
    if kind == "dots":
        return ((np.sin(u * f) * np.sin(v * f)) > 0.55).astype(np.float32)
    return (rng.uniform(size=(size, size)) < rng.uniform(0.1, 0.4)).astype(np.float32)  # speckle


def make_textures(dest: Path, scale: float = 1.0, seed: int = 14, size: int = 32) -> Path:
    """Six procedural textures in two random colours (6 x 400 at scale 1)."""
    rng = np.random.default_rng(seed)
    for cls in ("checks", "dots", "hatch", "speckle", "stripes", "waves"):
        for i in range(max(2, round(400 * scale))):
            bg, fg = (np.array(c, dtype=np.float32) for c in _colours(rng))
            t = _texture(cls, size, rng)[..., None]
            pic = Image.fromarray(np.clip(bg + (fg - bg) * t, 0, 255).astype(np.uint8))
            _save(dest, cls, i, _noisy(pic, rng, (4, 20)))
    return dest


def make_shapes(dest: Path, scale: float = 1.0, seed: int = 0) -> Path:
    """The project's own hard shapes (4 x 1000 at scale 1)."""
    from vit_demo.train.data import make_shapes as project_shapes

    project_shapes(dest, per_class=max(2, round(1000 * scale)), seed=seed, progress=False)
    return dest


def make_digits28(dest: Path, scale: float = 1.0, seed: int = 15) -> Path:
    """Handwriting-like 28 x 28 digits (``digits28.py``; 10 x 600 at scale 1)."""
    from digits28 import make_digits28 as draw

    return draw(dest, scale, seed)


MAKERS: dict[str, Callable[..., Path]] = {
    "shapes": make_shapes, "blobs": make_blobs, "outlines": make_outlines, "digits": make_digits,
    "digits28": make_digits28, "glyphs": make_glyphs, "textures": make_textures,
}
