"""Deletion and insertion curves (Petsiuk et al., RISE, BMVC 2018) at patch granularity.

Order the patches by a saliency map, most salient first. *Deletion* starts from the image and
removes patches in that order; *insertion* starts from a blank input and reveals them. After
each step we read the model's softmax probability of the target class. A faithful map makes the
probability fall fast under deletion (low area under the curve) and rise fast under insertion
(high area). A random order of the patches is the baseline every method has to beat.

Protocol, on the model's input: a removed patch is set to 0 in normalised space (the dataset's
mean colour); one step moves ``gw`` patches (a grid row's worth), so a curve has gh + 1 points;
the score ("AUC") is the mean of the probabilities over the points. All perturbed inputs of a
batch of images (every map, every step) go through the model together, in chunks
(:func:`vit_demo.methods.passes.masked_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..methods.passes import masked_scores
from ..model import VisionTransformer

RANDOM_SEEDS = (0, 1, 2)
CPU_FORWARD_BATCH = 16  # perturbed inputs per forward pass on a CPU (small batches stay in cache)
GPU_FORWARD_BATCH = 256


def patch_order(saliency: Tensor) -> Tensor:
    """[B, gh, gw] map -> [B, gh*gw] row-major patch indices, most salient first (ties keep
    the row-major order)."""
    return saliency.flatten(1).argsort(dim=-1, descending=True, stable=True)


def forward_batch(x: Tensor) -> int:
    """How many perturbed inputs go through the model at once on ``x``'s device."""
    return CPU_FORWARD_BATCH if x.device.type == "cpu" else GPU_FORWARD_BATCH


def num_steps(num_patches: int, per_step: int) -> int:
    return math.ceil(num_patches / per_step)


def curves(
    model: VisionTransformer, x: Tensor, orders: Tensor, target: Tensor, per_step: int
) -> tuple[Tensor, Tensor]:
    """Deletion and insertion curves for K patch orders per image.

    x [B, 3, h, w], orders [B, K, n] patch indices, target [B] -> two [B, K, S + 1] tensors.
    The clean and the blank input (the curves' ends) are run once per image, not per order.
    """
    B, K, n = orders.shape
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    if gh * gw != n:
        raise ValueError(f"orders cover {n} patches but the input has a {gh}x{gw} grid")
    S = num_steps(n, per_step)
    rank = torch.empty_like(orders)  # rank[b, o, patch] = its position in the order
    rank.scatter_(-1, orders, torch.arange(n, device=orders.device).expand_as(orders))
    counts = torch.arange(1, S, device=orders.device) * per_step  # the points strictly inside
    first = rank[:, :, None, :] < counts[:, None]  # [B, K, S-1, n]: among the first k patches
    keep = torch.cat([
        torch.ones(B, 1, n, dtype=torch.bool, device=x.device),  # the clean image
        torch.zeros(B, 1, n, dtype=torch.bool, device=x.device),  # all patches removed
        (~first).reshape(B, K * (S - 1), n),  # deletion: the first k removed
        first.reshape(B, K * (S - 1), n),  # insertion: only the first k shown
    ], dim=1)
    probs = masked_scores(model, x, keep.reshape(B, -1, gh, gw), target, forward_batch(x))  # [B, M]: hidden patches -> 0
    clean = probs[:, 0, None, None].expand(B, K, 1)
    blank = probs[:, 1, None, None].expand(B, K, 1)
    deleting, inserting = probs[:, 2:].reshape(B, 2, K, S - 1).unbind(dim=1)
    return torch.cat([clean, deleting, blank], dim=-1), torch.cat([blank, inserting, clean], dim=-1)


def random_orders(n: int, generators: Sequence[torch.Generator]) -> Tensor:
    """[len(generators), n]: one random permutation of the patches per seed."""
    return torch.stack([torch.randperm(n, generator=g) for g in generators])


def method_curves(model: VisionTransformer, x: Tensor, maps: Sequence[Tensor], target: Tensor,
                  generators: Sequence[torch.Generator] = ()) -> tuple[Tensor, Tensor]:
    """Deletion and insertion curves of K maps (each [B, gh, gw]) and of one random patch order
    per generator, for a batch x [B, 3, h, w] and its targets [B]: two [B, K + seeds, S + 1]
    tensors. The random orders are drawn per image, in order, from the generators."""
    B = x.shape[0]
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    orders = [patch_order(m.to(x.device))[:, None] for m in maps]  # each [B, 1, n]
    if generators:
        orders.append(torch.stack([random_orders(gh * gw, generators) for _ in range(B)]).to(x.device))
    return curves(model, x, torch.cat(orders, dim=1), target, per_step=gw)


def auc_table(names: Sequence[str], deletion: Tensor, insertion: Tensor) -> dict[str, dict[str, Any]]:
    """Mean curves [K + seeds, S + 1] -> ``{name: {"deletion_auc", "insertion_auc",
    "deletion_curve", "insertion_curve"}}`` for the K ``names``, and ``"random"`` for the mean
    of the remaining rows (the random orders), when there are any."""
    k = len(names)
    rows = [*zip(names, deletion[:k], insertion[:k])]
    if deletion.shape[0] > k:
        rows.append(("random", deletion[k:].mean(0), insertion[k:].mean(0)))
    return {name: {"deletion_auc": float(d.mean()), "insertion_auc": float(i.mean()),
                    "deletion_curve": d.tolist(), "insertion_curve": i.tolist()} for name, d, i in rows}
