"""Differential attention and parallel blocks (timm's vit_d*, vit_*_xp_*, vit_pwee, vit_dpwee,
vit_*_18x2_*): attention kinds that exist in timm with a plain attention only.

- differential attention (Ye et al., "Differential Transformer", ICLR 2025): two softmax maps per
  head, the second weighted by lambda and subtracted;
- parallel scaling blocks (ViT-22B): the attention and the MLP side by side, from one projection;
- parallel branches ("Three things everyone should know about Vision Transformers"): n attentions
  side by side, then n MLPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .capture import probabilities
from .config import ViTConfig
from .variants import RMSNorm, VariantAttention
from .vit import PARTS, HookPoint, LayerScale, Positions, make_act, make_norm, register


def add_diff_params(m: nn.Module, d: int, index: int) -> None:
    """Differential attention's parameters on ``m`` (timm's names, on the attention or the block):
    the vectors whose products give lambda, the heads' RMSNorm (``sub_norm``, eps 1e-5), and
    lambda_init = 0.8 - 0.6 exp(-0.3 * block index) (Ye et al., "Differential Transformer", ICLR 2025)."""
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        setattr(m, name, nn.Parameter(torch.randn(d) * 0.1))
    m.sub_norm = RMSNorm(2 * d, 1e-5)
    m.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * index)


def diff_lambda(m: nn.Module) -> torch.Tensor:
    """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init of ``m`` (ours or timm's: same names)."""
    return (torch.exp((m.lambda_q1 * m.lambda_k1).sum(-1).float())
            - torch.exp((m.lambda_q2 * m.lambda_k2).sum(-1).float()) + m.lambda_init)


def diff_attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, capture: bool | torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Differential attention with ``m``'s parameters: q, k, v [B, H, N, 2d] (each head's query
    and key in two halves of d) -> the heads' output [B, H, N, 2d], RMSNorm-ed and scaled by
    1 - lambda_init, and, captured, the map softmax1 - lambda softmax2 [B, H, N, N]. q and k pass
    ``m``'s hook points as [B, H, 2, N, d], the two maps' scores as [B, H, 2, N, N] (captured)."""
    B, H, N, D = q.shape
    q, k = (norm(t.reshape(B, H, N, 2, D // 2).transpose(2, 3)) for norm, t in ((m.q_norm, q), (m.k_norm, k)))
    q, k, v = m.hook_q(q), m.hook_k(k), m.hook_v(v)
    if m.relevance_rule is not None:  # q, k [B, H, 2, N, d]
        q, k, v = m.relevance_rule(q, k, v)
    lam = diff_lambda(m).type_as(q)
    if capture is False:  # the fused kernel on each half (4-D: the fast kernels)
        (o1, _), (o2, _) = (m.attend(q[:, :, i], k[:, :, i], v, (D // 2) ** -0.5) for i in (0, 1))
        attn, x = None, o1 - lam * o2
    else:  # the map itself mixes the values, so that gradients reach it
        s = probabilities(q, k, (D // 2) ** -0.5, True, None, m.hook_scores)  # [B, H, 2, N, N]
        attn = s[:, :, 0] - lam * s[:, :, 1]
        x = attn @ v
    return m.sub_norm(x) * (1 - m.lambda_init), attn


@register("attention", "diff")
class DiffAttention(VariantAttention):
    """Differential attention (timm's DiffAttention): each head's query and key are cut in two
    halves, two softmax maps are taken and the second, weighted by lambda, is subtracted; the
    captured attention is that difference (rows sum to 1 - lambda, entries may be negative)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        d = self.head_dim // 2
        self.q_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        add_diff_params(self, d, index)

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, _ = x.shape
        q, k, v = self.project(x)
        x, attn = diff_attend(self, q, k, v, capture)
        return self.proj(self.norm(x.transpose(1, 2).reshape(B, N, -1))), attn


@register("block", "scaling")
class ParallelScalingBlock(nn.Module):
    """Attention and MLP side by side (Dehghani et al., "Scaling Vision Transformers to 22 Billion
    Parameters", ICML 2023): one norm, one projection giving the MLP's hidden layer and q, k, v,
    then x + ls(attn_out(attention) + mlp_out(act(hidden))) (or one ``out_proj`` over both). With
    ``diff_attn`` the attention is differential (timm's DiffParallelScalingBlock)."""

    relevance = "attention"  # LRP (methods/lrp.py) gives modules so marked a rule for q, k, v:
    relevance_rule: Callable | None = None  # set only in its explanation mode

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C, hidden = cfg.embed_dim, cfg.mlp_hidden
        self.num_heads, self.split = cfg.num_heads, [hidden, C, C, C]
        self.scale = (C // cfg.num_heads) ** -0.5
        self.in_norm = make_norm(cfg)
        self.in_proj = nn.Linear(C, hidden + 3 * C, bias=cfg.qkv_bias)
        self.mlp_bias = None if cfg.qkv_bias else nn.Parameter(torch.zeros(hidden))  # in in_proj's bias otherwise
        d = cfg.attn_head_dim // (2 if cfg.diff_attn else 1)
        self.q_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        if cfg.diff_attn:
            add_diff_params(self, d, index)
        self.diff = cfg.diff_attn
        self.mlp_act = make_act(cfg.act)
        self.hook_q, self.hook_k, self.hook_v, self.hook_scores = HookPoint(), HookPoint(), HookPoint(), HookPoint()
        self.hook_hidden = HookPoint()  # the MLP half's hidden activation [B, N, hidden]
        fused = cfg.fused_out_proj or cfg.diff_attn
        self.out_proj = nn.Linear(C + hidden, C, bias=cfg.proj_bias) if fused else None
        self.attn_out_proj = None if fused else nn.Linear(C, C, bias=cfg.proj_bias)
        self.mlp_out_proj = None if fused else nn.Linear(hidden, C, bias=cfg.proj_bias)
        self.ls = LayerScale(C) if cfg.layer_scale else nn.Identity()
        self.attend = PARTS["kernel"]["attend"]

    @property
    def norm1(self) -> nn.Module:
        """The norm of the block's input (what GradCAM reads, as a plain block's norm1)."""
        return self.in_norm

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As the plain block's; ``positions`` is always None (no position family comes with this block)."""
        B, N, C = x.shape
        m, q, k, v = self.in_proj(self.in_norm(x)).split(self.split, dim=-1)
        m = self.hook_hidden(self.mlp_act(m if self.mlp_bias is None else m + self.mlp_bias))
        q, k, v = (t.reshape(B, N, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, N, D]
        if self.diff:  # q, k, v pass the hook points inside, q and k as halves
            a, attn = diff_attend(self, q, k, v, capture)
        else:
            q, k, v = self.hook_q(self.q_norm(q)), self.hook_k(self.k_norm(k)), self.hook_v(v)
            a, attn = self.attend(q, k, v, self.scale, capture, None, self.relevance_rule, self.hook_scores)
        a = a.transpose(1, 2).reshape(B, N, C)
        y = self.out_proj(torch.cat([a, m], dim=-1)) if self.out_proj is not None else (
            self.attn_out_proj(a) + self.mlp_out_proj(m))
        return x + self.ls(y), attn


@register("block", "things")
class ParallelThingsBlock(nn.Module):
    """Parallel branches (Touvron et al., "Three things everyone should know about Vision
    Transformers", ECCV 2022): x + sum_i ls_i(attn_i(norm_i(x))), then x + sum_i ls_i(mlp_i(norm_i(x))).
    The captured attention is every branch's heads side by side [B, n*H, N, N] (computed once,
    so gradients reach it); the fast path is each branch's own attention."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C = cfg.embed_dim

        def ls() -> nn.Module:
            return LayerScale(C) if cfg.layer_scale else nn.Identity()

        n, mlp = cfg.num_parallel, PARTS["mlp"][cfg.mlp_kind]
        self.attns = nn.ModuleList([nn.ModuleDict(dict(norm=make_norm(cfg), attn=VariantAttention(cfg, index), ls=ls()))
                                    for _ in range(n)])
        self.ffns = nn.ModuleList([nn.ModuleDict(dict(norm=make_norm(cfg), mlp=mlp.of(cfg), ls=ls())) for _ in range(n)])

    @property
    def norm1(self) -> nn.Module:
        """The first branch's norm of the block's input (what GradCAM reads, as a plain block's norm1)."""
        return self.attns[0]["norm"]

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As the plain block's; ``positions`` is always None (no position family comes with this block)."""
        B, N, _ = x.shape
        attn = None
        if capture is not False:  # every branch's heads in one softmax: one captured tensor
            parts = []
            for b in self.attns:  # each branch's q, k, v pass its hook points, the scores the first branch's
                a = b["attn"]
                q, k, v = a.project(b["norm"](x))
                parts.append((a.hook_q(a.q_norm(q)), a.hook_k(a.k_norm(k)), a.hook_v(v)))
            q, k, v = (torch.cat(t, dim=1) for t in zip(*parts))  # [B, n*H, N, D]
            first = self.attns[0]["attn"]
            o, attn = first.attend(q, k, v, first.scale, True, None, first.relevance_rule, first.hook_scores)
            outs = [b["ls"](b["attn"].proj(b["attn"].norm(o_i.transpose(1, 2).reshape(B, N, -1))))
                    for b, o_i in zip(self.attns, o.chunk(len(self.attns), dim=1))]
        else:
            outs = [b["ls"](b["attn"](b["norm"](x))[0]) for b in self.attns]
        x = x + torch.stack(outs).sum(dim=0)
        return x + torch.stack([b["ls"](b["mlp"](b["norm"](x))) for b in self.ffns]).sum(dim=0), attn
