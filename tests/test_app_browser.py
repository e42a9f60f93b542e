"""The app in a real browser: Chromium driven by Playwright, against ``python app.py`` on a
free loopback port with the shared DeiT-Tiny.

Screenshots of every step go to ``artifacts/screenshots/`` (git-ignored) for a person to look
at. Chromium is never downloaded: the test skips when /usr/bin/chromium is absent
(``.ci/browser-deps`` installs it in CI).
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from app_server import ROOT
from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: F401 (the browser tests' shared settings)
from PIL import Image

pytestmark = pytest.mark.browser

SHOTS = ROOT / "artifacts" / "screenshots"
TIMEOUT_MS = 60_000  # generous: CI machines are shared and slow


@pytest.fixture
def page(browser, app):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.outside = []  # requests that left this machine (there must be none)
    pg.on("request", lambda r: pg.outside.append(r.url)
          if not r.url.startswith((app.url.rstrip("/"), "data:", "blob:", "about:")) else None)
    pg.goto(app.url)
    pg.wait_for_selector("#upload")
    yield pg
    ctx.close()


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def img_src(pg, selector: str) -> str | None:
    loc = pg.locator(f"{selector} img")
    return loc.first.get_attribute("src") if loc.count() else None


def wait_src_change(pg, selector: str, old: str | None, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        src = img_src(pg, selector)
        if src and src != old:
            return src
        time.sleep(0.1)
    raise AssertionError(f"{selector}: the picture did not change within {timeout:.0f} s")


def fetch_pixels(pg, src: str) -> bytes:
    r = pg.request.get(src)
    assert r.ok, src
    return Image.open(io.BytesIO(r.body())).convert("RGB").tobytes()


def click_picture(pg, selector: str, fx: float, fy: float) -> None:
    """Click at a fraction of the picture as drawn: gr.Image letterboxes it inside the element
    (object-fit, never enlarged beyond its natural size)."""
    img = pg.locator(selector).first
    box = img.bounding_box()
    nw, nh = img.evaluate("e => [e.naturalWidth, e.naturalHeight]")
    r = min(box["width"] / nw, box["height"] / nh, 1)
    x0, y0 = (box["width"] - nw * r) / 2, (box["height"] - nh * r) / 2
    img.click(position={"x": x0 + nw * r * fx, "y": y0 + nh * r * fy})


def open_atlas(pg, timeout: float = 600) -> None:
    """Open the Atlas tab until its galleries show: the first app of a fresh machine computes the
    examples' atlas in the background (the tab says so), every later one reads it from disk."""
    deadline = time.monotonic() + timeout
    while True:
        pg.get_by_role("tab", name="Atlas").click()
        try:
            pg.wait_for_selector("#atlas-head-gallery img", timeout=5_000)
            pg.wait_for_selector("#atlas-picture img")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            pg.get_by_role("tab", name="Patches").click()


def upload(pg, path: Path) -> None:
    pg.set_input_files("#upload input[type=file]", str(path))


def test_tour(page, app, package_photos: dict[str, Path], tmp_path: Path) -> None:
    """Upload a photo, read the prediction, move the layer slider, click a patch, look at every
    section, check the timm verdict; bad input on the way must not break anything."""
    pg = page
    coffee = package_photos["coffee"]  # scikit-image's cup of espresso

    # 1. predictions
    upload(pg, coffee)
    pg.wait_for_selector("#predictions h2:has-text('espresso')")
    assert pg.inner_text("#predictions h2").strip() == "espresso"
    pg.wait_for_selector("#model-input img")
    assert "center-crop 224x224" in pg.inner_text("#input-caption")
    shot(pg, "01_predictions")

    # 2. the attention explorer: the layer slider re-renders the picture
    pg.get_by_role("tab", name="Attention").click()
    pg.wait_for_selector("#attention img")
    before_src = img_src(pg, "#attention")
    before = fetch_pixels(pg, before_src)
    slider = pg.locator("#layer input[type=range]")
    slider.focus()
    for _ in range(4):
        pg.keyboard.press("ArrowLeft")
    after_src = wait_src_change(pg, "#attention", before_src)
    assert fetch_pixels(pg, after_src) != before, "the attention picture did not change with the layer"
    pg.wait_for_selector("#attention-caption:has-text('layer 8 of 12')")  # 12 (the last) - 4: layers count from 1
    shot(pg, "02_attention_layer8")

    # 3. click a patch: it becomes the query
    old, old_picker = img_src(pg, "#attention"), img_src(pg, "#query-picker")
    click_picture(pg, "#query-picker img", 0.30, 0.40)
    wait_src_change(pg, "#attention", old)
    wait_src_change(pg, "#query-picker", old_picker)  # the picker outlines the query patch
    pg.wait_for_selector("#attention-caption:has-text('patch 74')")  # row 5 (0.40 * 14), column 4 (0.30 * 14)
    assert pg.locator("#query-patch input").input_value() == "74"
    shot(pg, "03_attention_patch_query")
    # ... and a click on the Patches tab's grid too (that tab wires its own click)
    pg.get_by_role("tab", name="Patches").click()
    pg.wait_for_selector("#patch-grid img")
    old_grid = img_src(pg, "#patch-grid")
    click_picture(pg, "#patch-grid img", 0.55, 0.10)  # row 2 (0.10 * 14), column 8 (0.55 * 14): patch 21
    wait_src_change(pg, "#patch-grid", old_grid)  # the grid outlines it
    pg.get_by_role("tab", name="Attention").click()
    pg.wait_for_selector("#attention-caption:has-text('patch 21')")
    assert pg.locator("#query-patch input").input_value() == "21"

    # 4. rollout and class-specific maps; 5. diagnostics
    pg.get_by_role("tab", name="Rollout & relevance").click()
    pg.wait_for_selector("#methods img")
    pg.wait_for_function("document.querySelector('#explain-class input').value.includes('espresso')")
    shot(pg, "04_methods")
    pg.get_by_role("tab", name="Model diagnostics").click()
    pg.wait_for_selector("#distance img")
    pg.wait_for_selector("#pos-embed img")
    shot(pg, "05_diagnostics")

    # 5b. the atlas of the example photos (computed once at start, kept on disk): a head's best
    # patches, and a clicked patch of the photo told as the concepts it is made of
    open_atlas(pg)
    old = img_src(pg, "#atlas-picture")
    click_picture(pg, "#atlas-picture img", 240 / 448, 240 / (448 + 46))  # patch (7, 7)'s middle: 32 px a patch
    pg.wait_for_selector("#atlas-patch:has-text('Patch row 7, column 7')")
    assert "is made of: concept" in pg.inner_text("#atlas-patch") or "none of the atlas" in pg.inner_text("#atlas-patch")
    wait_src_change(pg, "#atlas-picture", old)  # the clicked patch outlined
    shot(pg, "05b_atlas")

    # 6. timm on the same weights and input
    pg.get_by_role("tab", name="Compare with timm").click()
    pg.click("#run-timm")
    pg.wait_for_selector("#verdict:has-text('Identical')", timeout=120_000)
    assert "Identical to" in pg.inner_text("#verdict")
    assert "espresso" in pg.inner_text("#theirs")
    shot(pg, "06_timm")

    # a download: a slide-ready PNG made on demand, ONE click (no file box to click again)
    with pg.expect_download() as dl:
        pg.get_by_role("button", name="PNG for slides").last.click()
    png = tmp_path / "timm.png"
    dl.value.save_as(png)
    assert Image.open(png).width == 2400

    # bad input: a readable message, and the app goes on serving
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(package_photos["grace_hopper"].read_bytes()[:3000])  # a JPEG cut short
    upload(pg, broken)
    pg.wait_for_selector("#status:has-text('Cannot use this image')")
    assert "truncated" in pg.inner_text("#status")
    shot(pg, "07_bad_input")
    cat = package_photos["chelsea"]
    upload(pg, cat)
    pg.wait_for_selector("#predictions h2:has-text('Egyptian cat')")
    # the event's last outputs may still be on their way ("processing | 2.9/2.4s" under a load of 20)
    pg.wait_for_function("!document.querySelector('#status').innerText.includes('processing')")
    assert pg.inner_text("#status").strip() == ""

    assert not pg.outside, f"the page fetched from outside this machine: {pg.outside[:5]}"
    assert app.alive()
    assert "Traceback" not in app.log(20_000), app.log()


def test_example_gallery(page, app) -> None:
    """The bundled example photos are there and one click analyses one."""
    from vit_demo.app.examples import builtin_examples

    if not builtin_examples():
        pytest.skip("no example photos installed (matplotlib / scikit-image sample data)")
    pg = page
    pg.wait_for_selector("#examples .thumbnail-item", timeout=TIMEOUT_MS)  # the gallery may render after the page
    pg.locator("#examples .thumbnail-item").first.click()  # the cat from scikit-image
    pg.wait_for_selector("#predictions h2")
    pg.wait_for_function("document.querySelector('#predictions h2').innerText.includes('cat')", timeout=TIMEOUT_MS)
    shot(pg, "00_example")
    assert not pg.outside


def download(pg, selector: str, index: int, dest: Path) -> Path:
    """Click the ``index``-th download link of a gr.File and save what the browser gets."""
    link = pg.locator(f"{selector} a[download]").nth(index)
    link.wait_for()
    with pg.expect_download() as dl:
        link.click()
    out = dest / dl.value.suggested_filename
    dl.value.save_as(out)
    return out


def test_presentation_downloads(page, app, package_photos: dict[str, Path], tmp_path: Path) -> None:
    """Issue 12: the animation plays in the page and downloads as GIF and MP4; the slide deck
    downloads as PowerPoint and PDF; images and models side by side; the webcam is offered."""
    import imageio.v2 as iio2
    import imageio.v3 as iio
    from pptx import Presentation

    from vit_demo.present import animate, deck

    pg = page
    assert pg.locator("#upload button[aria-label='Capture from camera']").count() == 1, "no webcam source"
    upload(pg, package_photos["coffee"])
    pg.wait_for_selector("#predictions h2:has-text('espresso')")

    # the attention through the layers: the GIF in the page, GIF + MP4 to download
    pg.get_by_role("tab", name="Attention").click()
    pg.click("#attention-animate")
    pg.wait_for_selector("#attention-animation img", timeout=180_000)
    shot(pg, "08_attention_animation")
    positions, durations = animate.schedule(12)
    gif = download(pg, "#attention-animation-files", 0, tmp_path)
    mp4 = download(pg, "#attention-animation-files", 1, tmp_path)
    assert gif.suffix == ".gif" and mp4.suffix == ".mp4"
    assert iio.imread(gif, index=None).shape[:3] == (len(positions), 540, 960)
    r = iio2.get_reader(mp4, "ffmpeg")
    try:
        assert r.get_meta_data()["size"] == (1280, 720)
        assert r.count_frames() == animate.Animation([], durations, 12).mp4_frame_count()
    finally:
        r.close()

    # the deck of this image: progress under the button within a second ("slide 3 of 9"), the
    # button off while it is made
    pg.get_by_role("tab", name="For presentations").click()
    t0 = time.monotonic()
    pg.click("#make-deck")
    pg.wait_for_selector("#make-deck-progress .job-bar", timeout=1_000)
    assert time.monotonic() - t0 < 1.5 and pg.locator("#make-deck").is_disabled()
    pg.wait_for_selector("#make-deck-progress:has-text('slide')", timeout=120_000)
    assert f"of {len(deck.slide_costs(1))}" in pg.inner_text("#make-deck-progress")
    shot(pg, "09_deck_progress")
    pptx = download(pg, "#deck-files", 0, tmp_path)
    assert pg.locator("#make-deck").is_enabled()
    pdf = download(pg, "#deck-files", 1, tmp_path)
    prs = Presentation(str(pptx))
    assert len(prs.slides) == len(deck.slide_costs(1))
    assert prs.slides[0].shapes.title.text == "What the model sees: “espresso”"  # titled by the answer
    assert "Image: coffee" in prs.slides[0].shapes[1].text_frame.text  # the file's name in the subtitle
    assert all(s.notes_slide.notes_text_frame.text for s in prs.slides)
    assert pdf.read_bytes()[:5] == b"%PDF-"

    # side by side: this image and one more; then the same image under random weights
    pg.set_input_files("#more-images input[type=file]", str(package_photos["chelsea"]))
    pg.click("#compare-images")
    pg.wait_for_selector("#side-by-side img", timeout=120_000)
    pg.click("#second-model input")
    pg.keyboard.type("RANDOM")
    pg.keyboard.press("Enter")
    pg.click("#compare-models")
    pg.wait_for_selector("#two-models img", timeout=120_000)
    shot(pg, "10_present_tab")
    assert not pg.outside, f"the page fetched from outside this machine: {pg.outside[:5]}"
    assert "Traceback" not in app.log(20_000), app.log()


def placeholder_share(pg, selector: str) -> float:
    """The share of a tile picture's pixels in the grey of a "computing…" placeholder (236, 236, 236;
    JPEG moves it a little): 0 when every map is drawn, about a third per row of waiting tiles."""
    import numpy as np

    src = img_src(pg, selector)
    if not src:
        return 1.0
    px = np.asarray(Image.open(io.BytesIO(pg.request.get(src).body())).convert("RGB"), dtype=np.int16)
    return float((np.abs(px - 236).max(-1) <= 4).mean())


@pytest.mark.parametrize("delay", [0.0, 0.5, 2.0, 5.0])
def test_relevance_tab_opened_while_maps_compute(browser, app, package_photos: dict[str, Path], tmp_path: Path,
                                                  delay: float) -> None:
    """Issue 46: opened at once, or 0.5, 2 or 5 s after an upload (a fresh page each time, a picture
    the server has not seen), the "Rollout & relevance" tab draws every class-specific tile within
    30 s; before, a tab opened while the background pass ran kept its placeholders for good."""
    import numpy as np

    arr = np.asarray(Image.open(package_photos["coffee"]).convert("RGB")).copy()
    arr[:4, :4] = np.random.default_rng(int(delay * 10) + int(time.time())).integers(0, 255, (4, 4, 3))  # new content
    photo = tmp_path / f"coffee-{delay}.png"
    Image.fromarray(arr).save(photo)
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        pg = ctx.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(app.url)
        pg.wait_for_selector("#upload")
        upload(pg, photo)
        time.sleep(delay)
        pg.get_by_role("tab", name="Rollout & relevance").click()
        pg.wait_for_selector("#methods img")
        pg.wait_for_selector("#relevance img")
        deadline, shares = time.monotonic() + 30, (1.0, 1.0)
        while time.monotonic() < deadline:
            shares = placeholder_share(pg, "#methods"), placeholder_share(pg, "#relevance")
            if max(shares) < 0.02 and "Computing" not in pg.inner_text("#methods-caption"):
                break
            time.sleep(0.5)
        shot(pg, f"11_relevance_opened_after_{delay}s")
        assert max(shares) < 0.02, f"tiles still computing 30 s after opening the tab: grey share {shares}"
        assert "Computing" not in pg.inner_text("#methods-caption")
    finally:
        ctx.close()
