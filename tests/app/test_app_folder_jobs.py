"""The folder jobs (the Whole folder tab's survey, the Atlas tab's atlas) against huge pictures and
the time limit (issue 47, break 4), with raw HTTP against the running ``--exposed`` app (one
server for the module: ``--job-seconds 6 --max-megapixels 30``).

Before: the folder jobs read every picture whole, past ``--max-megapixels`` and without the
1,536-px reduction of a single upload (a 64-MP float TIFF raised the survey's memory by 1.75 GB),
and checked the time limit every 16 pictures (16 of them: 64 s against ``--job-seconds 30``);
an atlas of 100 photos ran 13 s past the limit. Now each picture is read as an upload is, the
time limit is checked before each, and an atlas that would not fit says so after its first
pictures, with the number that would.
"""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from attacks import Raw, file_payload, values_for
from PIL import Image

pytest.importorskip("httpx")

JOB_S = 6


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--job-seconds", str(JOB_S), "--max-megapixels", "30",
            "--max-upload-mb", "8", "--no-warm-up"]
    with running_app(args) as a:
        raw = Raw(a.url)
        pic = io.BytesIO()
        Image.new("RGB", (64, 64), (200, 30, 30)).save(pic, "PNG")
        stored = raw.http.post(raw.url + "gradio_api/upload", files=[("files", ("r.png", pic.getvalue()))]).json()[0]
        assert raw.call("predict", [file_payload(stored), None, 3]).success  # the model loaded: not the jobs' time
        yield a


def zip_of(path: Path, pictures: dict[str, Image.Image], fmt: str = "PNG") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, img in pictures.items():
            buf = io.BytesIO()
            img.save(buf, fmt, **({"compression": "tiff_adobe_deflate"} if fmt == "TIFF" else {}))
            z.writestr(name, buf.getvalue())
    return path


def run(app, event: str, archive: Path):
    raw = Raw(app.url)
    stored = raw.upload(archive)
    t0 = time.perf_counter()
    out = raw.call(event, values_for(raw, event, 0, file_payload(stored)), timeout=300)
    return out, time.perf_counter() - t0


def test_folder_jobs_refuse_pictures_past_the_pixel_limit(app, tmp_path: Path) -> None:
    """Two pictures of 6000 x 6000 px (36 MP) beside a small one, against --max-megapixels 30:
    before, the survey read them whole and surveyed all three; now they are refused from their
    header, in the survey's notes, and the small one is surveyed."""
    rng = np.random.default_rng(0)
    small = Image.fromarray(rng.integers(0, 256, (160, 160, 3), dtype=np.uint8))
    big = Image.new("RGB", (6000, 6000), (20, 120, 200))
    archive = zip_of(tmp_path / "mixed.zip", {"pics/a.png": small, "pics/b.png": big, "pics/c.png": big})
    out, took = run(app, "on_run", archive)
    print(f"survey: {took:.1f} s: {str(out.output)[:300] if out.success else out.message}")
    assert out.success, out.message
    status = out.output["data"][1]
    assert "**1 pictures**" in status and "the limit is 30 MP" in status, status


def test_the_survey_ends_within_the_time_limit(app, tmp_path: Path) -> None:
    """20 float TIFFs of 5400 x 5400 px (29 MP, a few KB each in the zip): before, the survey read
    16 of them whole (each a 29-MP array of float64 on its way to 8 bits) before it first checked
    its time limit, and ran the amortised LRP of 16 at once (23 s on a busy machine); now each is
    reduced at load, the limit is checked before each picture and the model takes 4 at a time:
    the survey ends within 4 s of the limit."""
    big = Image.new("F", (5400, 5400), 0.5)
    archive = zip_of(tmp_path / "big.zip", {f"pics/{i:02d}.tif": big for i in range(20)}, fmt="TIFF")
    out, took = run(app, "on_run", archive)
    print(f"survey of 20 float TIFFs of 29 MP, --job-seconds {JOB_S}: {took:.1f} s: {out.message}")
    assert not out.success and f"took longer than the {JOB_S} s" in out.message, out.message
    assert took < JOB_S + 4, took


def test_an_atlas_that_would_not_fit_says_so_up_front(app, tmp_path: Path) -> None:
    """An atlas of 60 pictures against a 6 s limit: before, it ran to the limit (or past it) and was
    stopped there; now it says after its first pictures how many would fit."""
    rng = np.random.default_rng(1)
    pics = {f"pics/{i:02d}.png": Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)) for i in range(60)}
    out, took = run(app, "on_build", zip_of(tmp_path / "sixty.zip", pics))
    print(f"atlas of 60 pictures, --job-seconds {JOB_S}: {took:.1f} s: {out.message}")
    assert not out.success and "An atlas of 60 pictures would take about" in out.message, out.message
    assert "send at most" in out.message or "too busy" in out.message
    assert took < JOB_S, took
