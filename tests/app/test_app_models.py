"""The app's models: it opens on the embedded DeiT-Tiny with no flags, keeps the random-weights
model on the menu, shows a checkpoint's own class names (top-k, class picker, figure titles),
and downloads a hub model on pick with a progress indicator (a stand-in hub on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from app_server import running_app
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

TOPK = 4  # position of the top-k in /analyze's outputs (model info, status, model input, its caption, top-k, ...)


@pytest.fixture(scope="module")
def shouting(deit_tiny, tmp_path_factory) -> Path:
    """The embedded DeiT-Tiny saved with its own class names: ImageNet's, in capitals."""
    from vit_demo.checkpoints.files import save
    from vit_demo.labels import labels_for

    out = tmp_path_factory.mktemp("ckpt") / "shouting_deit.safetensors"
    names = [n.upper() for n in labels_for(1000)]
    return save(deit_tiny.model, deit_tiny.data_config, out, name="deit_tiny_patch16_224", class_names=names)


def test_opens_on_the_embedded_model(tmp_path: Path, package_photos: dict[str, Path], shouting: Path) -> None:
    """No flags and an empty weights/ folder: the embedded DeiT-Tiny is picked and predicts; the
    random-weights model is on the menu, labelled; a checkpoint's class names reach /predict."""
    empty = tmp_path / "no_weights"
    empty.mkdir()
    env = {"VIT_DEMO_WEIGHTS_DIR": str(empty), "VIT_DEMO_WEIGHTS": str(shouting)}
    with running_app(["--no-warm-up"], env=env) as app:
        import urllib.request

        with urllib.request.urlopen(app.url + "config", timeout=30) as r:
            config = r.read().decode()
        notice = [c["props"] for c in json.loads(config)["components"] if c.get("props", {}).get("elem_id") == "no-weights"]
        assert notice and notice[0]["visible"] is False  # "No checkpoint found" is not shown
        assert "RANDOM weights" in config and "ImageNet-1k (the default" in config
        c = Client(app.url, verbose=False)
        out = c.predict(handle_file(str(package_photos["coffee"])), api_name="/analyze")
        assert out[TOPK]["label"] == "espresso", out[TOPK]
        assert "deit_tiny_patch16_224" in out[0] and "Random weights" not in out[0] + out[1]
        key = f"file:{shouting.name}"  # the menu names the file, never where it is
        got = c.predict(handle_file(str(package_photos["coffee"])), key, 3, api_name="/predict")
        assert [t["label"] for t in got["topk"]][:1] == ["ESPRESSO"], got
        assert "Traceback" not in app.log(50_000)


def test_class_names_in_picker_and_titles(shouting: Path, package_photos: dict[str, Path]) -> None:
    """A checkpoint's own class names are the analysis' labels: top-k, the class picker's
    choices and the class-specific figure titles all use them."""
    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.tabs.relevance import class_choices, method_maps, methods_caption

    reg = ModelRegistry([shouting], hub_names=())
    key = reg.default_key()
    assert key == f"file:{shouting.name}"
    lm = reg.get(key)
    a = reg.analyze(key, Image.open(package_photos["coffee"]))
    assert a.labels == lm.labels and a.labels[967] == "ESPRESSO"
    assert a.topk(3)[0]["label"] == "ESPRESSO"
    assert class_choices(a)[0][1] == 967 and "ESPRESSO" in class_choices(a)[0][0]
    titles = list(method_maps(a, lm, "mean", 0.0, 0, None))
    assert any("ESPRESSO" in t for t in titles), titles
    assert "ESPRESSO" in methods_caption(a, "mean", 0.0, 0, None)


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.browser
def test_hub_pick_downloads_with_progress(tmp_path: Path, package_photos: dict[str, Path]) -> None:
    """Pick a hub model in a real browser: a progress indicator while timm downloads it (from a
    deliberately slow stand-in hub), then it is ported to weights/ and runs."""
    if not CHROMIUM.exists():
        pytest.skip(f"needs Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
    from hub_server import fake_hub
    from test_hub_download import NAME, hub_checkpoint

    repo, data, _ = hub_checkpoint()
    weights = tmp_path / "weights"
    with fake_hub({repo: {"model.safetensors": data}}, seconds_per_mib=0.5) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "VIT_DEMO_WEIGHTS_DIR": str(weights)}
        # --model NAME puts it on the menu as a hub entry (no file for it here); the app still opens on the default
        with running_app(["--no-warm-up", "--model", NAME], env=env) as app, sync_api.sync_playwright() as p:
            from test_app_browser import CHROMIUM_ARGS

            b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                pg = b.new_page(viewport={"width": 1400, "height": 1000})
                pg.set_default_timeout(120_000)
                pg.goto(app.url)
                pg.wait_for_selector("#upload")
                pg.set_input_files("#upload input[type=file]", str(package_photos["coffee"]))
                pg.wait_for_selector("#predictions h2:has-text('espresso')")
                pg.locator("#model input").click()
                pg.get_by_role("option", name=re.compile(f"{NAME}.*download from the hub")).click()
                # gr.Progress over the model's description: our line first, then the download's own tqdm bar
                # gr.Progress over the model menu: our line first, then the download's own tqdm bar (its file name)
                shown = pg.wait_for_selector("text=/Downloading|model.safetensors/")
                assert "%" in shown.inner_text()
                pg.screenshot(path=str(tmp_path / "progress.png"))
                import shutil

                from test_app_browser import SHOTS
                SHOTS.mkdir(parents=True, exist_ok=True)
                shutil.copy(tmp_path / "progress.png", SHOTS / "hub_download_progress.png")
                # the progress text over #model-info names the model too: wait for the summary itself
                pg.wait_for_function("n => { const t = document.querySelector('#model-info')?.innerText || '';"
                                     " return t.includes(n) && !/Downloading|%/.test(t); }", arg=NAME)
                assert "Random weights" not in pg.inner_text("#model-info")
            finally:
                b.close()
        assert (weights / f"{NAME}.safetensors").is_file()
        gets = [q for m, q in hub.requests if m == "GET" and "/resolve/" in q]
        assert gets == [f"/{repo}/resolve/main/model.safetensors"]
        assert "Traceback" not in app.log(50_000), app.log()
        assert os.path.getsize(weights / f"{NAME}.safetensors") > 0


def test_an_exposed_app_downloads_only_when_allowed(tmp_path: Path, package_photos: dict[str, Path]) -> None:
    """Issue 47: any anonymous caller could make an exposed app download any hub model on its menu
    (hundreds of MB each, into weights/, under no disk budget), from any event that names a model.
    Now an exposed app offers none unless ``--allow-downloads``; then only the model menu's pick
    downloads (in the slow lane, one at a time), within ``--downloads-mb``, and a model that
    would pass the budget is refused before anything is fetched."""
    from attacks import Raw, file_payload
    from hub_server import fake_hub
    from test_hub_download import NAME, hub_checkpoint

    repo, data, _ = hub_checkpoint()  # vit_tiny: 5.7 M parameters, counted 2 x 4 bytes each (46 MB)
    weights = tmp_path / "weights"
    with fake_hub({repo: {"model.safetensors": data}}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "VIT_DEMO_WEIGHTS_DIR": str(weights)}
        with running_app(["--no-warm-up", "--exposed", "--model", NAME], env=env) as app:
            raw = Raw(app.url)
            menu = next(c for c in raw.config()["components"] if (c.get("props") or {}).get("elem_id") == "model")
            assert not [v for _, v in menu["props"]["choices"] if v.startswith("hub:")], menu["props"]["choices"]
            out = raw.call("predict", [file_payload(raw.upload(package_photos["coffee"])), f"hub:{NAME}", 3])
            assert "unknown model" in out.message, out.message
        assert not [q for _, q in hub.requests if "/resolve/" in q], hub.requests

        with running_app(["--no-warm-up", "--exposed", "--model", NAME, "--allow-downloads", "--downloads-mb", "60"],
                         env=env) as app:
            raw = Raw(app.url)
            stored = raw.upload(package_photos["coffee"])
            out = raw.call("predict", [file_payload(stored), f"hub:{NAME}", 3])  # not from the menu: not downloaded
            assert "pick it in the model menu" in out.message, out.message
            big = raw.call("on_model", ["hub:deit_small_patch16_224", None])  # 22 M parameters: past 60 MB
            assert "download budget" in json.dumps(big.output), big.output
            assert not [q for _, q in hub.requests if "/resolve/" in q], hub.requests
            picked = raw.call("on_model", [f"hub:{NAME}", None], timeout=300)
            assert picked.success and NAME in json.dumps(picked.output), (picked.message, picked.output)
            out = raw.call("predict", [file_payload(stored), f"hub:{NAME}", 3])
            assert out.success, out.message
        assert (weights / f"{NAME}.safetensors").is_file()
        assert [q for m, q in hub.requests if m == "GET" and "/resolve/" in q] == [f"/{repo}/resolve/main/model.safetensors"]
