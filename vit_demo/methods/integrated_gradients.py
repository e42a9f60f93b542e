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

Cost: ``steps`` forward and backward passes per image, run as many inputs at a time as fit in
:data:`PASS_BYTES` of attention (all 16 for a DeiT or a ViT-B/16; one at a time for a ViT-B/8,
whose 785 tokens make 16 inputs' attention and gradients 7 GB at once). The result is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import VisionTransformer
from ..preprocess import IMAGENET_MEAN, IMAGENET_STD
from ..progress import report
from .passes import gradient_pass, targets
from .registry import Target, register

STEPS = 16
PASS_BYTES = 512 << 20  # attention kept for the backward pass of one batch of the path, at most


def inputs_per_pass(model: VisionTransformer, steps: int) -> int:
    """How many points of the path one gradient pass takes: its attention maps and their
    gradients (about twice the maps) within :data:`PASS_BYTES`."""
    cfg = model.cfg
    gh, gw = cfg.grid_size
    n = gh * gw + cfg.num_prefix_tokens
    per_input = 2 * cfg.depth * cfg.num_heads * n * n * 4
    return max(1, min(steps, PASS_BYTES // per_input))


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
    chunk = inputs_per_pass(model, steps)
    for b in range(x.shape[0]):  # one image's path at a time, ``chunk`` of its points per pass
        path = base[b] + alphas[:, None, None, None] * (x[b] - base[b])  # [steps, 3, H, W]
        total = torch.zeros_like(x[b])
        for i in range(0, steps, chunk):
            with gradient_pass(model, path[i:i + chunk]) as p:
                logits = model(p).logits
                (grad,) = torch.autograd.grad(logits[:, t[b]].sum(), p)
            total += grad.sum(dim=0)
            report((b * steps + i + len(grad)) / (x.shape[0] * steps), "integrated gradients",
                   done=b * steps + i + len(grad), total=x.shape[0] * steps)
        out[b] = (x[b] - base[b]) * total / steps
    return out.detach()


@register("integrated-gradients", title="Integrated Gradients", cite="Sundararajan et al., ICML 2017; 16 steps, black baseline",
          solo=True)
def integrated_gradients_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """The IG map [B, gh, gw]: attributions summed over channels and over each patch."""
    p = model.cfg.patch_size
    r = integrated_gradients(model, x, target).sum(dim=1, keepdim=True)  # [B, 1, h, w]
    return F.avg_pool2d(r, p, p)[:, 0] * (p * p)
