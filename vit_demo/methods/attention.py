"""Where does a Vision Transformer look? Raw attention, and what the heads do.

Every function here is pure and batch-safe: it takes the per-layer attention probabilities a
forward pass captured (``model(x, capture=True)``: a list over layers of [B, H, N, N] tensors,
rows = queries, columns = keys) and the :class:`~vit_demo.model.TokenLayout` that says where
the prefix tokens and the patch grid are, and returns maps over the patch grid [B, gh, gw]:

- raw attention: one layer's attention from the [class] query (or a patch) to the patches;
- every head's map, of one layer or of all of them;
- mean attention distance and position-embedding similarity (Dosovitskiy et al., ICLR 2021,
  Fig. 7).

Which row is "the model's view" (:func:`class_row`): the [class] query's. A model with an
attention-pool head (MAP: SigLIP, PE; no paper defines this case for these methods) predicts
from a learned query that reads the last block's tokens, so the pool's attention over the tokens,
heads averaged (``layout.probe``), plays the role of the [class] row: the maps are that probe
carried through the matrix, ``probe @ M`` (for rollout: rollout through the blocks, then the
pool). Models with neither (average-pool heads) have no natural "class" query: there the maps
average the rows of every patch query instead (see :func:`query_index`). Register tokens are
prefix tokens: never on a map. Attention rollout is :mod:`~vit_demo.methods.rollout`; the
gradient-weighted maps :mod:`~vit_demo.methods.gradients`.

Shapes: B batch, L layers, H heads, N tokens = P prefix + gh*gw patches (row-major).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import TokenLayout, VisionTransformer, ViTOutput
from ..precision import widened
from .registry import Target, register

# ----------------------------------------------------------------------------- reading a map off a matrix


def query_index(layout: TokenLayout) -> int | None:
    """The token whose attention row is "the model's view": [class]. ``None`` when the model
    has no [class] token; the maps then average the rows of all patch queries."""
    return layout.cls_index


def reader(layout: TokenLayout, long: bool = False) -> str:
    """Whose attention the maps read, in words: the [class] token, an attention pool's query, or, for a
    model with neither (the default recipe of ``train``), the patch tokens on average. ``long``: with
    why that is the one (for a caption's first mention)."""
    if layout.probe is not None:
        return "the attention pool's query" + (" (the learned query whose reading the model answers from)"
                                               if long else "")
    if layout.cls_index is None:
        return "the patch tokens, on average" + (" (this model has no [class] token: it answers from their mean)"
                                                 if long else "")
    return "the [class] token" + (" (the extra token whose final state the model answers from)" if long else "")


def many_readers(layout: TokenLayout) -> bool:
    """Whether :func:`reader` is the patch tokens (a plural: "where they look")."""
    return layout.probe is None and layout.cls_index is None


def on_grid(values: Tensor, layout: TokenLayout) -> Tensor:
    """[..., gh*gw] -> [..., gh, gw]."""
    return values.reshape(*values.shape[:-1], *layout.grid)


def stacked(attentions: Sequence[Tensor]) -> Tensor | None:
    """The layers' attention as one [L, B, H, N, N] tensor, without a copy, when they lie one
    after another in one block, as a capturing forward pass without autograd writes them (see
    ``vit_demo.model.capture.capture_slots``); None otherwise. Batched over layers, a map costs a
    few operations in all instead of a few per layer (each one ~5-20 us on a CPU)."""
    a0 = attentions[0]
    step = a0.numel() * a0.element_size()
    if not all(a.shape == a0.shape and a.is_contiguous() and a.data_ptr() == a0.data_ptr() + i * step
               for i, a in enumerate(attentions)):
        return None
    return a0.as_strided((len(attentions), *a0.shape), (a0.numel(), *a0.stride()))


def class_row(matrix: Tensor, layout: TokenLayout) -> Tensor:
    """[B, ..., N, N] token-to-token matrix -> [B, ..., gh, gw]: the row of the query that makes
    the prediction, over the patch keys. With an attention-pool head: its probe [B, N] carried
    through ``matrix`` (probe @ matrix); else the [class] query's row, or the mean of the patch queries'
    rows when there is no [class] token."""
    P, q = layout.num_prefix, query_index(layout)
    if layout.probe is not None:
        probe = layout.probe.to(matrix.device, matrix.dtype)
        probe = probe.reshape(matrix.shape[0], *([1] * (matrix.ndim - 3)), 1, matrix.shape[-1])
        row = (probe @ matrix)[..., 0, P:]
    elif q is not None:
        row = matrix[..., q, P:]
    else:
        row = matrix[..., P:, P:].mean(dim=-2)
    return on_grid(row, layout)


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
    return class_row(_heads(attentions[layer], head), layout)


def query_attention(
    attentions: Sequence[Tensor], layout: TokenLayout, layer: int, query_patch: int, head: int | None = None
) -> Tensor:
    """Attention of one patch (row-major index into the grid) to every patch -> [B, gh, gw]."""
    _check_patch(query_patch, layout)
    P = layout.num_prefix
    return on_grid(_heads(attentions[layer], head)[:, P + query_patch, P:], layout)


def head_maps(
    attentions: Sequence[Tensor], layout: TokenLayout, layer: int | None = None, query_patch: int | None = None
) -> Tensor:
    """Every head's map: [B, H, gh, gw] for one layer, [B, L, H, gh, gw] when ``layer`` is None.

    The query is [class] (or the mean of the patch queries) unless ``query_patch`` is given.
    """
    P = layout.num_prefix
    if query_patch is not None:
        _check_patch(query_patch, layout)

    def one(a: Tensor) -> Tensor:  # [B, (L,) H, N, N] -> [B, (L,) H, gh, gw]
        return class_row(a, layout) if query_patch is None else on_grid(a[..., P + query_patch, P:], layout)

    if layer is not None:
        return one(attentions[layer])
    every = stacked(attentions)
    if every is not None:  # all layers at once: [L, B, ...] read as [B, L, ...]
        return one(every.transpose(0, 1))
    return torch.stack([one(a) for a in attentions], dim=1)


def captured(model: VisionTransformer, x: Tensor) -> ViTOutput:
    """One forward pass without gradients that captures every layer's attention (in float32: see
    :func:`in_float32`)."""
    with torch.no_grad():
        return in_float32(model(x, capture=True))


def in_float32(out: ViTOutput) -> ViTOutput:
    """``out`` with its attention in float32 (a model in bfloat16 captures bfloat16), still one block
    when it was one (:func:`stacked`: converted at once, read as slices)."""
    if not out.attentions or widened(out.attentions[0]) is out.attentions[0]:
        return out
    every = stacked(out.attentions)
    attentions = list(widened(every).unbind(0)) if every is not None else [widened(a) for a in out.attentions]
    return out._replace(attentions=attentions)


@register("attention", title="Raw attention", cite="last layer, [class] query, mean of heads", class_specific=False,
          bf16_ok=True)
def attention_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Last layer's [class] attention, heads averaged (class-agnostic: ``target`` unused).
    With an attention-pool head (no [class] query in the blocks): the pool's attention carried
    through the last block's attention, probe @ A_L (see :func:`class_row`)."""
    out = captured(model, x)
    return cls_attention(out.attentions, out.layout, layer=-1)


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
    embeddings, where the model has them, are left out.

    A model with rotary position embedding and no absolute one (EVA-02, DINOv3, RoPE-ViT): the
    cosine similarity of the patches' rotary codes (cos, sin of every pair's angle, of every
    block and head for learned frequencies), mean_i cos(theta_i(p) - theta_i(q)): how alike two
    patches look to q . k for the same content. A model whose positions are only relative
    biases (BEiT, the relpos ViT) has no per-patch code: ValueError."""
    cfg = model.cfg
    gh, gw = cfg.grid_size
    if model.pos_embed is None:
        if model.rope is None:
            raise ValueError(f"this model has no position embedding to compare: its positions are relative "
                             f"biases inside the attention ({cfg.rel_pos or 'none'})")
        with torch.no_grad():
            a = model.rope.angles((gh, gw)).float()  # [n, D/2] or [L, H, n, D/2]
        a = a.movedim(-2, 0).reshape(gh * gw, -1)
        pos = torch.cat([a.cos(), a.sin()], dim=-1)
    else:
        pos = model.pos_embed.detach()[0].float().flatten(0, -2)  # SAM's [gh, gw, C] too
        if not cfg.no_embed_class:
            pos = pos[cfg.num_prefix_tokens :]
    p = F.normalize(pos, dim=-1)
    return (p @ p.T).reshape(gh * gw, gh, gw)


MAX_PAIRS = 200_000  # pairs of patches :func:`grid_structure` ranks at most (a fixed sample of them beyond)


def grid_structure(similarity: Tensor) -> dict[str, float]:
    """What a position-embedding similarity ``[gh*gw, gh, gw]`` (:func:`pos_embed_similarity`) says
    about the 2-D grid, in numbers a caption can quote (pairs of distinct patches; distances in patches):

    - ``rank_corr``: Spearman's rank correlation of similarity with closeness (minus the distance
      between the patches' centres): about 1 when every patch is most alike its neighbours and less
      and less alike farther ones, about 0 when position on the grid does not matter;
    - ``across`` / ``down``: the mean similarity of horizontal / vertical neighbours (distance 1);
    - ``far``: of the pairs at least half the largest distance apart;
    - ``same_row`` / ``same_col`` / ``other``: of the pairs that share a row / a column / neither.
    """
    n, gh, gw = similarity.shape
    s = similarity.reshape(n, n).double()
    r, c = torch.div(torch.arange(n), gw, rounding_mode="floor"), torch.arange(n) % gw
    dr, dc = (r[:, None] - r[None]).abs(), (c[:, None] - c[None]).abs()
    dist = (dr.double() ** 2 + dc.double() ** 2).sqrt()
    pair = ~torch.eye(n, dtype=torch.bool)

    def mean(mask: Tensor) -> float:
        return float(s[mask & pair].mean()) if bool((mask & pair).any()) else float("nan")

    sim, close = s[pair], -dist[pair]
    if sim.numel() > MAX_PAIRS:
        keep = torch.randperm(sim.numel(), generator=torch.Generator().manual_seed(0))[:MAX_PAIRS]
        sim, close = sim[keep], close[keep]
    return {"rank_corr": _spearman(sim, close), "across": mean((dr == 0) & (dc == 1)),
            "down": mean((dr == 1) & (dc == 0)), "far": mean(dist >= dist.max() / 2),
            "same_row": mean(dr == 0), "same_col": mean(dc == 0), "other": mean((dr > 0) & (dc > 0))}


def _spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (ties share their mean rank)."""
    def ranks(x: Tensor) -> Tensor:
        _, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).double()
        return (ends - (counts.double() - 1) / 2)[inverse]  # the mean rank of each value's ties, from 1

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float((ra.square().sum() * rb.square().sum()).sqrt())
    return float((ra * rb).sum()) / den if den > 0 else 0.0
