"""Issue 46: the input size of a from-scratch run. A folder of ordinary photos (hundreds of pixels a
side, mixed sizes and orientations) trains with no flag but --data and --out at a size chosen for
the budget, and says which and why; small pictures (the shapes, the digits) keep their own size;
an --img-size or --patch-size the stem cannot use gets one error whose advice works when followed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from safetensors import safe_open

from vit_demo.train.data import DataError, size_share
from vit_demo.train.recipe import SIZE_CANDIDATES, coarse_patch, patch_for, scratch_config, size_advice
from vit_demo.train.sizing import (
    ENOUGH_EPOCHS,
    choose_size,
    fine_grid_epochs,
    size_candidates,
    small_size,
    wanted_epochs,
)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
SIZES = [(500, 375), (500, 333), (333, 500), (640, 480), (375, 500), (500, 375)]  # w x h: landscape and portrait


def train(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_demo", "train", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


def photo_folder(root: Path, package_photos: dict[str, Path]) -> Path:
    """Three classes of six large photos each, cut from the package photos: crops at different
    places, some turned to portrait, resized to 500x375, 500x333, 333x500, 640x480 and 375x500."""
    for name in ("chelsea", "coffee", "astronaut"):
        (root / name).mkdir(parents=True)
        src = Image.open(package_photos[name]).convert("RGB")
        w, h = src.size
        for i, (tw, th) in enumerate(SIZES):
            f = 0.7 + 0.05 * i  # a crop of 70-95 % of the photo, moved across it
            cw, ch = int(w * f), int(h * f)
            x0, y0 = (w - cw) * (i % 3) // 2, (h - ch) * (i % 2)
            pic = src.crop((x0, y0, x0 + cw, y0 + ch))
            if th > tw:
                pic = pic.rotate(90, expand=True)
            pic.resize((tw, th), Image.Resampling.BICUBIC).save(root / name / f"{name}_{i}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def photos(package_photos: dict[str, Path], tmp_path_factory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("photos"), package_photos)


def chosen(output: str) -> int:
    m = re.search(r"pictures are [^\n]*?: training at (\d+) px \(", output)
    assert m, output
    return int(m.group(1))


@pytest.mark.slow  # trains
def test_a_folder_of_photos_trains_with_no_flag_but_a_budget(photos: Path, tmp_path: Path) -> None:
    """The issue's command on full-size photos: it trains, at a size the conv stem can use and below
    the pictures' own, and its log says which size and why."""
    assert size_share(sorted(photos.rglob("*.jpg")))[0] == (375, 500)  # h x w: the most common, 6 of 18
    out = tmp_path / "photos.safetensors"
    r = train("--data", str(photos), "--out", str(out), "--minutes", "0.05", "--no-progress")
    assert r.returncode == 0, r.stderr
    size = chosen(r.stdout)
    assert size in SIZE_CANDIDATES and size < 333 and patch_for(size, "conv") is not None
    assert "pictures are of mixed sizes, most often 500x375: training at" in r.stdout
    assert "--img-size to choose" in r.stdout and f"{size} px, patch {patch_for(size, 'conv')}, conv stem" in r.stdout
    assert re.search(r"^epoch +1/", r.stdout, re.M) and "saved " in r.stdout
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["data_config"])["input_size"] == [size, size]
    assert json.loads(meta["config"])["conv_stem"] is True


@pytest.mark.slow  # trains
def test_a_roomy_budget_takes_the_largest_size(photos: Path, tmp_path: Path) -> None:
    """With one epoch asked for, the default 10 minutes hold it at every candidate: the largest,
    128 px, and the header says how to repeat the run exactly (the size came from the clock)."""
    r = train("--data", str(photos), "--out", str(tmp_path / "m.safetensors"), "--epochs", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert chosen(r.stdout) == 128, r.stdout
    assert "(the largest of 32, 48, 64, 96, 128 px at which 1 epoch fits 10 minutes (the default budget)" in r.stdout
    assert "128 px, patch 16, conv stem; 1 epochs" in r.stdout


def test_the_size_choice() -> None:
    """The largest size at which the budget holds enough epochs, or the smallest when none does:
    the smallest timed first, then the largest, then halfway between (an ample budget costs two
    probes, not five). A step's cost here: proportional to the pixels."""
    probed: list[int] = []

    def probe(size: int) -> float:
        probed.append(size)
        return 0.01 * (size / 32) ** 2

    # 2 steps an epoch, a validation pass of half a batch: an epoch is 2.17 steps; 100 epochs at 64 px
    # take 8.7 s and at 96 px 19.5 s (95 % of the budget is planned with)
    c = choose_size((375, 500), 0.6, "conv", None, probe, steps_per_epoch=2, val_steps=0.5, seconds=15)
    assert (c.size, probed, c.step_s) == (64, [32, 128, 64, 96], 0.04)
    assert c.note == ("pictures are mostly 500x375: training at 64 px (the largest of 32, 48, 64, 96, 128 px at which 100 "
                      "epochs fit the 0.25-minute budget; --img-size to choose)")
    probed.clear()
    c = choose_size((375, 500), 0.2, "conv", None, probe, steps_per_epoch=2, val_steps=0.5, seconds=1)
    assert (c.size, probed) == (32, [32]) and "the smallest of 32, 48, 64, 96, 128 px; even there only 43 of the 100" in c.note
    probed.clear()
    assert choose_size((375, 500), 1.0, "conv", None, probe, 2, 0.5, 600).size == 128 and probed == [32, 128]
    assert choose_size((60, 90), 1.0, "conv", None, probe, 2, 0.5, 600).size == 60  # their own side: 4-px patches, 15 a side
    assert choose_size((100, 150), 1.0, "conv", None, probe, 2, 0.5, 600).size == 96  # not 100 (25 a side), not above it
    probed.clear()
    for side, size in ((8, 8), (4, 8), (28, 28), (27, 28)):  # small pictures: their own size, no probe
        c = choose_size((side, side), 1.0, "conv", None, probe, 2, 0.5, 1)
        assert c.size == size and c.step_s is None and c.patch is None and f"training at {size} px" in c.note
    for side, patch in ((32, 4), (16, 2)):  # with --epochs or --patch-size, neither probed: the default grid
        assert choose_size((side, side), 1.0, "conv", None, probe, 2, 0.5, 1, epochs=5).patch is None
        assert choose_size((side, side), 1.0, "conv", patch, probe, 2, 0.5, 1).patch is None
    assert probed == []


def test_a_short_budget_takes_the_coarser_grid() -> None:
    """Small pictures under a budget: the default grid (8x8 at 32 px) when the budget holds 100 of its
    epochs (or 5,000 steps), else 8-px patches (4x4); the 32-px step timed once, at 10 ms."""
    assert [coarse_patch(n, "conv") for n in (8, 16, 24, 28, 32, 64)] == [None, 4, None, None, 8, 16]
    assert coarse_patch(32, "patch") is None  # the plain ViT keeps its patch
    assert [fine_grid_epochs(n) for n in (1, 50, 100, 5000)] == [100, 100, 50, 1]
    probed: list[int] = []

    def probe(size: int) -> float:
        probed.append(size)
        return 0.01

    # 50 steps an epoch and a validation pass of 12.5 steps at a third of the cost: 0.54 s an epoch
    c = choose_size((32, 32), 1.0, "conv", None, probe, 50, 12.5, 120)  # 2 minutes: 210 epochs
    assert (c.patch, c.flags, c.step_s, probed) == (None, "", 0.01, [32])
    c = choose_size((32, 32), 1.0, "conv", None, probe, 50, 12.5, 30)  # half a minute: 52 epochs
    assert (c.patch, c.flags, c.step_s) == (8, "--patch-size 8", None)
    assert c.note == ("pictures are 32x32: training at 32 px, their own size, in 8-px patches, a 4x4 grid: at 4-px "
                      "patches only 52 of the 100 epochs wanted fit the 0.5-minute budget, and the coarser grid trains "
                      "about 3 times as many (--patch-size to choose)")
    assert scratch_config(32, 4, c.patch, "conv").grid_size == (4, 4)
    # the epochs a size must hold: 100, fewer on a large folder (2,000 steps), or the --epochs asked for
    assert [wanted_epochs(n) for n in (1, 2, 20, 62, 5000)] == [ENOUGH_EPOCHS, 100, 100, 33, 1]
    assert wanted_epochs(62, epochs=7) == 7
    assert size_candidates(375, "conv") == [128, 96, 64, 48, 32]
    assert size_candidates(40, "conv") == [40, 32] and size_candidates(100, "conv") == [96, 64, 48, 32]  # 100: a 25x25 grid
    assert size_candidates(375, "conv", patch_size=16) == [128, 96, 64, 48, 32]
    assert size_candidates(375, "conv", patch_size=64) == [128, 64]  # a given patch: any multiple of it
    assert small_size(27, "patch") == 27 and small_size(27, "conv") == 28


def test_small_pictures_keep_their_size_and_patch() -> None:
    """What the shapes (32 px) and the digits (8 px) trained at before, unchanged."""
    assert [scratch_config(n, 4, stem="conv").patch_size for n in (8, 28, 32, 64, 48, 40, 50)] == [2, 4, 4, 8, 8, 4, 2]
    assert [scratch_config(n, 4).patch_size for n in (8, 28, 32, 64, 40, 96)] == [2, 4, 4, 8, 5, 12]


def followed(size: int, stem: str, patch: int | None, message: str) -> list[tuple[int, str, int | None]]:
    """Every (size, stem, patch) that the advice in ``message`` names: ``use A, or B, or C``, each one
    ``--img-size 352 or 384``, ``--patch-size 2 or 4``, ``--patch-size 4 --img-size 376``,
    ``--stem patch`` or ``leave out --patch-size``."""
    out = []
    for alt in message.split("; use ", 1)[1].split(", or "):
        if alt == "--stem patch":
            out.append((size, "patch", patch))
        elif alt == "leave out --patch-size":
            out.append((size, stem, None))
        elif m := re.fullmatch(r"--img-size (\d+)(?: or (\d+))?", alt):
            out += [(int(v), stem, patch) for v in m.groups() if v]
        elif m := re.fullmatch(r"--patch-size (\d+)(?: or (\d+))?", alt):
            out += [(size, stem, int(v)) for v in m.groups() if v]
        else:
            m = re.fullmatch(r"--patch-size (\d+) --img-size (\d+)", alt)
            assert m, (alt, message)
            out.append((int(m.group(2)), stem, int(m.group(1))))
    return out


@pytest.mark.parametrize("stem", ["conv", "patch"])
def test_every_size_works_or_gets_advice_that_works(stem: str) -> None:
    """Every input size from 2 to 400 px (and the photos' 500 and 640), with the default patch and
    with a few given ones: the model builds, or the error is one line whose every suggestion, when
    followed, builds it."""
    failed = 0
    for size in [*range(2, 401), 500, 640]:
        for patch in (None, 3, 5, 8, 16):
            try:
                scratch_config(size, 3, patch, stem)
                continue
            except DataError as e:
                message = str(e)
            failed += 1
            assert "\n" not in message and message.count("; use ") == 1, message
            options = followed(size, stem, patch, message)
            assert options, message
            for s, st, p in options:
                cfg = scratch_config(s, 3, p, st)  # raises if the advice does not work
                assert cfg.img_size == (s, s) and s % cfg.patch_size == 0
    assert failed > 100  # (the loop did meet unusable sizes)


@pytest.mark.slow  # trains
def test_the_issue_errors_advise_what_works(photos: Path, tmp_path: Path) -> None:
    """The issue's dead end: 375 px with the conv stem. The error names sizes that work and
    --stem patch; following the first trains."""
    with pytest.raises(DataError) as e:
        scratch_config(375, 3, None, "conv")
    assert str(e.value).endswith("use --img-size 352 or 384, or --stem patch")
    assert size_advice(375, "conv", 5) == "--stem patch" and patch_for(375, "patch", 5) == 5
    assert patch_for(375, "patch") == 75  # the plain ViT at 375 px: a 5x5 grid
    out = tmp_path / "m.safetensors"
    r = train("--data", str(photos), "--out", str(out), "--img-size", "375", "--no-progress")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--img-size 352 or 384" in r.stderr, r.stderr
    r = train("--data", str(photos), "--out", str(out), "--img-size", "352", "--epochs", "1", "--no-progress")
    assert r.returncode == 0 and "352 px, patch 32, conv stem" in r.stdout, r.stderr
