"""One forward pass with hooks: every number the step-through shows, as the model's own modules formed it.

:func:`where` says, for a block and a head of any family, which modules the numbers pass (the hook
points of vit.py and the families: docs/architecture.md, "Reading the forward pass"); :func:`record`
runs ``model(x, capture=True)`` once with forward hooks on exactly those and keeps copies of what
passed (copies: the capture kernel's softmax runs in place on the scores). Nothing here computes a
step: :mod:`.values` reads the numbers off the :class:`Recording`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..model import VisionTransformer, ViTOutput


class StepError(ValueError):
    """A request the step-through refuses (a patch, layer, head or temperature out of range), or a
    model it cannot walk through; the message is one line naming what is allowed, or which step is
    missing and why."""


class Tap(NamedTuple):
    """A module whose input (``read="in"``) or output (``read="out"``) is kept under ``name``."""

    name: str
    module: nn.Module
    read: str


class Where(NamedTuple):
    """Where the numbers of one head of one block pass, in this model's layout."""

    kind: str  # "plain" (q, k, v [B, H, N, D]), "diff" (q, k as [B, H, 2, N, d]), "window" (SAM: per window)
    points: nn.Module  # the module holding hook_q, hook_k, hook_v (an attention, or a scaling block)
    scores: nn.Module  # the module whose hook_scores the block's scores pass
    head: int  # the head's index in q, k, v
    score_head: int  # its index in the scores and in the captured map (parallel branches: all side by side)
    scale: float  # the scores' factor, 1 / sqrt(the query's width)
    taps: tuple[Tap, ...]  # the block's other numbers: normed, mixed, mid, hidden..., unturned q / k
    window: int  # SAM: the block's window in patches a side (0: global)


def heads_per_layer(model: VisionTransformer) -> int:
    """The heads one layer's captured attention has: the parallel branches' side by side."""
    cfg = model.cfg
    return cfg.num_heads * (cfg.num_parallel if cfg.block == "things" else 1)


def where(model: VisionTransformer, layer: int, head: int) -> Where:
    """The modules that hold block ``layer``'s numbers for ``head`` (see :class:`Where`)."""
    cfg, block = model.cfg, model.blocks[layer]
    if cfg.block == "scaling":  # ViT-22B: the points on the block, the MLP's hidden layer beside the attention
        mixed = (block.sub_norm if cfg.diff_attn else block.attn_out_proj or block.out_proj, "in")
        taps = (Tap("normed", block.in_norm, "out"), Tap("mixed", *mixed), Tap("hidden0", block.hook_hidden, "out"))
        return Where("diff" if cfg.diff_attn else "plain", block, block, head, head, block.scale, taps, 0)
    if cfg.block == "things":  # parallel branches: head h of the layer is head h % H of branch h // H
        branch, inner = divmod(head, cfg.num_heads)
        attn = block.attns[branch]["attn"]
        taps = (Tap("normed", block.attns[branch]["norm"], "out"), Tap("mixed", attn.norm, "in"),
                Tap("mid", block.ffns[0]["norm"], "in"),
                *(Tap(f"hidden{i}", f["mlp"].hook_hidden, "out") for i, f in enumerate(block.ffns)))
        return Where("plain", attn, block.attns[0]["attn"], inner, head, attn.scale, taps, 0)
    attn = block.attn
    diff = cfg.diff_attn
    mixed = attn.sub_norm if diff else attn.norm if isinstance(getattr(attn, "norm", None), nn.Module) else attn.proj
    post = getattr(block, "post_norm", False)
    taps = [Tap("mixed", mixed, "in"), Tap("mid", block.mlp if post else block.norm2, "in"),
            Tap("hidden0", block.mlp.hook_hidden, "out")]
    if not post:  # res-post blocks read the stream itself
        taps.append(Tap("normed", block.norm1, "out"))
    if cfg.rope:  # q and k as the projection (and qk-norm) gave them, before RoPE turns them
        taps += [Tap("q_unturned", attn.q_norm, "out"), Tap("k_unturned", attn.k_norm, "out")]
    window = getattr(attn, "window", 0) if cfg.window_size else 0
    kind = "diff" if diff else "window" if window else "plain"
    scale = (attn.head_dim // 2) ** -0.5 if diff else attn.scale
    return Where(kind, attn, attn, head, head, scale, tuple(taps), window)


@dataclass
class Recording:
    """What one forward pass of ``x`` [1, 3, H, W] let through the taps, and its output."""

    x: Tensor
    out: ViTOutput
    seen: dict[str, Tensor] = field(default_factory=dict)  # name -> a float32 copy, batch axis kept

    def get(self, name: str) -> Tensor | None:
        return self.seen.get(name)


def model_taps(model: VisionTransformer, w: Where) -> list[Tap]:
    """Every tap of one step-through: the embedding's, every block's output, and the chosen block's."""
    taps = [Tap("proj_in", model.patch_embed.proj, "in"), Tap("proj_out", model.patch_embed.proj, "out"),
            Tap("patch_tokens", model.patch_embed, "out"), Tap("tokens", model.norm_pre, "in"),
            Tap("stream0", model.norm_pre, "out")]
    taps += [Tap(f"block{i}", b, "out") for i, b in enumerate(model.blocks)]
    taps += [Tap("q", w.points.hook_q, "out"), Tap("k", w.points.hook_k, "out"), Tap("v", w.points.hook_v, "out"),
             Tap("scores", w.scores.hook_scores, "out")]
    return taps + list(w.taps)


def keeper(seen: dict[str, Tensor], tap: Tap) -> Callable:
    """The hook that copies what passes ``tap`` into ``seen`` (the first tensor of a tuple; float32), in
    this thread only: the app shares one model among its users, and another thread's forward pass
    while the hooks are on passes the same modules."""
    mine = threading.get_ident()

    def keep(tensor: object) -> None:
        t = tensor[0] if isinstance(tensor, (tuple, list)) else tensor
        if isinstance(t, Tensor) and tap.name not in seen and threading.get_ident() == mine:
            seen[tap.name] = t.detach().float().clone()

    if tap.read == "in":
        return lambda _m, args: keep(args)
    return lambda _m, _args, out: keep(out)


def record(model: VisionTransformer, x: Tensor, w: Where) -> Recording:
    """One ``model(x, capture=True)`` without gradients, every tap of :func:`model_taps` kept."""
    seen: dict[str, Tensor] = {}
    handles = []
    for tap in model_taps(model, w):
        hook = keeper(seen, tap)
        handles.append(tap.module.register_forward_pre_hook(hook) if tap.read == "in"
                       else tap.module.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            out = model(x, capture=True)
    finally:
        for h in handles:
            h.remove()
    return Recording(x, out, seen)
