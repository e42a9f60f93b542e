"""The app's Atlas tab on a tiny model: the atlas of the example photos computed once and then read
from the disk cache (keyed by the weights), a clicked patch coded as the atlas's NMF codes it, the
views, an atlas built from uploaded pictures within the survey's limits (exposed too) with a report
that names no server path, and the slide of the most important heads in a deck."""

from __future__ import annotations

import json
import threading
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from conftest import small_shapes_vit
from PIL import Image

from vit_demo.app import atlas_store as store_module
from vit_demo.app import uploads as uploads_module
from vit_demo.app.context import AppConfig, Context
from vit_demo.app.examples import Example
from vit_demo.app.registry import ModelRegistry
from vit_demo.app.server.limits import Limits
from vit_demo.app.session import Session, Upload
from vit_demo.app.tabs.atlas import AtlasTab
from vit_demo.evaluate.atlas import atlas
from vit_demo.evaluate.atlas_codes import code_tokens, tokens_after
from vit_demo.images import load_image
from vit_demo.preprocess import preprocess
from vit_demo.present import deck
from vit_demo.present.slides import write_pptx
from vit_demo.train.data import make_shapes

CLASSES = ["circle", "square", "star", "triangle"]


def tiny_checkpoint(path: Path, seed: int) -> Path:
    from vit_demo.checkpoints.files import save
    from vit_demo.train.recipe import scratch_data_config

    return save(small_shapes_vit(seed, depth=2), scratch_data_config(32), path, name="tiny", class_names=CLASSES)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Six shapes pictures as the app's examples, a tiny checkpoint, the disk cache in a temp folder."""
    root = tmp_path_factory.mktemp("atlas-tab")
    make_shapes(root / "shapes", per_class=2, size=32, seed=3, progress=False)
    pictures = sorted((root / "shapes").rglob("*.png"))[:6]
    ckpt = tiny_checkpoint(root / "tiny.safetensors", 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(store_module.CACHE_ENV, str(root / "cache"))
        yield root, pictures, ckpt


def make_tab(pictures: list[Path], ckpt: Path, exposed: bool = False) -> tuple[AtlasTab, Context]:
    reg = ModelRegistry([ckpt], random_names=(), hub_names=())
    cfg = AppConfig(weights=[str(ckpt)], limits=Limits(exposed=exposed))
    ctx = Context(cfg, reg, reg.default_key(), [Example(p, p.stem, "user") for p in pictures])
    tab = AtlasTab()
    with gr.Blocks(), gr.Tab("Atlas") as tab.gr_tab:
        tab.layout(ctx)
    return tab, ctx


def session(ctx: Context, picture: Path) -> Session:
    sess = ctx.session(None)
    img = Image.open(picture).convert("RGB")
    sess.upload = Upload(img, picture.name, img.size)
    sess.analysis = ctx.reg.analyze(sess.model_key, img)
    return sess


def test_example_atlas_once_then_from_the_disk_cache(world) -> None:
    root, pictures, ckpt = world
    tab, ctx = make_tab(pictures, ckpt)
    sess = ctx.session(None)
    assert "being computed" in tab.current(ctx, sess, None)  # the first opening starts it in the background
    at = tab.examples.compute(ctx.default_key)  # waits for it
    assert at.result["images"] == 6 and len(at.result["heads"]) == 2 * 2 and len(at.result["concepts"]) == 8
    folder = tab.examples.folder(ctx.default_key)
    assert (folder / "atlas.json").is_file() and at.components.shape == (8, 2 * 16)

    again, ctx2 = make_tab(pictures, ckpt)  # a new app: read from disk, not computed
    kept = again.current(ctx2, ctx2.session(None), None)
    assert kept.result["heads"] == json.loads(json.dumps(at.result["heads"]))
    np.testing.assert_array_equal(kept.components, at.components)

    other = tiny_checkpoint(root / "other.safetensors", 1)  # other weights: another folder, nothing kept yet
    third, ctx3 = make_tab(pictures, other)
    assert third.examples.folder(ctx3.default_key) != folder
    assert third.examples.cached(ctx3.default_key) is None


def test_clicked_patch_coded_as_the_atlas_codes_it(world) -> None:
    """The tab's NNLS coding of a picture's tokens = the NMF codes the atlas fitted for that picture."""
    root, pictures, ckpt = world
    _, ctx = make_tab(pictures, ckpt)
    lm = ctx.reg.get(ctx.default_key)
    folder = root / "one"
    folder.mkdir(exist_ok=True)
    for i, p in enumerate(pictures):
        (folder / f"{i}_{p.name}").write_bytes(p.read_bytes())
    fitted: dict = {}
    result = atlas(lm, folder, layer=1, concepts=4, progress=False, fitted=fitted)
    found = fitted["concepts"]
    x = preprocess(load_image(sorted(folder.iterdir())[0]), lm.data_config)[0][None]
    t = tokens_after(lm, x, result["concept_layer"])[0, 1:].numpy()
    codes = code_tokens(t, found.components)
    ref = found.codes[0]
    assert np.abs(codes - ref).max() <= 2e-3 * max(1.0, float(np.abs(ref).max()))


def test_other_sessions_forward_passes_untouched_while_an_atlas_is_built(world, tmp_path: Path) -> None:
    """The atlas ablates heads with hooks: on the app's shared model they would change every
    other session's predictions meanwhile (and mix their tokens into the atlas)."""
    _, pictures, ckpt = world
    _, ctx = make_tab(pictures, ckpt)
    lm = ctx.reg.get(ctx.default_key)
    x = preprocess(load_image(pictures[0]), lm.data_config)[0][None]
    with torch.inference_mode():
        ref = lm.model(x).logits
    (tmp_path / "pics").mkdir()
    for i, p in enumerate(pictures):
        (tmp_path / "pics" / f"{i}_{p.name}").write_bytes(p.read_bytes())
    job = threading.Thread(target=store_module.build_atlas, args=(lm, tmp_path / "pics", tmp_path, "k", ""))
    job.start()
    worst = 0.0
    with torch.inference_mode():
        while job.is_alive():
            worst = max(worst, float((lm.model(x).logits - ref).abs().max()))
    job.join()
    assert worst == 0.0 and (tmp_path / "report" / "report.html").is_file()


def test_views_and_a_clicked_patch(world) -> None:
    _, pictures, ckpt = world
    tab, ctx = make_tab(pictures, ckpt)
    at = tab.examples.compute(ctx.default_key)
    sess = session(ctx, pictures[0])
    out = tab.atlas_views(ctx, sess, at, 2, 1, 3)
    assert "**Layer 2, head 1**" in out[tab.head_md] and "**Concept 3**" in out[tab.concept_md]
    assert len(out[tab.head_gallery]) == len(at.head(2, 1)["top"]) == 6  # one best patch per picture
    assert Image.open(out[tab.head_gallery][0][0]).size == (84, 84)  # a crop, the patch outlined
    pic = tab.picture_views(ctx, sess, at, 3, "inferno", 0.6, query=5)
    assert Image.open(pic[tab.picture]).size == (448, 448 + 46)  # the picture and its colour bar
    codes = tab.codes(ctx, sess, at)
    w = codes.reshape(-1, 8)[5]
    best = int(np.argmax(w)) + 1
    assert pic[tab.patch_md].startswith("**Patch row 1, column 1** is made of: concept " + str(best))
    assert f"{w.max() / w.sum():.0%}" in pic[tab.patch_md]


@pytest.mark.parametrize("exposed", [False, True], ids=["local", "exposed"])
def test_built_from_uploads_within_the_survey_limits(world, monkeypatch: pytest.MonkeyPatch, exposed: bool) -> None:
    _, pictures, ckpt = world
    monkeypatch.setattr(uploads_module, "MAX_PICTURES_EXPOSED", 4)  # the survey's limits, made small
    monkeypatch.setattr(uploads_module, "MAX_PICTURES", 5)
    tab, ctx = make_tab(pictures, ckpt, exposed=exposed)
    sess = ctx.session(None)
    at, atlas_id = tab.build_from(ctx, sess, [str(p) for p in pictures])
    assert at.result["images"] == (4 if exposed else 5)
    assert tab.store[atlas_id] is at and tab.current(ctx, sess, atlas_id) is at
    report = at.crops.out.parent / "atlas-report.zip"  # named for what it is (it downloaded as report.zip)
    with zipfile.ZipFile(report) as z:
        public = z.read("report/atlas.json").decode()
    assert str(at.crops.out.parent) not in public and str(Path(pictures[0]).parent) not in public
    assert json.loads(public)["heads"][0]["top"][0]["path"].endswith(".png")


def test_atlas_slide_in_a_deck(world, tmp_path: Path) -> None:
    _, pictures, ckpt = world
    tab, ctx = make_tab(pictures, ckpt)
    at = tab.examples.compute(ctx.default_key)
    lm = ctx.reg.get(ctx.default_key)
    slide = deck.atlas_slide(lm, at.result, 1200)
    best = sorted(at.result["heads"], key=lambda h: -h["importance"])
    assert slide.meta["heads"] == [(h["layer"], h["head"]) for h in best]  # all four heads, most important first
    assert slide.pictures[0].width == 1200 and "Michel" in slide.notes
    assert len(deck.slide_costs(1, atlas=True)) == len(deck.slide_costs(1)) + 1
    path = write_pptx([slide], tmp_path / "atlas.pptx")
    from pptx import Presentation

    shapes = Presentation(str(path)).slides[0].shapes
    assert sum(s.shape_type == 13 for s in shapes) == 1  # one picture


def test_deck_atlas_option_checks_its_model(world, tmp_path: Path) -> None:
    from vit_demo.cli.common import UserError
    from vit_demo.cli.deck import read_atlas

    _, pictures, ckpt = world
    tab, ctx = make_tab(pictures, ckpt)
    at = tab.examples.compute(ctx.default_key)
    lm = ctx.reg.get(ctx.default_key)
    path = tmp_path / "atlas.json"
    path.write_text(json.dumps(at.result))
    assert read_atlas(str(path), lm)["images"] == 6
    path.write_text(json.dumps({**at.result, "heads": at.result["heads"][:-1]}))  # another model's heads
    with pytest.raises(UserError, match="not those of tiny"):
        read_atlas(str(path), lm)
    path.write_text("{")
    with pytest.raises(UserError, match="not an atlas.json"):
        read_atlas(str(path), lm)
