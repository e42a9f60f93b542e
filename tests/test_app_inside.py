"""The app's "Step inside": the tab, its guided mode, the ``/steps`` endpoint and the ``steps`` MCP tool.

- ``/steps`` answers a gradio_client call with the walk as JSON: an attention row over the 197 tokens
  that sums to 1, the Python API's numbers, the softmax at the temperature asked (clamped to its
  range), 13 pictures; a bad request is one line naming the allowed range, and nothing runs;
- exposed, ``/steps`` keeps the limits of the page's other events (files, the upload size, each
  client's share of the queue) and the ``steps`` tool those of the other tools (tests/test_app_mcp.py
  runs its exposed checks on every tool);
- in Chromium, the tab draws at least 8 finished step pictures within 30 s of an upload; a click on a
  patch of step 1 follows it (the same query patch as the Attention tab's); the layer and the
  temperature redraw; a step downloads as a 2400-px PNG; guided mode fits 1280x720 in presentation
  mode, one step at a time, Back / Next and the arrow keys;
- the slide deck takes the tab's patch, layer and head.

The app is tests/conftest.py's ``local_app`` (``--mcp``) and ``exposed_app``: no server of its own.
Screenshots go to ``artifacts/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo.inside import STEPS, StepError

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
VALUES = ("image", "pixels", "patch_vector", "embedding", "position", "position_similarity", "query", "keys", "values",
          "scores", "attention", "head_output", "residual_norms", "mlp_hidden", "lens", "logits")


def softmax(s, t: float = 1.0) -> np.ndarray:
    return torch.softmax(torch.tensor(s, dtype=torch.float32) / t, -1).numpy()


@pytest.fixture(scope="module")
def app(local_app):
    """The local app of tests/conftest.py (``--mcp``, no warm-up: the first call loads the model)."""
    return local_app


@pytest.fixture(scope="module")
def client(app):
    from gradio_client import Client

    return Client(app.url, verbose=False)


@pytest.fixture(scope="module")
def cat(package_photos) -> Path:
    return package_photos["chelsea"]


# ----------------------------------------------------------------------------- the endpoint


@pytest.mark.slow
def test_steps_endpoint_gives_the_walk(client, cat, deit_tiny) -> None:
    from gradio_client import handle_file

    from vit_demo.api.model import Model

    answer, pictures = client.predict(handle_file(str(cat)), 5, 9, 7, 2, api_name="/steps")
    assert (answer["patch"], answer["token"], answer["layer"], answer["head"]) == ([5, 9], 80, 7, 2)
    assert answer["image"] == cat.name and answer["temperature"] == 1.0 and set(VALUES) <= set(answer["values"])
    v = {k: np.asarray(x) for k, x in answer["values"].items()}
    assert v["attention"].shape == (197,) and abs(v["attention"].sum() - 1) < 1e-5
    np.testing.assert_allclose(v["attention"], softmax(v["scores"]), atol=1e-5)
    np.testing.assert_allclose(v["head_output"], v["attention"] @ v["values"], atol=1e-4)
    ours = Model(deit_tiny).steps(np.asarray(Image.open(cat).convert("RGB")), patch=(5, 9), layer=7, head=2).values
    for name in ("attention", "query", "logits", "residual_norms"):
        np.testing.assert_allclose(v[name], ours[name], atol=1e-4, err_msg=name)  # the Python API's numbers
    assert [s["name"] for s in answer["steps"]] == list(STEPS) and "projection_weight" not in answer["values"]
    assert len(pictures) == len(STEPS) and pictures[6]["caption"].startswith("7. Softmax")
    assert all(Image.open(p["image"]).width >= 500 for p in pictures)

    hot, _ = client.predict(handle_file(str(cat)), 5, 9, 7, 2, 2.0, api_name="/steps")
    assert hot["temperature"] == 2.0
    np.testing.assert_allclose(hot["values"]["attention"], softmax(v["scores"], 2.0), atol=1e-5)
    assert "NOT the model's attention" in hot["steps"][6]["text"]
    clamped, _ = client.predict(handle_file(str(cat)), 5, 9, 7, 2, 50, api_name="/steps")
    assert clamped["temperature"] == 10.0  # clamped to the documented range
    default, _ = client.predict(handle_file(str(cat)), api_name="/steps")  # every parameter's default
    assert (default["layer"], default["head"], default["temperature"]) == (0, 0, 1.0)
    assert default["patch"] == list(Model(deit_tiny).steps(np.asarray(Image.open(cat).convert("RGB"))).patch)


BAD = [  # (row, col, layer, head, temperature) -> what the one line says
    ((14, 3, 0, 0, 1), r"patch \(14, 3\) is outside the 14x14 patch grid: give \(row, col\) with rows 0..13"),
    ((1, 1, 12, 0, 1), r"layer 12: this model has layers 0..11"),
    ((1, 1, 0, 3, 1), r"head 3: this model has heads 0..2"),
    ((1, 1, 0, 0, 0), r"temperature 0: give a finite number above 0"),
    ((1, 1, 0, 0, -2), r"temperature -2: give a finite number above 0"),
    ((1, 1, 0, 0, "nan"), r"temperature 'nan': give a finite number above 0"),
    ((1, 1, 0, 0, "inf"), r"temperature 'inf': give a finite number above 0"),
    ((1, None, 0, 0, 1), r"give both row and col"),
    ((1.5, 1, 0, 0, 1), r"row '1.5': give a whole number"),
]


@pytest.mark.slow
def test_steps_endpoint_refuses_bad_input_in_one_line(client, cat) -> None:
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    for args, message in BAD:
        with pytest.raises(AppError, match=message) as e:
            client.predict(handle_file(str(cat)), *args, api_name="/steps")
        assert "\n" not in str(e.value) and len(str(e.value)) < 200, str(e.value)
    answer, _ = client.predict(handle_file(str(cat)), 13, 13, -1, 2, 0.1, api_name="/steps")  # the ends are fine
    assert answer["patch"] == [13, 13] and answer["layer"] == 11 and answer["temperature"] == 0.1


def test_a_bad_request_reads_no_picture_and_runs_nothing(deit_tiny) -> None:
    """The choice is checked against the model before the picture is opened or analysed."""
    from vit_demo.app.server.guard import InputError
    from vit_demo.app.tabs.inside import walk_request

    def never(*_args):
        raise AssertionError("analysed a bad request")

    reg = SimpleNamespace(spec=lambda key: None, get=lambda key: deit_tiny, analyze=never)
    ctx = SimpleNamespace(default_key="deit", reg=reg, files=None, cfg=None)  # cfg: opening the picture would fail
    for row, col, layer, head, t in [args for args, _ in BAD]:
        with pytest.raises(InputError):
            walk_request(ctx, "/no/such/picture.png", row, col, layer, head, t)


def test_the_pages_choice_counts_from_one() -> None:
    from vit_demo.app.tabs.inside import page_choice

    assert page_choice(12, 3, 2.5, 12, 3) == (11, 2, 2.5)
    assert page_choice("1", 1.0, 99, 12, 3) == (0, 0, 10.0)  # the temperature clamped into its range
    for layer, head, t, message in [(13, 1, 1, "layer 13: this model has layers 1..12 (counted from 1)"),
                                    (0, 1, 1, "layer 0: this model has layers 1..12"), (2.5, 1, 1, "layer 2.5"),
                                    (1, 4, 1, "head 4: this model has heads 1..3"), (1, 1, "nan", "temperature")]:
        with pytest.raises(StepError, match=message.replace("(", r"\(").replace(")", r"\)")):
            page_choice(layer, head, t, 12, 3)


def test_step_words_are_shown_as_written(deit_tiny) -> None:
    """A step's sentence keeps its underscores and stars (``attention_i``, not italics); away from
    T = 1 the softmax says in bold that it is no longer the model's."""
    from vit_demo.app.tabs.inside import plain, step_markdown
    from vit_demo.inside import step_through

    assert plain("exp(s_i / T) / sum_j exp(s_j / T) * 2") == r"exp(s\_i / T) / sum\_j exp(s\_j / T) \* 2"
    walk = step_through(deit_tiny.model, torch.zeros(1, 3, 224, 224), (5, 9), 7, 2)
    soft = STEPS.index("softmax") + 1
    assert step_markdown(soft, walk).startswith("### 7. Softmax") and "NOT" not in step_markdown(soft, walk)
    assert "**At T = 2 these weights are NOT the model's attention**" in step_markdown(soft, walk.with_temperature(2))


def test_a_click_on_the_first_steps_grid_picks_its_patch(deit_tiny) -> None:
    """The patch grid fills the top left of step 1's picture (its size: patches_grid_size); a click
    beside it (on the enlarged patch) picks nothing."""
    from vit_demo.app.query import clicked_patch
    from vit_demo.inside import step_through
    from vit_demo.viz.steps import patches_grid_size

    walk = step_through(deit_tiny.model, torch.zeros(1, 3, 224, 224), (2, 3), 0, 0)
    img = np.asarray(walk.render("patches"))
    w, h = patches_grid_size((14, 14))
    assert (w, h) == (440, 440) and img.shape[0] == h and img.shape[1] > w
    cyan = np.argwhere((img[:h, :w, 0] < 60) & (img[:h, :w, 1] > 180) & (img[:h, :w, 2] > 180))  # the lit patch's frame
    cy, cx = cyan.mean(0)
    a = SimpleNamespace(layout=SimpleNamespace(grid=(14, 14)))
    assert clicked_patch(a, SimpleNamespace(index=[cx, cy]), (w, h)) == 2 * 14 + 3
    assert clicked_patch(a, SimpleNamespace(index=[w + 30, 100]), (w, h)) is None


# ----------------------------------------------------------------------------- exposed, and the tool


@pytest.mark.slow
def test_steps_keeps_the_exposed_limits(exposed_app, cat, tmp_path) -> None:
    """Exposed (1 MB pictures, 8 places in the queue): a picture over the limit is refused at the
    upload, a server file is refused, one client asking again and again is told the queue is full
    while its own first requests are answered; a bad request is the same one line."""
    from attacks import Raw, file_payload
    from gradio_client import Client, handle_file

    from vit_demo.app.server.guard import REFUSED

    big = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)).save(big)
    with pytest.raises(ValueError, match="exceeds the maximum file size"):
        Client(exposed_app.url, verbose=False).predict(handle_file(str(big)), api_name="/steps")
    raw = Raw(exposed_app.url, source="127.0.0.31")
    out = raw.call("steps", [file_payload("/etc/passwd"), None, None, 0, 0, 1, None])
    assert not out.success and out.message == REFUSED
    stored = raw.upload(cat)
    out = raw.call("steps", [file_payload(stored), 1, 1, 99, 0, 1, None])
    assert not out.success and out.message == "layer 99: this model has layers 0..11 (counted from 0; -1 the last)"
    joined = [raw.join("steps", [file_payload(stored), i % 14, 3, i % 12, 0, 1, None]) for i in range(10)]
    refused = [a for c, a in joined if c != 200]
    assert refused and all("queue is full" in a.lower() for a in refused), joined
    done = raw.results({a for c, a in joined if c == 200}, timeout=300)
    assert done and all(m.get("success") for m in done.values()), [m.get("output") for m in done.values()]
    assert exposed_app.alive()


@pytest.mark.slow
def test_steps_tool(app, cat) -> None:
    from mcp_client import McpClient, data_url, first_json, images, texts

    c = McpClient(app.url + "gradio_api/mcp/")
    c.initialize()
    tool = {t["name"]: t for t in c.call("tools/list")["tools"]}["steps"]
    props = tool["inputSchema"]["properties"]
    assert len(tool["description"]) > 300 and props["step"]["enum"] == list(STEPS)
    assert all(len(p.get("description", "")) > 20 for p in props.values())
    r = c.tool("steps", image=data_url(cat, "image/png"), row=5, col=9, layer=7, head=2, step="scores")
    assert not r.get("isError"), r
    (png,) = images(r)
    assert Image.open(io.BytesIO(png)).width >= 500
    walk = first_json(r)
    a = np.asarray(walk["values"]["attention"])
    assert walk["patch"] == [5, 9] and a.shape == (197,) and abs(a.sum() - 1) < 1e-5
    assert walk["left_out"]["lens"] == [12, 1000] and "lens" not in walk["values"] and len(json.dumps(walk)) < 400_000
    r = c.tool("steps", image=data_url(cat, "image/png"), layer=12)
    assert r["isError"] and texts(r)[0] == "layer 12: this model has layers 0..11 (counted from 0; -1 the last)"


# ----------------------------------------------------------------------------- the deck


def test_the_deck_takes_the_tabs_choice(deit_tiny, monkeypatch) -> None:
    """For presentations -> Slide deck: the Step inside slides follow the query patch and the tab's
    layer and head (for the model the tab showed them with; another model: the deck's defaults)."""
    from vit_demo.analysis import analyze
    from vit_demo.app.session import Session, Upload
    from vit_demo.app.tabs import present
    from vit_demo.present.inside import inside_slides

    picture = Image.new("RGB", (224, 224), (120, 90, 60))
    sess = Session(model_key="deit", query=5 * 14 + 4)
    a = analyze(deit_tiny, picture)  # (the session holds it weakly, as the app's cache does)
    sess.upload, sess.analysis = Upload(picture, "brown.png", (224, 224)), a
    sess.inside = {"model": "deit", "layer": 7, "head": 2, "shown": {}}
    asked = {}

    class Stop(Exception):
        pass

    def build_slides(*_args, step=None, **_kw):
        asked["step"] = step
        raise Stop

    reg = SimpleNamespace(spec=lambda key: SimpleNamespace(path=None), timm_twin=lambda key: None)
    ctx = SimpleNamespace(reg=reg, model=lambda s: deit_tiny)
    monkeypatch.setattr(present.deck, "build_slides", build_slides)
    with pytest.raises(Stop):
        present.deck_files(sess, ctx)
    assert asked["step"] == {"patch": 74, "layer": 7, "head": 2}
    slides = list(inside_slides(deit_tiny, a, "brown", 1200, asked["step"]))
    assert "patch (5, 4)" in slides[0].notes and "layer 8, head 3" in slides[1].notes
    sess.model_key = "another"
    assert sess.step_choice() == {"patch": 74}


# ----------------------------------------------------------------------------- in Chromium


def open_page(browser, app, width: int, height: int, query: str = ""):
    ctx = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(120_000)
    pg.goto(app.url + query)
    pg.wait_for_selector("#upload")
    return pg


def finished_pictures(pg) -> int:
    """Step pictures drawn and loaded (each scrolled to: the browser loads a picture when it comes near)."""
    n = 0
    for name in STEPS:
        img = pg.locator(f"#inside-{name} img")
        if not img.count():
            continue
        img.first.scroll_into_view_if_needed()
        n += img.first.evaluate("e => e.complete && e.naturalWidth > 100")
    return n


def upload_fresh(pg, photo: Path, tmp_path: Path, seed: int) -> Path:
    """``photo`` with a few pixels changed: a picture the app has not analysed yet."""
    arr = np.asarray(Image.open(photo).convert("RGB")).copy()
    arr[:3, :3] = np.random.default_rng(seed + int(time.time())).integers(0, 255, (3, 3, 3))
    path = tmp_path / f"{photo.stem}-{seed}.png"
    Image.fromarray(arr).save(path)
    pg.set_input_files("#upload input[type=file]", str(path))
    return path


def shot(pg, name: str, full: bool = True) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


@pytest.mark.slow
@pytest.mark.browser
def test_step_inside_tab(browser, app, client, cat, tmp_path) -> None:
    from gradio_client import handle_file

    client.predict(handle_file(str(cat)), api_name="/predict")  # the model loaded (the app has no warm-up)
    pg = open_page(browser, app, 1440, 900)
    try:
        pg.get_by_role("tab", name="Step inside").click()
        t0 = time.monotonic()
        upload_fresh(pg, cat, tmp_path, 1)
        while finished_pictures(pg) < 8:
            assert time.monotonic() - t0 < 30, f"only {finished_pictures(pg)} step pictures 30 s after the upload"
            time.sleep(0.3)
        print(f"8 step pictures {time.monotonic() - t0:.1f} s after the upload")
        pg.wait_for_function("document.querySelectorAll('.inside-pic img').length == 13")
        assert [pg.inner_text(f"#inside-{n}-text h3")[:3].strip() for n in STEPS[:3]] == ["1.", "2.", "3."]
        followed = STEPS[:STEPS.index("residual") + 1]  # the pictures of the patch (readout, lens, logits: the photo's)
        old = pg.evaluate(f"{json.dumps(followed)}.map(n => document.querySelector(`#inside-${{n}} img`).src)")
        grid = pg.locator("#inside-patches img")
        grid.scroll_into_view_if_needed()
        box, nw = grid.bounding_box(), grid.evaluate("e => e.naturalWidth")
        scale = box["width"] / nw
        t0 = time.monotonic()
        grid.click(position={"x": (3.5 / 14) * 440 * scale, "y": (11.5 / 14) * 440 * scale})  # patch (11, 3)
        pg.wait_for_function(f"{json.dumps(followed)}.every((n, i) => document.querySelector(`#inside-${{n}} img`).src"
                             f" != {json.dumps(old)}[i])", polling=50)
        print(f"a click on patch (11, 3): its {len(followed)} new pictures in {time.monotonic() - t0:.2f} s")
        assert "patch (11, 3)" in pg.inner_text("#inside-info")
        assert "patch (11, 3)" in pg.inner_text("#inside-patches-text")
        shot(pg, "inside-1440x900")
        pg.evaluate("document.querySelector('#inside-intro').scrollIntoView()")
        shot(pg, "inside-1440x900-top", full=False)
        pg.get_by_role("tab", name="Attention").click()  # the same query patch
        pg.wait_for_selector("#attention-caption:has-text('patch 157')")
        pg.get_by_role("tab", name="Step inside").click()
        layer_and_temperature(pg)
        with pg.expect_download() as dl:
            pg.locator("#inside-step-7 .export-btn").click()
        dl.value.save_as(tmp_path / "softmax.png")
        assert Image.open(tmp_path / "softmax.png").width == 2400
    finally:
        pg.context.close()
    assert "Traceback" not in app.log(20_000)


def layer_and_temperature(pg) -> None:
    """The layer slider (from 1) steps into another block; the temperature re-takes the softmax."""
    slider = pg.locator("#inside-layer input[type=range]")
    slider.focus()
    for _ in range(4):
        pg.keyboard.press("ArrowLeft")
    pg.wait_for_selector("#inside-qkv-text:has-text('layer 8, head 1')")
    assert "layer 8 of 12" in pg.inner_text("#inside-info")
    number = pg.locator("#inside-temperature input[type=number]")
    number.fill("2.5")
    number.press("Enter")
    pg.wait_for_selector("#inside-softmax-text:has-text('NOT the model')")
    assert "T = 2.5" in pg.inner_text("#inside-softmax-text")


@pytest.mark.slow
@pytest.mark.browser
def test_guided_mode_fits_a_projector(browser, app, client, cat, tmp_path) -> None:
    """1280x720, presentation mode: one step at a time, its title, sentence and picture and Back /
    Next all on the screen, for every step; Next stops at the last, Back and the arrow keys go back."""
    from gradio_client import handle_file

    client.predict(handle_file(str(cat)), api_name="/predict")
    pg = open_page(browser, app, 1280, 720, "?present=1")
    try:
        pg.wait_for_function("document.body.classList.contains('present-mode')")
        pg.get_by_role("tab", name="Step inside").click()
        upload_fresh(pg, cat, tmp_path, 2)
        pg.wait_for_function("document.querySelectorAll('.inside-pic img').length == 13")
        pg.click("#inside-guided input")
        for k in range(1, len(STEPS) + 1):
            step_on_screen(pg, k)
            if k == 7:
                shot(pg, "inside-guided-1280x720", full=False)
            pg.click("#inside-next")
        step_on_screen(pg, len(STEPS))  # Next at the last step stays there
        pg.click("#inside-back")
        step_on_screen(pg, len(STEPS) - 1)
        pg.keyboard.press("ArrowLeft")
        step_on_screen(pg, len(STEPS) - 2)
        assert pg.evaluate("document.documentElement.scrollWidth") <= 1281
        pg.click("#inside-guided input")
        pg.wait_for_function("[...document.querySelectorAll('.inside-step')].every(e => e.offsetParent !== null)")
    finally:
        pg.context.close()


@pytest.mark.slow
@pytest.mark.browser
def test_step_inside_on_a_phone(browser, app, client, cat, tmp_path) -> None:
    """390x844: nothing wider than the screen; in guided mode Back, where and Next share one line."""
    from gradio_client import handle_file

    client.predict(handle_file(str(cat)), api_name="/predict")
    pg = open_page(browser, app, 390, 844)
    try:
        pg.get_by_role("tab", name="Step inside").click()
        upload_fresh(pg, cat, tmp_path, 3)
        pg.wait_for_function("document.querySelectorAll('.inside-pic img').length == 13")
        pg.evaluate("document.querySelector('#inside-step-1').scrollIntoView()")
        time.sleep(0.5)
        shot(pg, "inside-phone-390x844", full=False)
        assert pg.evaluate("document.documentElement.scrollWidth") <= 391
        pg.click("#inside-guided input")
        pg.click("#inside-next")
        step_on_screen(pg, 2, height=844, width=390)
        tops = [pg.locator(s).bounding_box()["y"] for s in ("#inside-back", "#inside-where", "#inside-next")]
        assert max(tops) - min(tops) < 40, tops
        shot(pg, "inside-phone-guided-390x844", full=False)
    finally:
        pg.context.close()


def step_on_screen(pg, k: int, height: int = 720, width: int = 1280) -> None:
    """Step ``k`` alone is shown, and all of it (title, sentence, picture) and Back / Next fit the screen."""
    pg.wait_for_selector(f"#inside-where:has-text('Step {k} of {len(STEPS)}')")
    shown = pg.evaluate("[...document.querySelectorAll('.inside-step')].filter(e => e.offsetParent !== null)"
                        ".map(e => e.id)")
    assert shown == [f"inside-step-{k}"], shown
    name = STEPS[k - 1]
    img = pg.locator(f"#inside-{name} img")
    pg.wait_for_function(f"(() => {{ const i = document.querySelector('#inside-{name} img');"
                         " return i && i.complete && i.naturalWidth > 0; })()")
    time.sleep(0.3)  # the picture fitted to the screen
    for what in (f"#inside-{name}-text h3", f"#inside-{name}-text p", img, "#inside-back", "#inside-next"):
        box = (pg.locator(what).first if isinstance(what, str) else what.first).bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= height + 1 and box["x"] + box["width"] <= width + 1, (
            k, what, box)
    assert img.first.bounding_box()["height"] >= (200 if width > 1000 else 100), f"step {k}'s picture is small"
