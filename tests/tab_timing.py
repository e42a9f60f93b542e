"""How long after an upload a tab of the app is whole, measured in Chromium as a person sees it.

    seconds = time_tab(browser, app.url, photo, "Rollout & relevance")

A fresh page, the photo dropped on the upload, the tab clicked at once, and the time from the drop
until the tab is finished: for "Rollout & relevance", its caption says nothing is being computed and
both tile pictures (the methods side by side, the relevance row) are loaded; for "Model
diagnostics", both charts are loaded. :func:`grey_share` then checks from the pixels that no tile is
still a "computing..." placeholder. Used by tests/test_app_speed.py and benchmarks/bench_tabs.py.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

RELEVANCE, DIAGNOSTICS = "Rollout & relevance", "Model diagnostics"

_LOADED = "(s => { const im = document.querySelector(s + ' img'); return !!im && im.complete && im.naturalWidth > 0; })"
DONE_JS = {  # the browser's own test of "finished", polled every animation frame
    RELEVANCE: "() => { const c = document.querySelector('#methods-caption');"
               " const t = c ? c.innerText : '';"
               " return t.includes('Attention rollout') && !t.includes('Computing')"
               f" && {_LOADED}('#methods') && {_LOADED}('#relevance'); }}",
    DIAGNOSTICS: f"() => {_LOADED}('#distance') && {_LOADED}('#pos-embed')",
}
TILE_PICTURES = {RELEVANCE: ("#methods", "#relevance"), DIAGNOSTICS: ("#distance", "#pos-embed")}
PLACEHOLDERS = {RELEVANCE: ("#methods", "#relevance"), DIAGNOSTICS: ()}  # pictures with "computing..." tiles


def wait_idle(pid: int, timeout: float = 600, quiet_s: float = 3.0) -> float:
    """Wait until process ``pid`` and its children use under 5 % of a core for ``quiet_s`` seconds in a
    row (the app's start-up work done: the model's warm-up, the Atlas tab's atlas of the examples);
    returns the seconds waited."""
    import psutil

    proc, t0 = psutil.Process(pid), time.monotonic()

    def cpu() -> float:
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    last, since = cpu(), time.monotonic()
    while time.monotonic() - t0 < timeout and time.monotonic() - since < quiet_s:
        time.sleep(0.5)
        now = cpu()
        if now - last > 0.025:  # 5 % of a core over the half second
            since = time.monotonic()
        last = now
    return time.monotonic() - t0


def fresh_photos(folder: Path, n: int, seed: int) -> list[Path]:
    """``n`` photos no app has seen: the photos that ship with scikit-image and matplotlib (a few
    random pixels in a corner make each one new), then drawn scenes (a colour gradient, random
    ellipses and boxes), as PNGs of 300-640 px a side in ``folder``."""
    from vit_demo.app.examples import builtin_examples

    rng = np.random.default_rng(seed)
    bases = [Image.open(e.path).convert("RGB") for e in builtin_examples()]
    out = []
    for i in range(n):
        if i % 2 == 0 and bases:  # every other one a real photo
            img = bases[(i // 2) % len(bases)].copy()
            arr = np.asarray(img).copy()
            arr[:6, :6] = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
            img = Image.fromarray(arr)
        else:
            img = drawn_scene(rng)
        p = folder / f"photo_{seed}_{i:02d}.png"
        img.save(p)
        out.append(p)
    return out


def drawn_scene(rng: np.random.Generator) -> Image.Image:
    """A picture that is nobody's photo: a gradient background with a few filled shapes."""
    w, h = (int(v) for v in rng.integers(300, 641, 2))
    top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0, 1, h)[:, None, None]
    arr = (top * (1 - t) + bottom * t).repeat(w, 1).astype(np.uint8)
    img = Image.fromarray(arr)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        box = (x0, y0, x0 + int(rng.integers(30, w // 2)), y0 + int(rng.integers(30, h // 2)))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    return img


WATCH_JS = """sels => { window.__seen = []; window.__t0 = performance.now();
  const look = () => { const h = document.querySelector('#predictions h2');
    if (window.__label === undefined && h && h.innerText.trim()) window.__label = performance.now() - window.__t0;
    for (const s of sels) { const im = document.querySelector(s + ' img');
    const src = im ? im.getAttribute('src') : null; const last = window.__seen.filter(r => r.sel === s).pop();
    if (src && (!last || last.src !== src)) window.__seen.push({t: performance.now() - window.__t0, sel: s, src}); } };
  new MutationObserver(look).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['src']}); }"""


def time_tab(browser, url: str, photo: Path, tab: str, timeout_s: float = 120) -> tuple[float, object]:
    """Seconds from dropping ``photo`` on a fresh page of the app at ``url`` until ``tab`` (clicked
    at once) is finished (:data:`DONE_JS`), and the page's context (the caller closes it; its page
    is ``ctx.pages[0]``). Every picture the tab's tiles showed meanwhile: :func:`pictures_seen`."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        pg = ctx.new_page()
        pg.set_default_timeout(timeout_s * 1000)
        pg.goto(url)
        pg.wait_for_selector("#upload input[type=file]", state="attached")
        pg.get_by_role("tab", name=tab).wait_for()
        pg.evaluate(WATCH_JS, list(TILE_PICTURES[tab]))
        t0 = time.perf_counter()
        pg.set_input_files("#upload input[type=file]", str(photo))
        pg.get_by_role("tab", name=tab).click()
        pg.wait_for_function(DONE_JS[tab], timeout=timeout_s * 1000)
        return time.perf_counter() - t0, ctx
    except BaseException:
        ctx.close()
        raise


def pictures_seen(pg) -> list[tuple[float, str, float]]:
    """(seconds after the drop, picture, its share of placeholder grey) of every picture the tab's
    tiles showed, in order (watched since the drop: :func:`time_tab`)."""
    seen = pg.evaluate("() => window.__seen || []")
    return [(r["t"] / 1000, r["sel"], grey_of(pg, r["src"])) for r in seen]


def label_at(pg) -> float | None:
    """When the prediction's label appeared, in seconds after the drop (:func:`time_tab`)."""
    t = pg.evaluate("() => window.__label")
    return None if t is None else t / 1000


def whole_at(seen: list[tuple[float, str, float]], selector: str) -> float | None:
    """When ``selector``'s picture was first whole (no placeholder), in seconds after the drop."""
    return next((t for t, sel, grey in seen if sel == selector and grey <= 0.02), None)


def grey_share(pg, selector: str) -> float:
    """The share of the picture's pixels in the grey of a "computing..." placeholder (236, 236, 236;
    JPEG moves it a little): 0 when every map is drawn."""
    return grey_of(pg, pg.locator(f"{selector} img").first.get_attribute("src"))


def grey_of(pg, src: str) -> float:
    body = pg.request.get(src).body()
    px = np.asarray(Image.open(io.BytesIO(body)).convert("RGB"), dtype=np.int16)
    return float((np.abs(px - 236).max(-1) <= 4).mean())
