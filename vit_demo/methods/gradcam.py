"""GradCAM for Vision Transformers (Selvaraju et al., ICCV 2017), the reshape-to-grid recipe.

The patch tokens of one layer's output are laid out on the patch grid as a [C, gh, gw]
"feature map" (prefix tokens dropped), as pytorch-grad-cam's ViT tutorial does with its
``reshape_transform``. Each channel is weighted by the mean over the patches of the gradient of
the class logit, and the map is ReLU(sum_c w_c A_c). Default layer: the last block's ``norm1``
(the tutorial's choice: the last block's output only feeds the [class] token's path).
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor, nn

from ..model import VisionTransformer
from .passes import gradient_pass, targets
from .registry import Target, register


def default_layer(model: VisionTransformer) -> nn.Module:
    """The last block's first LayerNorm, as in pytorch-grad-cam's ViT example."""
    return model.blocks[-1].norm1


def gradcam(model: VisionTransformer, x: Tensor, target: Target = None, layer: nn.Module | None = None) -> Tensor:
    """GradCAM map [B, gh, gw] of ``layer``'s output for the target logit (None: top-1)."""
    layer = default_layer(model) if layer is None else layer
    seen: list[Tensor] = []
    me = threading.get_ident()  # another thread's forward through the same layer is not ours
    handle = layer.register_forward_hook(lambda m, inp, out: seen.append(out) if threading.get_ident() == me else None)
    try:
        with gradient_pass(model, x) as x:
            out = model(x)
            t = targets(target, out.logits)
            (grad,) = torch.autograd.grad(out.logits.gather(1, t[:, None]).sum(), seen[-1])
    finally:
        handle.remove()
    layout = out.layout
    P, (gh, gw) = layout.num_prefix, layout.grid
    acts, grad = seen[-1].detach()[:, P:], grad[:, P:]  # [B, gh*gw, C]
    weights = grad.mean(dim=1, keepdim=True)  # [B, 1, C]: mean gradient of each channel over the grid
    return (weights * acts).sum(dim=-1).clamp(min=0).reshape(-1, gh, gw)


@register("gradcam", title="GradCAM", cite="Selvaraju et al., ICCV 2017; last block's norm1")
def gradcam_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """GradCAM on the default layer (the registry's ``gradcam``)."""
    return gradcam(model, x, target)
