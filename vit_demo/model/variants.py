"""timm's small variants of the ViT's parts, each a config option of a few lines:

- norms and activations: RMSNorm (AIMv2, Sapiens2), QuickGELU (CLIP), GELU-tanh (SigLIP), SiLU (GLUs);
- attention: learned q and v biases (BEiT, EVA), three projections instead of one (EVA-02 CLIP, PE),
  grouped-query attention (Sapiens2), a norm on every head's q and k, a norm on the heads' output
  (EVA-02 CLIP, BEiT-3). The position families extend it (rope.py, relpos.py, sam.py);
- MLPs: gated linear units (SwiGLU, packed and unpacked) and NormFormer's norm on the hidden layer;
- blocks: res-post norms (EVA-02-E, the "rpn" ViTs), LayerScale stored on the block as timm's EVA and
  BEiT name it, or on the attention branch only (Sapiens2).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .config import ViTConfig
from .vit import PARTS, Block, HookPoint, Positions, SelfAttention, make_act, make_norm, register


@register("norm", "rmsnorm")
class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without centring or bias (Zhang & Sennrich 2019)."""

    relevance = "rms_norm"  # LRP holds its root mean square constant (methods/lrp.py)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


@register("act", "quick_gelu")
class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    relevance = "activation"  # LRP's identity rule, as for GELU (methods/lrp.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


PARTS["act"].update(gelu_tanh=partial(nn.GELU, approximate="tanh"), silu=nn.SiLU)


@register("attention", "variant")
class VariantAttention(SelfAttention):
    """Multi-head self-attention with timm's variants (the module docstring lists them). A position
    family's subclass turns q and k (``turn``, rope.py) or adds a bias of its own (``position_bias``)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        C, H, D = cfg.embed_dim, self.num_heads, self.head_dim
        self.kv_heads = cfg.kv_heads[index] if cfg.kv_heads else H
        self.grid = cfg.grid_size
        self.q_bias = None
        if not cfg.qkv_fused:  # three projections (EVA-02 CLIP, PE, Sapiens2)
            self.qkv = None
            self.q_proj = nn.Linear(C, H * D, bias=cfg.qkv_bias or cfg.qv_bias)
            self.k_proj = nn.Linear(C, self.kv_heads * D, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(C, self.kv_heads * D, bias=cfg.qkv_bias or cfg.qv_bias)
        elif cfg.qv_bias:  # EVA, BEiT: biases on q and v only (k's is a fixed 0)
            self.q_bias, self.v_bias = nn.Parameter(torch.zeros(H * D)), nn.Parameter(torch.zeros(H * D))
            self.register_buffer("k_bias", torch.zeros(H * D), persistent=False)
        self.q_norm = make_norm(cfg, D) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, D) if cfg.qk_norm else nn.Identity()
        self.norm = make_norm(cfg, H * D) if cfg.attn_norm else nn.Identity()

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, N, C] -> q [B, H, N, D], k and v [B, H_kv, N, D]."""
        B, N, _ = x.shape
        H, D = self.num_heads, self.head_dim
        if self.qkv is None:
            q = self.q_proj(x).reshape(B, N, H, D).transpose(1, 2)
            k = self.k_proj(x).reshape(B, N, self.kv_heads, D).transpose(1, 2)
            return q, k, self.v_proj(x).reshape(B, N, self.kv_heads, D).transpose(1, 2)
        qkv = self.qkv(x)
        if self.q_bias is not None:  # EVA, BEiT: q and v biases, k's fixed at 0
            qkv = qkv + torch.cat((self.q_bias, self.k_bias, self.v_bias))
        q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
        return q, k, v

    def position_bias(self, grid: tuple[int, int], shared: torch.Tensor | None) -> torch.Tensor | None:
        """This block's relative position bias [1, H, N, N] plus the shared one: here the shared one."""
        return shared

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As the plain attention's; ``positions``: the grid, a rotary table, a relative bias shared by the
        blocks (VisionTransformer.positions; None: the trained grid, no rotation, no shared bias)."""
        B, N, _ = x.shape
        p = positions or Positions(self.grid, None, None)
        q, k, v = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        if p.rope is not None:  # rope.py: the patch tokens turned by their 2-D position
            q, k = self.turn(q, k, p.rope)
        if self.kv_heads != self.num_heads:  # grouped-query attention: each k/v head serves a group of q heads
            k = k.repeat_interleave(self.num_heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.num_heads // self.kv_heads, dim=1)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)  # as they enter the scores: normed, turned, repeated
        bias = self.position_bias(p.grid, p.bias)
        o, attn = self.attend(q, k, v, self.scale, capture, bias, self.relevance_rule, self.hook_scores)
        return self.proj(self.norm(o.transpose(1, 2).reshape(B, N, -1))), attn


@register("mlp", "variant")
class GatedMlp(nn.Module):
    """The MLP with NormFormer's norm on its hidden layer (EVA-02, BEiT-3), or a gated linear unit
    (GLU, Shazeer 2020): act(gate) * value, then fc2. ``swiglu`` has separate gate and value layers
    (fc1_g, fc1_x), ``glu`` one fc1 whose first half is the gate."""

    relevance = "gate"  # LRP (methods/lrp.py) gives modules so marked a rule for act(gate) * value:
    relevance_rule: Callable | None = None  # set only in its explanation mode

    def __init__(self, dim: int, hidden: int, act: nn.Module, bias: bool = True, kind: str = "mlp",
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.fc1_g = nn.Linear(dim, hidden, bias=bias)
            self.fc1_x = nn.Linear(dim, hidden, bias=bias)
        else:
            self.fc1 = nn.Linear(dim, 2 * hidden if kind == "glu" else hidden, bias=bias)
        self.act = act
        self.hook_hidden = HookPoint()  # the hidden activation [B, N, hidden]: act(fc1), or act(gate) * value
        self.norm = norm or nn.Identity()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    @classmethod
    def of(cls, cfg: ViTConfig) -> GatedMlp:
        """The blocks' MLP."""
        h = cfg.mlp_hidden
        return cls(cfg.embed_dim, h, make_act(cfg.act), bias=cfg.proj_bias, kind=cfg.mlp,
                   norm=make_norm(cfg, h) if cfg.mlp_norm else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mlp":
            return self.fc2(self.norm(self.hook_hidden(self.act(self.fc1(x)))))
        gate, value = (self.fc1_g(x), self.fc1_x(x)) if self.kind == "swiglu" else self.fc1(x).chunk(2, dim=-1)
        gate = self.act(gate)
        if self.relevance_rule is not None:  # same values, gradients shaped by an LRP rule
            gate, value = self.relevance_rule(gate, value)
        return self.fc2(self.norm(self.hook_hidden(gate * value)))


@register("block", "variant")
class VariantBlock(Block):
    """The block with ``post_norm``: the norm moves onto the branch, x + norm(attn(x)), then
    x + norm(mlp(x)); or with LayerScale as EVA and BEiT store it (``gamma_1``, ``gamma_2``), or
    on the attention branch only (Sapiens2)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        self.post_norm = cfg.post_norm
        on_block = cfg.layer_scale and cfg.layer_scale_on_block  # the same scales, other names
        if on_block:
            self.ls1 = nn.Identity()
        if on_block or cfg.layer_scale_attn_only:
            self.ls2 = nn.Identity()
        C = cfg.embed_dim
        self.gamma_1 = nn.Parameter(torch.full((C,), 1e-5)) if on_block else None
        self.gamma_2 = nn.Parameter(torch.full((C,), 1e-5)) if on_block and not cfg.layer_scale_attn_only else None

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = x if self.post_norm else self.norm1(x)
        a, attn = self.attn(h, capture) if positions is None else self.attn(h, capture, positions)
        if self.post_norm:
            x = x + self.norm1(a)
            return x + self.norm2(self.mlp(x)), attn
        x = x + (self.ls1(a) if self.gamma_1 is None else self.gamma_1 * a)
        m = self.mlp(self.norm2(x))
        return x + (self.ls2(m) if self.gamma_2 is None else self.gamma_2 * m), attn
