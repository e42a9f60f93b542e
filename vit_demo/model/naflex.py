"""NaFlexViT's embedding (timm's naflexvit, on an image: its dense path): a Linear projection of each
patch's pixels instead of a convolution, and a position table resampled its own way for every grid
(bicubic or bilinear, aligned corners or not, aspect-preserving or not; or one table per axis), none
on the prefix tokens. ``img_size`` is the position table's grid times the patch size.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig
from .vit import PatchEmbed, VisionTransformer, register


@register("embed", "naflex")
class NaFlexEmbed(PatchEmbed):
    """A Linear over each patch's pixels, in (row, column, channel) order."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__(cfg)
        p = cfg.patch_size
        self.proj = nn.Linear(p * p * cfg.in_chans, cfg.embed_dim, bias=cfg.patch_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        _, _, h, w = x.shape  # [B, 3, h, w]
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(f"input {h}x{w} is not a multiple of the patch size {p}")
        # [B, gh*gw, p*p*3], each patch row by row, channels fastest
        x = x.unflatten(2, (h // p, p)).unflatten(4, (w // p, p)).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)
        return self.norm(self.proj(x)), (h // p, w // p)


def naflex_positions(model: VisionTransformer, grid: tuple[int, int]) -> torch.Tensor | None:
    """NaFlexViT's positions for a gh x gw grid, [1, gh*gw, C] (None without): its table resampled
    (to L x L, the top-left gh x gw kept, when aspect-preserving), as timm's NaFlexEmbeds does
    for an image; a factorized table is two 1-D tables resampled linearly and added."""
    cfg, (gh, gw) = model.cfg, grid
    side = (max(grid),) * 2 if cfg.pos_embed_square else grid
    if getattr(model, "pos_embed_y", None) is not None:
        def axis(t: torch.Tensor, n: int) -> torch.Tensor:  # [1, L, C] -> [1, n, C]
            return t if t.shape[1] == n else F.interpolate(t.transpose(1, 2).float(), size=n, mode="linear").transpose(1, 2)

        pos = (axis(model.pos_embed_y, side[0])[:, :gh, None] + axis(model.pos_embed_x, side[1])[:, None, :gw])
        return pos.flatten(1, 2).to(model.pos_embed_y.dtype)
    if model.pos_embed is None:
        return None
    if grid == tuple(model.pos_embed.shape[1:3]):
        return model.pos_embed.flatten(1, 2)
    pos = F.interpolate(model.pos_embed.permute(0, 3, 1, 2).float(), size=side, mode=cfg.pos_embed_mode,
                        align_corners=cfg.pos_embed_align_corners, antialias=cfg.pos_embed_antialias)
    return pos[:, :, :gh, :gw].flatten(2).transpose(1, 2).to(model.pos_embed.dtype)


@register("init", "naflex")
def naflex_tables(model: VisionTransformer) -> None:
    """The model's positions the NaFlex way: one table per axis when factorized (``pos_embed_y``,
    ``pos_embed_x``, timm's names in our layout) and :func:`naflex_positions` for every grid."""
    cfg = model.cfg
    if cfg.pos_embed and cfg.pos_embed_factorized:
        (gh, gw), C = cfg.grid_size, cfg.embed_dim
        model.pos_embed = None
        model.pos_embed_y = nn.Parameter(torch.randn(1, gh, C) * 0.02)
        model.pos_embed_x = nn.Parameter(torch.randn(1, gw, C) * 0.02)
    model.position_embedding = partial(naflex_positions, model)
