"""The training recipe: hyper-parameters, the default from-scratch architecture, the optimiser
and the learning-rate schedule, and a pretrained model with a new head for fine-tuning.

The recipe is the one the ViT / DeiT papers and timm's train script use, sized for small data:
AdamW (no weight decay on biases, norms, tokens and position embeddings), linear warm-up then
cosine decay, label smoothing, gradient clipping, random-resized-crop + flip + colour jitter.
From scratch it adds what small data needs (docs/training.md): a
convolutional stem (Xiao et al. 2021) and as many epochs as the data's size calls for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..data.annotations import DataError
from ..model import VisionTransformer, ViTConfig, resample_pos_embed
from ..preprocess import DataConfig
from .augment import AugmentConfig


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
SMALL_SIDE = 32  # pictures up to this side train at their own size (the shapes: 32 px, the digits: 8 px)
SIZE_CANDIDATES = (32, 48, 64, 96, 128)  # larger pictures: the largest of these that fits the budget (.sizing)
GRID_SIDES = (4, 16)  # a default patch gives between 4 and 16 patches a side (about 8)
MAX_CONV_PATCH = 64  # a conv stem halves the picture at most 6 times by default


def scratch_size(side: int) -> int:
    """The input size of a from-scratch model for pictures of ``side`` pixels: their own size (at
    least 8, a 4 x 4 grid of 2-px patches). Enlarging 8-px digits to 32 px learned no better and took
    4x longer an epoch (docs/training.md). Larger pictures: :func:`~vit_demo.train.sizing.choose_size`."""
    return max(int(side), SCRATCH_MIN_SIDE)


STEMS = ("conv", "patch")  # --stem: the default from scratch first


def log_distance(a: float, b: float) -> float:
    return abs(math.log2(a / b))


def patch_for(img_size: int, stem: str = "patch", patch_size: int | None = None) -> int | None:
    """The patch size a from-scratch model of ``stem`` uses at ``img_size`` (``patch_size`` when
    given), or None when that stem cannot cut ``img_size`` into patches. ``conv``: a power of 2 (one
    halving of the picture each) that divides the size, by default the one nearest size / 8 (about 8
    patches a side). ``patch``: any divisor, by default round(size / 8) (at least 2), else the divisor
    nearest size / 8 that leaves 4 to 16 patches a side."""
    if img_size < 1 or (patch_size is not None and patch_size < 1):
        return None
    if stem == "conv":
        if patch_size is not None:
            ok = patch_size >= 2 and not patch_size & (patch_size - 1) and img_size % patch_size == 0
            return patch_size if ok else None
        powers = [2**k for k in range(1, MAX_CONV_PATCH.bit_length()) if img_size % 2**k == 0]
        return min(powers, key=lambda q: log_distance(img_size / 8, q)) if powers else None
    if patch_size is not None:
        return patch_size if img_size % patch_size == 0 else None
    p = max(2, round(img_size / 8))
    if img_size % p == 0:
        return p
    lo, hi = GRID_SIDES
    divisors = [d for d in range(2, img_size + 1) if img_size % d == 0 and lo <= img_size // d <= hi]
    return min(divisors, key=lambda d: log_distance(img_size / 8, d)) if divisors else None


def coarse_patch(img_size: int, stem: str) -> int | None:
    """The conv stem's default patch at ``img_size`` doubled (half as many patches a side, a quarter of
    the tokens) when that still leaves 4 or more a side, the shorter budgets' grid
    (:func:`~vit_demo.train.sizing.choose_size`): 32 px, 4-px patches -> 8 (a 4x4 grid). None when
    there is none (8 px: 2-px patches would become a 2x2 grid) and for the plain ViT."""
    p = patch_for(img_size, stem)
    if stem != "conv" or p is None or 2 * p > MAX_CONV_PATCH or img_size % (2 * p):
        return None
    return 2 * p if img_size // (2 * p) >= GRID_SIDES[0] else None


def fits_grid(img_size: int, stem: str, patch_size: int | None = None) -> bool:
    """``img_size`` works for ``stem`` (with ``patch_size``), and, with the default patch, with 4 to
    16 patches a side (a size a default can pick, or advice can give)."""
    p = patch_for(img_size, stem, patch_size)
    return p is not None and (patch_size is not None or GRID_SIDES[0] <= img_size // p <= GRID_SIDES[1])


def nearest_sizes(img_size: int, stem: str, patch_size: int | None = None) -> list[int]:
    """The nearest input sizes below and above ``img_size`` that ``stem`` (with ``patch_size``)
    can use (:func:`fits_grid`): none, one or two."""
    below = next((s for s in range(img_size - 1, 1, -1) if fits_grid(s, stem, patch_size)), None)
    above = next((s for s in range(img_size + 1, 4 * img_size + 130) if fits_grid(s, stem, patch_size)), None)
    return [s for s in (below, above) if s is not None]


def size_advice(img_size: int, stem: str, patch_size: int | None = None) -> str:
    """Flags that make a from-scratch model of ``stem`` at ``img_size`` with ``patch_size`` work, as
    words (``--img-size 352 or 384, or --stem patch``), nearest first; each is checked with
    :func:`patch_for`, so following any one of them works."""
    tips = []
    sizes = nearest_sizes(img_size, stem, patch_size)
    if sizes:
        tips.append("--img-size " + " or ".join(map(str, sizes)))
    if patch_size is not None:
        if stem == "conv":
            others = [2**k for k in range(1, max(MAX_CONV_PATCH, img_size).bit_length()) if img_size % 2**k == 0]
        else:
            others = [d for d in range(1, img_size + 1) if img_size % d == 0]
        others = sorted(sorted(others, key=lambda q: log_distance(patch_size, q))[:2])
        if others:
            tips.append("--patch-size " + " or ".join(map(str, others)))
        elif patch_for(img_size, stem) is not None:
            tips.append("leave out --patch-size")
    if stem == "conv" and patch_for(img_size, "patch", patch_size) is not None:
        tips.append("--stem patch")
    if not tips and patch_size is not None:  # the conv stem, a patch no power of 2, a size nothing else fits
        q = min((2**k for k in range(1, max(MAX_CONV_PATCH, patch_size).bit_length() + 1)),
                key=lambda q: log_distance(patch_size, q))
        tips.append(f"--patch-size {q} --img-size {max(q, q * round(img_size / q))}")
    return ", or ".join(tips)


def scratch_config(img_size: int, num_classes: int, patch_size: int | None = None, stem: str = "patch") -> ViTConfig:
    """The from-scratch architecture: patch 4 at 32 px (an 8x8 grid; larger pictures keep about 8
    patches a side, :func:`patch_for`), width 96, 4 blocks, 4 heads, MLP ratio 2: about 0.3 M
    parameters. ``stem``: ``"patch"``, the plain ViT with a [class] token (timm builds the same
    model); ``"conv"``, what ``train`` uses by default, a compact convolutional transformer in the
    spirit of CCT (Hassani et al. 2021): CCT's convolutional tokenizer (:class:`~vit_demo.model.ConvStem`
    with ``stem_pool``, 64 channels; patch sizes are powers of 2) and the patch tokens' mean as the
    read-out instead of a [class] token. On unlike small data sets the [class] token sat at chance for
    the first 10-40 epochs where the mean read-out learned from the third (docs/training.md).
    A size and patch the stem cannot use raise :class:`DataError` with flags that work (:func:`size_advice`)."""
    if stem not in STEMS:
        raise DataError(f"--stem must be one of {', '.join(STEMS)}, got {stem!r}")
    if img_size < 1 or (patch_size is not None and patch_size < 1):
        raise DataError(f"--img-size and --patch-size must be >= 1 (got {img_size} and {patch_size})")
    conv = stem == "conv"
    p = patch_for(img_size, stem, patch_size)
    if p is None:
        raise DataError(f"{unusable(img_size, stem, patch_size)}; use {size_advice(img_size, stem, patch_size)}")
    head = {"conv_stem": True, "stem_pool": True, "stem_width": 64, "class_token": False, "global_pool": "avg",
            "fc_norm": True} if conv else {}
    return ViTConfig(img_size=(img_size, img_size), patch_size=p, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0,
                     num_classes=num_classes, **head)


def unusable(img_size: int, stem: str, patch_size: int | None) -> str:
    """Why ``stem`` cannot cut ``img_size`` into patches (of ``patch_size``), in a few words."""
    if stem == "conv" and patch_size is not None and (patch_size < 2 or patch_size & (patch_size - 1)):
        return (f"--patch-size {patch_size}: the conv stem halves the picture once per doubling, so its patch is a "
                f"power of 2 (2, 4, 8, ...)")
    if patch_size is not None:
        return f"--img-size {img_size} is not a multiple of --patch-size {patch_size}"
    if stem == "conv":
        return (f"--img-size {img_size}: the conv stem needs a size that a power-of-2 patch divides"
                + (" (an odd size has none)" if img_size % 2 else ""))
    return f"--img-size {img_size}: no patch size divides it into 4 to 16 patches a side"


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


class WarmupCosine:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine decay to 0 at ``total_steps``. A class
    (not a closure) so that the scheduler's state saves it: :meth:`end_at` moves the end mid-run, and
    ``--resume`` must continue the schedule as it was then."""

    def __init__(self, total_steps: int, warmup_steps: int) -> None:
        self.total, self.warmup = int(total_steps), int(warmup_steps)
        self.warps: list[tuple[int, float]] = []  # (from step, speed): the rest of the schedule run faster

    def end_at(self, step: int, new_total: int) -> None:
        """From ``step`` on, the schedule's remaining part squeezed (or stretched) to end at ``new_total``
        (a run that must stop sooner still anneals to 0 at its last step)."""
        here = self.position(step)
        self.warps.append((int(step), (self.total - here) / max(1, new_total - step)))

    def position(self, step: int) -> float:
        """Where ``step`` falls on the original schedule, after the warps."""
        pos, at, speed = 0.0, 0, 1.0
        for start, sp in self.warps:
            if step < start:
                break
            pos, at, speed = pos + (start - at) * speed, start, sp
        return pos + (step - at) * speed

    def __call__(self, step: int) -> float:
        pos = self.position(step)
        if pos < self.warmup:
            return (pos + 1) / self.warmup
        t = (pos - self.warmup) / max(1, self.total - self.warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def warmup_cosine(total_steps: int, warmup_steps: int) -> WarmupCosine:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine decay to 0 (:class:`WarmupCosine`)."""
    return WarmupCosine(total_steps, warmup_steps)
