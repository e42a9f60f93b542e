"""A checkpoint trained here opens in the app: Chromium uploads a shape and sees the trained
model's own class names in the predictions and the class picker, and a rollout map.

The checkpoint is trained for real (the train command, 2 epochs on 120 shapes at 32 px, patch
4); what it predicts is not the point here, only that the app speaks its classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from app_server import ROOT, running_app
from test_app_browser import CHROMIUM, TIMEOUT_MS, shot, upload

from vit_demo.train.data import make_shapes

pytestmark = pytest.mark.browser
CLASSES = ["circle", "square", "star", "triangle"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    root = tmp_path_factory.mktemp("shapes")
    make_shapes(root / "data", per_class=30, size=32, seed=2, progress=False)
    out = root / "shapes-vit.safetensors"
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(root / "data"), "--out", str(out),
                        "--epochs", "2", "--no-progress", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["classes"] == CLASSES
    return out, root / "data"


@pytest.fixture(scope="module")
def app(trained: tuple[Path, Path]):
    with running_app(["--weights", str(trained[0])]) as a:
        yield a


def test_trained_checkpoint_in_the_app(browser, app, trained: tuple[Path, Path]) -> None:
    ckpt, data = trained
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    try:
        pg.goto(app.url)
        pg.wait_for_selector("#upload")
        upload(pg, data / "star" / "star_00000.png")
        pg.wait_for_selector("#predictions h2")
        top1 = pg.inner_text("#predictions h2").strip()
        assert top1 in CLASSES, top1
        text = pg.inner_text("#predictions")
        assert all(c in text for c in CLASSES), text  # four classes, four names: all in the top-k
        assert "center-crop 32x32" in pg.inner_text("#input-caption")
        shot(pg, "train_01_predictions")
        pg.get_by_role("tab", name="Rollout & relevance").click()
        pg.wait_for_selector("#methods img")
        pg.wait_for_function("CLASSES => CLASSES.some(c => document.querySelector('#explain-class input').value.includes(c))",
                             arg=CLASSES)
        shot(pg, "train_02_rollout")
        assert app.alive() and "Traceback" not in app.log(20_000), app.log()
    finally:
        ctx.close()
