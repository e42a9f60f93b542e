"""A Vision Transformer written from scratch, readable top to bottom.

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), plus the variants timm
builds on the same skeleton: DeiT (distillation token), DeiT-III (LayerScale, position
embedding without the prefix tokens), CLIP (pre-norm, QuickGELU), register tokens, and
average-pool heads with ``fc_norm``.

Parameter names follow timm's state_dict layout, so porting is a checked copy (see checkpoints/timm.py).
Nothing here imports timm: timm is the reference we compare against, not a building block.

Shapes in comments: B batch, C embed dim, N tokens, P prefix tokens, gh x gw patch grid,
H heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines the architecture of a plain ViT."""

    img_size: tuple[int, int] = (224, 224)  # the size it was trained at (H, W)
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0  # MLP hidden width = embed_dim * mlp_ratio
    qkv_bias: bool = True
    norm_eps: float = 1e-6  # 1e-6 for timm ViT/DeiT, 1e-5 for CLIP
    act: Literal["gelu", "quick_gelu"] = "gelu"
    class_token: bool = True
    dist_token: bool = False  # DeiT distillation token (two heads, averaged at inference)
    reg_tokens: int = 0  # register tokens (Darcet et al. 2024)
    no_embed_class: bool = False  # pos embed covers patches only, added before prefix concat
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP); patch conv has no bias then
    patch_bias: bool = True
    final_norm: bool = True
    layer_scale: bool = False  # LayerScale (DeiT-III, DINOv2); values come from the weights
    global_pool: Literal["token", "avg", ""] = "token"
    fc_norm: bool = False  # norm after pooling instead of before (avg-pool heads)
    num_classes: int = 1000  # 0: headless (features only, e.g. DINO)
    pos_embed_antialias: bool = True  # resampling positions for another input size: timm antialiases, transformers not
    # Trained here only, never in a port (timm's ViT has no such option; timm parity does not cover it):
    conv_stem: bool = False  # 3x3 stride-2 convolutions + BatchNorm + ReLU before a 1x1 patch projection (ConvStem)

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", tuple(int(s) for s in self.img_size))
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.global_pool == "token" and not (self.class_token or self.dist_token):
            raise ValueError("global_pool='token' needs a class token")
        if self.act not in ("gelu", "quick_gelu"):
            raise ValueError(f"unknown activation {self.act!r}")
        if self.conv_stem and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"conv_stem needs a patch size that is a power of 2, got {self.patch_size}")

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ViTConfig fields: {sorted(unknown)}")
        return cls(**d)


class TokenLayout(NamedTuple):
    """Where each token sits in the sequence: [class] [dist] [reg...] patches (row-major)."""

    num_prefix: int
    cls_index: int | None  # index of [class], None if the model has none
    dist_index: int | None
    reg_indices: tuple[int, ...]
    grid: tuple[int, int]  # (gh, gw) patch grid of this input

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def names(self) -> list[str]:
        """A short name for every prefix token, in order."""
        out = ["[class]"] if self.cls_index is not None else []
        out += ["[dist]"] if self.dist_index is not None else []
        out += [f"[reg{i}]" for i in range(len(self.reg_indices))]
        return out


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ConvStem(nn.Sequential):
    """Xiao et al., "Early convolutions help transformers see better" (NeurIPS 2021): log2(patch)
    3x3 stride-2 convolutions, each with BatchNorm and ReLU, widths doubling up to embed_dim / 2.
    Edges and corners come out of it, either contrast polarity alike; a 1x1 projection follows."""

    def __init__(self, cfg: ViTConfig) -> None:
        n = cfg.patch_size.bit_length() - 1  # patch 4: two halvings
        widths = [cfg.embed_dim // 2 ** (n - i) for i in range(n)]
        layers: list[nn.Module] = []
        for c_in, c_out in zip([cfg.in_chans, *widths], widths):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        super().__init__(*layers)


class PatchEmbed(nn.Module):
    """Cut the image into patches and project each one: a strided convolution does both
    (with ``conv_stem``, convolutions reach the patch grid and a 1x1 convolution projects)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        p = cfg.patch_size
        self.stem = ConvStem(cfg) if cfg.conv_stem else None
        c_in, p = (cfg.embed_dim // 2, 1) if cfg.conv_stem else (cfg.in_chans, p)
        self.proj = nn.Conv2d(c_in, cfg.embed_dim, kernel_size=p, stride=p, bias=cfg.patch_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        _, _, h, w = x.shape  # [B, 3, h, w]
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(f"input {h}x{w} is not a multiple of the patch size {p}")
        if self.stem is not None:
            x = self.stem(x)  # [B, C/2, gh, gw]
        x = self.proj(x)  # [B, C, gh, gw]
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])  # [B, gh*gw, C], row-major


class Attention(nn.Module):
    """Multi-head self-attention. Two paths, same numbers: a fused kernel for speed, and an
    explicit softmax(q k^T / sqrt(d)) that also returns the attention probabilities."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.embed_dim // cfg.num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim, bias=cfg.qkv_bias)
        self.proj = nn.Linear(cfg.embed_dim, cfg.embed_dim)
        self.relevance_rule: Callable | None = None  # set only in LRP's explanation mode (lrp.py)

    def forward(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, D]
        if self.relevance_rule is not None:  # same values, gradients shaped by an LRP rule
            q, k, v = self.relevance_rule(q, k, v)
        if capture:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, H, N, N]
            x = attn @ v
        else:
            attn = None
            x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, C)  # concatenate the heads
        return self.proj(x), attn


class Mlp(nn.Module):
    """Two linear layers with a GELU between: applied to every token independently."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.embed_dim, cfg.mlp_hidden)
        self.act = QuickGELU() if cfg.act == "quick_gelu" else nn.GELU()
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LayerScale(nn.Module):
    """Per-channel learned scale on a residual branch (Touvron et al., CaiT / DeiT-III)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ls1 = LayerScale(cfg.embed_dim) if cfg.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.mlp = Mlp(cfg)
        self.ls2 = LayerScale(cfg.embed_dim) if cfg.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, attn = self.attn(self.norm1(x), capture)
        x = x + self.ls1(a)
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x, attn


def resample_pos_embed(
    pos: torch.Tensor, old: tuple[int, int], new: tuple[int, int], antialias: bool = True
) -> torch.Tensor:
    """Resize a [1, gh*gw, C] grid of position embeddings to a new grid, bicubic, with
    antialiasing as timm does for ``dynamic_img_size`` (transformers' ``interpolate_pos_encoding``
    uses plain bicubic: ``antialias=False``)."""
    if old == new:
        return pos
    C = pos.shape[-1]
    grid = pos.float().reshape(1, old[0], old[1], C).permute(0, 3, 1, 2)  # [1, C, gh, gw]
    grid = F.interpolate(grid, size=new, mode="bicubic", antialias=antialias)
    return grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], C).to(pos.dtype)


class ViTOutput(NamedTuple):
    """What a forward pass returns. ``attentions`` is filled only when captured."""

    logits: torch.Tensor  # [B, num_classes], or pooled features [B, C] when headless
    attentions: list[torch.Tensor] | None  # per layer, post-softmax [B, H, N, N]
    layout: TokenLayout


class VisionTransformer(nn.Module):
    """The ViT: patch embedding + prefix tokens + position embedding, L blocks, norm, head."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, C)) if cfg.reg_tokens else None
        gh, gw = cfg.grid_size
        pos_len = gh * gw + (0 if cfg.no_embed_class else cfg.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.randn(1, pos_len, C) * 0.02)
        self.norm_pre = nn.LayerNorm(C, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(C, eps=cfg.norm_eps) if cfg.final_norm and not cfg.fc_norm else nn.Identity()
        self.fc_norm = nn.LayerNorm(C, eps=cfg.norm_eps) if cfg.final_norm and cfg.fc_norm else nn.Identity()
        self.head = nn.Linear(C, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = nn.Linear(C, cfg.num_classes) if cfg.dist_token and cfg.num_classes > 0 else None

    @torch.no_grad()
    def init_weights(self) -> VisionTransformer:
        """Initialise for training from scratch, as ViT / DeiT do: truncated normal (std 0.02)
        for linear layers and position embeddings, zero biases, unit LayerNorms, a tiny
        [class] token, and a zero head so that every class starts out equally likely."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for t in (self.cls_token, self.dist_token, self.reg_token):
            if t is not None:
                nn.init.normal_(t, std=1e-6)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        return self

    def layout(self, grid: tuple[int, int]) -> TokenLayout:
        cfg = self.cfg
        i = 0
        cls_index = dist_index = None
        if cfg.class_token:
            cls_index, i = i, i + 1
        if cfg.dist_token:
            dist_index, i = i, i + 1
        regs = tuple(range(i, i + cfg.reg_tokens))
        return TokenLayout(cfg.num_prefix_tokens, cls_index, dist_index, regs, grid)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, TokenLayout]:
        """Image [B, 3, h, w] -> token sequence [B, P + gh*gw, C] with position information."""
        cfg = self.cfg
        x, (gh, gw) = self.patch_embed(x)  # [B, gh*gw, C]
        B = x.shape[0]
        pos = self.pos_embed
        if (gh, gw) != cfg.grid_size:  # another input size: resample the patches' positions
            P = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
            pos = torch.cat([pos[:, :P], resample_pos_embed(pos[:, P:], cfg.grid_size, (gh, gw), cfg.pos_embed_antialias)], dim=1)
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if cfg.no_embed_class:  # DeiT-III / DINOv2: only patches get a position
            x = torch.cat(prefix + [x + pos], dim=1)
        else:
            x = torch.cat(prefix + [x], dim=1) + pos
        return x, self.layout((gh, gw))

    def forward_features(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], TokenLayout]:
        """All tokens after the last block and final norm [B, N, C], plus captured attention."""
        x, layout = self.embed(x)
        x = self.norm_pre(x)
        attentions = []
        for block in self.blocks:
            x, attn = block(x, capture)
            if capture:
                attentions.append(attn)
        return self.norm(x), attentions, layout

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        """Token sequence [B, N, C] -> logits [B, classes] (or pooled features if headless)."""
        cfg = self.cfg
        if self.head_dist is not None:  # DeiT distilled: average the [class] and [dist] heads
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2
        if cfg.global_pool == "token":
            x = x[:, 0]
        elif cfg.global_pool == "avg":
            x = x[:, cfg.num_prefix_tokens :].mean(dim=1)
        return self.head(self.fc_norm(x))

    def forward(self, x: torch.Tensor, capture: bool = False) -> ViTOutput:
        """Image [B, 3, h, w] -> logits; with ``capture=True`` also every layer's attention."""
        feats, attentions, layout = self.forward_features(x, capture)
        return ViTOutput(self.forward_head(feats), attentions if capture else None, layout)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

