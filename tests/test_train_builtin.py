"""The Train tab's built-in shapes set is what docs/training.md says it is: the background around
the shape is one colour under sensor-like noise (not a flat colour), lighter shape, nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vit_demo.train.builtin import SHAPES_SIZE, SHAPES_STYLE
from vit_demo.train.data import SHAPES, render_shape

DOC = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def background_noise(n: int = 60) -> list[float]:
    """The per-picture standard deviation (grey levels, mean over R, G, B) of the pixels more than
    one pixel away from the shape's box, on ``n`` pictures of the built-in style."""
    rng = np.random.default_rng(0)
    found = []
    for i in range(n):
        pic, (x0, y0, x1, y1) = render_shape(SHAPES[i % 4], SHAPES_SIZE, rng, SHAPES_STYLE)
        a = np.asarray(pic, dtype=np.float32)
        outside = np.ones(a.shape[:2], bool)
        outside[max(0, int(y0) - 1):int(np.ceil(y1)) + 1, max(0, int(x0) - 1):int(np.ceil(x1)) + 1] = False
        if outside.sum() >= 8:
            found.append(float(a[outside].std(axis=0).mean()))
    return found


def test_the_builtin_shapes_background_is_noisy_as_the_docs_say() -> None:
    noise = background_noise()
    assert len(noise) >= 40
    # a flat background would give 0 (or under 1 after the box filter's rounding); sigma 4-24 is drawn
    assert min(noise) >= 3.0 and np.median(noise) >= 8.0 and max(noise) <= 30.0, np.round(sorted(noise), 1)
    tab = DOC.read_text().split("The app's **Train** tab", 1)[1].split("- **A budget", 1)[0]
    words = " ".join(tab.split())
    assert "flat background" not in words and re.search(r"noise, its standard deviation 4 to 24 grey levels", words)
