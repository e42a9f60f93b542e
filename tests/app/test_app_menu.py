"""The model menu follows weights/ while the app runs: a checkpoint written there (as ``train``
does at its end) joins the menu on page load and when the menu is opened, without a restart; a
rewritten file is read again; a deleted one leaves the menu."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from app_server import running_app

from vit_demo.checkpoints.files import save
from vit_demo.model import VisionTransformer
from vit_demo.train.recipe import scratch_config, scratch_data_config

CHROMIUM = Path("/usr/bin/chromium")


def write_checkpoint(path: Path, names: list[str], seed: int = 0) -> Path:
    """A small trained-here checkpoint (random weights) with its own class names."""
    torch.manual_seed(seed)
    model = VisionTransformer(scratch_config(32, len(names))).init_weights()
    return save(model, scratch_data_config(32), path, name="", class_names=names)


def test_registry_follows_the_weights_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vit_demo.app.registry import ModelRegistry

    monkeypatch.setenv("VIT_DEMO_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.delenv("VIT_DEMO_WEIGHTS", raising=False)
    old = write_checkpoint(tmp_path / "old.safetensors", ["a", "b"])
    reg = ModelRegistry(hub_names=())
    keys = [k for _, k in reg.choices()]
    assert f"file:{old.name}" in keys and reg.refresh() == []  # nothing new yet (a key names the file, never its path)
    new = write_checkpoint(tmp_path / "shapes-vit.safetensors", ["circle", "square", "star", "triangle"])
    (tmp_path / "shapes-vit.safetensors.train-state").write_bytes(b"not a checkpoint")  # never listed
    added = reg.refresh()
    key = f"file:{new.name}"
    assert [s.key for s in added] == [key] and key in [k for _, k in reg.choices()]
    assert [k for _, k in reg.choices()].index(key) < [k for _, k in reg.choices()].index("random:deit_tiny_patch16_224")
    assert reg.get(key).labels == ("circle", "square", "star", "triangle")
    time.sleep(0.01)
    write_checkpoint(new, ["one", "two", "three"], seed=1)  # trained again into the same file
    os.utime(new, ns=(time.time_ns(), time.time_ns() + 10_000_000))  # a clearly newer modification time
    assert reg.refresh() == [] and reg.get(key).labels == ("one", "two", "three")
    old.unlink()
    reg.refresh()
    assert f"file:{old.name}" not in [k for _, k in reg.choices()] and reg.find_path(old) is None


@pytest.mark.browser
def test_new_checkpoint_appears_in_the_running_app(tmp_path: Path) -> None:
    """Chromium: the app is running; a checkpoint is written to weights/; opening the menu shows it,
    picking it loads it (its description), and a fresh page load lists it too."""
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
    from test_app_browser import CHROMIUM_ARGS, TIMEOUT_MS, shot

    weights = tmp_path / "weights"
    weights.mkdir()
    with running_app(["--no-warm-up"], env={"VIT_DEMO_WEIGHTS_DIR": str(weights)}) as app, \
            sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            pg = b.new_page(viewport={"width": 1280, "height": 720})
            pg.set_default_timeout(TIMEOUT_MS)
            pg.goto(app.url)
            pg.wait_for_selector("#upload")
            pg.locator("#model input").click()
            pg.get_by_role("option", name=re.compile("RANDOM weights")).wait_for()
            assert pg.get_by_role("option", name=re.compile("fresh-vit")).count() == 0
            pg.keyboard.press("Escape")
            pg.locator("#upload").click(position={"x": 5, "y": 5}, force=True)  # focus leaves the menu
            write_checkpoint(weights / "fresh-vit.safetensors", ["circle", "square", "star", "triangle"])
            pg.locator("#model input").click()  # opening the menu again brings it up to date
            pg.get_by_role("option", name=re.compile("fresh-vit")).click()
            pg.wait_for_function("() => (document.querySelector('#model-info')?.innerText || '').includes('fresh-vit')")
            assert "4 classes" in pg.inner_text("#model-info")
            shot(pg, "menu_refresh_new_checkpoint")
            other = b.new_page(viewport={"width": 390, "height": 844})
            other.set_default_timeout(TIMEOUT_MS)
            write_checkpoint(weights / "second-vit.safetensors", ["a", "b"])
            other.goto(app.url)  # a page load lists what is there now
            other.wait_for_selector("#upload")
            other.locator("#model input").click()
            other.get_by_role("option", name=re.compile("second-vit")).wait_for()
            assert other.get_by_role("option", name=re.compile("fresh-vit")).count() == 1
            shot(other, "menu_refresh_phone")
        finally:
            b.close()
        assert "Traceback" not in app.log(50_000), app.log()
