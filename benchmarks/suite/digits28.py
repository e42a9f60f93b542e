"""``digits28``: handwriting-like digits at 28 x 28, made offline, for the training suite.

The suite's real digits are scikit-learn's 8 x 8 scans, where the 2-minute recipe reaches 1.000;
on 28 x 28 real handwriting (MNIST-like) it reached 0.983. This generator draws digits the way a
hand does, so that the defaults are also chosen on pictures of that size and kind:

- **strokes**: every digit is one of several pen paths a hand writes it with (a 1 with or without
  its flag and foot, an open or a closed 4, a 7 with or without its bar, a 9 with a straight or a
  curved tail, a 2 with or without a loop, ...): smooth curves through control points that are
  each moved at random, drawn with a round pen whose width changes along the stroke, some strokes
  not quite closed or overshooting; one digit in five is a font's glyph instead (the DejaVu faces);
- **geometry**: slant (mostly to the right), rotation, width and height, size and position (the
  digit's centre of mass near the middle, as MNIST puts it, give or take 2 px);
- **elastic distortion** (Simard et al. 2003: a random displacement field smoothed by a Gaussian);
- **ink and paper**: a light digit on a dark ground (the MNIST convention), grey levels, blur and noise.

    from digits28 import make_digits28; make_digits28(Path("DIR"), scale=1.0)  # 10 x 600 pictures
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

SIZE = 28
UP = 4  # drawn at 4 x 28 px, then box-filtered down
PER_CLASS = 600


def arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 9) -> list[tuple[float, float]]:
    """Points on an ellipse from angle ``a0`` to ``a1`` (degrees; 0 = right, 90 = down)."""
    return [(cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a))) for a in np.linspace(a0, a1, n)]


def paths(digit: int, v: int) -> list[list[tuple[float, float]]]:
    """Variant ``v`` of the pen paths of ``digit`` in a box x 0..0.6, y 0..1 (y down)."""
    if digit == 0:
        return [arc(0.3, 0.5, 0.28 - 0.05 * v, 0.48, -100, 265 + 10 * v, 16)]
    if digit == 1:
        stem = [(0.33, 0.0), (0.3, 0.5), (0.28, 1.0)]
        return [[(0.14, 0.2), (0.33, 0.0), *stem[1:]], [(0.12, 1.0), (0.46, 1.0)]] if v == 2 else \
            [[(0.16, 0.18), (0.33, 0.0), *stem[1:]]] if v == 1 else [stem]
    if digit == 2:
        top = arc(0.3, 0.27, 0.26, 0.26, 200, 380, 9)
        tail = [(0.5, 0.45), (0.25, 0.75), (0.02, 1.0)]
        bottom = [(0.02, 1.0), (0.6, 0.99)] if v != 1 else [*arc(0.12, 0.9, 0.1, 0.09, 250, 500, 7), (0.6, 0.98)]
        return [top + tail + bottom[1:] if v != 1 else top + tail[:-1] + bottom]
    if digit == 3:
        upper = arc(0.28, 0.26, 0.25, 0.24, 200, 450, 10) if v != 1 else [(0.05, 0.0), (0.55, 0.0), (0.27, 0.42)]
        lower = arc(0.28, 0.73, 0.29, 0.27, 270, 520, 11)
        return [upper + lower]
    if digit == 4:
        if v == 0:  # closed: the diagonal
            return [[(0.42, 0.0), (0.0, 0.68), (0.6, 0.68)], [(0.45, 0.25), (0.45, 1.0)]]
        return [[(0.05, 0.0), (0.02, 0.62), (0.6, 0.62)], [(0.47, 0.05), (0.46, 1.0)]]  # open
    if digit == 5:
        bowl = arc(0.28, 0.68, 0.28, 0.3, 250, 500, 11) if v == 0 else arc(0.27, 0.7, 0.3, 0.28, 230, 490, 11)
        return [[(0.58, 0.0), (0.1, 0.0), (0.06, 0.42)] + bowl[1:]] if v == 0 else \
            [[(0.08, 0.02), (0.05, 0.44)] + bowl[1:], [(0.08, 0.02), (0.58, 0.0)]]
    if digit == 6:
        return [[(0.52, 0.0), (0.25, 0.18), (0.06, 0.5)] + arc(0.3, 0.73, 0.25, 0.26, 180, 540 - 10 * v, 13)]
    if digit == 7:
        stem = [(0.6, 0.0), (0.35, 0.5), (0.22, 1.0)] if v != 2 else [(0.6, 0.0), (0.45, 0.35), (0.3, 0.65), (0.26, 1.0)]
        out = [[(0.02, 0.02), *stem]]
        return out + [[(0.18, 0.52), (0.58, 0.5)]] if v == 1 else out
    if digit == 8:
        if v == 0:  # one stroke, a figure of eight: the lower loop the larger
            t = np.linspace(0, 2 * math.pi, 25)
            return [[(0.3 + (0.22 if math.cos(a) > 0 else 0.28) * math.sin(2 * a), 0.5 - 0.48 * math.cos(a)) for a in t]]
        return [arc(0.3, 0.25, 0.22, 0.24, 0, 365, 12), arc(0.3, 0.74, 0.28, 0.26, -90, 275, 12)]
    loop = arc(0.28, 0.27, 0.26, 0.26, 0, 365, 13)  # 9
    tail = [(0.55, 0.3), (0.5, 0.65), (0.42, 1.0)] if v == 0 else [(0.55, 0.3), (0.52, 0.75), (0.3, 1.0), (0.08, 0.9)]
    return [loop, tail]


VARIANTS = {0: 2, 1: 3, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 3, 8: 2, 9: 2}


def smooth(pts: list[tuple[float, float]], per: int = 6) -> np.ndarray:
    """A Catmull-Rom curve through ``pts`` (``per`` points a segment)."""
    p = np.asarray(pts, dtype=np.float64)
    if len(p) < 3:
        return np.linspace(p[0], p[-1], per * 2)
    q = np.vstack([p[0], p, p[-1]])
    out = []
    for i in range(1, len(q) - 2):
        p0, p1, p2, p3 = q[i - 1], q[i], q[i + 1], q[i + 2]
        for t in np.linspace(0, 1, per, endpoint=False):
            out.append(0.5 * (2 * p1 + (p2 - p0) * t + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t ** 2
                              + (3 * p1 - p0 - 3 * p2 + p3) * t ** 3))
    out.append(p[-1])
    return np.asarray(out)


def pen_drawing(digit: int, rng: np.random.Generator) -> np.ndarray:
    """The digit's strokes, jittered, slanted, rotated and scaled, drawn with a round pen of
    changing width: a float picture of ``SIZE * UP`` px, ink 0..1."""
    big = SIZE * UP
    img = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(img)
    shear, turn = rng.normal(0.15, 0.12), math.radians(rng.normal(0, 5))
    sx, sy = rng.uniform(0.75, 1.25), rng.uniform(0.85, 1.1)
    height = big * rng.uniform(0.55, 0.75)
    width = rng.uniform(1.2, 3.4) * UP  # the pen, in drawing px
    for stroke in paths(digit, int(rng.integers(VARIANTS[digit]))):
        pts = np.asarray(stroke) + rng.normal(0, 0.04, (len(stroke), 2))
        curve = smooth([tuple(p) for p in pts])
        curve = curve - [0.3, 0.5]
        x, y = curve[:, 0] * sx - curve[:, 1] * shear, curve[:, 1] * sy
        c, s = math.cos(turn), math.sin(turn)
        x, y = x * c - y * s, x * s + y * c
        xy = np.stack([big / 2 + x * height, big / 2 + y * height], 1)
        w = width * (1 + 0.25 * np.sin(np.linspace(0, rng.uniform(2, 6), len(xy)) + rng.uniform(0, 6)))
        for (x0, y0), (x1, y1), wi in zip(xy[:-1], xy[1:], w):
            draw.line([(x0, y0), (x1, y1)], fill=255, width=max(1, int(wi)))
            r = wi / 2
            draw.ellipse([x1 - r, y1 - r, x1 + r, y1 + r], fill=255)
    return np.asarray(img, dtype=np.float32) / 255


def font_drawing(digit: int, rng: np.random.Generator, fonts: list[Path]) -> np.ndarray:
    """The digit as a font's glyph (a DejaVu face), slanted and rotated: ink 0..1 at ``SIZE * UP`` px."""
    big = SIZE * UP
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(big * rng.uniform(0.6, 0.8)))
    img = Image.new("L", (big, big), 0)
    ImageDraw.Draw(img).text((big / 2, big / 2), str(digit), fill=255, font=font, anchor="mm")
    shear = rng.normal(0.12, 0.12)
    img = img.transform(img.size, Image.Transform.AFFINE, (1, shear, -shear * big / 2, 0, 1, 0),
                        resample=Image.Resampling.BILINEAR)
    return np.asarray(img.rotate(rng.normal(0, 6), resample=Image.Resampling.BILINEAR), dtype=np.float32) / 255


def elastic(a: np.ndarray, rng: np.random.Generator, alpha: float, sigma: float) -> np.ndarray:
    """Simard's elastic distortion: every pixel moved by a field of uniform(-1, 1) noise smoothed by a
    Gaussian of ``sigma`` px and scaled by ``alpha`` (at 28 px Simard et al. used sigma 4 and alpha
    34: moves of about 1.4 px)."""
    from scipy.ndimage import gaussian_filter, map_coordinates

    dx = gaussian_filter(rng.uniform(-1, 1, a.shape), sigma) * alpha
    dy = gaussian_filter(rng.uniform(-1, 1, a.shape), sigma) * alpha
    yy, xx = np.mgrid[0:a.shape[0], 0:a.shape[1]]
    return map_coordinates(a, [yy + dy, xx + dx], order=1, mode="constant")


def centred(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The ink's centre of mass moved to the middle, give or take 2 px (of the final 28)."""
    from scipy.ndimage import shift

    total = a.sum()
    if total <= 0:
        return a
    yy, xx = np.mgrid[0:a.shape[0], 0:a.shape[1]]
    cy, cx = (a * yy).sum() / total, (a * xx).sum() / total
    off = rng.uniform(-2, 2, 2) * UP
    return shift(a, (a.shape[0] / 2 - cy + off[0], a.shape[1] / 2 - cx + off[1]), order=1, mode="constant")


def render(digit: int, rng: np.random.Generator, fonts: list[Path]) -> Image.Image:
    """One 28 x 28 greyscale digit (the module docstring)."""
    ink = font_drawing(digit, rng, fonts) if fonts and rng.uniform() < 0.2 else pen_drawing(digit, rng)
    ink = elastic(ink, rng, alpha=rng.uniform(10, 34) * UP * UP, sigma=rng.uniform(3.5, 5.0) * UP)  # Simard's, at 4x
    ink = np.clip(centred(ink, rng), 0, 1)
    small = Image.fromarray((ink * 255).astype(np.uint8)).resize((SIZE, SIZE), Image.Resampling.BOX)
    small = small.filter(ImageFilter.GaussianBlur(rng.uniform(0, 0.6)))
    a = np.asarray(small, dtype=np.float32) / 255
    paper, pen = rng.uniform(0, 20), rng.uniform(180, 255)
    a = paper + (pen - paper) * a + rng.normal(0, rng.uniform(0, 8), a.shape)
    return Image.fromarray(np.clip(a.round(), 0, 255).astype(np.uint8), "L")


def make_digits28(dest: Path, scale: float = 1.0, seed: int = 15) -> Path:
    """10 classes of handwriting-like 28 x 28 digits (10 x 600 at scale 1), ``digit0`` .. ``digit9``."""
    from suite_data import _font_files, _save

    rng = np.random.default_rng(seed)
    fonts = _font_files()
    for i in range(max(2, round(PER_CLASS * scale))):
        for d in range(10):
            _save(dest, f"digit{d}", i, render(d, rng, fonts))
    return dest
