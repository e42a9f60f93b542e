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

from vit_demo.data.annotations import DataError, read_boxes
from vit_demo.train.data import (
    EASY,
    MORE_SHAPES,
    SHAPES,
    ShapeStyle,
    index_folder,
    load_folder,
    make_shapes,
    render_shape,
    shape_classes,
    shape_outline,
    split_indices,
)
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
    meta = make_shapes(tmp_path, per_class=10, size=48, seed=0, progress=False, style=EASY)  # bright, nothing else drawn
    for rel, (x0, y0, x1, y1) in meta["boxes"].items():
        pic = np.asarray(Image.open(tmp_path / rel), dtype=np.float64)
        assert pic.shape == (48, 48, 3) and 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48
        ys, xs = np.mgrid[:48, :48] + 0.5  # pixel centres
        inside = (xs >= x0 - 1) & (xs <= x1 + 1) & (ys >= y0 - 1) & (ys <= y1 + 1)
        background = np.median(pic[~inside], axis=0)
        shape = np.linalg.norm(pic - background, axis=2) > 100  # colours differ by >= 90 x sqrt(3), noise sd <= 24
        assert shape[inside].sum() >= 4, rel  # the shape is there...
        assert shape[~inside].mean() < 0.005, rel  # ...and hardly anything like it outside its box


def test_easy_style_is_the_original_generator() -> None:
    """``EASY`` draws what the generator drew before it had styles, draw for draw: the hash of
    12 pictures and boxes made by that version (commit d70724b) with the same seed."""
    import hashlib

    rng, h = np.random.default_rng(7), hashlib.sha256()
    for kind in list(SHAPES) * 3:
        pic, box = render_shape(kind, 32, rng, EASY)
        h.update(np.asarray(pic).tobytes())
        h.update(repr(box).encode())
    assert h.hexdigest() == "afdcce4bcaa9e763fd053ab8cc493ec88b14b5a3cea6964aee03896c969eaac0"


def shape_contrast(style: ShapeStyle, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per picture: shape luminance minus background luminance (medians inside the shape /
    outside its box), and the share of pixels outside the box that stand out from the background."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    contrast, stray = [], []
    for i in range(n):
        kind = SHAPES[i % 4]
        state = rng.bit_generator.state
        pic, (x0, y0, x1, y1) = render_shape(kind, 48, rng, style)
        rng2 = np.random.default_rng()
        rng2.bit_generator.state = state  # replay the draws up to the outline to get the shape's mask
        from vit_demo.train.data import shape_colours

        shape_colours(rng2, style.polarity)
        r = 48 * rng2.uniform(0.18, 0.38)
        cx, cy = rng2.uniform(r, 48 - r, 2)
        mask = Image.new("L", (48, 48), 0)
        ImageDraw.Draw(mask).polygon(shape_outline(kind, cx, cy, r, rng2.uniform(0, 2 * np.pi)), fill=255)
        lum = np.asarray(pic.convert("L"), dtype=np.float64)
        inside = np.asarray(mask) == 255
        ys, xs = np.mgrid[:48, :48] + 0.5
        outside = ~((xs >= x0 - 1) & (xs <= x1 + 1) & (ys >= y0 - 1) & (ys <= y1 + 1))
        background = np.median(lum[outside])
        contrast.append(np.median(lum[inside]) - background)
        stray.append(float((np.abs(lum[outside] - background) > 60).mean()))
    return np.array(contrast), np.array(stray)


def test_hard_style_random_polarity_and_distractors() -> None:
    """The default set: shapes darker than their background about half the time (the bright
    set: never), marks outside the shape's box with distractors (none without)."""
    contrast, _ = shape_contrast(ShapeStyle(distractors=0, texture=False), 120, seed=0)
    assert abs(contrast).min() > 25 and 0.35 < (contrast < 0).mean() < 0.65, contrast
    contrast, stray = shape_contrast(ShapeStyle("bright", 0, False), 60, seed=1)
    assert contrast.min() > 50 and stray.max() < 0.01
    _, none = shape_contrast(ShapeStyle("random", 0, False), 60, seed=2)
    _, stray = shape_contrast(ShapeStyle("random", 6, False), 60, seed=2)
    assert none.max() == 0 and (stray > 0.002).mean() > 0.5, stray  # most pictures carry marks of no class
    hard = ShapeStyle()
    assert (hard.polarity, hard.distractors, hard.texture) == ("random", 3, True)
    with pytest.raises(DataError, match="--polarity must be random or bright"):
        ShapeStyle("dark")


def test_more_shape_classes(tmp_path: Path) -> None:
    assert shape_classes(None) == SHAPES and shape_classes("all") == SHAPES + MORE_SHAPES
    assert shape_classes("6") == SHAPES + MORE_SHAPES[:2] and shape_classes("moon, heart") == ("moon", "heart")
    for bad, why in (("circle", "two or more"), ("circle,blob", "unknown: blob"), ("9", "between 2 and 8"),
                     ("circle,circle", "two or more different")):
        with pytest.raises(DataError, match=why):
            shape_classes(bad)
    for kind in SHAPES + MORE_SHAPES:  # every outline fits its circumradius, so the shape stays in the picture
        pts = np.array(shape_outline(kind, 0.0, 0.0, 1.0, 0.3))
        assert np.hypot(pts[:, 0], pts[:, 1]).max() == pytest.approx(1.0) and len(pts) >= 3
    meta = make_shapes(tmp_path, per_class=2, size=32, seed=0, classes="all", progress=False)
    assert sorted(d.name for d in tmp_path.iterdir() if d.is_dir()) == sorted(SHAPES + MORE_SHAPES)
    assert len(meta["boxes"]) == 16 and meta["style"] == {"polarity": "random", "distractors": 3, "texture": True}


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


@pytest.mark.slow  # commands in subprocesses
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    cmd = [sys.executable, "-m", "vit_demo", "train", "--data", str(tmp_path), "--out", str(tmp_path / "m.safetensors")]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "at least 2" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "vit_demo", "data", "shapes", "--out", str(tmp_path / "s"), "--per-class", "2",
                        "--size", "16"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "wrote 8 pictures" in r.stdout and "polarity random, up to 3 distractors, textured" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vit_demo", "data", "shapes", "--out", str(tmp_path / "e"), "--per-class", "1",
                        "--easy", "--classes", "moon,cross"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "wrote 2 pictures (moon, cross; 32 px; polarity bright, up to 0 distractors, flat)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vit_demo", "data", "shapes", "--out", str(tmp_path / "f"), "--classes",
                        "blob,star"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "unknown: blob" in r.stderr, r.stderr
    assert len(json.loads((tmp_path / "s" / "boxes.json").read_text())["boxes"]) == 8


def test_cifar10_offline_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from vit_demo.train.cifar import download_cifar

    def no_network(*args, **kwargs):
        raise OSError("network unreachable (blocked in this test)")

    monkeypatch.setenv("VIT_DEMO_DATA", str(tmp_path))  # an empty cache: it would have to download
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(DataError, match="cannot download CIFAR-10"):  # one connection attempt, no retries
        download_cifar("cifar10")
    assert not any(tmp_path.iterdir())  # nothing half-downloaded
