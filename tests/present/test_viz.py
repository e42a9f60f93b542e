"""Renderers: the right size, not blank, the map really drawn, valid files in every format.

Maps come from the real DeiT-Tiny on a real photo (the ``scene`` fixture), so the figures
tested are the ones users get. No wall-clock assertions: the fast renderers are checked for
what they draw, not how fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vit_demo import viz
from vit_demo.images import load_image
from vit_demo.methods.attention import cls_attention, head_maps, mean_attention_distance, pos_embed_similarity
from vit_demo.methods.rollout import rollout
from vit_demo.preprocess import preprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scene(deit_tiny, package_photos):
    """One photo through the real model: picture, attentions, layout, a few maps."""
    x, pic = preprocess(load_image(package_photos["chelsea"]), deit_tiny.data_config)
    with torch.no_grad():
        out = deit_tiny.model(x[None], capture=True)
    cls = head_maps(out.attentions, out.layout)[0]  # [L, H, gh, gw]
    return {
        "pic": pic,
        "out": out,
        "layout": out.layout,
        "cls": cls.numpy(),
        "last": cls_attention(out.attentions, out.layout, -1)[0].numpy(),
        "rollout": rollout(out.attentions, out.layout)[0].numpy(),
        "probs": out.logits.softmax(-1)[0],
        "labels": deit_tiny.labels,
    }


def png(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def assert_slide_png(path: Path, min_width: int = 2000) -> np.ndarray:
    a = png(path)
    assert a.shape[1] >= min_width, f"{path.name} is {a.shape[1]} px wide"
    assert a.std() > 20, f"{path.name} looks blank (pixel std {a.std():.1f})"
    return a


# ----------------------------------------------------------------------------- helpers


def test_upsample_matches_torch_bilinear_and_nearest_blocks():
    rng = np.random.default_rng(0)
    m = rng.random((3, 7, 10)).astype(np.float32)
    smooth = viz.upsample(m, (56, 80), smooth=True)
    ref = F.interpolate(torch.from_numpy(m)[None], size=(56, 80), mode="bilinear", align_corners=False)[0].numpy()
    np.testing.assert_allclose(smooth, ref, atol=1e-5)
    blocky = viz.upsample(m, (56, 80), smooth=False)
    np.testing.assert_array_equal(blocky, np.repeat(np.repeat(m, 8, axis=1), 8, axis=2))


def test_normalize_is_per_map_unless_range_given():
    m = np.stack([np.arange(4.0).reshape(2, 2), 10 + 5 * np.arange(4.0).reshape(2, 2), np.full((2, 2), 3.0)])
    n = viz.normalize(m)
    np.testing.assert_allclose(n[0], n[1])  # each map on its own min..max
    assert n[0].min() == 0 and n[0].max() == 1
    np.testing.assert_array_equal(n[2], 0)  # a constant map does not divide by zero
    fixed = viz.normalize(m, vmin=0, vmax=30)
    np.testing.assert_allclose(fixed[1], np.clip(m[1] / 30, 0, 1))


def test_colormap_names():
    assert viz.colormap_lut("viridis").shape == (256, 3)
    with pytest.raises(ValueError, match="unknown colormap"):
        viz.check_cmap("not-a-cmap")


# ----------------------------------------------------------------------------- fast renderers


def test_overlay_image(scene):
    pic, heat = scene["pic"], scene["last"]
    plain = np.asarray(pic, dtype=np.int16)
    out = viz.overlay_image(pic, heat)
    assert out.size == pic.size and out.mode == "RGB"
    assert np.abs(np.asarray(out, dtype=np.int16) - plain).mean() > 10  # the map is drawn
    # alpha 0: the picture itself; alpha 1: the colours alone
    np.testing.assert_array_equal(np.asarray(viz.overlay_image(pic, heat, alpha=0.0)), np.asarray(pic))
    assert viz.overlay_image(pic, heat, size=448).size == (448, 448)
    assert viz.overlay_image(pic, heat, size=(320, 200)).size == (320, 200)
    smooth, blocky = (np.asarray(viz.overlay_image(pic, heat, smooth=s)) for s in (True, False))
    assert (smooth != blocky).any()
    # blocky: flat inside each 16-px patch
    b = np.asarray(viz.overlay_image(None, heat, smooth=False, size=224))
    assert (b[:16, :16] == b[0, 0]).all()
    # per-map min..max: an affine change of the map draws the same picture (up to float rounding)
    shifted = np.asarray(viz.overlay_image(pic, 3 * heat + 7), dtype=np.int16)
    assert np.abs(shifted - np.asarray(out, dtype=np.int16)).max() <= 3
    # colormaps differ
    assert (np.asarray(viz.overlay_image(pic, heat, cmap="viridis")) != np.asarray(out)).any()


def test_overlay_non_square_and_mark():
    rng = np.random.default_rng(1)
    pic = Image.fromarray(rng.integers(0, 255, (160, 256, 3), dtype=np.uint8))
    heat = rng.random((10, 16))
    out = viz.overlay_image(pic, heat, mark=17)
    assert out.size == (256, 160)
    a = np.asarray(out)
    r, c = divmod(17, 16)
    edge = a[r * 16 + 2, c * 16 + 4 : c * 16 + 12]  # the outline's top edge (cyan)
    assert (edge == viz.HIGHLIGHT_RGB).all()
    with pytest.raises(ValueError, match="outside"):
        viz.overlay_image(pic, heat, mark=160)


def test_heads_image(scene):
    pic, cls = scene["pic"], scene["cls"]
    L, H = cls.shape[:2]
    one = viz.heads_image(pic, cls[-1], layer=L - 1)
    assert one.mode == "RGB" and one.width > 2 * one.height  # 3 heads side by side
    a = np.asarray(one)
    assert a.std() > 20
    # the whole model: 12 layers run across (columns), the 3 heads down (rows), filling a wide page
    whole = viz.heads_image(pic, cls, tile=64)
    assert whole.width > L * 64 and whole.height > H * 64 and whole.width > 2 * whole.height
    bare = viz.heads_image(pic, cls, tile=64, titles=False)
    assert bare.size == (L * 64 + (L - 1) * 2, H * 64 + (H - 1) * 2)
    # column j is layer j, row i head i: the tile at (head 1, layer 2) is that head's map
    b = np.asarray(bare)
    assert np.array_equal(b[66:130, 66:130], np.asarray(viz.heads_image(pic, cls[1], tile=64, titles=False))[:, 66:130])
    assert (b[:64, :64] != b[66:130, :64]).any()  # tiles really differ between heads
    # many heads wrap into rows of at most 6
    twelve = viz.heads_image(pic, np.random.default_rng(0).random((12, 14, 14)), tile=50, titles=False)
    assert twelve.size == (6 * 50 + 5 * 2, 2 * 50 + 2)


def test_patch_grid_image(scene):
    pic = scene["pic"]
    g = viz.patch_grid_image(pic, 16)
    assert g.size == (448, 448)  # 2x: 32-px cells for readable numbers
    lit = viz.patch_grid_image(pic, 16, highlight=45)
    diff = np.abs(np.asarray(lit, dtype=np.int16) - np.asarray(g, dtype=np.int16)).sum(-1)
    ys, xs = np.nonzero(diff)
    r, c = divmod(45, 14)
    assert ys.min() >= r * 32 - 2 and ys.max() <= (r + 1) * 32 + 2  # only that patch changes
    assert xs.min() >= c * 32 - 2 and xs.max() <= (c + 1) * 32 + 2
    plain = viz.patch_grid_image(pic, 16, numbers=False)
    assert plain.size == (224, 224)
    assert (np.asarray(plain) != np.asarray(pic)).any()  # the grid lines
    # a click on the highlighted patch maps back to it
    assert viz.patch_index_at((c + 0.5) * 32, (r + 0.5) * 32, g.size, (14, 14)) == 45
    assert viz.patch_index_at(447.9, 447.9, g.size, (14, 14)) == 195



def test_sequence_slots():
    slots = viz.sequence_slots(["[class]", "[dist]"], 196, head=3, tail=2, highlight=100)
    assert [s.kind for s in slots] == ["prefix"] * 2 + ["patch"] * 3 + ["gap", "patch", "gap"] + ["patch"] * 2
    assert [s.patch for s in slots if s.kind == "patch"] == [0, 1, 2, 100, 194, 195]
    assert [s.position for s in slots if s.kind != "gap"] == [0, 1, 2, 3, 4, 102, 196, 197]
    assert [s.patch for s in viz.sequence_slots([], 5, head=3, tail=2, highlight=4)] == [0, 1, 2, 3, 4]  # all fit
    assert [s.patch for s in viz.sequence_slots([], 9, head=3, tail=2, highlight=3)] == [0, 1, 2, 3, None, 7, 8]


def test_sequence_image(scene):
    pic, names = scene["pic"], scene["layout"].names()
    img = viz.sequence_image(pic, 16, names, highlight=100, width=900, embed_dim=192)
    assert img.size == (900, 250)
    assert (np.asarray(img) == viz.HIGHLIGHT_RGB).all(-1).any()  # the highlighted patch's frame
    assert not (np.asarray(viz.sequence_image(pic, 16, names, width=900)) == viz.HIGHLIGHT_RGB).all(-1).any()


# ----------------------------------------------------------------------------- figures


def test_patch_grid_figure(scene, tmp_path):
    fig = viz.patch_grid_figure(scene["pic"], 16, scene["layout"].names(), highlight=45)
    a = assert_slide_png(viz.save_figure(fig, tmp_path / "grid.png", width_px=2400))
    assert a.shape[1] == 2400


def test_heatmap_figure_draws_the_map(scene, tmp_path):
    pic, heat = scene["pic"], scene["rollout"]
    on = assert_slide_png(viz.save_figure(viz.heatmap_figure(pic, heat, colorbar=False), tmp_path / "on.png"))
    off = png(viz.save_figure(viz.heatmap_figure(pic, heat, alpha=0.0, colorbar=False), tmp_path / "off.png"))
    assert on.shape == off.shape
    assert np.abs(on.astype(np.int16) - off.astype(np.int16)).mean() > 10
    fig = viz.heatmap_figure(pic, heat, smooth=False, cmap="viridis", title="rollout", show_input=True, mark=45)
    assert_slide_png(viz.save_figure(fig, tmp_path / "both.png"))


def test_heatmap_figure_non_square(tmp_path):
    rng = np.random.default_rng(2)
    pic = rng.integers(0, 255, (224, 320, 3), dtype=np.uint8)
    fig = viz.heatmap_figure(pic, rng.random((14, 20)), smooth=False, title="14x20 grid", caption="non-square")
    a = assert_slide_png(viz.save_figure(fig, tmp_path / "wide.png", width_px=2400))
    assert a.shape[1] == 2400 and a.shape[0] < a.shape[1]


def test_heads_figures(scene, tmp_path):
    cls = scene["cls"]
    fig = viz.heads_figure(scene["pic"], cls[-1], layer=11, title="layer 12 of 12")  # layer: the index
    assert [t.get_text() for t in fig.axes[0].texts] == ["L12 H1", "L12 H2", "L12 H3"]  # people count from 1
    assert_slide_png(viz.save_figure(fig, tmp_path / "heads.png"))
    fig = viz.heads_figure(scene["pic"], cls, title="all")
    names = {t.get_text() for t in fig.axes[0].texts}
    assert {"L1 H1", "L4 H3", "L12 H3"} <= names and len(names) == cls.shape[0] * cls.shape[1]
    assert_slide_png(viz.save_figure(fig, tmp_path / "all.png"))


def test_figures_show_the_apps_pixels_of_a_map(scene):
    """An exported figure's map and the app's preview of the same map are the same pixels (one
    renderer, viz.overlay_array, draws both): the one-map figure, the side-by-side figure and
    every panel of the heads figure."""
    pic, heat = scene["pic"], scene["rollout"]
    fig = viz.heatmap_figure(pic, heat, cmap="viridis", smooth=False, title="rollout", show_input=True, mark=45)
    shown = np.asarray(fig.axes[1].images[0].get_array())
    np.testing.assert_array_equal(shown, np.asarray(viz.overlay_image(pic, heat, "viridis", smooth=False)))
    maps = {"attention": scene["last"], "rollout": heat}
    fig = viz.compare_figure(pic, maps, alpha=0.4, show_input=False)
    for ax, m in zip(fig.axes, maps.values()):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), np.asarray(viz.overlay_image(pic, m, alpha=0.4)))
    heads = scene["cls"][-1]  # [H, gh, gw]: panels of 224 px, each titled above its picture
    ax = viz.heads_figure(pic, heads, layer=11).axes[0]
    mosaic = np.asarray(ax.images[0].get_array())
    label_px = 2 * ax.texts[0].get_position()[1]  # the first row's titles sit in the middle of their band
    for i, text in enumerate(ax.texts):
        xc, yc = text.get_position()
        x, y = round(xc - 112), round(yc + label_px / 2)
        np.testing.assert_array_equal(mosaic[y : y + 224, x : x + 224], np.asarray(viz.overlay_image(pic, heads[i], size=224)))


def test_compare_distance_pos_embed_topk(scene, deit_tiny, tmp_path):
    out, layout = scene["out"], scene["layout"]
    maps = {"attention": scene["last"], "rollout": scene["rollout"]}
    assert_slide_png(viz.save_figure(viz.compare_figure(scene["pic"], maps, title="compare"), tmp_path / "cmp.png"))

    d = mean_attention_distance(out.attentions, layout, 16)[0]
    fig = viz.distance_figure(d, title="distance", reference=viz.uniform_attention_distance(layout.grid, 16))
    ax = fig.axes[0]
    xs = np.concatenate([c.get_offsets()[:, 0] for c in ax.collections])
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert len(xs) == d.numel()  # one dot per head and layer
    np.testing.assert_allclose(np.sort(ys), np.sort(d.numpy().ravel()), rtol=1e-6)
    assert_slide_png(viz.save_figure(fig, tmp_path / "dist.png"))

    sim = pos_embed_similarity(deit_tiny.model)
    fig = viz.pos_embed_figure(sim, title="pos")
    im = fig.axes[0].images[0]
    assert im.get_clim() == (-1, 1)  # shared scale
    assert_slide_png(viz.save_figure(fig, tmp_path / "pos.png"))

    from vit_demo.labels import topk

    preds = topk(scene["probs"], 5, scene["labels"])
    fig = viz.topk_figure(preds)
    bars = fig.axes[0].patches
    np.testing.assert_allclose(sorted(b.get_width() for b in bars), sorted(p["prob"] * 100 for p in preds), rtol=1e-6)
    assert_slide_png(viz.save_figure(fig, tmp_path / "topk.png"))


def test_uniform_attention_distance():
    # a 1x2 grid of 16-px patches: distances 0, 16, 16, 0 -> mean 8
    assert viz.uniform_attention_distance((1, 2), 16) == pytest.approx(8.0)


# ----------------------------------------------------------------------------- files


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<svg"), (".pdf", b"%PDF-")])
def test_vector_formats(scene, tmp_path, suffix, magic):
    fig = viz.heatmap_figure(scene["pic"], scene["last"], title="vector")
    path = viz.save_figure(fig, tmp_path / f"fig{suffix}")
    head = path.read_bytes()[:400]
    assert magic in head if suffix == ".svg" else head.startswith(magic)
    assert path.stat().st_size > 10_000


def test_save_figure_width_and_errors(scene, tmp_path):
    fig = viz.topk_figure({"a": 0.7, "b": 0.2, "c": 0.1})
    for w in (2000, 2400, 3001):
        assert png(viz.save_figure(fig, tmp_path / f"w{w}.png", width_px=w)).shape[1] == w
    with pytest.raises(ValueError, match="unsupported figure format"):
        viz.save_figure(fig, tmp_path / "fig.jpg")
    img = viz.figure_to_image(fig, 1000)
    assert img.width == 1000 and img.mode == "RGB"


def test_no_pyplot_state():
    """viz never imports pyplot (no global figure registry, no GUI backend)."""
    code = (
        "import sys, numpy as np\n"
        "from vit_demo import viz\n"
        "fig = viz.heatmap_figure(np.zeros((32, 32, 3), np.uint8), np.eye(2))\n"
        "viz.figure_to_image(fig, 300)\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_colour_bars_legends_and_zero_differences(scene):
    """The app's pictures get a colour bar that says low / high and the scale; a chart never
    repeats a colour; a layer-difference chart of exact zeros says so instead of being empty."""
    from vit_demo.viz.charts import layer_diff_figure, method_colors

    pic = viz.overlay_image(scene["pic"], scene["cls"][-1, 0], size=300)
    out = viz.with_colorbar(pic, "viridis", "each map scaled to its own range")
    assert out.width == pic.width and out.height == pic.height + 46
    strip = np.asarray(out)[pic.height + 10, :, :]
    assert len({tuple(c) for c in strip}) > 50  # a gradient, not a flat strip
    names = ["attention", "rollout", "grad-rollout", "chefer", "lrp", "attnlrp", "lrp-gated", "gradcam",
             "integrated-gradients", "rise", "lrp-causal", "a-new-method", "another"]
    colours = method_colors(names)
    assert len(set(colours.values())) == len(names)
    fig = layer_diff_figure([0.0] * 12, "t", "s")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("0") == 12 and any("exactly 0" in t for t in texts)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:2] == ["1", "2"]  # layers from 1


def test_tiles_in_rows_of_columns() -> None:
    """Issue 46: on a phone the tiles come two a row (seven tiles: four rows), each as large as in one row."""
    import numpy as np
    from PIL import Image

    from vit_demo import viz

    pic = Image.new("RGB", (64, 64), (128, 128, 128))
    maps = {f"map {i}\nfor it": np.random.default_rng(i).random((4, 4)) for i in range(5)}
    one = viz.tiles_image(pic, maps, tile=100, pending=["late one", "late two"])
    two = viz.tiles_image(pic, maps, tile=100, pending=["late one", "late two"], columns=2)
    assert one.size == (7 * 100 + 6 * 12, 100 + 46)
    assert two.size == (2 * 100 + 12, 4 * (100 + 46) + 3 * 12)
    grey = np.asarray(two)[3 * (146 + 12) + 46 + 10, 10]  # row 4, column 1: the last placeholder (off its text)
    assert tuple(grey) == (236, 236, 236)
    assert viz.tiles_image(pic, maps, tile=100, columns=9).size == (5 * 100 + 4 * 12, 146)  # fewer tiles than columns
