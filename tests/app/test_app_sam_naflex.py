"""What the app and ``predict`` do with the families that are not a fixed square of patches, on
tiny random models: a NaFlex model keeps the picture's aspect ratio (a 4:3 photo becomes a 4:3
patch grid within the patch budget, timm's NaFlex transform to the pixel), and SAM's encoder
(windowed attention, no classifier) has its windows drawn on the patch grid, its maps zero
outside a query's window, and every class-specific method named as not offered, with why."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vit_demo import methods, viz
from vit_demo.analysis import analyze
from vit_demo.app.tabs.attention import HEAD_MEAN, attention_maps, attention_view, query_picture
from vit_demo.app.tabs.patches import patch_caption, patch_picture
from vit_demo.app.tabs.relevance import methods_caption
from vit_demo.checkpoints.load import LoadedModel
from vit_demo.checkpoints.timm import from_timm
from vit_demo.predict import predict_images
from vit_demo.preprocess import fit_to_sequence, preprocess, sequence_size

TINY = dict(depth=1, embed_dim=32, num_heads=2)


def tiny(name: str, **kwargs) -> LoadedModel:
    torch.manual_seed(0)
    model, dc = from_timm(timm.create_model(name, pretrained=False, **TINY, **kwargs).eval())
    return LoadedModel(model, dc, name, "random weights", name, random_weights=True)


@pytest.fixture(scope="module")
def photo_4x3(package_photos: dict[str, Path]) -> Image.Image:
    img = Image.open(package_photos["chelsea"]).convert("RGB")  # 451 x 300
    return img.crop((0, 0, 400, 300))


def test_sequence_size_is_timms() -> None:
    """The NaFlex size rule against timm's own, on shapes from a strip to a square, budgets of
    a small and a large model."""
    from timm.data.naflex_transforms import get_image_size_for_seq

    for h, w in [(300, 400), (480, 640), (640, 480), (224, 224), (100, 900), (1000, 37), (17, 23)]:
        for patch, budget in [(16, 576), (16, 256), (14, 1024)]:
            assert sequence_size(h, w, patch, budget) == get_image_size_for_seq((h, w), patch, budget)[1], (h, w, patch)


def test_naflex_keeps_the_aspect_ratio(photo_4x3: Image.Image, tmp_path: Path) -> None:
    lm = tiny("naflexvit_base_patch16_gap", pos_embed_grid_size=(4, 4))
    budget = math.prod(s // 16 for s in lm.data_config.input_size)
    assert budget == 576  # 384 x 384 px of 16-px patches
    # timm's NaFlex evaluation transform gives the same tensor
    dc = lm.data_config
    ref = timm.data.create_transform(input_size=(3, *dc.input_size), interpolation=dc.interpolation, mean=dc.mean,
                                     std=dc.std, naflex=True, patch_size=16, max_seq_len=budget)(photo_4x3)
    x = preprocess(photo_4x3, lm.input_config(photo_4x3.size))[0]
    assert x.shape == ref.shape and torch.equal(x, ref)
    a = analyze(lm, photo_4x3)
    gh, gw = a.layout.grid
    assert (gh, gw) == (21, 27) and gh * gw <= budget < (gh + 1) * (gw + 1)
    assert abs(gh - gw * 3 / 4) < 1  # rows : columns is 3 : 4 within one patch
    w, h = patch_picture(a).size
    assert (w // gw, h // gh) == (32, 32) and "NaFlex" in patch_caption(a, lm)  # the grid drawn as it is
    # predict: two shapes in one batch, each with its own grid (3:4 and 4:3), in order
    photo_4x3.save(tmp_path / "wide.png")
    photo_4x3.transpose(Image.Transpose.ROTATE_90).save(tmp_path / "tall.png")
    out = predict_images(lm, [tmp_path / "wide.png", tmp_path / "tall.png"], k=3, progress=False)
    assert [r["input_size"] for r in out] == [[336, 432], [432, 336]]
    probs = lm.model(x[None]).logits.softmax(-1)[0]
    assert [t["index"] for t in out[0]["topk"]] == probs.topk(3).indices.tolist()
    fit = fit_to_sequence(dc, (400, 300), 16)  # resize to the whole grid, crop nothing
    assert (fit.input_size, fit.crop_pct, fit.crop_mode) == ((336, 432), 1.0, "squash")
    fixed = tiny("vit_small_patch16_224", img_size=32)  # a fixed-size model keeps its transform
    assert fixed.input_config((400, 300)) is fixed.data_config


SAM = dict(img_size=96, window_size=4, global_attn_indexes=(1,), neck_chans=16)


def test_sam_windows_drawn_and_explained(photo_4x3: Image.Image) -> None:
    torch.manual_seed(0)
    model, dc = from_timm(timm.create_model("samvit_base_patch16", pretrained=False, depth=3, embed_dim=32,
                                            num_heads=2, **SAM).eval())
    lm = LoadedModel(model, dc.with_size((96, 96)), "sam", "random weights", "samvit_base_patch16")
    a = analyze(lm, photo_4x3)
    assert (a.windows, a.window, a.layout.grid, a.logits.numel()) == ((4, 0, 4), 4, (6, 6), 0)
    # the patch grid with the window borders: green after 4 patches, a plain grid line after 1
    pic = np.asarray(patch_picture(a))
    cell = pic.shape[1] // 6
    assert tuple(pic[cell // 2, 4 * cell]) == viz.WINDOW_RGB and tuple(pic[cell // 2, cell]) != viz.WINDOW_RGB
    picker = np.asarray(query_picture(a, None))  # the attention tab's click target too
    assert tuple(picker[picker.shape[0] // 12, picker.shape[1] * 4 // 6]) == viz.WINDOW_RGB
    # a windowed layer: patch 0 sees only its 4 x 4 window; the global layer sees the whole grid
    m0 = attention_maps(a, 0, HEAD_MEAN, 0)
    assert m0[4:].abs().max() == 0 and m0[:, 4:].abs().max() == 0 and m0[:4, :4].sum().item() == pytest.approx(1, abs=1e-5)
    m1 = attention_maps(a, 1, HEAD_MEAN, 0)
    assert m1[4:].sum() > 0.05 and m1.sum().item() == pytest.approx(1, abs=1e-5)
    assert "within 4×4-patch windows" in attention_view(a, 0, HEAD_MEAN, 0)[1]
    assert "global layers" in attention_view(a, 1, HEAD_MEAN, None)[1]
    assert "layer 2 attends over the whole grid" in patch_caption(a, lm)
    # no classifier, in words, each class-specific method named
    caption = methods_caption(a, "mean", 0.0, 0, None)
    assert "predicts no classes" in caption
    assert all(methods.get(n).title in caption for n in methods.names(class_specific=True))
