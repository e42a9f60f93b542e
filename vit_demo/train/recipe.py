"""The training recipe: hyper-parameters, the default from-scratch architecture, the optimiser
and the learning-rate schedule, and a pretrained model with a new head for fine-tuning.

The recipe is the one the ViT / DeiT papers and timm's train script use, sized for small data:
AdamW (no weight decay on biases, norms, tokens and position embeddings), linear warm-up then
cosine decay, label smoothing, gradient clipping, random-resized-crop + flip + colour jitter.
From scratch it adds what small data needs (README, "Train your own"; docs/training.md): a
convolutional stem (Xiao et al. 2021) and as many epochs as the data's size calls for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..model import VisionTransformer, ViTConfig, resample_pos_embed
from ..preprocess import DataConfig
from .augment import AugmentConfig
from .data import DataError


@dataclass(frozen=True)
class Recipe:
    """Hyper-parameters. Defaults from :func:`scratch_recipe` / :func:`finetune_recipe`."""

    epochs: int
    batch_size: int
    lr: float  # peak learning rate (the head's, when fine-tuning)
    backbone_lr_scale: float  # backbone LR = lr * this (fine-tuning); 1 from scratch
    weight_decay: float
    warmup_epochs: float
    label_smoothing: float
    grad_clip: float
    augment: AugmentConfig


def scratch_recipe(epochs: int = 100, flip: bool = False) -> Recipe:
    """Small data, small pictures: AdamW at 1e-3, batch 64, label smoothing 0.1, light crops (75-100 %
    of the picture) and colour jitter 0.2 (stronger crops left the model under-fitting), no flips
    unless ``flip`` (a mirrored digit or letter is not the same class: flips cost the digits half a
    point; docs/training.md). ``epochs`` is a placeholder: ``train`` picks the epochs that fit its
    time budget (:mod:`.budget`) unless ``--epochs`` is given."""
    return Recipe(epochs=epochs, batch_size=64, lr=1e-3, backbone_lr_scale=1.0, weight_decay=0.05,
                  warmup_epochs=min(5, max(1, epochs // 20)), label_smoothing=0.1, grad_clip=1.0,
                  augment=AugmentConfig(scale=(0.75, 1.0), jitter=0.2, hflip=0.5 if flip else 0.0))


def finetune_recipe(freeze: bool) -> Recipe:
    """A pretrained backbone: few epochs, gentle crops, a 10x lower LR for the backbone."""
    return Recipe(epochs=5 if not freeze else 8, batch_size=16, lr=1e-3, backbone_lr_scale=0.1, weight_decay=0.05,
                  warmup_epochs=1, label_smoothing=0.1, grad_clip=1.0, augment=AugmentConfig(scale=(0.35, 1.0), jitter=0.2))


SCRATCH_MIN_SIDE = 8  # smaller pictures are enlarged to this for a model trained from scratch


def scratch_size(side: int) -> int:
    """The input size of a from-scratch model for pictures of ``side`` pixels: their own size (at
    least 8, a 4 x 4 grid of 2-px patches). Enlarging 8-px digits to 32 px learned no better and took
    4x longer an epoch (docs/training.md)."""
    return max(int(side), SCRATCH_MIN_SIDE)


STEMS = ("conv", "patch")  # --stem: the default from scratch first


def scratch_config(img_size: int, num_classes: int, patch_size: int | None = None, stem: str = "patch") -> ViTConfig:
    """The from-scratch architecture: patch 4 at 32 px (an 8x8 grid; larger pictures keep about 8
    patches a side), width 96, 4 blocks, 4 heads, MLP ratio 2: about 0.3 M parameters. ``stem``:
    ``"patch"``, the plain ViT with a [class] token (timm builds the same model); ``"conv"``, what
    ``train`` uses by default, a compact convolutional transformer in the spirit of CCT (Hassani et
    al. 2021): CCT's convolutional tokenizer (:class:`~vit_demo.model.ConvStem` with ``stem_pool``,
    64 channels; patch sizes are powers of 2) and the patch tokens' mean as the read-out instead of
    a [class] token. On unlike small data sets the [class] token sat at chance for the first 10-40
    epochs where the mean read-out learned from the third (docs/training.md)."""
    if stem not in STEMS:
        raise DataError(f"--stem must be one of {', '.join(STEMS)}, got {stem!r}")
    conv = stem == "conv"
    powers = [2**k for k in range(1, 7) if img_size % 2**k == 0] or [2]  # a conv stem halves the size k times
    p = patch_size or (min(powers, key=lambda q: abs(math.log2(img_size / 8 / q))) if conv else max(2, round(img_size / 8)))
    if img_size % p:
        raise DataError(f"--img-size {img_size} is not a multiple of the patch size {p}; pass --patch-size")
    if conv and p & (p - 1):
        raise DataError(f"--stem conv needs a patch size that is a power of 2 (got {p}); pass --patch-size or --stem patch")
    head = {"conv_stem": True, "stem_pool": True, "stem_width": 64, "class_token": False, "global_pool": "avg",
            "fc_norm": True} if conv else {}
    return ViTConfig(img_size=(img_size, img_size), patch_size=p, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0,
                     num_classes=num_classes, **head)


def scratch_data_config(img_size: int) -> DataConfig:
    """Eval transform of a model trained here: resize the shorter side, center-crop (no margin)."""
    return DataConfig(input_size=(img_size, img_size), interpolation="bicubic", crop_pct=1.0, crop_mode="center",
                      mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def with_new_head(model: VisionTransformer, num_classes: int, img_size: int | None = None) -> VisionTransformer:
    """A copy of ``model`` with a fresh zero head for ``num_classes`` (and, given ``img_size``, its
    position embeddings resampled to that size)."""
    cfg = model.cfg
    size = (img_size, img_size) if img_size else cfg.img_size
    new = VisionTransformer(replace(cfg, num_classes=num_classes, img_size=size)).init_weights()
    sd = {k: v for k, v in model.state_dict().items() if not k.startswith(("head.", "head_dist."))}
    if size != cfg.img_size and cfg.rel_pos:
        raise ValueError(f"a relative position bias ({cfg.rel_pos}) is defined for the {cfg.img_size[0]}x{cfg.img_size[1]} "
                         f"input it was trained at: fine-tune at that size")
    if size != cfg.img_size and "pos_embed" in sd:  # RoPE tables follow the grid by themselves
        P = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        pos = sd["pos_embed"]
        sd["pos_embed"] = torch.cat([pos[:, :P], resample_pos_embed(pos[:, P:], cfg.grid_size, new.cfg.grid_size)], 1)
    missing, unexpected = new.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith(("head.", "head_dist.")) for k in missing), (missing, unexpected)
    return new


def make_optimizer(model: VisionTransformer, recipe: Recipe, freeze: bool) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases, norms, tokens, position embeddings, relative-position
    tables, learned RoPE frequencies and an attention pool's query (as timm does);
    the head at ``lr``, the backbone at ``lr * backbone_lr_scale`` (or frozen)."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        is_head = name.startswith(("head.", "head_dist."))
        if freeze and not is_head:
            p.requires_grad_(False)
            continue
        no_decay = p.ndim <= 1 or name in ("pos_embed", "cls_token", "dist_token", "reg_token", "rope.freqs") or \
            name.endswith(("relative_position_bias_table", "attn_pool.latent"))
        groups.setdefault((is_head, no_decay), []).append(p)
    param_groups = [
        {"params": ps, "lr": recipe.lr * (1.0 if is_head else recipe.backbone_lr_scale),
         "weight_decay": 0.0 if no_decay else recipe.weight_decay}
        for (is_head, no_decay), ps in sorted(groups.items())
    ]
    return torch.optim.AdamW(param_groups, lr=recipe.lr, betas=(0.9, 0.999))


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine decay to 0."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f

