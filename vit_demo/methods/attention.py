"""Where does a Vision Transformer look? Attention maps and the explanations built on them.

Every function here is pure and batch-safe: it takes the per-layer attention probabilities a
forward pass captured (``model(x, capture=True)``: a list over layers of [B, H, N, N] tensors,
rows = queries, columns = keys) and the :class:`~vit_demo.model.TokenLayout` that says where
the prefix tokens and the patch grid are, and returns maps over the patch grid [B, gh, gw].

Methods, each following its paper:

- raw attention: one layer's attention from the [class] query to the patches;
- attention rollout (Abnar & Zuidema, ACL 2020): the product over layers of the attention with
  the residual connection added;
- gradient-weighted rollout: rollout with each layer's heads weighted by the gradient of the
  class score (Chefer et al. 2021, as a rollout);
- Chefer, Gur & Wolf, "Generic Attention-model Explainability" (ICCV 2021): relevance
  accumulated block by block, R <- R + E_h[(grad A * A)^+] R;
- mean attention distance and position-embedding similarity (Dosovitskiy et al., ICLR 2021,
  Fig. 7).

Models without a [class] token (average-pool heads) have no natural "class" query: there the
maps average the rows of every patch query instead (see :func:`query_index`).

Shapes: B batch, L layers, H heads, N tokens = P prefix + gh*gw patches (row-major).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .gradcam import gradcam_map
from .lrp import attn_lrp_map, cp_lrp_map, gradient_lock
from .model import TokenLayout, VisionTransformer
from .perturb import causal_lrp_map, rise_map

Fusion = Literal["mean", "max", "min"]

# ----------------------------------------------------------------------------- reading a map off a matrix


def query_index(layout: TokenLayout) -> int | None:
    """The token whose attention row is "the model's view": [class]. ``None`` when the model
    has no [class] token; the maps then average the rows of all patch queries."""
    return layout.cls_index


def _on_grid(v: Tensor, layout: TokenLayout) -> Tensor:
    """[..., gh*gw] -> [..., gh, gw]."""
    return v.reshape(*v.shape[:-1], *layout.grid)


def _class_row(m: Tensor, layout: TokenLayout) -> Tensor:
    """[..., N, N] token-to-token matrix -> [..., gh, gw]: the [class] query's row over the
    patch keys, or the mean of the patch queries' rows when there is no [class] token."""
    P, q = layout.num_prefix, query_index(layout)
    row = m[..., q, P:] if q is not None else m[..., P:, P:].mean(dim=-2)
    return _on_grid(row, layout)


def _heads(a: Tensor, head: int | None) -> Tensor:
    """[B, H, N, N] -> [B, N, N]: one head, or the mean over heads."""
    return a.mean(dim=1) if head is None else a[:, head]


def _check_patch(query_patch: int, layout: TokenLayout) -> None:
    if not 0 <= query_patch < layout.num_patches:
        raise ValueError(f"query_patch {query_patch} is outside the {layout.grid[0]}x{layout.grid[1]} patch grid")


# ----------------------------------------------------------------------------- raw attention


def cls_attention(attentions: Sequence[Tensor], layout: TokenLayout, layer: int, head: int | None = None) -> Tensor:
    """Attention of the [class] query to every patch at ``layer`` -> [B, gh, gw].

    ``head=None`` averages the heads. With no [class] token: the mean over patch queries.
    """
    return _class_row(_heads(attentions[layer], head), layout)


def query_attention(
    attentions: Sequence[Tensor], layout: TokenLayout, layer: int, query_patch: int, head: int | None = None
) -> Tensor:
    """Attention of one patch (row-major index into the grid) to every patch -> [B, gh, gw]."""
    _check_patch(query_patch, layout)
    P = layout.num_prefix
    return _on_grid(_heads(attentions[layer], head)[:, P + query_patch, P:], layout)


def head_maps(
    attentions: Sequence[Tensor], layout: TokenLayout, layer: int | None = None, query_patch: int | None = None
) -> Tensor:
    """Every head's map: [B, H, gh, gw] for one layer, [B, L, H, gh, gw] when ``layer`` is None.

    The query is [class] (or the mean of the patch queries) unless ``query_patch`` is given.
    """
    P = layout.num_prefix
    if query_patch is not None:
        _check_patch(query_patch, layout)

    def one(a: Tensor) -> Tensor:  # [B, H, N, N] -> [B, H, gh, gw]
        return _class_row(a, layout) if query_patch is None else _on_grid(a[:, :, P + query_patch, P:], layout)

    if layer is not None:
        return one(attentions[layer])
    return torch.stack([one(a) for a in attentions], dim=1)


# ----------------------------------------------------------------------------- attention rollout


def _fuse(a: Tensor, fusion: Fusion) -> Tensor:
    """[B, H, N, N] -> [B, N, N]: combine the heads of one layer."""
    if fusion == "mean":
        return a.mean(dim=1)
    if fusion == "max":
        return a.amax(dim=1)
    if fusion == "min":
        return a.amin(dim=1)
    raise ValueError(f"unknown head fusion {fusion!r}: 'mean', 'max' or 'min'")


def _discard_lowest(a: Tensor, layout: TokenLayout, fraction: float) -> Tensor:
    """Zero the lowest ``fraction`` of the entries of each matrix in ``a`` [..., N, N], each
    matrix (image) on its own.

    The [class] token's row and column are never candidates, so its attention to and from
    every token survives. Ties at the threshold are all discarded: every entry at or below
    the k-th smallest candidate goes (k = floor(fraction * candidates)), which makes the
    result independent of sort order. Models without [class] protect no entry.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"discard must be in [0, 1), got {fraction}")
    N = a.shape[-1]
    candidate = torch.ones(N, N, dtype=torch.bool, device=a.device)
    q = query_index(layout)
    if q is not None:
        candidate[q, :] = False
        candidate[:, q] = False
    k = math.floor(fraction * int(candidate.sum()))
    if k == 0:
        return a
    values = a[..., candidate]  # [..., candidates]
    threshold = values.sort(dim=-1).values[..., k - 1]  # the k-th smallest, per matrix
    drop = candidate & (a <= threshold[..., None, None])
    return a.masked_fill(drop, 0.0)


def _with_residual(a: Tensor) -> Tensor:
    """A + I with every ROW renormalised to sum to 1: a token's output is its attention mix
    plus itself (the skip connection), as a distribution over the tokens it draws from."""
    a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    return a / a.sum(dim=-1, keepdim=True)


def _chain(mats: Sequence[Tensor]) -> Tensor:
    """M_last @ ... @ M_first: how the output tokens draw on the input tokens."""
    out = mats[0]
    for m in mats[1:]:
        out = m @ out
    return out


def _rollout_layers(attentions: Sequence[Tensor], layout: TokenLayout, fusion: Fusion, discard: float) -> list[Tensor]:
    return [_with_residual(_discard_lowest(_fuse(a, fusion), layout, discard)) for a in attentions]


def _check_start(attentions: Sequence[Tensor], start_layer: int) -> None:
    if not 0 <= start_layer < len(attentions):
        raise ValueError(f"start_layer {start_layer} is outside 0..{len(attentions) - 1}")


def rollout_matrix(
    attentions: Sequence[Tensor],
    layout: TokenLayout,
    fusion: Fusion = "mean",
    discard: float = 0.0,
    start_layer: int = 0,
) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020) as a token-to-token matrix [B, N, N].

    Per layer: fuse the heads (``mean``/``max``/``min``), optionally zero the lowest
    ``discard`` fraction of the fused entries (per image, [class] row and column kept; the
    discard is the heuristic of later implementations, not part of the paper), add the
    identity for the residual and renormalise the rows. Then R = A_L ... A_start.

    With mean fusion, row-normalised A + I is the paper's 0.5 A + 0.5 I. Every row of R sums to 1.
    """
    _check_start(attentions, start_layer)
    return _chain(_rollout_layers(attentions[start_layer:], layout, fusion, discard))


def rollout(
    attentions: Sequence[Tensor],
    layout: TokenLayout,
    fusion: Fusion = "mean",
    discard: float = 0.0,
    start_layer: int = 0,
) -> Tensor:
    """Attention rollout map [B, gh, gw]: the [class] row of :func:`rollout_matrix` over the
    patches (the mean of the patch rows without [class])."""
    return _class_row(rollout_matrix(attentions, layout, fusion, discard, start_layer), layout)


def per_head_rollout(
    attentions: Sequence[Tensor],
    layout: TokenLayout,
    fusion: Fusion = "mean",
    discard: float = 0.0,
    start_layer: int = 0,
) -> Tensor:
    """One rollout map per head of the LAST layer [B, H, gh, gw]: that head alone (with the
    same discard, residual and row normalisation) on top of the fused rollout of the layers
    from ``start_layer`` to the one below the last. With mean fusion and no discard, the mean
    over heads of these maps is :func:`rollout`."""
    _check_start(attentions, start_layer)
    last = attentions[-1]  # [B, H, N, N]
    heads = _with_residual(_discard_lowest(last, layout, discard))  # every head on its own
    below = attentions[start_layer:-1]
    if below:
        heads = heads @ _chain(_rollout_layers(below, layout, fusion, discard))[:, None]
    return _class_row(heads, layout)


# ----------------------------------------------------------------------------- gradients


class AttnGrads(NamedTuple):
    """One forward and one backward pass: what the gradient-based methods need."""

    logits: Tensor  # [B, classes]
    attentions: list[Tensor]  # per layer [B, H, N, N], post-softmax
    grads: list[Tensor]  # per layer d(logits[b, target_b]) / d attention, [B, H, N, N]
    layout: TokenLayout
    target: Tensor  # [B] class explained for each image (long)


def _targets(target: int | Tensor | None, logits: Tensor) -> Tensor:
    """None -> top-1 prediction; an int -> the same class for every image; a tensor -> [B]."""
    B = logits.shape[0]
    if target is None:
        return logits.argmax(dim=-1)
    t = torch.as_tensor(target, dtype=torch.long, device=logits.device).reshape(-1)
    if t.numel() == 1:
        t = t.expand(B)
    if t.shape != (B,):
        raise ValueError(f"target has {t.numel()} entries for a batch of {B}")
    if bool(((t < 0) | (t >= logits.shape[-1])).any()):
        raise ValueError(f"target {t.tolist()} outside 0..{logits.shape[-1] - 1}")
    return t


def attention_gradients(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> AttnGrads:
    """One forward pass (capturing attention) and one backward pass of sum_b logits[b, t_b].

    Images in a batch do not interact, so the gradient of the sum gives each image the
    gradient of its own score. ``torch.autograd.grad`` returns the gradients without touching
    the parameters' ``.grad``; the pass runs with gradients on even when called under
    ``torch.no_grad`` or ``torch.inference_mode``. Holds the model's :func:`~vit_demo.lrp.gradient_lock`.
    """
    with gradient_lock(model), torch.inference_mode(False), torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)  # a normal tensor, in the graph
        out = model(x, capture=True)
        t = _targets(target, out.logits)
        score = out.logits.gather(1, t[:, None]).sum()
        grads = torch.autograd.grad(score, out.attentions)
    return AttnGrads(
        out.logits.detach(), [a.detach() for a in out.attentions], [g.detach() for g in grads], out.layout, t.detach()
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
    mats = [_with_residual(_positive_weighted(a, g)) for a, g in zip(attentions, grads)]
    return _class_row(_chain(mats), layout)


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
    return _class_row(R, layout)


# ----------------------------------------------------------------------------- what the heads do


def _patch_centres(grid: tuple[int, int], patch_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[gh*gw, 2] (y, x) pixel coordinates of the patch centres, row-major."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = (torch.stack([ys, xs], dim=-1).reshape(-1, 2) + 0.5) * patch_size
    return centres.to(dtype=dtype, device=device)


def mean_attention_distance(attentions: Sequence[Tensor], layout: TokenLayout, patch_size: int) -> Tensor:
    """Mean attention distance in pixels, [B, L, H] (ViT paper, Fig. 7 right).

    For each patch query: the mean Euclidean distance between its centre and the key patches'
    centres, weighted by its attention to them; then averaged over the patch queries.
    Normalisation: the weights are the query's attention to the PATCH keys renormalised to sum
    to 1 (the attention it pays to prefix tokens, which have no position, is left out), so the
    result is a proper weighted mean distance.
    """
    P = layout.num_prefix
    a0 = attentions[0]
    c = _patch_centres(layout.grid, patch_size, a0.dtype, a0.device)
    dist = torch.cdist(c, c)  # [n, n] pixels between patch centres
    out = []
    for a in attentions:
        w = a[:, :, P:, P:]
        w = w / w.sum(dim=-1, keepdim=True)  # [B, H, n, n], rows sum to 1 over patches
        out.append((w * dist).sum(dim=-1).mean(dim=-1))  # [B, H]
    return torch.stack(out, dim=1)


def pos_embed_similarity(model: VisionTransformer) -> Tensor:
    """Cosine similarity of each patch's learned position embedding with every other patch's,
    [gh*gw, gh, gw] at the training grid (ViT paper, Fig. 7 centre). Prefix tokens' position
    embeddings, where the model has them, are left out."""
    cfg = model.cfg
    pos = model.pos_embed.detach()[0].float()
    if not cfg.no_embed_class:
        pos = pos[cfg.num_prefix_tokens :]
    gh, gw = cfg.grid_size
    p = F.normalize(pos, dim=-1)
    return (p @ p.T).reshape(gh * gw, gh, gw)


# ----------------------------------------------------------------------------- one call per method

MapFn = Callable[[VisionTransformer, Tensor, int | Tensor | None], Tensor]


def _captured(model: VisionTransformer, x: Tensor):
    with torch.no_grad():
        return model(x, capture=True)


def _attention_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """Last layer's [class] attention, heads averaged (class-agnostic: ``target`` unused)."""
    out = _captured(model, x)
    return cls_attention(out.attentions, out.layout, layer=-1)


def _rollout_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """Attention rollout, mean fusion, no discard (class-agnostic: ``target`` unused)."""
    out = _captured(model, x)
    return rollout(out.attentions, out.layout)


def _grad_rollout_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """Gradient-weighted rollout for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return grad_rollout(ag.attentions, ag.grads, ag.layout)


def _chefer_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """Chefer et al. relevance for ``target`` (None: the predicted class)."""
    ag = attention_gradients(model, x, target)
    return chefer_relevance(ag.attentions, ag.grads, ag.layout)


def _gated_lrp_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """CP-LRP gated by gradient-weighted rollout: max(CP-LRP, 0) * grad-rollout, per patch.

    Two kinds of evidence for the same class: LRP says which patches' pixels carry the class
    logit, grad-rollout says which patches the class-relevant attention flows from. The
    product keeps a patch only when both point at it. Defined once (no weights to tune); chosen
    on 10 photos outside the quick subset (sorted indices 5, 105, ..., 905).
    """
    ag = attention_gradients(model, x, target)
    gate = grad_rollout(ag.attentions, ag.grads, ag.layout)
    return cp_lrp_map(model, x, ag.target).clamp(min=0) * gate


METHODS: dict[str, MapFn] = {
    "attention": _attention_map,
    "rollout": _rollout_map,
    "grad-rollout": _grad_rollout_map,
    "chefer": _chefer_map,
    "lrp": cp_lrp_map,  # CP-LRP, lrp.py
    "attnlrp": attn_lrp_map,  # AttnLRP, lrp.py
    "gradcam": gradcam_map,  # gradcam.py
    "rise": rise_map,  # perturb.py
    "lrp-gated": _gated_lrp_map,
    "lrp-causal": causal_lrp_map,  # perturb.py: lrp-gated x the effect of its patches under perturbation
}
"""Explanation methods by name: ``fn(model, x [B, 3, h, w], target) -> [B, gh, gw]`` map."""

SLOW_METHODS = ("rise", "lrp-causal")  # hundreds of forward passes per image: run only when asked for by name (or "all")
DEFAULT_METHODS = tuple(m for m in METHODS if m not in SLOW_METHODS)
