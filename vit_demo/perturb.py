"""A causal explanation from forward passes only: RISE (Petsiuk et al., BMVC 2018) on the patch grid.

Random smooth masks over the patch grid hide part of the image (a hidden patch is blended
toward 0 in normalised space, the dataset's mean colour, as in the deletion / insertion test);
each masked input is scored by the softmax probability of the class explained. A patch's
saliency is the mean score of the masks that show it minus the mean score of the masks that
hide it, both weighted by how much each mask shows (hides) it:

    S(p) = sum_m s_m M_m(p) / sum_m M_m(p)  -  sum_m s_m (1 - M_m(p)) / sum_m (1 - M_m(p))

(RISE's estimator, sum_m s_m M_m(p) / (N keep), with the complementary term subtracted: the
same expectation up to a constant for a uniform mask density, with less variance.)

Masks, as in RISE: a coarse random binary grid (cells of ``cell`` x ``cell`` patches, each kept
with probability ``keep``) upsampled bilinearly and shifted by a random offset of up to a cell.
They come from a seeded generator, so a map is reproducible, and every image of a batch gets the
same masks, so a batch gives the same maps as single images. Cost: ``masks`` forward passes per
image, run ``chunk`` inputs at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import VisionTransformer


@dataclass(frozen=True)
class RiseSettings:
    masks: int = 256  # forward passes per image
    cell: int = 2  # coarse cell size in patches
    keep: float = 0.5  # probability that a coarse cell shows the image
    seed: int = 0
    chunk: int = 32  # masked inputs per forward pass


def rise_masks(grid: tuple[int, int], s: RiseSettings) -> Tensor:
    """[masks, gh, gw] soft masks in [0, 1] (1 = the patch shows the image), seeded."""
    gh, gw = grid
    g = torch.Generator().manual_seed(s.seed)
    ch, cw = math.ceil(gh / s.cell) + 1, math.ceil(gw / s.cell) + 1
    coarse = (torch.rand(s.masks, 1, ch, cw, generator=g) < s.keep).float()
    up = F.interpolate(coarse, size=(ch * s.cell, cw * s.cell), mode="bilinear", align_corners=False)[:, 0]
    dy = torch.randint(0, s.cell, (s.masks,), generator=g)
    dx = torch.randint(0, s.cell, (s.masks,), generator=g)
    return torch.stack([up[i, y : y + gh, x : x + gw] for i, (y, x) in enumerate(zip(dy.tolist(), dx.tolist()))])


@torch.inference_mode()
def masked_scores(
    model: VisionTransformer, x: Tensor, masks: Tensor, target: Tensor, chunk: int,
    progress: Callable[[float], Any] | None = None,
) -> Tensor:
    """Target probability of every image under every mask: x [B, 3, h, w], masks [M, gh, gw]
    (patch level, values in [0, 1]), target [B] -> [B, M]. ``progress(fraction done)`` is
    called after every forward pass."""
    p = model.cfg.patch_size
    B, M = x.shape[0], masks.shape[0]
    pixels = masks.to(x.device, x.dtype).repeat_interleave(p, dim=-2).repeat_interleave(p, dim=-1)  # [M, h, w]
    out = torch.empty(B * M, device=x.device)
    for start in range(0, B * M, chunk):
        idx = torch.arange(start, min(start + chunk, B * M), device=x.device)
        b, m = idx // M, idx % M
        probs = model(x[b] * pixels[m, None]).logits.float().softmax(dim=-1)
        out[start : start + len(idx)] = probs.gather(1, target[b][:, None])[:, 0]
        if progress is not None:
            progress((start + len(idx)) / (B * M))
    return out.reshape(B, M)


def rise_from_scores(scores: Tensor, masks: Tensor) -> Tensor:
    """The contrast estimator: scores [B, M], masks [M, gh, gw] -> saliency [B, gh, gw]."""
    m = masks.to(scores.device, scores.dtype).flatten(1)  # [M, n]
    shown = scores @ m / m.sum(dim=0).clamp(min=1e-6)
    hidden = scores @ (1 - m) / (1 - m).sum(dim=0).clamp(min=1e-6)
    return (shown - hidden).reshape(-1, *masks.shape[1:])


def rise(
    model: VisionTransformer, x: Tensor, target: int | Tensor | None = None, settings: RiseSettings | None = None,
    progress: Callable[[float], Any] | None = None,
) -> Tensor:
    """RISE saliency [B, gh, gw] for the target class (None: the top-1 class of each image);
    ``progress`` as in :func:`masked_scores`."""
    from .explain import _targets

    s = settings or RiseSettings()
    p = model.cfg.patch_size
    grid = (x.shape[-2] // p, x.shape[-1] // p)
    with torch.inference_mode():
        t = _targets(target, model(x).logits)
    masks = rise_masks(grid, s)
    return rise_from_scores(masked_scores(model, x, masks, t, s.chunk, progress), masks)


def rise_map(model: VisionTransformer, x: Tensor, target: int | Tensor | None = None) -> Tensor:
    """RISE with the default settings (the registry's ``rise``)."""
    return rise(model, x, target)
