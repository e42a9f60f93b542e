"""GradCAM for Vision Transformers (Selvaraju et al., ICCV 2017), the reshape-to-grid recipe.

The patch tokens of one layer's output are laid out on the patch grid as a [C, gh, gw]
"feature map" (prefix tokens dropped), as pytorch-grad-cam's ViT tutorial does with its
``reshape_transform``. Each channel is weighted by the mean over the patches of the gradient of
the class logit, and the map is ReLU(sum_c w_c A_c). Default layer: the last block's ``norm1``
(the tutorial's choice: the last block's output only feeds the [class] token's path). In a model
of res-post blocks (EVA-02-E, the "rpn" ViTs), whose norm1 normalises the attention's output, not
the tokens, the same tokens are the last block's input: the output of the block before it.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor, nn

from ..model import VisionTransformer
from .passes import gradient_pass, targets
from .registry import Target, register


def default_layer(model: VisionTransformer) -> nn.Module:
    """The last block's first LayerNorm, as in pytorch-grad-cam's ViT example (res-post blocks:
    the block before the last, or the embedding's last step in a one-block model)."""
    if not model.cfg.post_norm:
        return model.blocks[-1].norm1
    return model.blocks[-2] if len(model.blocks) > 1 else model.norm_pre


def gradcam(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """GradCAM map [B, gh, gw] of :func:`default_layer`'s output for the target logit (None: top-1)."""
    layer = default_layer(model)
    seen: list[Tensor] = []
    me = threading.get_ident()  # another thread's forward through the same layer is not ours
    def keep(m: nn.Module, inp: tuple, out: Tensor | tuple) -> None:
        if threading.get_ident() == me:
            seen.append(out[0] if isinstance(out, tuple) else out)  # a block returns (tokens, attention)

    handle = layer.register_forward_hook(keep)
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
