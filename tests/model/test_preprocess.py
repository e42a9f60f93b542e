"""Preprocessing parity: our eval transform gives exactly the tensor timm's own
``create_transform(**resolve_data_config({}, model=m))`` gives, for several configs (crop_pct,
interpolation, mean/std, squash, non-square ResizeKeepRatio), on real photos; and the
extreme-aspect-ratio fast path agrees with a plain resize-then-crop within one grey level."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from timm.data import create_transform, resolve_data_config

from vit_demo.checkpoints.timm import data_config_from_timm
from vit_demo.images import load_image
from vit_demo.preprocess import DataConfig, center_box, model_input_image, preprocess, resized_size

# name -> data-config overrides; each is a different path through timm's eval transform
CONFIGS = {
    "deit_tiny_patch16_224": {},  # 0.9, bicubic, ImageNet mean/std: shorter side to 248
    "vit_base_patch16_clip_224.laion2b_ft_in12k_in1k": {},  # 0.95, CLIP mean/std
    "vit_base_patch16_224_miil.in21k": {},  # bilinear, 0.875, mean 0 / std 1
    "vit_base_patch16_clip_384.laion2b_ft_in1k": {},  # squash, crop_pct 1.0, 384 px
    "deit_tiny_patch16_224@256x384": {"input_size": (3, 256, 384)},  # non-square: ResizeKeepRatio
}
# Real photos bundled with scikit-image and matplotlib: 12 RGB (3 of them JPEGs) and 8 greyscale,
# from 102 px to 1411 px a side, square, landscape and portrait.
PHOTOS = [("skimage", f"data/{n}") for n in (
    "astronaut.png", "chelsea.png", "chessboard_RGB.png", "coffee.png", "color.png", "hubble_deep_field.jpg",
    "ihc.png", "motorcycle_left.png", "phantom.png", "retina.jpg", "rocket.jpg",
    "brick.png", "camera.png", "cell.png", "clock_motion.png", "coins.png", "page.png", "text.png", "microaneurysms.png",
)] + [("matplotlib", "mpl-data/sample_data/grace_hopper.jpg")]


def timm_config(key: str) -> dict:
    name = key.split("@")[0]
    tm = timm.create_model(name, pretrained=False, depth=1)  # one block: the config is all we need
    return resolve_data_config(CONFIGS[key], model=tm), tm


@pytest.fixture(scope="module")
def configs() -> dict[str, tuple[dict, DataConfig]]:
    out = {}
    for key in CONFIGS:
        cfg, tm = timm_config(key)
        dc = DataConfig.from_timm(cfg)
        if not CONFIGS[key]:
            assert data_config_from_timm(tm) == dc  # what port.from_timm attaches to a model
        out[key] = cfg, dc
    return out


@pytest.fixture(scope="module")
def photos() -> list:
    from vit_demo.app.examples import package_dir

    picked = [package_dir(pkg) / rel for pkg, rel in PHOTOS if package_dir(pkg) is not None]
    picked = [p for p in picked if p.is_file()]
    if len(picked) < len(PHOTOS):
        pytest.skip("needs scikit-image's and matplotlib's sample photos (pip install -c requirements.txt -e .)")
    modes = [Image.open(p).mode for p in picked]
    assert modes.count("L") >= 4 and len(picked) == 20
    return picked


def test_the_configs_really_differ(configs):
    seen = {(cfg["crop_pct"], cfg["interpolation"], cfg["crop_mode"], cfg["input_size"], cfg["mean"])
            for cfg, _ in configs.values()}
    assert len(seen) == len(CONFIGS)
    cfg, dc = configs["deit_tiny_patch16_224@256x384"]
    assert dc.input_size == (256, 384) and dc.scale_size == (284, 426)
    assert "ResizeKeepRatio" in repr(create_transform(**cfg))
    assert configs["vit_base_patch16_clip_384.laion2b_ft_in1k"][1].crop_mode == "squash"


@pytest.mark.parametrize("key", list(CONFIGS))
def test_same_tensor_as_timm_on_real_photos(configs, photos, key):
    cfg, dc = configs[key]
    tf = create_transform(**cfg)
    for path in photos:
        want = tf(Image.open(path).convert("RGB"))  # timm's ImageDataset loader
        got, pic = preprocess(load_image(path), dc)
        assert got.shape == want.shape == (3, *dc.input_size)
        assert torch.equal(got, want), f"{path.name}: max abs diff {(got - want).abs().max():.3g}"


@settings(max_examples=40, deadline=None)
@given(w=st.integers(1, 700), h=st.integers(1, 700), seed=st.integers(0, 2**16),
       key=st.sampled_from(list(CONFIGS)))
def test_same_tensor_as_timm_on_any_size(configs, w, h, seed, key):
    """Random noise at any size up to 700 px a side, tiny ones included (rounding corner cases),
    outside the fast path's territory: bit-identical."""
    cfg, dc = configs[key]
    rw, rh = resized_size(w, h, dc)
    ch, cw = dc.input_size
    if rw * rh > 16 * cw * ch:
        return  # the fast path: see the next test
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))
    assert torch.equal(preprocess(img, dc)[0], create_transform(**cfg)(img))


def resize_then_crop(cfg: dict):
    """timm's eval transform up to the picture (no ToTensor / Normalize): the plain path."""
    steps = create_transform(**cfg).transforms
    assert type(steps[-2]).__name__ == "MaybeToTensor" and type(steps[-1]).__name__ == "Normalize"
    return lambda img: [img := t(img) for t in steps[:-2]][-1]


# the last one Pillow itself resizes vertical pass first (h > 100 w, shrinking)
EXTREME = [(10, 1000), (1000, 7), (2, 600), (3, 2000), (1500, 13), (37, 4000), (260, 30000)]


@pytest.mark.parametrize("size", EXTREME, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("key", ["deit_tiny_patch16_224", "vit_base_patch16_224_miil.in21k",
                                 "deit_tiny_patch16_224@256x384"])
def test_extreme_aspect_fast_path_agrees_with_resize_then_crop(configs, size, key):
    """model_input_image resamples only the source box behind the crop (box=) instead of
    building a huge strip: same picture within one grey level. Noise is the worst case."""
    cfg, dc = configs[key]
    w, h = size
    rw, rh = resized_size(w, h, dc)
    assert rw * rh > 16 * dc.input_size[0] * dc.input_size[1]  # really on the fast path
    rng = np.random.default_rng(w * 7919 + h)
    for img in (Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)),
                Image.linear_gradient("L").resize((w, h)).convert("RGB")):
        fast = np.asarray(model_input_image(img, dc)).astype(int)
        plain = np.asarray(resize_then_crop(cfg)(img)).astype(int)
        assert fast.shape == plain.shape == (*dc.input_size, 3)
        assert np.abs(fast - plain).max() <= 1


@pytest.mark.parametrize("interpolation", ["nearest", "lanczos", "hamming"])
def test_fast_path_other_filters(interpolation):
    """The filters no timm ViT config uses here, against PIL's own resize-then-crop.
    ("box" is left out: at exact pixel-boundary ties the float32 box can pick the neighbour.)"""
    dc = DataConfig(interpolation=interpolation)
    for w, h in ((3, 2000), (1000, 7), (260, 30000)):
        img = Image.fromarray(np.random.default_rng(w + h).integers(0, 256, (h, w, 3), dtype=np.uint8))
        rw, rh = resized_size(w, h, dc)
        plain = img.resize((rw, rh), Image.Resampling[interpolation.upper()]).crop(center_box(rw, rh, 224, 224))
        assert np.abs(np.asarray(model_input_image(img, dc)).astype(int) - np.asarray(plain)).max() <= 1


def test_fast_path_on_a_3x5000_strip_matches_the_plain_path_row():
    """The plain path would need a 248 x 413333 (100 MP) intermediate; every row of that
    strip's crop is the same, so a 3 x 50 strip with the same columns gives the reference."""
    dc = DataConfig()
    cols = np.random.default_rng(0).integers(0, 256, (1, 3, 3), dtype=np.uint8)
    tall, short = (Image.fromarray(np.repeat(cols, n, axis=0)) for n in (5000, 50))
    fast = np.asarray(model_input_image(tall, dc)).astype(int)
    ref_row = np.asarray(short.resize(resized_size(3, 50, dc), Image.Resampling.BICUBIC)).astype(int)[0, 12:236]
    assert (fast == fast[:1]).all() and np.abs(fast[0] - ref_row).max() <= 1


def test_data_config_round_trip_and_validation():
    dc = DataConfig(input_size=(256, 384), interpolation="bilinear", crop_pct=0.95, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert DataConfig.from_dict(dc.to_dict()) == dc
    for bad in ({"interpolation": "sinc"}, {"crop_mode": "border"}, {"crop_pct": 0}, {"crop_pct": 1.5}):
        with pytest.raises(ValueError):
            DataConfig(**bad)
