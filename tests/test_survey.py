"""A whole folder at once: the watermark shortcut of the shapes generator, the survey's map
statistics against naive loops, the clustering's eigengap on maps with a known structure, a zip
of pictures unpacked without trusting it, the command's JSON, torchrun's shards, and the
Clever-Hans lesson itself on a small model trained here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_demo.train.data import DataError, Shortcut, make_shapes, read_watermarks, watermark_box

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_demo", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


# ----------------------------------------------------------------------------- the watermark


def test_watermark_marks_the_planned_pictures_and_nothing_else(tmp_path: Path) -> None:
    marked = make_shapes(tmp_path / "wm", per_class=20, size=32, seed=3, progress=False, shortcut=Shortcut())
    make_shapes(tmp_path / "clean", per_class=20, size=32, seed=3, progress=False)
    marks = marked["watermarks"]
    assert read_watermarks(tmp_path / "wm") == marks and read_watermarks(tmp_path / "clean") == {}
    assert marked["shortcut"] == {"kind": "watermark", "class": "circle", "rate": 0.9, "leak": 0.05, "corner": "bottom-left"}
    per_class = {c: sum(r.startswith(c + "/") for r in marks) for c in marked["classes"]}
    assert per_class == {"circle": 18, "square": 1, "triangle": 1, "star": 1}
    x0, y0, x1, y1 = (int(v) for v in watermark_box(32))
    assert (x0, y0, x1, y1) == (1, 25, 7, 31)  # 6 px, one pixel in from the bottom-left corner
    for rel in marked["boxes"]:
        a = np.asarray(Image.open(tmp_path / "wm" / rel)).astype(int)
        b = np.asarray(Image.open(tmp_path / "clean" / rel)).astype(int)
        outside = np.ones(a.shape[:2], bool)
        outside[y0:y1, x0:x1] = False
        assert (a[outside] == b[outside]).all(), rel  # the same shapes: the mark is drawn after them, seeded apart
        if rel in marks:
            assert marks[rel] == [1.0, 25.0, 7.0, 31.0]
            mark = a[y0:y1, x0:x1, 0]  # a 2x2 checker: white top-left and bottom-right, black elsewhere
            assert (mark[:3, :3] == 255).all() and (mark[3:, 3:] == 255).all()
            assert (mark[:3, 3:] == 0).all() and (mark[3:, :3] == 0).all()
        else:
            assert (a == b).all(), rel


def test_watermark_flags_and_errors(tmp_path: Path) -> None:
    r = run_cli("data", "shapes", "--out", str(tmp_path / "s"), "--per-class", "10", "--shortcut", "watermark",
                "--shortcut-class", "star", "--shortcut-rate", "1", "--shortcut-leak", "0")
    assert r.returncode == 0, r.stderr
    assert "a watermark (bottom-left corner) on 10 of them: 100% of 'star', 0% of the others" in r.stdout
    assert all(rel.startswith("star/") for rel in read_watermarks(tmp_path / "s"))
    r = run_cli("data", "shapes", "--out", str(tmp_path / "t"), "--per-class", "2", "--shortcut", "watermark",
                "--shortcut-class", "hexagon")
    assert r.returncode == 2 and r.stderr.strip() == ("error: --shortcut-class 'hexagon' is not one of the classes "
                                                      "(circle, square, triangle, star)")
    with pytest.raises(DataError, match=r"must be in \[0, 1\]"):
        Shortcut(rate=1.5).marked(["a", "b"], 4, 0)
