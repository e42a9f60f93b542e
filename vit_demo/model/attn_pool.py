"""The attention-pool head (``global_pool="map"``; SigLIP, PE): instead of the [class] token or the
patches' mean, a learned query reads the token sequence. Its attention is the model's own answer to
"where does the classifier look": a forward pass that captures returns it (``pool_attention``) and
puts its heads' mean in the token layout (``probe``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .config import ViTConfig
from .vit import PARTS, HookPoint, Mlp, make_act, make_norm, register


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; SigLIP, PE): a learned latent query attends to the
    token sequence (the patches, or with ``pool_include_prefix`` every token), then an MLP with a
    residual connection. Returns the pooled features [B, C] and, when captured, the query's
    attention over the tokens it reads [B, H, 1, n]."""

    relevance = "attention"  # LRP (methods/lrp.py) gives modules so marked a rule for q, k, v:
    relevance_rule: Callable | None = None  # set only in its explanation mode

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        C = cfg.embed_dim
        self.num_heads = cfg.map_heads or cfg.num_heads
        self.head_dim = C // self.num_heads
        self.scale = self.head_dim**-0.5
        self.skip = 0 if cfg.pool_include_prefix else cfg.num_prefix_tokens  # the tokens it does not read
        self.latent = nn.Parameter(torch.zeros(1, 1, C))
        self.q = nn.Linear(C, C)
        self.kv = nn.Linear(C, 2 * C)
        self.proj = nn.Linear(C, C)
        self.norm = make_norm(cfg)
        self.mlp = Mlp(C, cfg.map_mlp_hidden or cfg.mlp_hidden, make_act(cfg.act))
        self.hook_q, self.hook_k, self.hook_v, self.hook_scores = HookPoint(), HookPoint(), HookPoint(), HookPoint()
        self.attend = PARTS["kernel"]["attend"]

    def forward(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x[:, self.skip:]
        B, N, C = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, H, D).transpose(1, 2)  # [B, H, 1, D]
        k, v = self.kv(x).reshape(B, N, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        x, attn = self.attend(q, k, v, self.scale, capture, None, self.relevance_rule, self.hook_scores)
        x = self.proj(x.transpose(1, 2).reshape(B, 1, C))
        x = x + self.mlp(self.norm(x))
        return x[:, 0], attn


register("part", "attn_pool")(lambda cfg: AttentionPool(cfg) if cfg.global_pool == "map" else None)
