"""The built-in training sets (the app's Train tab, ``python -m vit_demo data digits``), written as
ImageFolders on this computer, offline:

- ``digits``: scikit-learn's 1,797 real handwritten digits (8 x 8 greyscale scans, 10 classes),
  every scan as a PNG in its class's folder (``digit0`` .. ``digit9``);
- ``shapes``: the project's procedural shapes (:func:`~vit_demo.train.data.make_shapes`), the easy
  style: four classes at 16 px, one shape a picture, lighter than its one-colour background with no
  texture or other marks, sensor-like noise over the whole picture (:func:`~vit_demo.train.data.render_shape`;
  attention has an object to find; a busy CPU needs several minutes for a good accuracy).

:func:`ensure` writes a set once under a folder (into a temporary name, renamed when complete, so
a half-written set is never used) and returns it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from .data import ShapeStyle, make_shapes

SHAPES_PER_CLASS = 300
SHAPES_SIZE = 16
SHAPES_STYLE = ShapeStyle("bright", 0, False)  # lighter shapes on one colour, no texture or marks; noise on all (easy)


def make_digits(dest: str | os.PathLike, per_class: int | None = None) -> Path:
    """scikit-learn's digits as 8 x 8 greyscale PNGs, one folder per class (all 1,797; the first
    ``per_class`` of each class when given)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    dest = Path(dest)
    counts = [0] * 10
    for i, (pic, t) in enumerate(zip(d.images, d.target)):
        counts[int(t)] += 1
        if per_class is not None and counts[int(t)] > per_class:
            continue
        folder = dest / f"digit{int(t)}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((pic * 255 / 16).round().astype(np.uint8), "L").save(folder / f"digit{int(t)}_{i:04d}.png")
    return dest


def make_easy_shapes(dest: str | os.PathLike) -> Path:
    """The shapes set of the module docstring."""
    make_shapes(dest, per_class=SHAPES_PER_CLASS, size=SHAPES_SIZE, seed=0, progress=False, style=SHAPES_STYLE)
    return Path(dest)


MAKERS: dict[str, Callable[[str | os.PathLike], Path]] = {"digits": make_digits, "shapes": make_easy_shapes}
WORDS = {"digits": "1,797 handwritten digits, 8 x 8 px, 10 classes (scikit-learn's scans)",
         "shapes": f"{4 * SHAPES_PER_CLASS:,} shapes, {SHAPES_SIZE} px, 4 classes (circle, square, star, triangle)"}


def ensure(name: str, root: str | os.PathLike) -> Path:
    """The built-in set ``name`` under ``root`` (written the first time)."""
    if name not in MAKERS:
        raise ValueError(f"no built-in data set {name!r}: choose one of {', '.join(MAKERS)}")
    root = Path(root)
    dest = root / name
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        MAKERS[name](tmp / name)
        try:
            (tmp / name).rename(dest)
        except OSError:  # another process finished it first
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
