"""Rotary position embedding in 2-D (RoPE; Su et al. 2021, for images: Heo et al., ECCV 2024):
EVA-02, RoPE-ViT (incl. learned mixed frequencies), DINOv3, PE, Sapiens2.

The model holds one :class:`RotaryEmbedding` (``rope``: timm's name) that makes the table of angles
for an input's patch grid; every block's :class:`RotaryAttention` turns its queries and keys by it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .config import ViTConfig
from .variants import VariantAttention
from .vit import register


class RotaryEmbedding(nn.Module):
    """2-D rotary position embedding (RoPE; Su et al. 2021, for images: Heo et al., ECCV 2024).

    Each patch's query and key are cut into pairs of channels and every pair is turned by an
    angle that grows with the patch's position, so q . k depends on where two patches are
    relative to each other. The angles are a table [n, D/2]: ``axial`` (EVA-02, RoPE-ViT, PE)
    gives the first half of each head's pairs the row (or x) coordinate and the second half the
    column, times frequencies temperature^(-i / (D/4)); ``mixed`` (RoPE-ViT) learns frequencies
    per block and head that mix x and y; ``dinov3`` uses coordinates in [-1, 1] and 2 pi / periods.
    ``table(grid)`` gives [n, 2D] (sin | cos), or [L, H, n, 2D] for ``mixed``.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.attn_head_dim
        if cfg.rope == "mixed":  # learned [x or y, block, head, D/2]; initialised as RoPE-ViT: turned at random
            mag = 1.0 / cfg.rope_temperature ** (torch.arange(0, D, 4).float() / D)
            turn = torch.rand(cfg.depth, cfg.num_heads, 1) * 2 * math.pi
            fx = torch.cat([mag * torch.cos(turn), mag * torch.cos(turn + math.pi / 2)], dim=-1)
            fy = torch.cat([mag * torch.sin(turn), mag * torch.sin(turn + math.pi / 2)], dim=-1)
            self.freqs = nn.Parameter(torch.stack([fx, fy]))
        self.cache: dict[tuple[Any, ...], torch.Tensor] = {}  # fixed tables per grid and device

    def coordinates(self, grid: tuple[int, int]) -> torch.Tensor:
        """[n, 2] coordinates of the patches (row-major), as (row, col) or (x, y) with ``rope_xy``."""
        cfg = self.cfg
        shape, ref = (grid[::-1], (cfg.rope_ref_grid or ())[::-1]) if cfg.rope_xy else (grid, cfg.rope_ref_grid)
        if cfg.rope == "dinov3":  # patch centres in (0, 1) of the image side, then [-1, 1]
            denom = {"separate": shape, "min": (min(shape),) * 2, "max": (max(shape),) * 2}[cfg.rope_normalize]
            axes = [(torch.arange(0.5, s, dtype=torch.float32) + cfg.rope_offset) / d for s, d in zip(shape, denom)]
        else:
            axes = [torch.arange(s).float() + cfg.rope_offset for s in shape]
            if ref:  # EVA: as if the grid had the size it was pretrained at
                axes = [a / s * r for a, s, r in zip(axes, shape, ref)]
        c = torch.stack(torch.meshgrid(axes, indexing="xy" if cfg.rope_xy else "ij"), dim=-1).reshape(-1, 2)
        return 2.0 * c - 1.0 if cfg.rope == "dinov3" else c

    def angles(self, grid: tuple[int, int]) -> torch.Tensor:
        """The angle of every patch and pair: [n, D/2], or [L, H, n, D/2] for ``mixed``."""
        cfg, n4 = self.cfg, self.cfg.attn_head_dim // 4
        c = self.coordinates(grid).to(self.freqs.device if cfg.rope == "mixed" else "cpu")
        if cfg.rope == "mixed":
            return c[:, 0, None] * self.freqs[0][..., None, :] + c[:, 1, None] * self.freqs[1][..., None, :]
        if cfg.rope == "dinov3":
            lo_hi = cfg.rope_periods
            periods = (lo_hi[0] * (lo_hi[1] / lo_hi[0]) ** torch.linspace(0, 1, n4) if lo_hi else
                       cfg.rope_temperature ** (2.0 * torch.arange(n4, dtype=torch.float32) / (2 * n4)))
            return (2 * math.pi * c[:, :, None] / periods).flatten(1)
        bands = 1.0 / cfg.rope_temperature ** (torch.arange(n4, dtype=torch.float32) / n4)
        return (c[:, :, None] * bands).flatten(1)  # [n, (row | x) bands then (col | y) bands]

    def table(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """sin | cos of the angles, each repeated for the two channels of its pair."""
        if self.cfg.rope == "mixed":  # learned: follows the parameters (and their gradients)
            return self.encode(self.angles(grid)).to(device)
        key = (grid, str(device))
        if key not in self.cache:  # fixed: one table per grid and device, kept out of autograd and inference mode
            with torch.inference_mode(False), torch.no_grad():
                self.cache[key] = self.encode(self.angles(grid)).to(device)
        return self.cache[key]

    def encode(self, a: torch.Tensor) -> torch.Tensor:
        a = torch.cat([a, a], dim=-1) if self.cfg.rope_half else a.repeat_interleave(2, dim=-1)
        return torch.cat([a.sin(), a.cos()], dim=-1)


def rotate(x: torch.Tensor, table: torch.Tensor, num_prefix: int, half: bool) -> torch.Tensor:
    """Turn the patch tokens of q or k [B, H, N, D] by ``table`` ([n, 2D] or [H, n, 2D]); the
    prefix tokens have no position and stay as they are."""
    sin, cos = table.chunk(2, dim=-1)
    p = x[:, :, num_prefix:]
    if half:  # pairs (i, i + D/2): (a, b) -> (-b, a)
        a, b = p.chunk(2, dim=-1)
        turned = torch.cat([-b, a], dim=-1)
    else:  # pairs (2i, 2i + 1)
        turned = torch.stack([-p[..., 1::2], p[..., ::2]], dim=-1).reshape(p.shape)
    return torch.cat([x[:, :, :num_prefix], (p * cos + turned * sin).to(x.dtype)], dim=2)


@register("attention", "rope")
class RotaryAttention(VariantAttention):
    """Attention whose queries and keys are turned by the model's rotary table (after their norms,
    before grouped k/v heads are repeated)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        self.index, self.num_prefix, self.rope_half = index, cfg.num_prefix_tokens, cfg.rope_half

    def turn(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [B, H, N, D] turned by ``table``: [n, 2D], [H, n, 2D], or ``mixed``'s [L, H, n, 2D] (this block's)."""
        table = table[self.index] if table.ndim == 4 else table
        return rotate(q, table, self.num_prefix, self.rope_half), rotate(k, table, self.num_prefix, self.rope_half)


register("part", "rope")(lambda cfg: RotaryEmbedding(cfg) if cfg.rope else None)
