"""GradCAM for Vision Transformers (Selvaraju et al., ICCV 2017), the reshape-to-grid recipe.

The patch tokens of one layer's output are laid out on the patch grid as a [C, gh, gw]
"feature map" (prefix tokens dropped), as pytorch-grad-cam's ViT tutorial does with its
``reshape_transform``. Each channel is weighted by the mean over the patches of the gradient of
the class logit, and the map is ReLU(sum_c w_c A_c). Default layer: the last block's ``norm1``
(the tutorial's choice: the last block's output only feeds the [class] token's path). In a model
of res-post blocks (EVA-02-E, the "rpn" ViTs), whose norm1 normalises the attention's output, not
the tokens, the same tokens are the last block's input: the output of the block before it.

Inside :func:`~vit_demo.methods.registry.reuse`, after the attention-gradient pass of the same
input and class (:func:`~vit_demo.methods.gradients.attention_gradients`, which records the default
layer's output and gradient), the map is read off that pass instead of a pass of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import TokenLayout, VisionTransformer
from .gradients import default_layer, layer_output
from .passes import gradient_pass, targets
from .registry import Target, computed, register

__all__ = ["default_layer", "gradcam", "gradcam_map"]


def gradcam(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """GradCAM map [B, gh, gw] of :func:`default_layer`'s output for the target logit (None: top-1)."""
    seen, handle = layer_output(default_layer(model))
    try:
        with gradient_pass(model, x) as x:
            out = model(x)
            t = targets(target, out.logits)
            (grad,) = torch.autograd.grad(out.logits.gather(1, t[:, None]).sum(), seen[-1])
    finally:
        handle.remove()
    return weighted(seen[-1].detach(), grad, out.layout)


def weighted(acts: Tensor, grad: Tensor, layout: TokenLayout) -> Tensor:
    """ReLU(sum_c w_c A_c) [B, gh, gw] from a layer's tokens [B, N, C] and their gradient, w_c the mean
    gradient of channel c over the patches."""
    P, (gh, gw) = layout.num_prefix, layout.grid
    acts, grad = acts[:, P:], grad[:, P:]  # [B, gh*gw, C]
    weights = grad.mean(dim=1, keepdim=True)  # [B, 1, C]: mean gradient of each channel over the grid
    return (weights * acts).sum(dim=-1).clamp(min=0).reshape(-1, gh, gw)


@register("gradcam", title="GradCAM", cite="Selvaraju et al., ICCV 2017; last block's norm1", bf16_ok=True)
def gradcam_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """GradCAM on the default layer (the registry's ``gradcam``): read off the attention-gradient pass
    when one for this input and class ran in the open reuse scope, else a pass of its own."""
    ag = computed("attention-gradients", model, x, target)
    if ag is not None and ag.tokens is not None:
        return weighted(ag.tokens, ag.token_grads, ag.layout)
    return gradcam(model, x, target)
