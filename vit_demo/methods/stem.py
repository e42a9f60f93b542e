"""What a convolutional stem (``ViTConfig.conv_stem``; the default recipe's CCT tokenizer) makes of
one picture, for the Patches tab: each stage's output (after its ReLU and, with ``stem_pool``, its
max-pool) as the mean of its channels, then the tokens (each one's length), and how many pixels one
token sees. Read-only: the model's own modules, run in order. No method is registered here."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..model import VisionTransformer


class StemStage(NamedTuple):
    """One stage of the stem: its name ("stage 1", ..., "tokens"), its channels, and a map [h, w] at
    its own resolution (a stage: the mean of its channels; the tokens: each token vector's length)."""

    name: str
    channels: int
    map: Tensor


def stem_layers(model: VisionTransformer) -> nn.Sequential:
    """The model's convolutional stem (ValueError when its patches are cut and projected instead)."""
    stem = model.patch_embed.stem
    if stem is None:
        raise ValueError("this model has no convolutional stem: each patch is cut out, flattened and projected")
    return stem


@torch.inference_mode()
def stem_stages(model: VisionTransformer, x: Tensor) -> list[StemStage]:
    """The stem's stages on the first picture of ``x`` [B, 3, H, W], then the tokens (before the
    position embedding). A stage ends after its ReLU, or after the max-pool that follows it."""
    layers = list(stem_layers(model))
    h, out = x[:1], []
    for i, m in enumerate(layers):
        h = m(h)
        pool_next = i + 1 < len(layers) and isinstance(layers[i + 1], nn.MaxPool2d)
        if isinstance(m, nn.MaxPool2d) or (isinstance(m, nn.ReLU) and not pool_next):
            out.append(StemStage(f"stage {len(out) + 1}", h.shape[1], h[0].float().mean(0).cpu()))
    tokens, grid = model.patch_embed(x[:1])  # [1, gh*gw, C]
    out.append(StemStage("tokens", tokens.shape[-1], tokens[0].float().norm(dim=-1).reshape(grid).cpu()))
    return out


def receptive_field(model: VisionTransformer) -> int:
    """The side, in pixels, of the square of input one token depends on (padding aside): each
    convolution or pool of kernel k adds (k - 1) times the stride so far."""
    rf, jump = 1, 1
    for m in [*stem_layers(model), model.patch_embed.proj]:
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d)):
            k, s = (v if isinstance(v, int) else v[0] for v in (m.kernel_size, m.stride))
            rf, jump = rf + (k - 1) * jump, jump * s
    return rf
