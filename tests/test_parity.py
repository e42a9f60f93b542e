"""The scratch ViT equals timm's, family by family (random init, fp32), and on real weights."""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import perturbed_timm

from vit_demo.checkpoints.timm import config_from_timm, from_timm
from vit_demo.images import load_image
from vit_demo.labels import class_from_filename
from vit_demo.model import VisionTransformer
from vit_demo.preprocess import preprocess

TOL = 1e-4

# (timm name, kwargs, what it exercises). Reduced depth keeps CI fast; DeiT-Tiny at full depth.
FAMILIES = [
    ("vit_tiny_patch16_224", {}, "plain ViT, full depth"),
    ("vit_base_patch32_384", {"depth": 2}, "patch 32 at 384 px"),
    ("deit_tiny_patch16_224", {}, "DeiT, full depth"),
    ("deit_tiny_distilled_patch16_224", {"depth": 2}, "distillation token, two heads averaged"),
    ("deit3_small_patch16_224", {"depth": 2}, "LayerScale + no_embed_class"),
    ("vit_small_patch16_224.dino", {"depth": 2}, "headless (DINO): features"),
    ("vit_base_patch16_clip_quickgelu_224", {"depth": 2}, "CLIP: pre_norm, QuickGELU, eps 1e-5, no patch bias"),
    ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 224}, "4 register tokens, no_embed_class"),
    ("vit_base_patch16_reg4_gap_256", {"depth": 2}, "avg pool + fc_norm, no class token"),
]


@pytest.mark.parametrize("name,kwargs,what", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_matches_timm(name: str, kwargs: dict, what: str) -> None:
    tm = perturbed_timm(name, **kwargs)
    model, dc = from_timm(tm)
    assert isinstance(model, VisionTransformer)
    x = torch.randn(3, 3, *model.cfg.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tm(x)
        fast = model(x).logits
        captured = model(x, capture=True)
    assert fast.shape == ref.shape
    assert (fast - ref).abs().max().item() <= TOL, what
    assert (captured.logits - ref).abs().max().item() <= TOL, "capture path differs"
    assert torch.equal(fast.argmax(-1), ref.argmax(-1))
    assert len(captured.attentions) == model.cfg.depth
    n = model.cfg.num_prefix_tokens + model.cfg.grid_size[0] * model.cfg.grid_size[1]
    assert captured.attentions[0].shape == (3, model.cfg.num_heads, n, n)


def test_config_inferred_not_tabled() -> None:
    """The config comes from the instance: change timm's kwargs and the config follows."""
    tm = timm.create_model("vit_base_patch16_224", pretrained=False, depth=3, num_heads=4, embed_dim=128,
                           global_pool="avg", class_token=False, reg_tokens=2, qkv_bias=False, num_classes=7)
    cfg = config_from_timm(tm)
    assert (cfg.depth, cfg.num_heads, cfg.embed_dim, cfg.num_classes) == (3, 4, 128, 7)
    assert (cfg.global_pool, cfg.class_token, cfg.reg_tokens, cfg.qkv_bias, cfg.fc_norm) == ("avg", False, 2, False, True)


@pytest.mark.parametrize("size", [(256, 384), (224, 320), (160, 96)])
def test_non_square_input_matches_dynamic_timm(size: tuple[int, int]) -> None:
    tm = perturbed_timm("deit_tiny_patch16_224", dynamic_img_size=True, depth=4)
    model, _ = from_timm(tm)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, out = tm(x), model(x, capture=True)
    assert (model(x).logits - ref).abs().max().item() <= TOL
    assert (out.logits - ref).abs().max().item() <= TOL
    assert out.layout.grid == (size[0] // 16, size[1] // 16)


def test_unsupported_model_named() -> None:
    from functools import partial

    from timm.layers import GluMlp

    from vit_demo.checkpoints.files import UnsupportedModelError

    with torch.device("meta"):  # differential attention and parallel blocks are ported now: a GLU gated the other way
        tm = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, mlp_layer=partial(GluMlp, gate_last=True))
    with pytest.raises(UnsupportedModelError, match="vit_small_patch16_224: .*a GLU with its gate in the second half"):
        config_from_timm(tm)


@pytest.mark.slow  # 100 ImageNet photos
def test_real_deit_tiny_on_quick_subset(deit_tiny, deit_tiny_timm, quick_images) -> None:
    """Real weights, 100 real photos: same top-1 as timm everywhere, logits within 1e-4,
    accuracy at least 0.75."""
    x = torch.stack([preprocess(load_image(p), deit_tiny.data_config)[0] for p in quick_images])
    labels = torch.tensor([class_from_filename(p.name) for p in quick_images])
    with torch.inference_mode():
        ours = torch.cat([deit_tiny.model(c).logits for c in x.split(25)])
        ref = torch.cat([deit_tiny_timm(c) for c in x.split(25)])
    assert (ours - ref).abs().max().item() <= TOL
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    acc = (ours.argmax(-1) == labels).float().mean().item()
    assert acc >= 0.75, f"top-1 accuracy {acc:.2f} on the quick subset"


def test_real_deit_tiny_on_package_photos(deit_tiny, deit_tiny_timm, package_photos, labelled_photos) -> None:
    """Real weights, the photos that ship with matplotlib / scikit-image: same top-5 as timm,
    logits within 1e-4, and the expected class for the photos whose subject is an ImageNet class."""
    photos = list(package_photos.values())
    x = torch.stack([preprocess(load_image(p), deit_tiny.data_config)[0] for p in photos])
    with torch.inference_mode():
        ours, ref = deit_tiny.model(x).logits, deit_tiny_timm(x)
    assert (ours - ref).abs().max().item() <= TOL
    assert torch.equal(ours.topk(5).indices, ref.topk(5).indices)
    top1 = dict(zip(photos, ours.argmax(-1).tolist()))
    for path, accepted in labelled_photos:
        assert deit_tiny.labels[top1[path]] in accepted, (path.name, deit_tiny.labels[top1[path]])
