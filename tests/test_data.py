"""The shapes generator (deterministic, boxes that hold the shape) and ImageFolder reading
(bad files skipped and counted, clear errors before any training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_demo.train.data import DataError, index_folder, load_folder, make_shapes, read_boxes, split_indices
from vit_demo.train.recipe import scratch_data_config

ROOT = Path(__file__).resolve().parent.parent


def test_shapes_are_deterministic_and_boxed(tmp_path: Path) -> None:
    a, b, c = (make_shapes(tmp_path / n, per_class=5, size=32, seed=s, progress=False)
               for n, s in (("a", 3), ("b", 3), ("c", 4)))
    assert a["boxes"] == b["boxes"] and a["boxes"] != c["boxes"]
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert len(files) == 20 and [f.parent.name for f in files[::5]] == ["circle", "square", "star", "triangle"]
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert read_boxes(tmp_path / "a") == a["boxes"]


def test_box_holds_the_shape(tmp_path: Path) -> None:
    meta = make_shapes(tmp_path, per_class=10, size=48, seed=0, progress=False)
    for rel, (x0, y0, x1, y1) in meta["boxes"].items():
        pic = np.asarray(Image.open(tmp_path / rel), dtype=np.float64)
        assert pic.shape == (48, 48, 3) and 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48
        ys, xs = np.mgrid[:48, :48] + 0.5  # pixel centres
        inside = (xs >= x0 - 1) & (xs <= x1 + 1) & (ys >= y0 - 1) & (ys <= y1 + 1)
        background = np.median(pic[~inside], axis=0)
        shape = np.linalg.norm(pic - background, axis=2) > 100  # colours differ by >= 90 x sqrt(3), noise sd <= 24
        assert shape[inside].sum() >= 4, rel  # the shape is there...
        assert shape[~inside].mean() < 0.005, rel  # ...and hardly anything like it outside its box


def test_split_is_stratified_and_seeded() -> None:
    targets = [0] * 10 + [1] * 5 + [2] * 2
    tr, va = split_indices(targets, 0.2, seed=1)
    assert sorted(tr + va) == list(range(17))
    assert [sum(targets[i] == c for i in va) for c in range(3)] == [2, 1, 1]
    assert split_indices(targets, 0.2, seed=1) == (tr, va) and split_indices(targets, 0.2, seed=2) != (tr, va)


def test_bad_files_are_skipped_and_counted(tmp_path: Path) -> None:
    make_shapes(tmp_path, per_class=4, size=32, seed=0, progress=False)
    (tmp_path / "circle" / "broken.png").write_bytes(b"not a picture at all")
    good = (tmp_path / "square" / "square_00000.png").read_bytes()
    (tmp_path / "square" / "truncated.png").write_bytes(good[: len(good) // 2])
    (tmp_path / "star" / "notes.txt").write_text("ignored: not an image suffix")
    warnings: list[str] = []
    index = index_folder(tmp_path)
    data = load_folder(index, scratch_data_config(32), 0.25, 0, 32, progress=False, warn=warnings.append)
    assert data.skipped == 2 and len(warnings) == 2
    assert "broken.png" in warnings[0] and "truncated.png" in warnings[1]
    assert len(data.train_x) + len(data.val_x) == 16 and data.train_x.dtype == data.train_x.new_zeros(0).dtype
    assert data.classes == ["circle", "square", "star", "triangle"]


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder"):
        index_folder(tmp_path / "missing")
    (tmp_path / "only").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "only" / "a.png")
    with pytest.raises(DataError, match="found 1 class folder"):
        index_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no pictures here")
    with pytest.raises(DataError, match="no image files: empty"):
        index_folder(tmp_path)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    cmd = [sys.executable, "-m", "vit_demo", "train", "--data", str(tmp_path), "--out", str(tmp_path / "m.safetensors")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "at least 2" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "vit_demo", "data", "shapes", "--out", str(tmp_path / "s"), "--per-class", "2",
                        "--size", "16"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "wrote 8 pictures" in r.stdout
    assert len(json.loads((tmp_path / "s" / "boxes.json").read_text())["boxes"]) == 8


def test_cifar10_offline_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from vit_demo.train.data import load_cifar10

    def no_network(*args, **kwargs):
        raise OSError("network unreachable (blocked in this test)")

    monkeypatch.setenv("VIT_DEMO_DATA", str(tmp_path))  # an empty cache: it would have to download
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(DataError, match="cannot download CIFAR-10"):  # one connection attempt, no retries
        load_cifar10(scratch_data_config(32))
    assert not any(tmp_path.iterdir())  # nothing half-downloaded
