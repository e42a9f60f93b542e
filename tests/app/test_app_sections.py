"""The app's sections on their own, built in-process on a tiny checkpoint (no server): a tab wires
its own events (a click on the Patches tab's picture picks the query patch, with or without the
Attention tab), and the Attention tab's layer slider names the shown model's depth."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest
import torch
from PIL import Image

from vit_demo.app import build as build_module
from vit_demo.app.context import AppConfig, Context
from vit_demo.app.session import Session, Upload
from vit_demo.app.tabs.attention import PATCH_QUERY, AttentionTab, query_picture_size
from vit_demo.app.tabs.patches import PatchesTab, patch_picture_size
from vit_demo.model import VisionTransformer, ViTConfig

DEPTH = 3  # not 12: the slider's label must not say "12 = last"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    from vit_demo.checkpoints.files import save
    from vit_demo.train.recipe import scratch_data_config

    torch.manual_seed(0)
    cfg = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=DEPTH, num_heads=2, num_classes=4)
    model = VisionTransformer(cfg).init_weights().eval()
    path = tmp_path_factory.mktemp("sections") / "tiny.safetensors"
    return save(model, scratch_data_config(32), path, name="tiny", class_names=["a", "b", "c", "d"])


def picture() -> Image.Image:
    img = Image.new("RGB", (32, 32), (30, 40, 200))
    img.paste((40, 200, 60), (8, 10, 22, 24))
    return img


def by_elem_id(demo: gr.Blocks, elem_id: str):
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def select_event(demo: gr.Blocks, component):
    """The one event a select on ``component`` runs."""
    found = [f for f in demo.fns.values() if any(t[0] == component._id and t[1] == "select" for t in f.targets)]
    assert len(found) == 1, found
    return found[0]


def click(app, elem_id: str, row: int, col: int, size_of=patch_picture_size) -> tuple[Session, dict]:
    """A new session with the picture analysed, then a click in the middle of patch (row, col) of
    the picture ``elem_id``: the session and the event's outputs."""
    demo, reg = app.demo, app.reg
    key = reg.default_key()
    sess = Session(model_key=key)
    sess.upload = Upload(picture(), "shapes.png", (32, 32))
    a = reg.analyze(key, sess.upload.picture)
    sess.analysis = a
    target = by_elem_id(demo, elem_id)
    event = select_event(demo, target)
    w, h = size_of(a)
    gh, gw = a.layout.grid
    evt = gr.SelectData(target, {"index": [(col + 0.5) * w / gw, (row + 0.5) * h / gh], "value": None})
    values = [getattr(c, "value", None) for c in event.inputs[1:]]
    return sess, event.fn(evt, sess, *values)


def test_a_click_on_the_patches_picture_picks_the_query_without_the_attention_tab(tiny_ckpt, monkeypatch) -> None:
    """The Patches tab wires its own click (it was wired by the Attention tab: without that tab a
    click on the patch grid did nothing)."""
    monkeypatch.setattr(build_module, "TABS", (PatchesTab,))
    app = build_module.build(AppConfig(weights=[str(tiny_ckpt)]))
    sess, out = click(app, "patch-grid", 2, 1)
    assert sess.query == 2 * 4 + 1
    assert {by_elem_id(app.demo, "patch-grid"), by_elem_id(app.demo, "sequence")} <= set(out)


def test_a_click_on_the_patches_picture_sets_the_attention_explorers_query(tiny_ckpt) -> None:
    app = build_module.build(AppConfig(weights=[str(tiny_ckpt)]))
    sess, out = click(app, "patch-grid", 3, 2)
    demo = app.demo
    assert sess.query == 3 * 4 + 2
    assert out[by_elem_id(demo, "query-patch")] == 14 and out[by_elem_id(demo, "query-mode")] == PATCH_QUERY
    assert "patch 14 (row 4, column 3)" in out[by_elem_id(demo, "attention-caption")]
    _, again = click(app, "query-picker", 0, 3, query_picture_size)  # the Attention tab's own picker: the same
    assert again[by_elem_id(demo, "query-patch")] == 3


def test_layer_slider_names_the_models_depth(tiny_ckpt) -> None:
    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.sections.display import DisplayControls

    reg = ModelRegistry([tiny_ckpt], random_names=(), hub_names=())
    ctx = Context(AppConfig(), reg, reg.default_key())
    tab = AttentionTab()
    with gr.Blocks():
        DisplayControls().layout(ctx)
        tab.layout(ctx)
    assert tab.layer.label == "Layer (1 = first)"  # no model shown yet: no number
    sess = Session(model_key=ctx.default_key)
    sess.upload = Upload(picture(), "shapes.png", (32, 32))
    a = reg.analyze(ctx.default_key, sess.upload.picture)
    sess.analysis = a
    out = tab.show(sess, reg.get(ctx.default_key), {c: c.value for c in tab.show_inputs})
    assert out[tab.layer]["label"] == f"Layer (1 = first, {DEPTH} = last)" and out[tab.layer]["maximum"] == DEPTH
