"""The app in Chromium on a CPU that computes bf16 (``python app.py``, the default ``--precision auto``,
the suite's $VIT_DEMO_NO_BF16 switched back off for it): the slide deck made for a photo never tells
the audience MISMATCH, and its timm slide names the precision it compared (both in fp32); the Compare
tab says the same and shows the prediction above the tabs (bf16) beside fp32's.

On a CPU without bf16 the app is asked for it by name (``--precision bf16``, emulated): the model then
runs in bf16 all the same. Screenshots go to ``artifacts/screenshots/`` (git-ignored)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from app_server import ROOT, running_app
from conftest import CHROMIUM

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ROOT / "artifacts" / "screenshots"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def bf16_app(deit_tiny_path: Path):
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    from vit_demo.precision import ENV_NO_BF16, bf16_is_fast

    with pytest.MonkeyPatch.context() as mp:  # the hardware's answer (the suite switched the detection off)
        mp.setenv(ENV_NO_BF16, "0")
        native = bf16_is_fast("cpu")
    args = ["--weights", str(deit_tiny_path), "--no-warm-up", *([] if native else ["--precision", "bf16"])]
    with running_app(args, env={ENV_NO_BF16: "0"}) as a:  # the detection on, as on a user's machine
        yield a


def download(pg, selector: str, index: int, dest: Path) -> Path:
    link = pg.locator(f"{selector} a[download]").nth(index)
    link.wait_for()
    with pg.expect_download() as dl:
        link.click()
    out = dest / dl.value.suggested_filename
    dl.value.save_as(out)
    return out


def deck_text(pptx: Path) -> list[tuple[str, str]]:
    """(title, every other word on the slide and in its notes) of each slide."""
    from pptx import Presentation

    out = []
    for s in Presentation(str(pptx)).slides:
        words = [sh.text_frame.text for sh in s.shapes if sh.has_text_frame]
        out.append((s.shapes.title.text, " ".join([*words, s.notes_slide.notes_text_frame.text])))
    return out


def test_deck_and_compare_of_a_bf16_app_say_fp32_and_never_mismatch(browser, bf16_app, package_photos, tmp_path):
    from vit_demo.present import deck

    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    try:
        pg.goto(bf16_app.url)
        pg.wait_for_selector("#upload")
        pg.set_input_files("#upload input[type=file]", str(package_photos["coffee"]))
        pg.wait_for_selector("#predictions h2:has-text('espresso')")
        pg.wait_for_selector("#model-info:has-text('bf16')")
        info = pg.inner_text("#model-info")
        assert "Runs in bf16 (" in info and "99.8 %" in info, info  # bf16, and the figures measured on this model

        pg.get_by_role("tab", name="For presentations").click()
        pg.click("#make-deck")
        pptx = download(pg, "#deck-files", 0, tmp_path)  # waits for the deck (a minute on a busy machine)
        pdf = download(pg, "#deck-files", 1, tmp_path)
        slides = deck_text(pptx)
        assert len(slides) == len(deck.slide_costs(1))
        for title, words in slides:
            assert "MISMATCH" not in title.upper() and "MISMATCH" not in words.upper(), (title, words)
        title, words = slides[-2]  # the check against timm
        assert title == "Checked against timm, both in fp32: identical", title
        assert "Identical to 0.0001, both in fp32" in words and "both models in float32" in words
        assert "ran deit_tiny_patch16_224 in bf16, for speed" in words
        if shutil.which("pdftotext"):  # the PDF says the same
            text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
            assert "both in fp32" in text and "MISMATCH" not in text.upper()
        SHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SHOTS / "precision_01_deck.png"), full_page=True)

        pg.get_by_role("tab", name="Compare with timm").click()
        pg.click("#run-timm")
        pg.wait_for_selector("#verdict:has-text('both in fp32')", timeout=120_000)
        verdict, table = pg.inner_text("#verdict"), pg.inner_text("#timm-table")
        assert "PASS" in verdict and "Identical to 0.0001, both in fp32" in verdict, verdict
        assert "both in fp32" in table and "the prediction above the tabs, in bf16" in table, table
        pg.screenshot(path=str(SHOTS / "precision_02_compare.png"), full_page=True)
        assert "Traceback" not in bf16_app.log(20_000), bf16_app.log()
    finally:
        ctx.close()
