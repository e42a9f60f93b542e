"""The app for the classroom and the stage (issue 23), in a real Chromium against one app server:

- at each view size (a phone 390x844, a projector 1280x720, a desktop 1440x900): no horizontal
  scrolling and no element sticking out to the right, every tab reachable on screen; at the
  projector and desktop sizes, in presentation mode, the prediction and the open tab's map on
  one screen together (the Attention tab and the Rollout & relevance tab);
- a long action (the slow RISE map) shows its progress right under its button within a second
  ("masks 96/256"), its button greyed out meanwhile, the old pictures kept until the new ones
  arrive, and Cancel stops it;
- one click on "PNG for slides" downloads the figure (no file box to click a second time), for
  the relevance row too.

Screenshots go to ``artifacts/screenshots/`` (git-ignored); the three view sizes also to
``artifacts/screenshots/views/``, for docs/.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PIL import Image
from test_app_browser import SHOTS

from vit_demo.app.build import TABS as APP_TABS

pytestmark = pytest.mark.browser

TIMEOUT_MS = 120_000  # generous: CI machines are shared and slow
TABS = tuple(tab.title for tab in APP_TABS)  # every tab of the page, in its order

# elements whose right edge lies beyond the viewport, leaves only (their children all fit), visible ones
STICKING_OUT = """() => {
  const W = document.documentElement.clientWidth, out = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || r.right <= W + 1) continue;
    const s = getComputedStyle(e);
    if (s.visibility === 'hidden' || s.position === 'fixed') continue;
    if ([...e.children].some(k => k.getBoundingClientRect().right > W + 1)) continue;
    out.push(`${e.tagName}#${e.id}.${String(e.className).slice(0, 40)} right=${Math.round(r.right)}`);
  }
  return out;
}"""


def open_page(browser, app, width: int, height: int, query: str = ""):
    ctx = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(app.url + query)
    pg.wait_for_selector("#upload")
    return pg


def upload_coffee(pg, package_photos) -> None:
    pg.set_input_files("#upload input[type=file]", str(package_photos["coffee"]))
    pg.wait_for_selector("#predictions h2:has-text('espresso')")


def on_screen(pg, selector: str) -> bool:
    """The element is entirely inside the viewport (no scrolling needed to see it)."""
    box = pg.locator(selector).first.bounding_box()
    vw, vh = pg.viewport_size["width"], pg.viewport_size["height"]
    return bool(box) and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= vw + 1 \
        and box["y"] + box["height"] <= vh + 1


def no_horizontal_overflow(pg, where: str) -> None:
    scroll, client = pg.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll <= client, f"{where}: the page is {scroll} px wide in a {client} px window"
    out = pg.evaluate(STICKING_OUT)
    assert not out, f"{where}: sticking out to the right: {out[:5]}"


def menu_fits_its_box(pg, selector: str) -> None:
    """A menu's text ends before its arrow (a long one in "…"): it ran under the arrow on a phone and
    in presentation mode."""
    text_right, arrow_left, ellipsis = pg.locator(f"{selector} input[role=combobox]").first.evaluate(
        "e => { const s = getComputedStyle(e), a = e.closest('.wrap-inner').querySelector('.icon-wrap');"
        " return [e.getBoundingClientRect().right - parseFloat(s.paddingRight), a.getBoundingClientRect().left,"
        " s.textOverflow]; }")
    assert text_right <= arrow_left + 1 and ellipsis == "ellipsis", (selector, text_right, arrow_left, ellipsis)


def settled(pg) -> None:
    """No event in flight (Gradio's "processing | 0.2s" labels gone), for a clean screenshot."""
    pg.wait_for_function("!document.body.innerText.includes('processing |')", timeout=TIMEOUT_MS)
    time.sleep(0.3)


def shot(pg, name: str, full: bool = True) -> Path:
    path = SHOTS / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(path), full_page=full)
    return path


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 720), (1440, 900)], ids=["phone", "projector", "desktop"])
def test_view_size(browser, app, package_photos, width: int, height: int) -> None:
    """No horizontal scroll, every tab reachable; in presentation mode (not on a phone) the
    prediction and the first map of the open tab are on screen together."""
    pg = open_page(browser, app, width, height)
    try:
        upload_coffee(pg, package_photos)
        no_horizontal_overflow(pg, f"{width}x{height}, the top of the page")
        for name in TABS:  # every tab can be reached and opened
            tab = pg.get_by_role("tab", name=name)
            box = tab.bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= width + 1, f"tab {name!r} off screen: {box}"
            tab.click()
            no_horizontal_overflow(pg, f"{width}x{height}, tab {name!r}")
        rows = pg.evaluate("new Set([...document.querySelectorAll('#tabs button[role=tab]')]"
                           ".map(b => Math.round(b.getBoundingClientRect().top))).size")
        assert rows <= 2, f"{width}x{height}: the tabs wrap into {rows} rows (docs/app.md says at most two)"
        menu_fits_its_box(pg, "#model")
        if width < 1000:  # a phone: the maps side by side in two columns, so that each one can be read
            pg.get_by_role("tab", name="Rollout & relevance").click()
            pg.wait_for_function("!document.querySelector('#relevance').innerText.includes('processing')")
            pg.wait_for_function("(() => { const i = document.querySelector('#relevance img');"
                                 " return !!i && i.complete && i.naturalWidth > 0; })()")  # the picture loaded
            nw, nh = pg.locator("#relevance img").first.evaluate("e => [e.naturalWidth, e.naturalHeight]")
            shown = pg.locator("#relevance img").first.bounding_box()
            assert nh > nw and shown["width"] >= 0.8 * width, (nw, nh, shown)  # 7 tiles: 4 rows of 2, screen-wide
        pg.get_by_role("tab", name="Attention").click()
        pg.wait_for_selector("#attention img")
        settled(pg)
        shot(pg, f"views/{width}x{height}")
    finally:
        pg.context.close()
    if width < 1000:
        return  # a phone shows one column; presentation mode is for projectors and desktops
    pg = open_page(browser, app, width, height, "?present=1")
    try:
        pg.wait_for_function("document.body.classList.contains('present-mode')")
        upload_coffee(pg, package_photos)
        pg.get_by_role("tab", name="Attention").click()
        pg.wait_for_selector("#attention img")
        time.sleep(0.5)  # the layout settles
        assert on_screen(pg, "#predictions"), "presentation mode: the prediction is not on screen"
        hint = pg.locator("#present-mode .info-text").first
        assert hint.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "presentation mode: its hint is cut off"
        menu_fits_its_box(pg, "#model")
        assert on_screen(pg, "#attention img"), "presentation mode: the attention map is not on screen with it"
        assert on_screen(pg, "#layer"), "presentation mode: the map's layer control is not on screen"
        settled(pg)
        shot(pg, f"views/{width}x{height}-presentation", full=False)
        pg.get_by_role("tab", name="Rollout & relevance").click()
        pg.wait_for_selector("#methods img")
        time.sleep(0.5)
        assert on_screen(pg, "#predictions") and on_screen(pg, "#methods img"), \
            "presentation mode: the prediction and the rollout / relevance maps are not on one screen"
        no_horizontal_overflow(pg, f"{width}x{height} presentation mode")
    finally:
        pg.context.close()


def test_long_action_progress_cancel_and_old_pictures(browser, app, package_photos) -> None:
    """RISE: the bar says "masks n/256" within a second of the click, the button is off while it
    runs, the maps on the page stay until the new ones arrive; Cancel stops it; run to the end,
    the relevance row gains the RISE map."""
    pg = open_page(browser, app, 1440, 900)
    try:
        upload_coffee(pg, package_photos)
        pg.get_by_role("tab", name="Rollout & relevance").click()
        pg.wait_for_selector("#relevance img")
        pg.wait_for_function("!document.querySelector('#relevance').innerText.includes('processing')")
        old = pg.locator("#relevance img").first.get_attribute("src")
        t0 = time.monotonic()
        pg.click("#run-rise")
        pg.wait_for_selector("#run-rise-progress .job-bar", timeout=1_000)
        assert time.monotonic() - t0 < 1.5
        assert pg.locator("#run-rise").is_disabled(), "the button must be off while its work runs"
        pg.wait_for_selector("#run-rise-progress:has-text('masks')", timeout=TIMEOUT_MS)
        text = pg.inner_text("#run-rise-progress")
        assert "/256" in text and "%" in text, text
        assert pg.locator("#relevance img").first.get_attribute("src") == old, "the old maps must stay while it runs"
        assert pg.locator("#relevance img").first.is_visible()
        shot(pg, "classroom_rise_running", full=False)
        # Cancel: the bar says so, the button comes back, the page keeps its maps
        pg.click("#run-rise-cancel")
        pg.wait_for_selector("#run-rise-progress:has-text('Stopped')", timeout=10_000)
        assert pg.locator("#run-rise").is_enabled()
        assert pg.locator("#relevance img").first.get_attribute("src") == old
        # again, to the end: a new relevance row, the button on, the bar gone
        pg.click("#run-rise")
        pg.wait_for_function(f"document.querySelector('#relevance img').getAttribute('src') !== {old!r}",
                             timeout=TIMEOUT_MS * 3)  # 256 forward passes on a busy 2-core machine
        pg.wait_for_function("!document.querySelector('#run-rise').disabled")
        assert "masks" not in pg.inner_text("#run-rise-progress")
        assert "Traceback" not in app.log(20_000), app.log()
    finally:
        pg.context.close()


def test_one_click_downloads(browser, app, package_photos, tmp_path: Path) -> None:
    """Each "PNG for slides" button downloads its figure with ONE click, off until there is an image;
    the relevance row (gated LRP, GradCAM, ...) has its own."""
    pg = open_page(browser, app, 1440, 900)
    try:
        pg.get_by_role("tab", name="Rollout & relevance").click()
        pg.wait_for_selector("#export-methods")
        assert pg.locator("#export-methods").is_disabled(), "no image yet: nothing to export"
        upload_coffee(pg, package_photos)
        pg.wait_for_selector("#relevance img")
        for button, expect in (("#export-methods", "methods"), ("#export-relevance", "relevance")):
            pg.wait_for_function(f"!document.querySelector('{button}').disabled")
            with pg.expect_download(timeout=TIMEOUT_MS) as dl:
                pg.click(button)
            path = tmp_path / dl.value.suggested_filename
            dl.value.save_as(path)
            assert expect in path.name and path.suffix == ".png"
            assert Image.open(path).width == 2400
        assert not pg.locator("#methods-file a[download]").is_visible()  # no file box to click
    finally:
        pg.context.close()
