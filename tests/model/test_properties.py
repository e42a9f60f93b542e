"""Property tests (hypothesis): any image of any size and mode becomes a finite model input of
the configured size, and the whole prediction pipeline on a small random model gives finite
logits and proper attention distributions."""

from __future__ import annotations

import io

import numpy as np
import pytest
import timm
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vit_demo.checkpoints.timm import from_timm
from vit_demo.images import load_image
from vit_demo.methods.attention import cls_attention
from vit_demo.methods.rollout import rollout
from vit_demo.preprocess import DataConfig, preprocess, to_tensor

MODES = ("L", "RGB", "RGBA", "P", "CMYK", "I;16", "LA", "1")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

side = st.integers(1, 600)
sizes = st.one_of(
    st.tuples(side, side),
    st.tuples(st.integers(1, 4), st.integers(300, 600)),  # extreme aspect ratios, both ways
    st.tuples(st.integers(300, 600), st.integers(1, 4)),
)


def make_image(mode: str, size: tuple[int, int], seed: int, transparency: bool = False) -> Image.Image:
    """A random picture of ``size`` (w, h) in ``mode``."""
    w, h = size
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))
    if mode == "1":
        return Image.fromarray(rng.integers(0, 2, (h, w)).astype(bool))
    bands = len(Image.new(mode, (1, 1)).getbands())
    img = Image.frombytes(mode, size, rng.integers(0, 256, w * h * bands, dtype=np.uint8).tobytes())
    if mode == "P":
        img.putpalette(rng.integers(0, 256, 768, dtype=np.uint8).tobytes())
        if transparency:
            img.info["transparency"] = int(rng.integers(0, 256))
    return img


def encode(img: Image.Image) -> bytes:
    """The file a user would upload: PNG where PNG can hold the mode, else TIFF (CMYK)."""
    b = io.BytesIO()
    kw = {"transparency": img.info["transparency"]} if "transparency" in img.info else {}
    img.save(b, "TIFF" if img.mode == "CMYK" else "PNG", **kw)
    return b.getvalue()


data_configs = st.builds(
    DataConfig,
    input_size=st.sampled_from([(224, 224), (256, 384), (96, 64), (32, 32)]),
    interpolation=st.sampled_from(["bicubic", "bilinear", "nearest", "lanczos"]),
    crop_pct=st.sampled_from([0.875, 0.9, 0.95, 1.0, 0.5]),
    crop_mode=st.sampled_from(["center", "squash"]),
    mean=st.sampled_from([(0.485, 0.456, 0.406), (0.5, 0.5, 0.5), (0.0, 0.0, 0.0)]),
    std=st.sampled_from([(0.229, 0.224, 0.225), (0.5, 0.5, 0.5), (1.0, 1.0, 1.0)]),
)


@SETTINGS
@given(mode=st.sampled_from(MODES), size=sizes, seed=st.integers(0, 2**16), via_file=st.booleans(),
       transparency=st.booleans(), dc=data_configs)
def test_any_image_becomes_a_finite_model_input(mode, size, seed, via_file, transparency, dc):
    img = make_image(mode, size, seed, transparency)
    rgb = load_image(encode(img) if via_file else img)
    assert rgb.mode == "RGB" and rgb.size == size
    x, pic = preprocess(rgb, dc)
    assert x.shape == (3, *dc.input_size) and x.dtype == torch.float32
    assert torch.isfinite(x).all()
    assert pic.mode == "RGB" and pic.size == dc.input_size[::-1]
    assert torch.equal(x, to_tensor(pic, dc))
    lo = (0 - torch.tensor(dc.mean)) / torch.tensor(dc.std)
    hi = (1 - torch.tensor(dc.mean)) / torch.tensor(dc.std)
    assert (x >= lo[:, None, None] - 1e-6).all() and (x <= hi[:, None, None] + 1e-6).all()


@SETTINGS
@given(mode=st.sampled_from(["L", "I;16", "1", "RGB"]), size=st.tuples(st.integers(1, 40), st.integers(1, 40)),
       seed=st.integers(0, 2**16), via_file=st.booleans())
def test_conversion_to_rgb_is_exact(mode, size, seed, via_file):
    """Greyscale levels are copied to R = G = B; 16-bit maps v -> round(v / 257); 1-bit to 0/255."""
    img = make_image(mode, size, seed)
    got = np.asarray(load_image(encode(img) if via_file else img)).astype(np.int64)
    src = np.asarray(img).astype(np.int64)
    want = {"L": src, "I;16": np.round(src / 257.0), "1": src * 255}.get(mode)
    if mode == "RGB":
        assert np.array_equal(got, src)
    else:
        assert all(np.array_equal(got[..., c], want) for c in range(3))


# ----------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def tiny_model():
    """timm's DeiT-Tiny architecture, 2 blocks, random weights, ported (fast on the CPU)."""
    torch.manual_seed(0)
    model, dc = from_timm(timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=2))
    return model, dc


images = st.tuples(st.sampled_from(MODES), sizes, st.integers(0, 2**16))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batch=st.lists(images, min_size=1, max_size=3), input_size=st.sampled_from([(224, 224), (160, 256), (96, 64)]))
def test_predict_pipeline_is_finite_and_attention_rows_sum_to_one(tiny_model, batch, input_size):
    model, dc = tiny_model
    dc = dc.with_size(input_size)
    x = torch.stack([preprocess(load_image(make_image(m, s, seed)), dc)[0] for m, s, seed in batch])
    with torch.inference_mode():
        out = model(x, capture=True)
        plain = model(x).logits
    B, (h, w) = len(batch), input_size
    gh, gw = h // 16, w // 16
    N = 1 + gh * gw
    assert out.logits.shape == (B, 1000) and torch.isfinite(out.logits).all()
    assert torch.allclose(out.logits, plain, atol=1e-4, rtol=1e-4)  # capturing changes nothing
    assert out.layout.grid == (gh, gw) and len(out.attentions) == 2
    for a in out.attentions:
        assert a.shape == (B, 3, N, N) and torch.isfinite(a).all() and (a >= 0).all()
        assert torch.allclose(a.sum(-1), torch.ones(B, 3, N), atol=1e-5)
    assert torch.isfinite(out.logits.softmax(-1)).all()

    for m in (rollout(out.attentions, out.layout), cls_attention(out.attentions, out.layout, -1)):
        assert m.shape == (B, gh, gw) and torch.isfinite(m).all() and (m >= 0).all()
        assert (m.sum((-2, -1)) <= 1 + 1e-5).all()  # [class] row minus its prefix share
