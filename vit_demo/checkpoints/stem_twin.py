"""timm's twin of a model whose tokens come from a convolutional stem (the default recipe's CCT
tokenizer, trained here). timm's ``VisionTransformer`` has no such stem, so the twin is timm's class
built from the stored config with the stem as its patch-embedding layer (timm's own ``embed_layer``
argument), every weight loaded strictly from the same file. The stem is ours on both sides: the
check starts at the tokens it makes, and timm's position embedding, blocks, final norm, pooling,
fc_norm and head take it from there. :func:`traced` reads what each stage hands on, in both models.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..model import ConvStemEmbed, ViTConfig

STEM_SCOPE = ("The convolutional stem (CCT's convolutions) has no timm counterpart, so the check starts at the tokens "
              "it makes: timm's VisionTransformer takes over from there (position embedding, every block, final norm, "
              "pooling and head); train --stem patch trains a model that timm builds whole.")
STAGES = ("tokens", "blocks", "norm", "pooled")  # what :func:`traced` records, in forward order


class StemEmbed(ConvStemEmbed):
    """The scratch model's convolutional stem behind timm's patch-embedding interface: built from
    the arguments timm's ``VisionTransformer`` gives its ``embed_layer`` (checked against the
    config), with ``grid_size`` and ``num_patches``, and [B, gh, gw, C] tokens for
    ``dynamic_img_size`` (timm's NHWC). Same state-dict names as ours (``patch_embed.stem.*``)."""

    def __init__(self, cfg: ViTConfig, img_size: Any = None, patch_size: Any = None, in_chans: int = 3,
                 embed_dim: int = 0, output_fmt: str | None = None, **_timm_args: Any) -> None:
        if not cfg.conv_stem:
            raise ValueError("StemEmbed is the convolutional stem: this config has none")
        if (in_chans, embed_dim) != (cfg.in_chans, cfg.embed_dim):
            raise ValueError(f"timm asks for {in_chans} -> {embed_dim} channels, the config has "
                             f"{cfg.in_chans} -> {cfg.embed_dim}")
        super().__init__(cfg)
        self.grid_size = cfg.grid_size
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.nhwc = output_fmt == "NHWC"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        tokens, grid = super().forward(x)
        return tokens.unflatten(1, grid) if self.nhwc else tokens


def is_stem_twin(tm: nn.Module) -> bool:
    """Whether ``tm`` is timm's model fed by our convolutional stem (the check starts at the tokens)."""
    return isinstance(getattr(tm, "patch_embed", None), StemEmbed)


@contextmanager
def traced(model: nn.Module) -> Iterator[dict[str, list[torch.Tensor]]]:
    """What each stage of a ViT hands on while the block runs, in this thread only (another
    thread's forward of the same model is not recorded): ``tokens`` (after the position
    embedding: ``norm_pre``'s input), each of ``blocks`` (its output), ``norm`` (the final
    norm's output) and ``pooled`` (the head's input, after pooling and fc_norm). Both our model and
    timm's ``VisionTransformer`` name these parts alike; a block of ours returns (tokens, attention)."""
    got: dict[str, list[torch.Tensor]] = {k: [] for k in STAGES}
    me = threading.get_ident()

    def keep(stage: str, t: Any) -> None:
        if threading.get_ident() == me:
            got[stage].append((t[0] if isinstance(t, tuple) else t).detach())

    hooks = [model.norm_pre.register_forward_pre_hook(lambda _m, a: keep("tokens", a)),
             model.norm.register_forward_hook(lambda _m, _a, o: keep("norm", o)),
             model.head.register_forward_pre_hook(lambda _m, a: keep("pooled", a))]
    hooks += [b.register_forward_hook(lambda _m, _a, o: keep("blocks", o)) for b in model.blocks]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


def stage_diffs(ours: dict[str, list[torch.Tensor]], theirs: dict[str, list[torch.Tensor]]) -> dict[str, Any]:
    """Max |difference| per stage of two :func:`traced` records of one forward each: a number
    for ``tokens``, ``norm`` and ``pooled``, one per block for ``blocks``."""

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        if a.shape != b.shape:
            raise ValueError(f"the two models hand on {tuple(a.shape)} and {tuple(b.shape)}: not the same stage")
        return (a.float() - b.float()).abs().max().item()

    if len(ours["blocks"]) != len(theirs["blocks"]):
        raise ValueError(f"{len(ours['blocks'])} blocks against {len(theirs['blocks'])}")
    out: dict[str, Any] = {k: diff(ours[k][0], theirs[k][0]) for k in STAGES if k != "blocks"}
    out["blocks"] = [diff(a, b) for a, b in zip(ours["blocks"], theirs["blocks"])]
    return out
