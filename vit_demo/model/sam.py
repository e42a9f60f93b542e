"""SAM's image encoder (timm's vision_transformer_sam; Li et al., ViTDet, ECCV 2022; Kirillov et al.,
"Segment Anything", ICCV 2023): attention within windows of w x w patches (or over the whole grid in
the global blocks), a decomposed relative position bias, and a convolutional neck after the blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig
from .variants import VariantAttention
from .vit import Positions, register


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """[B, gh, gw, C] -> [B * windows, w, w, C], the grid padded with zeros at the bottom and right."""
    B, gh, gw, C = x.shape
    x = F.pad(x, (0, 0, 0, -gw % w, 0, -gh % w))
    hp, wp = x.shape[1] // w, x.shape[2] // w
    return x.view(B, hp, w, wp, w, C).transpose(2, 3).reshape(-1, w, w, C)


def window_unpartition(x: torch.Tensor, w: int, grid: tuple[int, int]) -> torch.Tensor:
    """[B * windows, w, w, C] -> [B, gh, gw, C], the padding cut off."""
    gh, gw = grid
    hp, wp = -(-gh // w), -(-gw // w)
    x = x.view(-1, hp, wp, w, w, x.shape[-1]).transpose(2, 3).reshape(-1, hp * w, wp * w, x.shape[-1])
    return x[:, :gh, :gw]


def rel_pos_table(size: int, table: torch.Tensor) -> torch.Tensor:
    """[size, size, D]: the embedding of every (query, key) offset along one axis, the learned
    table [2s - 1, D] linearly resampled when it was learned for another size (as timm and SAM)."""
    if table.shape[0] != 2 * size - 1:
        table = F.interpolate(table.T[None], size=2 * size - 1, mode="linear")[0].T
    offsets = torch.arange(size)[:, None] - torch.arange(size)[None, :] + size - 1
    return table[offsets.to(table.device)]


def decomposed_bias(q: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """MViTv2's decomposed relative position bias (Li et al., CVPR 2022; SAM): q [B, H, h*w, D]
    -> [B, H, h*w, h*w], q . R_h[row offset] + q . R_w[column offset]."""
    h, w = size
    r = q.reshape(*q.shape[:2], h, w, q.shape[-1])
    by_row = torch.einsum("bnhwc,hkc->bnhwk", r, rel_pos_table(h, rel_h))
    by_col = torch.einsum("bnhwc,wkc->bnhwk", r, rel_pos_table(w, rel_w))
    return (by_row[..., :, None] + by_col[..., None, :]).reshape(*q.shape[:2], h * w, h * w)


def window_map(a: torch.Tensor, grid: tuple[int, int], w: int) -> torch.Tensor:
    """Every window's attention [B * windows, H, w*w, w*w] as one [B, H, N, N] over the grid: 0
    between windows; what a query gave the padding (keys past the grid's edge) is left out."""
    (gh, gw), N = grid, grid[0] * grid[1]
    hp, wp = -(-gh // w), -(-gw // w)
    rows = torch.arange(hp * w).view(hp, 1, w, 1).expand(hp, wp, w, w)
    cols = torch.arange(wp * w).view(1, wp, 1, w).expand(hp, wp, w, w)
    index = (rows * gw + cols).where((rows < gh) & (cols < gw), N).reshape(hp * wp, w * w).to(a.device)  # N: padding
    a = a.reshape(-1, hp * wp, *a.shape[1:]).transpose(1, 2)  # [B, H, windows, w*w, w*w]
    out = a.new_zeros(a.shape[0], a.shape[1], N + 1, N + 1)
    out[:, :, index[:, :, None], index[:, None, :]] = a
    return out[:, :, :N, :N]


@register("attention", "window")
class WindowAttention(VariantAttention):
    """SAM's attention: within windows of w x w patches, or over the whole grid in the global
    blocks, with a decomposed relative position bias. Captured: one [B, H, N, N] per block,
    windows on the diagonal (``window_map``)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        self.window = 0 if index in cfg.global_blocks else cfg.window_size
        gh, gw = (self.window, self.window) if self.window else cfg.grid_size
        decomposed = cfg.rel_pos == "decomposed"
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * gh - 1, self.head_dim)) if decomposed else None
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * gw - 1, self.head_dim)) if decomposed else None

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As the plain attention's, on ``positions.grid`` (None: the trained grid); q, k, v pass their
        hook points per window [B * windows, H, w*w, D] (the whole grid in a global block)."""
        B, N, C = x.shape
        grid, w = positions.grid if positions is not None else self.grid, self.window
        t = x.reshape(B, *grid, C)
        t = window_partition(t, w) if w else t  # [B', h, w, C]: windows or the whole grid
        size = (t.shape[1], t.shape[2])
        q, k, v = self.project(t.flatten(1, 2))  # [B', H, h*w, D]
        q, k, v = self.hook_q(self.q_norm(q)), self.hook_k(self.k_norm(k)), self.hook_v(v)
        if self.relevance_rule is not None:  # before the bias, which reads q
            q, k, v = self.relevance_rule(q, k, v)
        bias = decomposed_bias(q, self.rel_pos_h, self.rel_pos_w, size) if self.rel_pos_h is not None else None
        o, attn = self.attend(q, k, v, self.scale, capture, bias, None, self.hook_scores)
        o = o.transpose(1, 2).flatten(2)  # [B', h*w, C]: the heads side by side
        if w:
            o = window_unpartition(o.reshape(-1, *size, C), w, grid)
        if attn is not None and w:  # one [B, H, N, N]; gradients reach it through a term worth 0
            attn = window_map(attn.detach(), grid, w)
            if torch.is_grad_enabled():
                attn.requires_grad_(True)
                v = window_unpartition(v.transpose(1, 2).flatten(2).reshape(-1, *size, C), w, grid)
                v = v.reshape(B, N, self.num_heads, -1).transpose(1, 2)  # [B, H, N, D]
                o = o.reshape(B, N, C) + ((attn - attn.detach()) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(self.norm(o.reshape(B, N, C))), attn


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of a [B, C, h, w] map (timm's LayerNorm2d)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


class SamNeck(nn.Sequential):
    """SAM's neck after the blocks: 1x1 convolution, norm, 3x3 convolution, norm (no biases), on the
    tokens laid out as their grid: [B, gh*gw, C] -> [B, gh*gw, neck_chans]."""

    def __init__(self, cfg: ViTConfig) -> None:
        C, n = cfg.embed_dim, cfg.neck_chans
        super().__init__(nn.Conv2d(C, n, 1, bias=False), ChannelNorm(n), nn.Conv2d(n, n, 3, padding=1, bias=False),
                         ChannelNorm(n))
        self.out_chans = n

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x.transpose(1, 2).unflatten(2, grid)).flatten(2).transpose(1, 2)


register("part", "neck")(lambda cfg: SamNeck(cfg) if cfg.neck_chans else None)
