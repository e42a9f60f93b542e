"""Integrated Gradients (Sundararajan, Taly & Yan, "Axiomatic Attribution for Deep Networks",
ICML 2017), the attribution Captum users know.

The attribution of input value i for the class logit F is

    IG_i(x) = (x_i - x'_i) * integral_0^1 dF(x' + a (x - x')) / dx_i da,

approximated by the paper's Riemann sum over ``steps`` points a = k / steps, k = 1..steps (16 here).
The baseline x' is a black image: pixel value 0 in every channel, i.e. (0 - mean) / std in the
model's normalised input space, with the ImageNet mean and std that the timm models here use
(a model trained with other statistics gets the darkest image those statistics reach, still "no
signal"). The map sums the attribution over the colour channels and over each patch, as the LRP
maps do; by completeness its total approximates F(x) - F(x').

Cost: ``steps`` forward and backward passes per image, run ``steps`` inputs at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import VisionTransformer
from ..preprocess import IMAGENET_MEAN, IMAGENET_STD
from .passes import gradient_pass, targets
from .registry import Target, register

STEPS = 16


def black(x: Tensor) -> Tensor:
    """The black baseline for inputs like ``x`` [B, 3, H, W], in ImageNet-normalised space."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device)[:, None, None]
    std = torch.tensor(IMAGENET_STD, dtype=x.dtype, device=x.device)[:, None, None]
    return ((0 - mean) / std).expand_as(x)


def integrated_gradients(model: VisionTransformer, x: Tensor, target: Target = None, steps: int = STEPS,
                         baseline: Tensor | None = None) -> Tensor:
    """IG attributions [B, 3, H, W] for the target logit (None: each image's top-1 class)."""
    base = black(x) if baseline is None else baseline.expand_as(x)
    with torch.no_grad():
        t = targets(target, model(x).logits)
    alphas = torch.arange(1, steps + 1, dtype=x.dtype, device=x.device) / steps  # [steps]
    out = torch.empty_like(x)
    for b in range(x.shape[0]):  # one image's path at a time: ``steps`` inputs per pass
        path = base[b] + alphas[:, None, None, None] * (x[b] - base[b])  # [steps, 3, H, W]
        with gradient_pass(model, path) as p:
            logits = model(p).logits
            (grad,) = torch.autograd.grad(logits[:, t[b]].sum(), p)
        out[b] = (x[b] - base[b]) * grad.mean(dim=0)
    return out.detach()


@register("integrated-gradients", title="Integrated Gradients", cite="Sundararajan et al., ICML 2017; 16 steps, black baseline")
def integrated_gradients_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """The IG map [B, gh, gw]: attributions summed over channels and over each patch."""
    p = model.cfg.patch_size
    r = integrated_gradients(model, x, target).sum(dim=1, keepdim=True)  # [B, 1, h, w]
    return F.avg_pool2d(r, p, p)[:, 0] * (p * p)
