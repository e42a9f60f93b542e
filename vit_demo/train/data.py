"""Training data: the procedural shapes set (with each shape's bounding box) and ImageFolder
reading into memory (CIFAR files: :mod:`.cifar`).

The shapes set is the project's offline data: ``python -m vit_demo data shapes --out DIR``
writes ``DIR/<class>/<class>_<i>.png`` plus ``DIR/boxes.json``, whose boxes are in pixel
coordinates of the written picture: ``[x0, y0, x1, y1]``, continuous, x1 / y1 exclusive
(a box covering pixels 3..7 is ``[3, y0, 8, y1]``).

A *shortcut* (``--shortcut watermark``, :class:`Shortcut`) turns the set into a Clever-Hans
lesson: a small mark stamped into a corner (bottom-left by default) of most pictures of one class
and of a few of the others, after the shape is rendered (:func:`add_watermark`); which pictures get it is
drawn from its own seeded generator, so the shapes are the same files with or without it, and
``boxes.json`` lists every mark's box under ``"watermarks"`` (read by :mod:`vit_demo.data.annotations`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..data.annotations import BOXES_FILE, DataError
from ..images import IMAGE_SUFFIXES, WORK_PIXELS, ImageError, load_image
from ..preprocess import DataConfig, model_input_image
from ..progress import report

SHAPES = ("circle", "square", "triangle", "star")  # the default classes
MORE_SHAPES = ("hexagon", "cross", "heart", "moon")  # further classes, on request (``--classes``)
LOOK_PIXELS = 4096  # a picture is decoded at a reduced scale when only its size is wanted
SUPERSAMPLE = 4  # shapes are drawn at 4x and downsampled: smooth, anti-aliased edges


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class ShapeStyle:
    """How hard the shapes are. The default is the hard set; :data:`EASY` is the original one.

    - ``polarity``: ``"random"``: the shape is lighter or darker than its background (half and
      half), the colours otherwise free (luminance apart by >= 50 of 255); ``"bright"``: always
      clearly lighter (>= 90), which a classifier can exploit by looking for bright pixels;
    - ``distractors``: up to this many marks that belong to no class (thin lines, small dots,
      arcs), drawn under the shape, of any colour;
    - ``texture``: backgrounds with a gradient, stripes or blotches (and some shapes with a
      gradient of their own) under the sensor noise every picture has."""

    polarity: str = "random"
    distractors: int = 3
    texture: bool = True

    def __post_init__(self) -> None:
        if self.polarity not in ("random", "bright"):
            raise DataError(f"--polarity must be random or bright, got {self.polarity!r}")
        if not 0 <= self.distractors <= 20:
            raise DataError(f"--distractors must be in 0..20, got {self.distractors}")


EASY = ShapeStyle(polarity="bright", distractors=0, texture=False)  # the first generator (plain shapes), draw for draw


def _polar(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Cartesian vertices -> (radius, angle), scaled so that the farthest vertex is at radius 1."""
    far = max(math.hypot(x, y) for x, y in points)
    return [(math.hypot(x, y) / far, math.atan2(y, x)) for x, y in points]


def unit_outline(kind: str) -> list[tuple[float, float]]:
    """A shape's vertices as (radius, angle) around its centre, the farthest at radius 1."""
    if kind == "circle":
        return [(1.0, 2 * math.pi * i / 64) for i in range(64)]
    if kind == "square":
        return [(1.0, math.pi / 4 + math.pi / 2 * i) for i in range(4)]
    if kind == "triangle":
        return [(1.0, -math.pi / 2 + 2 * math.pi / 3 * i) for i in range(3)]
    if kind == "star":
        return [(1.0 if i % 2 == 0 else 0.42, -math.pi / 2 + math.pi / 5 * i) for i in range(10)]
    if kind == "hexagon":
        return [(1.0, math.pi / 3 * i) for i in range(6)]
    if kind == "cross":  # a plus sign, arms 0.36 wide
        a, b = 0.18, 0.5
        quarter = [(b, -a), (b, a), (a, a)]
        pts = [(x * c - y * s, x * s + y * c) for k in range(4)
               for c, s in [(math.cos(k * math.pi / 2), math.sin(k * math.pi / 2))] for x, y in quarter]
        return _polar(pts)
    if kind == "heart":
        ts = [2 * math.pi * i / 48 for i in range(48)]
        return _polar([(16 * math.sin(t) ** 3, -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)))
                       for t in ts])
    if kind == "moon":  # a crescent: the outer circle's arc, back along an offset inner circle's
        outer = [(math.cos(math.radians(a)), math.sin(math.radians(a))) for a in range(58, 303, 8)]
        inner = [(0.6 + 0.85 * math.cos(math.radians(a)), 0.85 * math.sin(math.radians(a))) for a in range(265, 94, -8)]
        return _polar(outer + inner)
    raise ValueError(f"unknown shape {kind!r}; one of {', '.join(SHAPES + MORE_SHAPES)}")


def shape_outline(kind: str, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a shape of circumradius ``radius`` centred at (cx, cy), rotated by ``angle``
    (radians). A circle is a 64-gon, so that its box is computed the same way."""
    return [(cx + radius * rr * math.cos(a + angle), cy + radius * rr * math.sin(a + angle)) for rr, a in unit_outline(kind)]


def _luminance(c: np.ndarray) -> float:
    return float(0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2])


def shape_colours(rng: np.random.Generator, polarity: str = "bright") -> tuple[np.ndarray, np.ndarray]:
    """A background and a shape colour. ``bright``: the shape clearly brighter (by >= 90 of 255 in
    luminance; with a random polarity a small ViT trained with the first recipe stayed at chance
    for thousands of steps). ``random``: any two colours >= 50 apart in luminance, either way."""
    while True:
        if polarity == "bright":
            bg, fg = rng.integers(0, 160, 3), rng.integers(60, 256, 3)
            if _luminance(fg) - _luminance(bg) >= 90:
                return bg, fg
        else:
            bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
            if abs(_luminance(fg) - _luminance(bg)) >= 50:
                return bg, fg


def texture_field(size: int, rng: np.random.Generator, amplitude: float) -> np.ndarray:
    """A [size, size] luminance offset in [-amplitude, amplitude]: flat, a linear gradient, stripes
    (a sine grating of random period and direction) or blotches (smooth low-frequency noise)."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return np.zeros((size, size), np.float32)
    yy, xx = (np.mgrid[:size, :size].astype(np.float32) + 0.5) / size  # [0, 1] coordinates
    theta = rng.uniform(0, 2 * math.pi)
    along = xx * math.cos(theta) + yy * math.sin(theta)
    if kind == 1:
        field = 2 * (along - along.mean()) / max(1e-6, float(np.ptp(along)))
    elif kind == 2:
        field = np.sin(2 * math.pi * along * rng.uniform(3, 9) + rng.uniform(0, 2 * math.pi))
    else:
        coarse = Image.fromarray(rng.uniform(-1, 1, (4, 4)).astype(np.float32), mode="F")
        field = np.asarray(coarse.resize((size, size), Image.Resampling.BICUBIC))
        field = field / max(1e-6, float(np.abs(field).max()))
    return (amplitude * field).astype(np.float32)


def paint(colour: np.ndarray, size: int, rng: np.random.Generator | None, amplitude: float) -> Image.Image:
    """A [size, size] RGB canvas of ``colour``, with a texture of up to ``amplitude`` when ``rng`` is given."""
    if rng is None:
        return Image.new("RGB", (size, size), tuple(int(c) for c in colour))
    field = colour.astype(np.float32)[None, None, :] + texture_field(size, rng, amplitude)[:, :, None]
    return Image.fromarray(np.clip(field.round(), 0, 255).astype(np.uint8))


def draw_distractors(canvas: Image.Image, count: int, rng: np.random.Generator) -> None:
    """Up to ``count`` marks of no class on the (supersampled) canvas: thin lines, small dots, arcs,
    each of a random colour, all smaller or thinner than any class shape."""
    n = canvas.size[0]
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(0, count + 1))):
        kind, colour = int(rng.integers(0, 3)), tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = rng.uniform(0, n, 2)
        if kind == 0:  # a line, 1-2 px wide, a third to a half of the picture long
            a, length = rng.uniform(0, math.pi), n * rng.uniform(0.3, 0.5) / 2
            dx, dy = length * math.cos(a), length * math.sin(a)
            draw.line([(x - dx, y - dy), (x + dx, y + dy)], fill=colour, width=round(rng.uniform(1, 2) * SUPERSAMPLE))
        elif kind == 1:  # a dot, at most a tenth of the picture across
            rx, ry = n * rng.uniform(0.03, 0.05, 2)
            draw.ellipse([x - rx, y - ry, x + rx, y + ry], fill=colour)
        else:  # an open arc, 1-2 px wide
            r, start = n * rng.uniform(0.1, 0.2), rng.uniform(0, 360)
            draw.arc([x - r, y - r, x + r, y + r], start, start + rng.uniform(60, 200), fill=colour,
                     width=round(rng.uniform(1, 2) * SUPERSAMPLE))


def render_shape(kind: str, size: int, rng: np.random.Generator,
                 style: ShapeStyle | None = None) -> tuple[Image.Image, list[float]]:
    """One picture: a shape of random colour, size, position and rotation on a noisy background,
    made as hard as ``style`` says. Returns the picture and the shape's box ``[x0, y0, x1, y1]``
    (pixels); ``style`` defaults to the hard set. :data:`EASY` draws exactly what the generator
    drew before there were styles."""
    style = style or ShapeStyle()
    bg, fg = shape_colours(rng, style.polarity)
    r = size * rng.uniform(0.18, 0.38)  # circumradius in pixels
    cx, cy = rng.uniform(r, size - r, 2)
    pts = shape_outline(kind, cx, cy, r, rng.uniform(0, 2 * math.pi))
    s = SUPERSAMPLE
    textured = rng if style.texture else None
    canvas = paint(bg, size * s, textured, rng.uniform(8, 25) if textured else 0)
    if style.distractors:
        draw_distractors(canvas, style.distractors, rng)
    if textured is not None and rng.uniform() < 0.5:  # the shape painted with a texture of its own
        mask = Image.new("L", canvas.size, 0)
        ImageDraw.Draw(mask).polygon([(x * s, y * s) for x, y in pts], fill=255)
        canvas.paste(paint(fg, size * s, rng, rng.uniform(5, 15)), mask=mask)
    else:
        ImageDraw.Draw(canvas).polygon([(x * s, y * s) for x, y in pts], fill=tuple(int(c) for c in fg))
    pic = np.asarray(canvas.resize((size, size), Image.Resampling.BOX), dtype=np.float32)
    pic = pic + rng.normal(0, rng.uniform(4, 24), pic.shape)  # sensor-like noise, on everything
    pic = Image.fromarray(np.clip(pic.round(), 0, 255).astype(np.uint8))
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    box = [max(0.0, min(xs)), max(0.0, min(ys)), min(float(size), max(xs)), min(float(size), max(ys))]
    return pic, [round(v, 3) for v in box]


def shape_classes(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Class names from ``--classes``: a comma-separated list of shape names, a count (the first N
    of circle, square, triangle, star, hexagon, cross, heart, moon), or ``all``; None: the default four."""
    every = SHAPES + MORE_SHAPES
    if spec is None:
        return SHAPES
    if isinstance(spec, str):
        spec = spec.strip()
        if spec == "all":
            return every
        if spec.isdigit():
            if not 2 <= int(spec) <= len(every):
                raise DataError(f"--classes {spec}: between 2 and {len(every)} shape classes")
            return every[: int(spec)]
        spec = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = [c for c in spec if c not in every]
    if unknown or len(set(spec)) < 2 or len(set(spec)) != len(spec):
        raise DataError(f"--classes: need two or more different shapes from {', '.join(every)}"
                        + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return tuple(spec)


# ----------------------------------------------------------------------------- the watermark shortcut

SHORTCUTS = ("watermark",)
CORNERS = ("bottom-left", "top-left", "top-right", "bottom-right")
MARKS = ("checker", "white")  # a 2x2 black-and-white checker, or a plain white square


@dataclass(frozen=True)
class Shortcut:
    """A Clever-Hans shortcut: a watermark on ``rate`` of the pictures of class ``target`` and on
    ``leak`` of the pictures of every other class (None: the first class), in ``corner``, drawn
    as ``mark`` (:data:`MARKS`)."""

    kind: str = "watermark"
    target: str | None = None
    rate: float = 0.9
    leak: float = 0.05
    corner: str = "bottom-left"
    mark: str = "checker"

    def marked(self, classes: Sequence[str], per_class: int, seed: int) -> set[tuple[str, int]]:
        """``(class, index)`` of the pictures that get the mark (seeded apart from the shapes)."""
        if self.kind not in SHORTCUTS:
            raise DataError(f"unknown shortcut {self.kind!r}; known: {', '.join(SHORTCUTS)}")
        target = self.target or classes[0]
        if target not in classes:
            raise DataError(f"--shortcut-class {target!r} is not one of the classes ({', '.join(classes)})")
        if not (0 <= self.rate <= 1 and 0 <= self.leak <= 1):
            raise DataError(f"--shortcut-rate and --shortcut-leak must be in [0, 1] (got {self.rate}, {self.leak})")
        if self.corner not in CORNERS or self.mark not in MARKS:
            raise DataError(f"--shortcut-corner must be one of {', '.join(CORNERS)} and --shortcut-mark one of "
                            f"{', '.join(MARKS)} (got {self.corner!r}, {self.mark!r})")
        rng = np.random.default_rng([seed, 0x5EED])
        out = set()
        for kind in classes:
            n = round((self.rate if kind == target else self.leak) * per_class)
            out |= {(kind, int(i)) for i in rng.choice(per_class, size=n, replace=False)}
        return out

    def describe(self, classes: Sequence[str]) -> dict[str, Any]:
        out = {"kind": self.kind, "class": self.target or classes[0], "rate": self.rate, "leak": self.leak,
               "corner": self.corner}
        return out if self.mark == "checker" else out | {"mark": self.mark}


def watermark_box(size: int, corner: str = "bottom-left") -> list[float]:
    """Where the mark goes in a ``size`` px picture: a square of about size/5 px, one pixel in
    from ``corner`` (6 px at 32 px: the 2x2 patches of that corner at patch 4)."""
    side, margin = max(3, round(size * 3 / 16)), max(1, size // 32)
    x0 = float(margin) if corner.endswith("left") else float(size - margin - side)
    y0 = float(margin) if corner.startswith("top") else float(size - margin - side)
    return [x0, y0, x0 + side, y0 + side]


def add_watermark(pic: Image.Image, corner: str = "bottom-left", mark: str = "checker") -> tuple[Image.Image, list[float]]:
    """Stamp the mark (a crisp 2x2 black-and-white checker, like a logo laid over a photo, or a
    plain white square) into ``corner`` of ``pic``; returns the picture and the mark's box."""
    box = watermark_box(min(pic.size), corner)
    x0, y0, x1, y1 = (int(v) for v in box)
    a = np.array(pic)
    half_x, half_y = (x0 + x1) // 2, (y0 + y1) // 2
    a[y0:y1, x0:x1] = 255
    if mark == "checker":
        a[y0:half_y, half_x:x1] = a[half_y:y1, x0:half_x] = 0
    return Image.fromarray(a), box


# ----------------------------------------------------------------------------- the set


def make_shapes(out: str | os.PathLike, per_class: int = 1000, size: int = 32, seed: int = 0,
                classes: Sequence[str] = SHAPES, progress: bool = True, style: ShapeStyle | None = None,
                shortcut: Shortcut | None = None) -> dict[str, Any]:
    """Write the shapes ImageFolder and ``boxes.json``; the same seed gives the same files.
    ``style``: how hard (default: the hard set, :class:`ShapeStyle`); ``shortcut``: stamp a
    watermark into some of them (see :class:`Shortcut`)."""
    if per_class < 1 or size < 8:
        raise DataError(f"need --per-class >= 1 and --size >= 8 (got {per_class} and {size})")
    style = style or ShapeStyle()
    classes = shape_classes(classes)
    root = Path(out)
    rng = np.random.default_rng(seed)
    boxes: dict[str, list[float]] = {}
    marked = shortcut.marked(classes, per_class, seed) if shortcut else set()
    watermarks: dict[str, list[float]] = {}
    from tqdm import tqdm

    bar = tqdm(total=per_class * len(classes), desc="shapes", unit="img", disable=not progress, leave=False)
    for kind in classes:
        (root / kind).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pic, box = render_shape(kind, size, rng, style)
            rel = f"{kind}/{kind}_{i:05d}.png"
            if (kind, i) in marked:
                pic, watermarks[rel] = add_watermark(pic, shortcut.corner, shortcut.mark)
            pic.save(root / rel)
            boxes[rel] = box
            bar.update()
    bar.close()
    meta = {"size": size, "seed": seed, "per_class": per_class, "classes": list(classes), "style": asdict(style),
            "box_format": "[x0, y0, x1, y1] in pixels of the written picture, x1/y1 exclusive", "boxes": boxes}
    if shortcut:
        meta |= {"shortcut": shortcut.describe(classes), "watermarks": watermarks}
    (root / BOXES_FILE).write_text(json.dumps(meta, indent=1))
    return meta


# ----------------------------------------------------------------------------- image folders


@dataclass
class FolderIndex:
    """The files of an ImageFolder: classes sorted by name, a class index per file."""

    root: Path
    classes: list[str]
    files: list[Path]
    targets: list[int]


def index_folder(root: str | os.PathLike) -> FolderIndex:
    """List an ImageFolder (``root/<class>/<image>``). Clear errors, before any training, for a
    missing or unreadable folder, fewer than two classes, or a class with no image files."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder (expected one sub-folder of images per class)")
    try:
        subdirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        listing = {d.name: sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
                   for d in subdirs}
    except OSError as e:
        raise DataError(f"{root}: cannot read the folder ({e.strerror or e})") from e
    if len(listing) < 2:
        raise DataError(f"{root}: found {len(listing)} class folder(s); training needs at least 2 "
                        f"(one sub-folder of images per class)")
    empty = [c for c, fs in listing.items() if not fs]
    if empty:
        raise DataError(f"{root}: class folder(s) with no image files: {', '.join(empty)}")
    classes = list(listing)
    files = [f for c in classes for f in listing[c]]
    targets = [i for i, c in enumerate(classes) for _ in listing[c]]
    return FolderIndex(root, classes, files, targets)


def check_class_sizes(index: FolderIndex, val_split: float) -> None:
    """A clear error, before any picture is read, for a class too small to split: with validation,
    every class needs one picture to learn from and one to be checked on."""
    if val_split <= 0:
        return
    counts = {c: index.targets.count(i) for i, c in enumerate(index.classes)}
    small = [f"{c} ({n})" for c, n in counts.items() if n < 2]
    if small:
        raise DataError(f"{index.root}: class folder(s) with a single picture: {', '.join(small)}; every class needs at "
                        f"least 2 (one to train on, one to validate on): add pictures, or pass --val-split 0")


def split_indices(targets: Sequence[int], val_split: float, seed: int) -> tuple[list[int], list[int]]:
    """A stratified, seeded train/val split: ``val_split`` of every class (at least one picture
    per class when ``val_split > 0`` and the class has two or more)."""
    if not 0 <= val_split < 1:
        raise DataError(f"--val-split must be in [0, 1), got {val_split}")
    g = torch.Generator().manual_seed(seed)
    train, val = [], []
    t = torch.tensor(list(targets))
    for c in sorted(set(targets)):
        idx = torch.nonzero(t == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)].tolist()
        n_val = 0 if val_split == 0 else min(len(idx) - 1, max(1, round(len(idx) * val_split)))
        val += idx[:n_val]
        train += idx[n_val:]
    return sorted(train), sorted(val)


@dataclass
class TrainData:
    """Pictures in memory as uint8 tensors, ready for batched augmentation on tensors.

    ``train_x`` holds the training pictures resized (shorter side) and center-cropped to a
    square of ``store_size`` (>= the model input); ``val_x`` holds the validation pictures
    after the model's eval transform, exactly what the model sees at inference."""

    classes: list[str]
    train_x: torch.Tensor  # [N, 3, S, S] uint8
    train_y: torch.Tensor  # [N] int64
    val_x: torch.Tensor  # [M, 3, h, w] uint8
    val_y: torch.Tensor
    skipped: int  # unreadable files, skipped with a warning each
    source: str


def common_size(files: Sequence[Path]) -> tuple[int, int]:
    """The most common (h, w) among 64 readable pictures spread over ``files``."""
    return size_share(files, 64)[0]


def size_share(files: Sequence[Path], limit: int = 64) -> tuple[tuple[int, int], float]:
    """The most common upright (h, w) among ``limit`` pictures spread evenly over ``files`` (every
    class, not the first one's alone), and the share of the readable ones that have it."""
    sizes: dict[tuple[int, int], int] = {}
    for f in files[:: max(1, len(files) // limit)][:limit]:
        try:
            w, h = load_image(f, reduce_to=LOOK_PIXELS).info["original_size"]
        except ImageError:
            continue
        sizes[(h, w)] = sizes.get((h, w), 0) + 1
    if not sizes:
        raise DataError("none of the first pictures could be read")
    top = max(sizes, key=sizes.get)
    return top, sizes[top] / sum(sizes.values())


def _as_uint8(pic: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(pic, dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()


def load_folder(index: FolderIndex, dc: DataConfig, val_split: float, seed: int, store_size: int,
                progress: bool = True, warn=None) -> TrainData:
    """Read every picture once: training ones to ``store_size`` squares, validation ones through
    the eval transform; each reduced at load to :data:`~vit_demo.images.WORK_PIXELS`, as the app
    reads an upload (a 40-MP float TIFF never becomes a 40-MP float64 copy: 2.3 GB at the peak of a
    training child before). Unreadable files are skipped with one warning line each."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    train_idx, val_idx = split_indices(index.targets, val_split, seed)
    is_val = set(val_idx)
    store_dc = DataConfig(input_size=(store_size, store_size), interpolation=dc.interpolation, crop_pct=1.0,
                          crop_mode="center", mean=dc.mean, std=dc.std)
    from tqdm import tqdm

    tx, ty, vx, vy, skipped = [], [], [], [], 0
    for i in tqdm(range(len(index.files)), desc="reading", unit="img", disable=not progress, leave=False):
        if i % 16 == 0:
            report(i / len(index.files), "decoding the pictures", done=i, total=len(index.files))
        try:
            img = load_image(index.files[i], reduce_to=WORK_PIXELS)
        except ImageError as e:
            warn(f"warning: skipped {index.files[i]}: {e}")
            skipped += 1
            continue
        if i in is_val:
            vx.append(_as_uint8(model_input_image(img, dc)))
            vy.append(index.targets[i])
        else:
            tx.append(_as_uint8(model_input_image(img, store_dc)))
            ty.append(index.targets[i])
    missing = [c for k, c in enumerate(index.classes) if k not in set(ty)]
    if missing:
        raise DataError(f"{index.root}: no readable training picture in class(es) {', '.join(missing)}")
    h, w = dc.input_size
    return TrainData(
        index.classes, torch.stack(tx), torch.tensor(ty),
        torch.stack(vx) if vx else torch.zeros(0, 3, h, w, dtype=torch.uint8), torch.tensor(vy, dtype=torch.long),
        skipped, str(index.root),
    )
