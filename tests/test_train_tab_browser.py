"""The Train tab in Chromium, as a teacher meets it (a real app, real trainings of seconds):

- while it prepares, the bar says what the training process does ("preparing: decoding the
  pictures ...") and no empty panel shows under it; once it trains, the bar says the epoch of an
  "about" plan and the time left, and that time is on the page once (the line under the bar has
  the accuracy, not a second ETA);
- after Cancel, the bar says "Stopped." and nothing of the stopped run's epochs or time is left
  under it, nor its board of curves and snapshots (the run and its files are gone);
- at the end, the filmstrip's every column is on screen and none is under its download and
  full-screen buttons: at 1440x900, at 1280x720 in presentation mode and at 390x844 (a phone).

Screenshots go to ``artifacts/screenshots/`` (train_tab_*.png).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from app_server import running_app
from test_app_browser import shot

from vit_demo.app.tabs.train import STOPPED

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TIMEOUT_MS = 180_000  # generous: the machine is shared
VIEWS = [(1440, 900, ""), (1280, 720, "?present=1"), (390, 844, "")]

# The bar's words, whether the board of curves and snapshots shows, and the line under the bar: read at once.
READ = """() => {
  const board = document.querySelector('#train-board');
  const shown = !!board && board.offsetParent !== null && board.getBoundingClientRect().height > 0;
  return [document.querySelector('#train-run-progress').innerText.trim(), shown,
          document.querySelector('#train-status').innerText.trim()];
}"""

# Where the filmstrip's picture is painted (its <img> scales it down to fit, keeping its shape) and
# where the buttons over it are, in the page's pixels.
STRIP = """() => {
  const img = document.querySelector('#train-filmstrip img'), r = img.getBoundingClientRect();
  const s = Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight, 1);
  const w = img.naturalWidth * s, h = img.naturalHeight * s;
  const x = r.x + (r.width - w) / 2, y = r.y + (r.height - h) / 2;
  const buttons = [...document.querySelectorAll('#train-filmstrip button.icon-button')].map(b => {
    const q = b.getBoundingClientRect(); return [q.left, q.top, q.right, q.bottom]; });
  return {painted: [x, y, x + w, y + h], natural: [img.naturalWidth, img.naturalHeight], buttons,
          width: document.documentElement.clientWidth};
}"""


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    with running_app(["--weights", str(deit_tiny_path), "--train-minutes-max", "0.25"]) as a:
        yield a


def open_train_tab(browser, app, width: int = 1440, height: int = 900, query: str = ""):
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(app.url + query)
    pg.wait_for_selector("#upload")
    pg.get_by_role("tab", name="Train").click()
    pg.wait_for_selector("#train-run")
    return ctx, pg


def test_the_bar_says_what_happens_and_cancel_leaves_no_stale_epoch(browser, app) -> None:
    ctx, pg = open_train_tab(browser, app)
    try:
        pg.click("#train-run")
        seen: list[tuple[str, bool, str]] = []
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while time.monotonic() < deadline:  # until an epoch has ended (the line under the bar has its accuracy)
            seen.append(tuple(pg.evaluate(READ)))
            if seen[-1][2].startswith("after epoch"):
                break
            time.sleep(0.2)
        bar, board, status = seen[-1]
        assert status.startswith("after epoch"), seen[-5:]
        preparing = [s for s in seen if s[0].startswith("Preparing")]
        assert preparing and not any(s[1] for s in preparing), preparing  # no empty panels while it prepares
        assert any(s[0].startswith("Preparing: decoding the pictures") or s[0].startswith("Preparing: timing")
                   for s in preparing), preparing  # it said what the process does
        assert re.match(r"Epoch \d+ of (about )?\d+ · (about \d+:\d\d left|any moment now)", bar), bar
        assert board and "left" not in status and "ETA" not in status and " of " not in status, status  # one ETA: the bar's
        shot(pg, "train_tab_1440_training")
        pg.click("#train-run-cancel")
        pg.wait_for_function("document.querySelector('#train-run-progress').innerText.includes('Stopped.')")
        pg.wait_for_function("t => document.querySelector('#train-status').innerText.trim() === t", arg=STOPPED)
        time.sleep(1.5)  # a late update of the stopped run would show by now
        bar, board, status = pg.evaluate(READ)
        assert bar == "Stopped." and status == STOPPED, (bar, status)
        assert not board  # nor the stopped run's curves and last snapshot ("epoch 2 of 6 ...")
        shot(pg, "train_tab_1440_cancelled")
        assert pg.locator("#train-run").is_enabled() and not pg.locator("#train-run-cancel").is_visible()
    finally:
        ctx.close()


def test_every_column_of_the_filmstrip_is_on_screen(browser, app) -> None:
    ctx, pg = open_train_tab(browser, app)
    try:
        pg.click("#train-run")
        pg.wait_for_function("document.querySelector('#train-result') && "
                             "document.querySelector('#train-result').innerText.includes('Best validation accuracy')")
        for width, height, query in VIEWS:
            pg.set_viewport_size({"width": width, "height": height})
            if query:  # presentation mode: the checkbox of the page (what ?present=1 turns on)
                pg.locator("#present-mode input").check()
            pg.locator("#train-filmstrip").scroll_into_view_if_needed()
            time.sleep(0.5)
            strip = pg.evaluate(STRIP)
            x0, y0, x1, y1 = strip["painted"]
            snapshots = (strip["natural"][0] - 122) // 100  # the pictures' column (106 px), then 100 px a snapshot
            shot(pg, f"train_tab_{width}_filmstrip")
            assert snapshots >= 2, strip  # before training, and at least one epoch
            assert x0 >= -0.5 and x1 <= strip["width"] + 0.5, (width, strip)  # no column off the page
            for bx0, by0, bx1, by1 in strip["buttons"]:  # and none under a button
                assert bx1 <= x0 or bx0 >= x1 or by1 <= y0 or by0 >= y1, (width, strip)
            if query:
                pg.locator("#present-mode input").uncheck()
    finally:
        ctx.close()
