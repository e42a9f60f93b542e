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

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..model import TokenLayout, VisionTransformer
from .attention import class_row
from .passes import gradient_pass, targets
from .registry import Target, register, shared
from .rollout import chain, with_residual


class AttnGrads(NamedTuple):
    """One forward and one backward pass: what the gradient-based methods need."""

    logits: Tensor  # [B, classes]
    attentions: list[Tensor]  # per layer [B, H, N, N], post-softmax
    grads: list[Tensor]  # per layer d(logits[b, target_b]) / d attention, [B, H, N, N]
    layout: TokenLayout
    target: Tensor  # [B] class explained for each image (long)


@shared("attention-gradients")
def attention_gradients(model: VisionTransformer, x: Tensor, target: Target = None) -> AttnGrads:
    """One forward pass (capturing attention) and one backward pass of sum_b logits[b, t_b].

    Images in a batch do not interact, so the gradient of the sum gives each image the
    gradient of its own score. ``torch.autograd.grad`` returns the gradients without touching
    the parameters' ``.grad``; the pass runs with gradients on even when called under
    ``torch.no_grad`` or ``torch.inference_mode`` (:func:`~vit_demo.methods.passes.gradient_pass`).
    """
    with gradient_pass(model, x) as x:
        out = model(x, capture=True)
        t = targets(target, out.logits)
        score = out.logits.gather(1, t[:, None]).sum()
        grads = torch.autograd.grad(score, out.attentions)
    return AttnGrads(
        out.logits.detach(), [a.detach() for a in out.attentions], [g.detach() for g in grads], out.layout.detach(),
        t.detach()
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
    """
    if len(attentions) != len(grads):
        raise ValueError(f"{len(attentions)} attention layers but {len(grads)} gradients")
    mats = [with_residual(_positive_weighted(a, g)) for a, g in zip(attentions, grads)]
    return class_row(chain(mats), layout)


def chefer_relevance(attentions: Sequence[Tensor], grads: Sequence[Tensor], layout: TokenLayout) -> Tensor:
    """Chefer, Gur & Wolf (ICCV 2021), Eq. 5-6 for self-attention [B, gh, gw]:
    R = I; for each block in order, R <- R + A_bar R with A_bar = E_h[(grad A * A)^+].
    The map is the [class] row of R over the patches (R is not renormalised)."""
    if len(attentions) != len(grads):
        raise ValueError(f"{len(attentions)} attention layers but {len(grads)} gradients")
    a0 = attentions[0]
    B, _, N, _ = a0.shape
    R = torch.eye(N, dtype=a0.dtype, device=a0.device).expand(B, N, N)
    for a, g in zip(attentions, grads):
        R = R + _positive_weighted(a, g) @ R
    return class_row(R, layout)


@register("grad-rollout", title="Gradient rollout", cite="rollout weighted by the class gradient, as in Chefer et al. 2021")
def grad_rollout_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Gradient-weighted rollout for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return grad_rollout(ag.attentions, ag.grads, ag.layout)


@register("chefer", title="Chefer relevance", cite="Chefer, Gur & Wolf, ICCV 2021")
def chefer_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Chefer et al. relevance for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return chefer_relevance(ag.attentions, ag.grads, ag.layout)
