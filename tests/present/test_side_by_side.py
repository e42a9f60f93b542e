"""Side by side (vit_demo.present.side_by_side): one colour scale across images, the maps are the
methods' own, and two models on one image show their own predictions."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from skimage import data

from vit_demo import viz
from vit_demo.methods.attention import cls_attention
from vit_demo.methods.gradients import attention_gradients, chefer_relevance
from vit_demo.preprocess import preprocess
from vit_demo.present import side_by_side


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    return [Image.fromarray(data.chelsea()), Image.fromarray(data.coffee()), Image.fromarray(data.astronaut())]


def _panel(value: float, seed: int) -> side_by_side.Panel:
    rng = np.random.default_rng(seed)
    pic = Image.fromarray(rng.integers(0, 255, (224, 224, 3), dtype=np.uint8))
    return side_by_side.Panel(pic, rng.random((14, 14)).astype(np.float32) * value, [{"label": f"c{seed}", "prob": 0.5}])


def _colorbar_range(fig) -> tuple[float, float]:
    return fig.axes[-1].get_xlim()  # the horizontal colour bar is the last axes


def test_one_scale_for_all_images_or_each_its_own():
    panels = [_panel(1.0, 0), _panel(5.0, 1), _panel(0.2, 2)]
    fig = side_by_side.images_figure(panels, ["a", "b", "c"], label="relevance", shared_scale=True)
    lo, hi = _colorbar_range(fig)
    assert lo == pytest.approx(min(float(p.map.min()) for p in panels))
    assert hi == pytest.approx(max(float(p.map.max()) for p in panels))
    assert len(fig.axes) == 2 * 3 + 1
    assert [fig.axes[i].get_title() for i in range(3)] == ["a", "b", "c"]
    assert "c1  50.0%" in [ax.get_xlabel() for ax in fig.axes]
    own = side_by_side.images_figure(panels, show_inputs=False)  # the default: each map its own scale, said so
    assert _colorbar_range(own) == (0.0, 1.0) and len(own.axes) == 3 + 1
    assert "own min–max" in own.axes[-1].get_xlabel()
    with pytest.raises(ValueError, match="1 to 4"):
        side_by_side.images_figure([_panel(1.0, i) for i in range(5)])


def test_method_maps_are_the_methods_own(deit_tiny, photos):
    x, _ = preprocess(photos[0], deit_tiny.data_config)
    ag = attention_gradients(deit_tiny.model, x[None])
    p = side_by_side.method_map(deit_tiny, photos[0], "chefer")
    np.testing.assert_allclose(p.map, chefer_relevance(ag.attentions, ag.grads, ag.layout)[0].numpy(), atol=1e-6)
    assert p.target == int(ag.target[0]) and p.predictions[0]["index"] == p.target
    att = side_by_side.method_map(deit_tiny, photos[0], "attention", layer=3, head=1)
    np.testing.assert_allclose(att.map, cls_attention(ag.attentions, ag.layout, 3, 1)[0].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="unknown method"):
        side_by_side.method_map(deit_tiny, photos[0], "saliency")


def test_compare_images_and_two_models(deit_tiny, photos, tmp_path):
    from vit_demo.checkpoints.load import load_model

    fig = side_by_side.compare_images(deit_tiny, photos, ["cat", "coffee", "astronaut"], "rollout")
    out = viz.save_figure(fig, tmp_path / "images.png", width_px=1200)
    assert Image.open(out).width == 1200
    assert "Attention rollout" in fig.get_suptitle()
    other = load_model("deit_tiny_patch16_224", random_init=True, device="cpu")
    fig2 = side_by_side.compare_models([deit_tiny, other], photos[0], "attention", layer=11)
    assert "layer 12 of 12" in fig2.get_suptitle()  # layer=11 is the index; people read the 12th of 12
    titles = [ax.get_title().replace("\n", " ") for ax in fig2.axes[:2]]
    assert titles == [deit_tiny.name, other.name]
    captions = [ax.get_xlabel() for ax in fig2.axes[2:4]]
    trained = side_by_side.method_map(deit_tiny, photos[0], "attention", layer=11)
    assert captions[0].splitlines()[0].startswith(trained.predictions[0]["label"])
    assert captions[0] != captions[1]  # random weights predict something else, with other confidence
    with pytest.raises(ValueError, match="outside"):
        side_by_side.compare_models([deit_tiny, other], photos[0], "attention", layer=12)
