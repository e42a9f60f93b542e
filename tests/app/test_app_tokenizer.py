"""What the Patches and Attention tabs say about how a model makes its tokens and where it reads
its answer: the convolutional stem of the default trained model (CCT's tokenizer, no [class]
token) described as it is, with its receptive field measured on the model; the plain ViT's
caption as it was; the attention notes and the query menu true for a model without [class]."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from vit_demo import viz
from vit_demo.analysis import Analysis, analyze
from vit_demo.app.session import Upload
from vit_demo.app.tabs.attention import CLASS_TOKEN, PATCH_QUERY, export_attention, query_and_note, query_choices
from vit_demo.app.tabs.patches import patch_caption, sequence_tokenizer, stem_picture
from vit_demo.checkpoints.load import LoadedModel
from vit_demo.methods.stem import receptive_field, stem_stages
from vit_demo.model import VisionTransformer
from vit_demo.train.recipe import scratch_config, scratch_data_config

PLAIN_CAPTION = (
    "**4×4-px patches → a 8×8 grid = 64 patches**, numbered in the order the transformer reads them (left to right, "
    "top to bottom). Each patch becomes one 96-number vector; the sequence is `[class]` + 64 patches = **65 tokens**. "
    "The **[class] token** is an extra token with no piece of the picture: through attention it gathers what the "
    "patches say, and the model reads its answer from it alone. Click a patch to make it the query in the attention "
    "explorer.")


def scratch(stem: str, **changes) -> LoadedModel:
    torch.manual_seed(0)
    model = VisionTransformer(replace(scratch_config(32, 4, stem=stem), **changes)).init_weights()
    nn.init.normal_(model.head.weight, std=0.5)
    return LoadedModel(model.eval(), scratch_data_config(32), f"scratch-{stem}", "random weights", None,
                       random_weights=True)


@pytest.fixture(scope="module")
def shape_picture() -> Image.Image:
    img = Image.new("RGB", (32, 32), (30, 40, 200))
    img.paste((40, 200, 60), (8, 10, 22, 24))
    return img


def analysed(lm: LoadedModel, img: Image.Image) -> Analysis:
    return analyze(lm, img)


def test_plain_vit_caption_as_before(shape_picture: Image.Image) -> None:
    lm = scratch("patch")
    a = analysed(lm, shape_picture)
    assert patch_caption(a, lm) == PLAIN_CAPTION and sequence_tokenizer(lm) is None


def test_conv_stem_caption_says_what_the_stem_does(shape_picture: Image.Image) -> None:
    lm = scratch("conv")
    a = analysed(lm, shape_picture)
    text = patch_caption(a, lm)
    assert "**convolutional stem**" in text and "flatten" not in text, text
    assert ("2 stages, each a 3×3 convolution with BatchNorm and ReLU, then a 3×3 max-pool of stride 2 that halves the "
            "picture (32×32 → 16×16 → 8×8 px; 32, then 64 channels), then a 1×1 convolution") in text
    assert "one token sees 13×13 pixels of the picture, more than its own 4×4 cell" in text
    assert "**no [class] token**" in text and "**mean of the patch tokens**" in text and "65 tokens" not in text
    assert "64 patches = **64 tokens**" in text and "alone" not in text
    # the stride-2 stem (no pools): its own words and field
    lm2 = scratch("conv", stem_pool=False)
    text2 = patch_caption(analysed(lm2, shape_picture), lm2)
    assert "each a 3×3 convolution of stride 2, which halves the picture" in text2 and "7×7 pixels" in text2


def measured_field(lm: LoadedModel, row: int, col: int) -> tuple[int, int]:
    """How many rows, and how many columns, of input pixels change token (row, col) when set very
    high, a whole row or column at a time (convolutions and BatchNorm made positive, so that such
    pixels win every max-pool and pass every ReLU they reach)."""
    pe = lm.model.patch_embed
    with torch.no_grad():
        for m in pe.modules():
            if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)):
                m.weight.abs_()
        base = torch.zeros(1, 3, 32, 32)
        probe = base.repeat(64, 1, 1, 1)
        for i in range(32):
            probe[i, :, i, :] = 1000.0  # row i
            probe[32 + i, :, :, i] = 1000.0  # column i
        tokens, (_, gw) = pe(torch.cat([base, probe]))
    t = tokens[:, row * gw + col]
    hit = ((t[1:] - t[0]).abs().amax(-1) > 1e-3).numpy()
    return int(hit[:32].sum()), int(hit[32:].sum())


def test_receptive_field_is_measured() -> None:
    for changes, side in (({}, 13), ({"stem_pool": False}, 7)):
        lm = scratch("conv", **changes)
        assert receptive_field(lm.model) == side
        assert measured_field(lm, 4, 4) == (side, side)  # an inner token: the whole field inside the picture


def test_stem_stages_and_pictures(shape_picture: Image.Image) -> None:
    lm = scratch("conv")
    a = analysed(lm, shape_picture)
    stages = stem_stages(lm.model, a.x)
    assert [(s.name, s.channels, tuple(s.map.shape)) for s in stages] == [
        ("stage 1", 32, (16, 16)), ("stage 2", 64, (8, 8)), ("tokens", 96, (8, 8))]
    with torch.no_grad():
        tokens = lm.model.patch_embed(a.x)[0][0]
    torch.testing.assert_close(stages[-1].map.flatten(), tokens.norm(dim=-1))
    pic = stem_picture(a, lm)
    assert pic.height > 150 and pic.width > 4 * 150 and np.asarray(pic).std() > 0
    with pytest.raises(ValueError, match="no convolutional stem"):
        stem_stages(scratch("patch").model, a.x)
    # the sequence picture says how the tokens are made (the plain model's words otherwise)
    words = sequence_tokenizer(lm)
    assert words and "convolutional stem" in words and "flatten" not in words
    plain = viz.sequence_image(a.picture, 4, [], None, 900, 96)
    assert np.asarray(viz.sequence_image(a.picture, 4, [], None, 900, 96, words)).tobytes() != np.asarray(plain).tobytes()


def test_attention_notes_without_a_class_token(shape_picture: Image.Image) -> None:
    lm = scratch("conv")
    a = analysed(lm, shape_picture)
    q, note = query_and_note(a, PATCH_QUERY, 500)
    assert q is None and "showing the mean of the patch queries (no [class] token)" in note and "[class] token." not in note
    assert query_choices(a) == [("the mean of the patch queries (no [class] token)", CLASS_TOKEN),
                                (PATCH_QUERY, PATCH_QUERY)]
    plain = scratch("patch")
    b = analysed(plain, shape_picture)
    assert "showing the [class] token." in query_and_note(b, PATCH_QUERY, 500)[1]
    assert query_choices(b) == [(CLASS_TOKEN, CLASS_TOKEN), (PATCH_QUERY, PATCH_QUERY)]
    up = Upload(shape_picture, "shape.png", (32, 32))
    assert "mean-of-patches" in export_attention(a, up, 3, "mean", None, "inferno", 0.6, True).name


def test_rollout_caption_and_deck_name_the_reader(shape_picture: Image.Image) -> None:
    """The Rollout & relevance caption and the deck's slides say whose attention they show: the [class]
    token for the plain ViT, the patch tokens on average for the default trained model (no [class])."""
    from vit_demo.app.tabs.relevance import methods_caption
    from vit_demo.present import deck

    for stem, reader, absent in (("patch", "the [class] token", "the patch tokens, on average"),
                                 ("conv", "the patch tokens, on average", "[class] token (the extra")):
        lm = scratch(stem)
        a = analysed(lm, shape_picture)
        cap = methods_caption(a, "mean", 0.0, 0, None)
        assert f"where {reader}" in cap and absent not in cap, cap
        slides = [deck.tokens_slide(a, "x", 400), deck.heads_slide(a, "x", 400, "inferno"),
                  deck.layers_slide(a, "x", 400, "inferno")]
        text = " ".join(f"{s.notes} {s.subtitle}" for s in slides)
        assert reader in text
        if stem == "conv":
            assert "[class] token" not in text.replace("no [class] token", ""), text
