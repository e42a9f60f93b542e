"""The survey in a real Chromium: the HTML report opens from disk, its filters and sorting work,
nothing in it reaches beyond file://, and a hostile file name stays text; the app's "Whole folder"
tab surveys uploaded pictures and a zip, and a click on a tile opens that picture in the other tabs.

Real photos bundled with scikit-image and matplotlib, named the way the shared ImageNet sample is
(``<wnid>_<name>``) so that the survey knows their classes; two are given a wrong class on purpose.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from app_server import ROOT
from test_app_browser import CHROMIUM, TIMEOUT_MS, shot

from vit_demo.labels import imagenet_labels, imagenet_wnids

pytestmark = pytest.mark.browser

NAMED = {  # photo -> the ImageNet class its file name gives it (the last two are wrong on purpose)
    "coffee": "espresso", "chelsea": "tabby", "grace_hopper": "military uniform", "motorcycle": "moped",
    "camera": "tripod", "astronaut": "goldfish", "rocket": "tench",
}
HOSTILE = '<img src=x onerror="window.pwned=1">'  # a file name that must stay text


def wnid(label: str) -> str:
    return imagenet_wnids()[imagenet_labels().index(label)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, package_photos: dict[str, Path]) -> Path:
    root = tmp_path_factory.mktemp("photos")
    for name, label in NAMED.items():
        src = package_photos[name]
        stem = f"{name}{HOSTILE}" if name == "rocket" else name
        shutil.copyfile(src, root / f"{wnid(label)}_{stem}{src.suffix}")
    return root


@pytest.fixture(scope="module")
def surveyed(folder: Path, tmp_path_factory) -> tuple[dict, Path]:
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    out = tmp_path_factory.mktemp("report")
    r = subprocess.run([sys.executable, "-m", "vit_demo", "survey", "--images", str(folder), "--out", str(out),
                        "--method", "chefer", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out


def tiles(pg) -> list[dict]:
    return pg.eval_on_selector_all("#gallery .tile", "ts => ts.map(t => ({index: +t.dataset.index, "
                                   "confidence: +t.dataset.confidence, cluster: +t.dataset.cluster}))")


def test_report_filters_offline(browser, surveyed: tuple[dict, Path]) -> None:
    result, out = surveyed
    images = result["images"]
    wrong = [r["index"] for r in images if r["correct"] is False]
    assert len(images) == 7 and len(wrong) >= 2  # astronaut and rocket at least
    ctx = browser.new_context(viewport={"width": 1280, "height": 720})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    requests, errors = [], []
    pg.on("request", lambda r: requests.append(r.url))
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        pg.goto((out / "report.html").as_uri())
        pg.wait_for_selector("#gallery .tile")
        assert len(tiles(pg)) == 7 and pg.inner_text("#count") == "7 of 7 pictures"
        assert pg.locator("#embedding img").count() == 7 and pg.locator("#clusters .card").count() >= 1
        shot(pg, "survey_report_all")
        pg.select_option("#show", "wrong")
        assert sorted(t["index"] for t in tiles(pg)) == sorted(wrong)
        assert pg.locator("#embedding img.out").count() == 7 - len(wrong)  # the others fade
        pg.select_option("#show", "all")
        pg.select_option("#sort", "conf-asc")
        confs = [t["confidence"] for t in tiles(pg)]
        assert confs == sorted(confs) and confs[0] == min(r["confidence"] for r in images)
        c = max(result["clusters"], key=lambda c: c["size"])
        pg.select_option("#cluster", str(c["id"]))
        assert {t["index"] for t in tiles(pg)} == {r["index"] for r in images if r["cluster"] == c["id"]}
        pg.click("#reset")
        pg.fill("#find", "grace")
        assert [t["index"] for t in tiles(pg)] == [r["index"] for r in images if "grace" in r["path"]]
        pg.click("#reset")
        rocket = pg.locator("#gallery .tile", has_text="rocket")
        assert HOSTILE in rocket.inner_text()  # shown as text...
        rocket.click()
        pg.wait_for_selector("#detail[open]")
        assert "tench" in pg.inner_text("#detail-body")
        shot(pg, "survey_report_detail")
        assert pg.evaluate("window.pwned") is None  # ...never run
        assert not errors, errors
        outside = [u for u in requests if not u.startswith(("file://", "data:"))]
        assert not outside, f"the report fetched from beyond the disk: {outside[:5]}"
        assert any(u.endswith("-map.jpg") for u in requests)  # the thumbnails came from the folder
    finally:
        ctx.close()


# ----------------------------------------------------------------------------- the app's tab


def uploaded(pg, name: str) -> None:
    """Wait until the file box lists ``name`` (it shows "stem .ext") and nothing is still uploading."""
    pg.wait_for_function("name => { const t = document.querySelector('#folder-files').textContent; "
                         "return t.includes(name) && !t.includes('Uploading'); }", arg=name)


def test_whole_folder_tab(browser, app, package_photos: dict[str, Path], tmp_path: Path) -> None:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    outside: list[str] = []
    pg.on("request", lambda r: outside.append(r.url) if not r.url.startswith((app.url.rstrip("/"), "data:", "blob:")) else None)
    try:
        pg.goto(app.url)
        pg.wait_for_selector("#upload")
        pg.get_by_role("tab", name="Whole folder").click()
        three = [package_photos[n] for n in ("chelsea", "coffee", "grace_hopper")]
        pg.set_input_files("#folder-files input[type=file]", [str(p) for p in three])
        uploaded(pg, "grace_hopper")
        pg.click("#folder-run")
        pg.wait_for_selector("#folder-status :text('3 pictures')", timeout=180_000)
        pg.wait_for_function("document.querySelectorAll('#folder-gallery .thumbnail-item').length === 3")
        assert pg.locator("#folder-clusters .thumbnail-item").count() == 3  # three classes, one picture each
        pg.wait_for_selector("#folder-embedding img")
        pg.wait_for_selector("#folder-report a[download]")
        shot(pg, "survey_tab_three")
        captions = pg.locator("#folder-gallery .thumbnail-item").all_inner_texts()
        coffee = next(i for i, t in enumerate(captions) if "coffee" in t)
        assert "espresso" in captions[coffee]
        pg.locator("#folder-gallery .thumbnail-item").nth(coffee).click()
        pg.wait_for_selector("#predictions h2:has-text('espresso')")
        pg.wait_for_selector("#methods img")  # the Rollout & relevance tab opened on it
        assert pg.get_by_role("tab", name="Rollout & relevance").get_attribute("aria-selected") == "true"
        shot(pg, "survey_tab_opened")

        # a zip with class folders (labels), a picture in a nested folder, and a member that tries to escape
        archive = tmp_path / "photos.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.write(package_photos["coffee"], "set/espresso/coffee.png")
            z.write(package_photos["chelsea"], "set/Egyptian cat/chelsea.png")
            z.write(package_photos["camera"], "set/goldfish/camera.png")  # wrong on purpose
            z.writestr("../../escaped.png", package_photos["coffee"].read_bytes())
            z.writestr("notes.txt", "not a picture")
        pg.get_by_role("tab", name="Whole folder").click()
        pg.locator("#folder-files button[aria-label='Clear']").click()  # a new upload would join the three
        pg.set_input_files("#folder-files input[type=file]", str(archive))
        uploaded(pg, "photos")
        pg.click("#folder-run")
        pg.wait_for_selector("#folder-status :text('4 pictures')", timeout=180_000)
        status = pg.inner_text("#folder-status")
        assert "accuracy" in status and "on 3" in status, status  # three labelled by their folders; escaped.png is not
        pg.click("#folder-show input")
        pg.get_by_role("option", name="wrong predictions").click()
        pg.wait_for_function("document.querySelectorAll('#folder-gallery .thumbnail-item').length === 1")
        assert "camera" in pg.inner_text("#folder-gallery")
        shot(pg, "survey_tab_zip_wrong")
        assert not list(tmp_path.parent.glob("escaped.png")) and not (Path("/tmp") / "escaped.png").exists()
        assert not outside, outside[:5]
        assert app.alive() and "Traceback" not in app.log(20_000), app.log()
    except Exception:
        shot(pg, "survey_tab_failed")
        print(app.log(5000))
        raise
    finally:
        ctx.close()
