"""Attention weighted by the gradient of the class score: gradient-weighted rollout, and the
relevance of Chefer, Gur & Wolf, "Generic Attention-model Explainability" (ICCV 2021).

One forward pass that captures attention and one backward pass of the class logit
(:func:`attention_gradients`) feed both maps; each layer's heads are weighted by how the class
score responds to them, E_h[(grad A * A)^+].

With an attention-pool head (SigLIP, PE), which neither paper covers, the maps read the pool's
query instead of the [class] row (:func:`~vit_demo.methods.attention.class_row`): the class-specific
weighting stays in the blocks' matrices, and the pool's attention, averaged over its heads and not
weighted by its gradient, is the read-out row, as the [class] row is (probe @ R).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..model import TokenLayout, VisionTransformer
from ..precision import widened
from .attention import on_grid
from .passes import gradient_pass, targets
from .registry import Target, register, shared
from .rollout import query_vector, with_residual


class AttnGrads(NamedTuple):
    """One forward and one backward pass: what the gradient-based methods need."""

    logits: Tensor  # [B, classes]
    attentions: list[Tensor]  # per layer [B, H, N, N], post-softmax
    grads: list[Tensor]  # per layer d(logits[b, target_b]) / d attention, [B, H, N, N]
    layout: TokenLayout
    target: Tensor  # [B] class explained for each image (long)
    tokens: Tensor | None = None  # [B, N, C] the output of GradCAM's layer (default_layer), from the same pass
    token_grads: Tensor | None = None  # [B, N, C] d(logits[b, target_b]) / d tokens


def default_layer(model: VisionTransformer) -> nn.Module:
    """GradCAM's layer: the last block's first LayerNorm, as in pytorch-grad-cam's ViT example (res-post
    blocks: the block before the last, or the embedding's last step in a one-block model)."""
    if not model.cfg.post_norm:
        return model.blocks[-1].norm1
    return model.blocks[-2] if len(model.blocks) > 1 else model.norm_pre


def layer_output(layer: nn.Module) -> tuple[list[Tensor], torch.utils.hooks.RemovableHandle]:
    """A list that a forward pass on this thread fills with ``layer``'s output (a block's tokens), and the
    hook's handle (another thread's forward through the same layer is not ours)."""
    seen: list[Tensor] = []
    me = threading.get_ident()

    def keep(m: nn.Module, inp: tuple, out: Tensor | tuple) -> None:
        if threading.get_ident() == me:
            seen.append(out[0] if isinstance(out, tuple) else out)  # a block returns (tokens, attention)

    return seen, layer.register_forward_hook(keep)


@shared("attention-gradients")
def attention_gradients(model: VisionTransformer, x: Tensor, target: Target = None) -> AttnGrads:
    """One forward pass (capturing attention) and one backward pass of sum_b logits[b, t_b].

    Images in a batch do not interact, so the gradient of the sum gives each image the
    gradient of its own score. ``torch.autograd.grad`` returns the gradients without touching
    the parameters' ``.grad``; the pass runs with gradients on even when called under
    ``torch.no_grad`` or ``torch.inference_mode`` (:func:`~vit_demo.methods.passes.gradient_pass`).
    The same backward pass gives GradCAM's gradient (``tokens``, ``token_grads``), which it reads when
    it runs after this pass in a :func:`~vit_demo.methods.registry.reuse` scope.
    """
    seen, handle = layer_output(default_layer(model))
    try:
        with gradient_pass(model, x) as x:
            out = model(x, capture=True)
            t = targets(target, out.logits)
            score = out.logits.gather(1, t[:, None]).sum()
            *grads, token_grads = torch.autograd.grad(score, [*out.attentions, seen[-1]])
    finally:
        handle.remove()
    return AttnGrads(  # float32 (a model in bfloat16 captures bfloat16): the maps built on them sum in float32
        widened(out.logits.detach()), [widened(a.detach()) for a in out.attentions],
        [widened(g.detach()) for g in grads], out.layout.detach(), t.detach(), widened(seen[-1].detach()),
        widened(token_grads.detach())
    )


def _positive_weighted(a: Tensor, g: Tensor) -> Tensor:
    """E_h[(grad A * A)^+]: [B, H, N, N] -> [B, N, N], heads weighted by how the class score
    responds to them, negative contributions clipped before averaging."""
    return (g * a).clamp(min=0).mean(dim=1)


def grad_rollout(attentions: Sequence[Tensor], grads: Sequence[Tensor], layout: TokenLayout) -> Tensor:
    """Gradient-weighted rollout [B, gh, gw]: per layer E_h[(grad A * A)^+], plus identity,
    rows renormalised, multiplied from the first layer up (R = A_L ... A_1). Layer l's
    attention is paired with layer l's own gradient.

    Choices where write-ups differ: negative products are clipped per head before the mean
    over heads (Chefer et al.'s E_h[(.)^+], not the clip-after-mean of some code), and there
    is no discard. Unlike rollout this map depends on the scale of the gradients: A_bar is
    added to I unnormalised, so logits (not probabilities) are differentiated, as in Chefer.

    Only the row read off is computed: the query vector carried down, v <- v M_l from the last layer
    (as :func:`~vit_demo.methods.rollout.rollout` does), N^2 a layer where the matrix costs N^3.
    """
    if len(attentions) != len(grads):
        raise ValueError(f"{len(attentions)} attention layers but {len(grads)} gradients")
    v = query_vector(layout, attentions[0])  # [B, 1, N]: [class], the pool's probe, or the patches' mean
    for a, g in reversed(list(zip(attentions, grads))):
        v = v @ with_residual(_positive_weighted(a, g))
    return on_grid(v[:, 0, layout.num_prefix :], layout)


def chefer_relevance(attentions: Sequence[Tensor], grads: Sequence[Tensor], layout: TokenLayout) -> Tensor:
    """Chefer, Gur & Wolf (ICCV 2021), Eq. 5-6 for self-attention [B, gh, gw]:
    R = I; for each block in order, R <- R + A_bar R with A_bar = E_h[(grad A * A)^+].
    The map is the [class] row of R over the patches (R is not renormalised). R is the product
    (I + A_bar_L) ... (I + A_bar_1), so that row is the query vector carried down, v <- v + v A_bar_l
    from the last layer: N^2 a layer where R costs N^3."""
    if len(attentions) != len(grads):
        raise ValueError(f"{len(attentions)} attention layers but {len(grads)} gradients")
    v = query_vector(layout, attentions[0])  # [B, 1, N]: [class], the pool's probe, or the patches' mean
    for a, g in reversed(list(zip(attentions, grads))):
        v = torch.baddbmm(v, v, _positive_weighted(a, g))
    return on_grid(v[:, 0, layout.num_prefix :], layout)


@register("grad-rollout", title="Gradient rollout", cite="rollout weighted by the class gradient, as in Chefer et al. 2021",
          bf16_ok=True)
def grad_rollout_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Gradient-weighted rollout for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return grad_rollout(ag.attentions, ag.grads, ag.layout)


@register("chefer", title="Chefer relevance", cite="Chefer, Gur & Wolf, ICCV 2021", bf16_ok=True)
def chefer_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Chefer et al. relevance for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return chefer_relevance(ag.attentions, ag.grads, ag.layout)
