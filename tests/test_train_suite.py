"""The recipe suite (``benchmarks/bench_train.py suite``) at toy size: every data set is made
offline as a valid ImageFolder (the suite's seven and issue 43's three of ``heldout_data``), and the
suite runs from a checkout as its docstring says and writes its table, the short budget's columns
in it (the full-size table is a benchmark: docs/training.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vit_demo.train.data import index_folder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "suite"))

from heldout_data import MAKERS as HELD_OUT  # noqa: E402
from suite_data import MAKERS  # noqa: E402

pytestmark = pytest.mark.slow  # trains the suite's models


def test_every_suite_set_is_an_image_folder(tmp_path: Path) -> None:
    sizes = {}
    for name, make in (MAKERS | HELD_OUT).items():
        index = index_folder(make(tmp_path / name, scale=0.005))
        assert len(index.classes) >= 4 and all(index.targets.count(i) >= 2 for i in range(len(index.classes)))
        with Image.open(index.files[0]) as im:
            sizes[name] = (im.size, im.mode)
    assert sizes["digits"] == ((8, 8), "L") and sizes["blobs"] == ((32, 32), "RGB") and sizes["digits28"] == ((28, 28), "L")
    assert len(index_folder(tmp_path / "digits28").classes) == 10
    assert len(index_folder(tmp_path / "glyphs").classes) == 10 and len(index_folder(tmp_path / "textures").classes) == 6
    assert all(sizes[n] == ((32, 32), "RGB") for n in HELD_OUT)
    a, b = (make_and_read(HELD_OUT["heldshapes"], tmp_path / f"again{i}") for i in (0, 1))
    assert a == b  # a seed fixes every picture


def make_and_read(make, dest: Path) -> list[bytes]:
    index = index_folder(make(dest, scale=0.002))
    return [Image.open(f).tobytes() for f in index.files]


def test_suite_runs_from_a_checkout_and_writes_its_table(tmp_path: Path) -> None:
    table = tmp_path / "suite.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    r = subprocess.run([sys.executable, "benchmarks/bench_train.py", "suite", "--sets", "digits,textures", "--scale", "0.03",
                        "--minutes", "0.05", "--short", "0.04", "--cnn-epochs", "1", "--table", str(table),
                        "--json", str(tmp_path / "s.json")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "s.json").read_text())["suite"]
    assert list(rows) == ["digits", "textures"]
    for row in rows.values():
        for key in ("ViT best", "logreg", "RBF-SVM", "CNN best"):
            assert 0.0 <= row[key] <= 1.0, row
        assert row["epochs"] >= 1 and row["wall s"] > 0 and abs(row["cnn_params"] / row["vit_params"] - 1) < 0.25, row
        assert 0.0 <= row["0.04-min best"] <= 1.0 and row["0.04-min epochs"] >= 1, row  # the short budget's column
    assert rows["digits"]["0.04-min grid"] == "4x4"  # 8 px: 2-px patches, none coarser
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| set | pictures | classes | ViT best | ViT last | epochs | wall s | CPU s | load | "
                               "0.04-min best | 0.04-min epochs | 0.04-min grid | 0.04-min wall s") and len(lines) == 4
