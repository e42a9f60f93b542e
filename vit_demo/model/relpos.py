"""Relative position biases added to the attention scores: BEiT's learned tables (one per block, or
one shared: ``rel_pos_bias``) and the relpos ViT's small MLP of the log-spaced offset (one per block,
or one shared: ``shared_rel_pos``). Both are defined for the patch grid the model was trained at
(as in timm): another input size is refused in words. SAM's decomposed bias is in sam.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig
from .variants import VariantAttention
from .vit import Mlp, register


def check_grid(grid: tuple[int, int], trained: tuple[int, int]) -> None:
    if grid != trained:
        raise ValueError(f"a relative position bias is defined for the {trained[0]}x{trained[1]} patch grid the "
                         f"model was trained at, not {grid[0]}x{grid[1]}: use its input size")


def relative_position_index(grid: tuple[int, int], cls: bool) -> torch.Tensor:
    """[N, N] index into a table of (2gh-1)(2gw-1) relative offsets (Swin, BEiT), plus three
    entries for [class] -> patch, patch -> [class] and [class] -> [class] when ``cls``."""
    gh, gw = grid
    yx = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # [2, n]
    d = (yx[:, :, None] - yx[:, None, :]).permute(1, 2, 0)  # [n, n, 2] offsets
    index = (d[..., 0] + gh - 1) * (2 * gw - 1) + (d[..., 1] + gw - 1)
    if cls:
        m = (2 * gh - 1) * (2 * gw - 1)
        index = F.pad(index, (1, 0, 1, 0))
        index[0, :], index[:, 0], index[0, 0] = m, m + 1, m + 2
    return index


def table_bias(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A learned relative-position table [entries, H] -> the attention bias [1, H, N, N] (BEiT:
    [class] is the only prefix token)."""
    n = grid[0] * grid[1] + 1
    index = relative_position_index(grid, cls=True).to(table.device)
    return table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)


def new_table(cfg: ViTConfig) -> nn.Parameter:
    gh, gw = cfg.grid_size
    return nn.Parameter(torch.zeros((2 * gh - 1) * (2 * gw - 1) + 3, cfg.num_heads))


class RelPosTable(nn.Module):
    """BEiT's relative position bias shared by all blocks: one learned table."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.grid = cfg.grid_size
        self.relative_position_bias_table = new_table(cfg)

    def forward(self, grid: tuple[int, int]) -> torch.Tensor:
        check_grid(grid, self.grid)
        return table_bias(self.relative_position_bias_table, grid)


class RelPosMlp(nn.Module):
    """The relpos ViT's bias: a small MLP (ReLU) of the log-spaced relative offset,
    sign(d) log(1 + |d|) per axis (timm's "cr" mode, after Swin-V2), one output per head.
    Prefix tokens get no bias."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.num_prefix, self.grid = cfg.num_prefix_tokens, cfg.grid_size
        self.mlp = Mlp(2, cfg.rel_pos_hidden, nn.ReLU(), out=cfg.num_heads)

    def forward(self, grid: tuple[int, int]) -> torch.Tensor:
        check_grid(grid, self.grid)
        gh, gw = grid
        d = torch.stack(torch.meshgrid(torch.arange(1 - gh, gh).float(), torch.arange(1 - gw, gw).float(),
                                       indexing="ij"), dim=-1).to(self.mlp.fc1.weight.device)  # [2gh-1, 2gw-1, 2]
        bias = self.mlp(torch.sign(d) * torch.log(1.0 + d.abs())).view(-1, self.mlp.fc2.out_features)
        n = gh * gw
        bias = bias[relative_position_index(grid, cls=False).to(d.device).view(-1)].view(n, n, -1).permute(2, 0, 1)
        return F.pad(bias, [self.num_prefix, 0, self.num_prefix, 0]).unsqueeze(0)  # [1, H, N, N]


@register("attention", "relpos")
class RelPosAttention(VariantAttention):
    """Attention with a relative position bias of its own: BEiT's table (``rel_pos="table"``, the
    parameter ``relative_position_bias_table`` on the attention) or the relpos ViT's MLP (``"mlp"``)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        self.rel_pos = RelPosMlp(cfg) if cfg.rel_pos == "mlp" else None
        self.relative_position_bias_table = new_table(cfg) if cfg.rel_pos == "table" else None

    def position_bias(self, grid: tuple[int, int], shared: torch.Tensor | None) -> torch.Tensor | None:
        """This block's relative position bias [1, H, N, N] plus the shared one, if any."""
        if self.rel_pos is not None:
            own = self.rel_pos(grid)
        else:
            check_grid(grid, self.grid)
            own = table_bias(self.relative_position_bias_table, grid)
        return own if shared is None else own + shared


register("part", "rel_pos_bias")(lambda cfg: RelPosTable(cfg) if cfg.rel_pos == "shared_table" else None)
register("part", "shared_rel_pos")(lambda cfg: RelPosMlp(cfg) if cfg.rel_pos == "shared_mlp" else None)
