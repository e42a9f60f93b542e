"""Integrated Gradients against the paper: a naive one-step-at-a-time Riemann sum, completeness
(the attributions add up to F(x) - F(baseline)), and on a real photo a map that deletes better
than random patch orders. The registry contract (shape, batching, target) is test_methods_contract."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vit_demo.evaluate.curves import method_curves
from vit_demo.methods.integrated_gradients import black, integrated_gradients, integrated_gradients_map
from vit_demo.model import VisionTransformer, ViTConfig
from vit_demo.preprocess import preprocess


def small_model() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(img_size=(32, 48), patch_size=16, embed_dim=32, depth=2, num_heads=2,
                                       num_classes=5)).eval()


def naive_ig(model, x, target: int, steps: int) -> torch.Tensor:
    """Sundararajan et al., Eq. 3: (x - x') * (1/m) sum_k dF(x' + k/m (x - x'))/dx, one step at a time."""
    base = black(x[None])[0]
    total = torch.zeros_like(x)
    for k in range(1, steps + 1):
        point = (base + k / steps * (x - base))[None].clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(model(point).logits[0, target], point)
        total += grad[0]
    return (x - base) * total / steps


def test_black_is_pixel_zero():
    x = torch.zeros(1, 3, 2, 2)
    b = black(x)
    torch.testing.assert_close(b[0, :, 0, 0], torch.tensor([-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225]))


def test_matches_the_naive_sum_and_batches():
    model = small_model()
    x = torch.randn(3, 3, 32, 48, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0, 3, 4])
    got = integrated_gradients(model, x, t, steps=16)
    for b in range(3):
        torch.testing.assert_close(got[b], naive_ig(model, x[b], int(t[b]), 16), atol=1e-5, rtol=1e-4)
    m = integrated_gradients_map(model, x, t)
    assert m.shape == (3, 2, 3)
    torch.testing.assert_close(m.sum(dim=(1, 2)), got.sum(dim=(1, 2, 3)), atol=1e-4, rtol=1e-4)  # patches sum it all


def test_completeness():
    """The attributions sum to F(x) - F(x'), up to the Riemann sum's error (many steps: small)."""
    model = small_model()
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([1, 2])
    with torch.no_grad():
        gap = model(x).logits.gather(1, t[:, None])[:, 0] - model(black(x)).logits.gather(1, t[:, None])[:, 0]
    total = integrated_gradients(model, x, t, steps=256).sum(dim=(1, 2, 3))
    torch.testing.assert_close(total, gap, atol=0.02 * float(gap.abs().max()), rtol=0)
    coarse = integrated_gradients(model, x, t, steps=4).sum(dim=(1, 2, 3))
    assert (coarse - gap).abs().max() > (total - gap).abs().max()  # more steps, closer


@pytest.mark.slow  # the deletion protocol
def test_deletes_better_than_random_on_a_photo(deit_tiny, package_photos):
    x = preprocess(Image.open(package_photos["coffee"]).convert("RGB"), deit_tiny.data_config)[0][None]
    t = deit_tiny.model(x).logits.argmax(-1)
    m = integrated_gradients_map(deit_tiny.model, x, t)
    d, i = method_curves(deit_tiny.model, x, [m], t, [torch.Generator().manual_seed(s) for s in range(3)])
    ig, rnd = d[0, 0].mean(), d[0, 1:].mean()
    assert ig < 0.8 * rnd, (float(ig), float(rnd))
    assert i[0, 0].mean() > i[0, 1:].mean()


def test_the_same_when_the_path_runs_a_few_points_at_a_time(monkeypatch):
    """A big model runs its path a few points per pass (memory: issue 21); the sum is the same."""
    from vit_demo.methods import integrated_gradients as ig

    model = small_model()
    x = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(4))
    t = torch.tensor([1, 4])
    whole = integrated_gradients(model, x, t)
    assert ig.inputs_per_pass(model, 16) == 16
    monkeypatch.setattr(ig, "PASS_BYTES", 1)
    assert ig.inputs_per_pass(model, 16) == 1
    torch.testing.assert_close(integrated_gradients(model, x, t), whole, atol=1e-6, rtol=1e-5)
