"""The app's named API, driven with gradio_client against ``python app.py`` on a free loopback
port (one server for the module): predictions equal the CLI's, bad input gives a readable
message and the app keeps serving, and every client (session) gets its own results."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from app_server import ROOT, running_app
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    with running_app(["--weights", str(deit_tiny_path)]) as a:
        yield a


@pytest.fixture(scope="module")
def client(app) -> Client:
    return Client(app.url, verbose=False)


STATUS, TOPK = 1, 4  # positions in /analyze's outputs (model info, status, model input, its caption, top-k, ...)


def new_client(app) -> Client:
    return Client(app.url, verbose=False)


# Every named endpoint's parameters, by name and in order (docs/app.md, "The named API").
# Adding a control to a tab changes none of them: /analyze is (image, model), whatever the tabs show.
ENDPOINTS = {
    "/predict": ["image", "model", "k"],
    "/analyze": ["image", "model"],
    "/attention": ["layer", "head", "query", "patch", "cmap", "alpha", "smooth"],
    "/compare": ["k"],
    "/train": ["dataset", "minutes", "zip"],  # the Train tab's run (tests/test_app_train.py)
    "/steps": ["image", "row", "col", "layer", "head", "temperature"],  # Step inside (tests/test_app_inside.py)
}
TOOLS = {  # --mcp: the tools' events (their parameters are the MCP tools')
    "/tool_predict": ["image", "k", "model"],
    "/tool_explain": ["image", "method", "class_index", "model"],
    "/tool_attention": ["image", "layer", "head", "rollout", "model"],
    "/tool_verify": ["image", "model"],
    "/tool_steps": ["image", "row", "col", "layer", "head", "temperature", "step", "model"],
}


def parameters(named: dict) -> dict[str, list[str]]:
    """endpoint -> its parameters' names, from /gradio_api/info's ``named_endpoints``."""
    return {name: [p["parameter_name"] for p in ep["parameters"]] for name, ep in named.items()}


def test_named_endpoints(client: Client) -> None:
    named = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert parameters(named) == ENDPOINTS


def built_parameters(monkeypatch: pytest.MonkeyPatch, tabs=None, mcp: bool = False) -> dict[str, list[str]]:
    """The named endpoints of the page built in this process (what /gradio_api/info serves)."""
    from vit_demo.app import build as build_module

    if tabs is not None:
        monkeypatch.setattr(build_module, "TABS", tabs)
    app = build_module.build(build_module.AppConfig(mcp=mcp))
    return parameters(app.demo.get_api_info()["named_endpoints"])


def test_endpoint_parameters_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert built_parameters(monkeypatch) == ENDPOINTS
    assert built_parameters(monkeypatch, mcp=True) == ENDPOINTS | TOOLS


def test_a_new_control_in_a_tab_moves_no_endpoint_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control added to what two tabs show for a new analysis (one in the middle of the list):
    every endpoint keeps its parameters. (Before, /analyze took every tab's controls, positionally:
    the new one shifted the ones after it.)"""
    import gradio as gr

    from vit_demo.app.build import TABS
    from vit_demo.app.tabs.attention import AttentionTab
    from vit_demo.app.tabs.relevance import RelevanceTab

    def wider(tab: type) -> type:
        class Wider(tab):
            def layout(self, ctx):
                super().layout(ctx)
                extra = gr.Slider(0, 1, value=0.5, label=f"A new control of {self.title}")
                self.show_inputs = [*self.show_inputs[:1], extra, *self.show_inputs[1:]]

        return Wider

    tabs = tuple(wider(t) if t in (AttentionTab, RelevanceTab) else t for t in TABS)
    assert built_parameters(monkeypatch, tabs) == ENDPOINTS


def test_predict_matches_cli(client: Client, deit_tiny_path: Path, package_photos: dict[str, Path]) -> None:
    photos = [package_photos[n] for n in ("coffee", "chelsea", "grace_hopper", "motorcycle", "camera")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "vit_demo", "predict", *map(str, photos), "--weights", str(deit_tiny_path),
                        "--topk", "5", "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    cli = {Path(o["image"]).name: o["topk"] for o in json.loads(r.stdout)}
    for p in photos:
        out = client.predict(handle_file(str(p)), api_name="/predict")
        assert out["image"] == p.name
        ours, ref = out["topk"], cli[p.name]
        assert [t["index"] for t in ours] == [t["index"] for t in ref], p.name
        assert [t["label"] for t in ours] == [t["label"] for t in ref], p.name
        for a, b in zip(ours, ref):
            assert a["prob"] == pytest.approx(b["prob"], abs=1e-5), p.name
    # the k parameter
    three = client.predict(handle_file(str(photos[0])), k=3, api_name="/predict")
    assert len(three["topk"]) == 3 and three["topk"][0]["label"] == "espresso"
    with pytest.raises(AppError, match="k must be a whole number from 1 to 10"):  # refused, never an empty list
        client.predict(handle_file(str(photos[0])), k=0, api_name="/predict")


# ----------------------------------------------------------------------------- bad input


def _png(width: int, height: int, bit_depth: int, color_type: int, rows: bytes) -> bytes:
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def huge_bilevel_png(size: int = 20_000) -> bytes:
    """A real, complete 1-bit PNG of size x size px (400 MP) in about 60 KB."""
    row = b"\0" * (1 + (size + 7) // 8)
    co = zlib.compressobj(9)
    body = b"".join(co.compress(row * 1000) for _ in range(size // 1000)) + co.flush()
    return _png(size, size, 1, 0, body)


def bad_files(tmp: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, a phrase the message must contain)."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = {}
    p = tmp / "notes.png"
    p.write_text("this is a text file with an image's name\n" * 20)
    out["not an image"] = (p, "not an image file")
    p = tmp / "truncated.jpg"
    p.write_bytes(good.read_bytes()[:4000])
    out["truncated"] = (p, "truncated")
    p = tmp / "one_pixel.png"
    Image.new("RGB", (1, 1), (200, 30, 30)).save(p)
    out["1x1 px"] = (p, "1x1 px")
    p = tmp / "huge.png"
    p.write_bytes(huge_bilevel_png())
    out["20000x20000 px"] = (p, "too many pixels")
    return out


@pytest.mark.parametrize("case", ["not an image", "truncated", "1x1 px", "20000x20000 px"])
def test_bad_input_is_refused_readably(client: Client, package_photos: dict[str, Path], tmp_path: Path, case: str) -> None:
    path, phrase = bad_files(tmp_path, package_photos["grace_hopper"])[case]
    with pytest.raises(AppError) as err:
        client.predict(handle_file(str(path)), api_name="/predict")
    msg = str(err.value)
    assert phrase in msg and path.name in msg, msg
    assert "Traceback" not in msg and len(msg) < 400, msg
    # the app goes on serving
    ok = client.predict(handle_file(str(package_photos["coffee"])), api_name="/predict")
    assert ok["topk"][0]["label"] == "espresso"


def test_bad_input_in_the_ui_event(app, package_photos: dict[str, Path], tmp_path: Path) -> None:
    """The upload event (what the browser calls) shows the message in the page instead of failing."""
    c = new_client(app)
    path, phrase = bad_files(tmp_path, package_photos["grace_hopper"])["truncated"]
    out = c.predict(handle_file(str(path)), api_name="/analyze")
    status = out[STATUS]
    assert "Cannot use this image" in status and phrase in status
    out = c.predict(handle_file(str(package_photos["coffee"])), api_name="/analyze")
    assert out[TOPK]["label"] == "espresso"


def test_animated_gif_uses_the_first_frame(client: Client, package_photos: dict[str, Path], tmp_path: Path) -> None:
    first = Image.open(package_photos["coffee"]).convert("RGB").resize((224, 168))
    frames = [first, Image.new("RGB", first.size, (0, 0, 255)), Image.new("RGB", first.size, (255, 0, 0))]
    gif = tmp_path / "animated.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100, loop=0)
    out = client.predict(handle_file(str(gif)), api_name="/predict")
    assert any("animated" in n and "3 frames" in n and "first frame" in n for n in out["notes"]), out["notes"]
    assert out["topk"][0]["prob"] > 0


# ----------------------------------------------------------------------------- sessions and re-renders


def test_slider_rerender_and_compare(app, package_photos: dict[str, Path]) -> None:
    c = new_client(app)
    out = c.predict(handle_file(str(package_photos["coffee"])), api_name="/analyze")
    assert out[TOPK]["label"] == "espresso"
    # layers count from 1, as the slider shows them; the head menu's value is the index ("2": head 3)
    a11 = c.predict(12, "mean", "[class] token", 0, "inferno", 0.6, True, api_name="/attention")
    a3 = c.predict(3, "mean", "[class] token", 0, "inferno", 0.6, True, api_name="/attention")
    assert "layer 12 of 12" in a11[1] and "layer 3 of 12" in a3[1]
    assert Image.open(a11[0]).tobytes() != Image.open(a3[0]).tobytes()
    q = c.predict(3, "2", "a patch (click the picture)", 100, "viridis", 0.5, False, api_name="/attention")
    assert "patch 100" in q[1] and "head 3 of 3" in q[1]
    # out of range: said, not silently ignored
    bad = c.predict(13, "mean", "a patch (click the picture)", 500, "inferno", 0.6, True, api_name="/attention")
    assert "There is no layer 13" in bad[1] and "There is no patch 500" in bad[1] and "[class] token" in bad[1]
    verdict = c.predict(5, api_name="/compare")[0]
    assert "Identical to 0.0001, both in fp32" in verdict, verdict


def test_sessions_are_separate(app, package_photos: dict[str, Path]) -> None:
    """Two users at once: each one's re-render shows its own image."""
    photos = {"espresso": package_photos["coffee"], "Egyptian cat": package_photos["chelsea"]}
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def user(label: str, path: Path) -> None:
        try:
            c = new_client(app)
            out = c.predict(handle_file(str(path)), api_name="/analyze")
            results[label + " analyze"] = out[TOPK]["label"]
            att = c.predict(5, "all", "[class] token", 0, "inferno", 0.6, True, api_name="/attention")
            results[label + " attention"] = Image.open(att[0]).tobytes()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=user, args=item) for item in photos.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results["espresso analyze"] == "espresso" and results["Egyptian cat analyze"] == "Egyptian cat"
    assert results["espresso attention"] != results["Egyptian cat attention"]


def test_server_healthy(app) -> None:
    assert app.alive()
    assert "Traceback" not in app.log(50_000), app.log()


def test_random_weights_model_stays_on_the_menu(app, package_photos: dict[str, Path]) -> None:
    """The random-weights model is still offered (for teaching), and says so when it runs. (With
    no flags the app opens on the embedded checkpoint: tests/test_app_models.py.)"""
    c = new_client(app)
    out = c.predict(handle_file(str(package_photos["coffee"])), "random:deit_tiny_patch16_224", api_name="/analyze")
    assert "Random weights" in out[STATUS] and "random weights" in out[0]
    assert len(out[TOPK]["confidences"]) == 5
