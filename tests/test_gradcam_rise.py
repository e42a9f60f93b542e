"""GradCAM against pytorch-grad-cam 1.5.7, RISE against a mask-by-mask reference, and the
gated LRP map against its definition. Each on the real DeiT-Tiny and on small random models
with register tokens, a distillation token and no [class] token, batch-safe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vit_demo.explain import METHODS, attention_gradients, grad_rollout
from vit_demo.gradcam import gradcam
from vit_demo.lrp import cp_lrp_map
from vit_demo.perturb import RiseSettings, rise, rise_masks

NARROW = {"depth": 2, "embed_dim": 96, "num_heads": 3, "num_classes": 10}
SMALL = {
    "vit_small_patch14_reg4_dinov2": {"img_size": 224},
    "vit_base_patch16_reg4_gap_256": {"img_size": 224},
    "deit_tiny_distilled_patch16_224": {},
}


@pytest.fixture(scope="module", params=list(SMALL))
def small_pair(request):
    import timm

    from vit_demo.port import from_timm

    torch.manual_seed(0)
    tm = timm.create_model(request.param, pretrained=False, **NARROW, **SMALL[request.param]).eval()
    model, _ = from_timm(tm)
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    return request.param, tm, model, x


def grad_cam_library(tm, x, target, num_prefix, grid):
    """pytorch-grad-cam's GradCAM on timm's blocks[-1].norm1 with the ViT reshape transform
    (prefix tokens dropped, tokens laid on the grid), kept at grid resolution: [B, gh, gw]
    min-max scaled as the library scales it."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    gh, gw = grid

    def reshape(t):
        return t[:, num_prefix:].reshape(t.shape[0], gh, gw, t.shape[-1]).permute(0, 3, 1, 2)

    with GradCAM(model=tm, target_layers=[tm.blocks[-1].norm1], reshape_transform=reshape) as cam:
        cam.get_target_width_height = lambda input_tensor: (gw, gh)  # no upsampling: compare on the grid
        return torch.from_numpy(cam(x, targets=[ClassifierOutputTarget(int(c)) for c in target]))


def scaled(m):
    """Each map divided by its maximum. The library min-max scales twice (per layer, then after
    averaging the layers), each time over (1e-7 + max); on a ReLU map (min 0) the result is the
    map over its max up to that epsilon, which is not small next to a random model's tiny CAM:
    so both sides are compared max-scaled."""
    return m / m.amax(dim=(1, 2), keepdim=True)


def test_gradcam_matches_pytorch_grad_cam_on_deit_tiny(deit_tiny, deit_tiny_timm, package_photos):
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    x = torch.stack([preprocess(load_image(package_photos[n]), deit_tiny.data_config)[0] for n in ("coffee", "chelsea")])
    t = torch.tensor([0, 370])
    ours = gradcam(deit_tiny.model, x, t)
    assert ours.shape == (2, 14, 14) and bool((ours >= 0).all()) and float(ours.max()) > 0
    ref = grad_cam_library(deit_tiny_timm, x, t, num_prefix=1, grid=(14, 14))
    torch.testing.assert_close(scaled(ours), scaled(ref), atol=1e-5, rtol=0)


def test_gradcam_token_variants_and_batches(small_pair):
    name, tm, model, x = small_pair
    t = torch.tensor([1, 2, 3, 4])
    p = model.cfg.patch_size
    grid = (224 // p, 224 // p)
    ours = gradcam(model, x, t)
    assert ours.shape == (4, *grid)
    ref = grad_cam_library(tm, x, t, model.cfg.num_prefix_tokens, grid)
    torch.testing.assert_close(scaled(ours), scaled(ref), atol=1e-5, rtol=0)
    for b in range(4):
        torch.testing.assert_close(gradcam(model, x[b : b + 1], t[b : b + 1]), ours[b : b + 1], atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------------------- RISE


def naive_rise(model, x, target, masks):
    """One image, one mask at a time, pixel by pixel blending toward 0; the contrast estimator
    written as explicit sums, float64."""
    p = model.cfg.patch_size
    M, gh, gw = masks.shape
    scores = []
    for m in range(M):
        xm = x.clone()
        for r in range(gh):
            for c in range(gw):
                xm[:, r * p : (r + 1) * p, c * p : (c + 1) * p] *= float(masks[m, r, c])
        with torch.no_grad():
            scores.append(float(model(xm[None]).logits.softmax(-1)[0, target]))
    out = np.zeros((gh, gw))
    for r in range(gh):
        for c in range(gw):
            w = [float(masks[m, r, c]) for m in range(M)]
            shown = sum(s * wi for s, wi in zip(scores, w)) / sum(w)
            hidden = sum(s * (1 - wi) for s, wi in zip(scores, w)) / sum(1 - wi for wi in w)
            out[r, c] = shown - hidden
    return torch.from_numpy(out)


def test_rise_masks_are_seeded():
    s = RiseSettings(masks=64, cell=2, keep=0.5, seed=3)
    a, b = rise_masks((14, 14), s), rise_masks((14, 14), s)
    assert a.shape == (64, 14, 14) and torch.equal(a, b)
    assert not torch.equal(a, rise_masks((14, 14), RiseSettings(masks=64, seed=4)))
    assert 0.0 <= float(a.min()) and float(a.max()) <= 1.0
    assert abs(float(a.mean()) - 0.5) < 0.1  # about half the image shown


def test_rise_matches_naive_and_batches(small_pair):
    name, _, model, x = small_pair
    s = RiseSettings(masks=12, seed=5, chunk=7)  # a chunk size that splits images across passes
    t = torch.tensor([1, 2, 3, 4])
    p = model.cfg.patch_size
    grid = (224 // p, 224 // p)
    got = rise(model, x, t, s)
    assert got.shape == (4, *grid)
    masks = rise_masks(grid, s)
    torch.testing.assert_close(got[0].double(), naive_rise(model, x[0], 1, masks), atol=1e-5, rtol=0)
    for b in range(4):
        torch.testing.assert_close(rise(model, x[b : b + 1], t[b : b + 1], s), got[b : b + 1], atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------------------- gated LRP, the registry


def test_gated_lrp_is_its_definition(small_pair):
    name, _, model, x = small_pair
    got = METHODS["lrp-gated"](model, x, None)
    ag = attention_gradients(model, x, None)
    want = cp_lrp_map(model, x, ag.target).clamp(min=0) * grad_rollout(ag.attentions, ag.grads, ag.layout)
    torch.testing.assert_close(got, want)
    for b in range(4):
        torch.testing.assert_close(METHODS["lrp-gated"](model, x[b : b + 1], None), got[b : b + 1], atol=1e-6, rtol=1e-4)


def test_registry_has_the_new_methods():
    assert list(METHODS)[4:] == ["lrp", "attnlrp", "gradcam", "rise", "lrp-gated"]
