"""Training augmentation, done on whole batches of uint8 tensors (no per-picture PIL work).

Random-resized-crop and horizontal flip are one affine map per picture, applied with a single
``grid_sample`` call; colour jitter (brightness, contrast, saturation) is a few per-picture
multiplies. Every random number comes from the ``torch.Generator`` passed in, so a seed
fixes the result (and a resumed run draws exactly what an uninterrupted one would).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..preprocess import DataConfig


@dataclass(frozen=True)
class AugmentConfig:
    """How strongly training pictures are varied (timm's names and meanings)."""

    scale: tuple[float, float] = (0.35, 1.0)  # crop area, as a share of the picture
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio (w / h)
    hflip: float = 0.5  # probability of a horizontal flip
    jitter: float = 0.3  # brightness / contrast / saturation factors in [1 - j, 1 + j]


def _uniform(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g)


def crop_flip_theta(n: int, aug: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """[n, 2, 3] affine maps (output -> input, in [-1, 1] coordinates) of random crops + flips."""
    area = _uniform(n, *aug.scale, generator)
    log_r = _uniform(n, math.log(aug.ratio[0]), math.log(aug.ratio[1]), generator)
    w = (area * log_r.exp()).sqrt().clamp(max=1.0)  # crop width and height, share of the side
    h = (area / log_r.exp()).sqrt().clamp(max=1.0)
    cx = (2 * torch.rand(n, generator=generator) - 1) * (1 - w)  # crop centre: the crop stays inside
    cy = (2 * torch.rand(n, generator=generator) - 1) * (1 - h)
    flip = torch.where(torch.rand(n, generator=generator) < aug.hflip, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    return theta


def colour_jitter(x: torch.Tensor, strength: float, generator: torch.Generator) -> torch.Tensor:
    """Random brightness, contrast and saturation per picture; ``x`` in [0, 1], [B, 3, H, W]."""
    if strength <= 0:
        return x
    n = x.shape[0]
    b, c, s = (_uniform(n, 1 - strength, 1 + strength, generator)[:, None, None, None].to(x.device) for _ in range(3))
    x = x * b
    grey = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2])[:, None]  # [B, 1, H, W]
    x = (x - grey.mean(dim=(2, 3), keepdim=True)) * c + grey.mean(dim=(2, 3), keepdim=True)
    grey = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2])[:, None]
    return (grey + (x - grey) * s).clamp(0, 1)


def normalize(x: torch.Tensor, dc: DataConfig) -> torch.Tensor:
    """[0, 1] pictures -> the model's normalised input."""
    mean = torch.tensor(dc.mean, device=x.device)[:, None, None]
    std = torch.tensor(dc.std, device=x.device)[:, None, None]
    return (x - mean) / std


def train_batch(x: torch.Tensor, dc: DataConfig, aug: AugmentConfig, generator: torch.Generator) -> torch.Tensor:
    """uint8 pictures [B, 3, S, S] -> augmented, normalised model inputs [B, 3, h, w]."""
    n = x.shape[0]
    h, w = dc.input_size
    theta = crop_flip_theta(n, aug, generator).to(x.device)
    grid = F.affine_grid(theta, [n, 3, h, w], align_corners=False)
    x = F.grid_sample(x.float() / 255, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    return normalize(colour_jitter(x, aug.jitter, generator), dc)


def eval_batch(x: torch.Tensor, dc: DataConfig) -> torch.Tensor:
    """uint8 pictures already through the eval transform -> normalised model inputs."""
    return normalize(x.float() / 255, dc)
