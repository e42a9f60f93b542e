"""Do the maps point at what the model uses? Deletion and insertion (Petsiuk et al., RISE 2018).

Order the patches by a saliency map, most salient first. *Deletion* starts from the image and
removes patches in that order; *insertion* starts from a blank input and reveals them. After
each step we read the model's softmax probability of the target class. A faithful map makes the
probability fall fast under deletion (low area under the curve) and rise fast under insertion
(high area). A random order of the patches is the baseline every method has to beat.

Protocol, at patch granularity on the model's input:

- a removed patch is set to 0 in normalised space, i.e. to the dataset's mean colour;
- one step moves ``gw`` patches (a grid row's worth; 14 for a 14x14 grid), so a curve has
  gh + 1 points, from 0 patches to all of them;
- the score ("AUC") is the mean of the target-class probabilities over the points;
- target: the model's top-1 class on the clean image ("predicted") or the true class read
  from the file name ("label"); gradient-based maps explain that same class;
- the random baseline averages one random patch order per seed (3 seeds by default,
  :data:`RANDOM_SEEDS`).

All perturbed inputs of a batch of images (every method, every step) go through the model
together, in chunks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from .explain import DEFAULT_METHODS, METHODS, SLOW_METHODS
from .model import VisionTransformer
from .perturb import masked_scores

if TYPE_CHECKING:
    from .weights import LoadedModel

T = TypeVar("T")

RANDOM_SEEDS = (0, 1, 2)
CPU_FORWARD_BATCH = 16  # perturbed inputs per forward pass on a CPU (small batches stay in cache)
GPU_FORWARD_BATCH = 256


def patch_order(saliency: Tensor) -> Tensor:
    """[B, gh, gw] map -> [B, gh*gw] row-major patch indices, most salient first (ties keep
    the row-major order)."""
    return saliency.flatten(1).argsort(dim=-1, descending=True, stable=True)


def _num_steps(num_patches: int, per_step: int) -> int:
    return math.ceil(num_patches / per_step)


def _curves(
    model: VisionTransformer, x: Tensor, orders: Tensor, target: Tensor, per_step: int, chunk: int | None = None
) -> tuple[Tensor, Tensor]:
    """Deletion and insertion curves for K patch orders per image.

    x [B, 3, h, w], orders [B, K, n] patch indices, target [B] -> two [B, K, S + 1] tensors.
    The clean and the blank input (the curves' ends) are run once per image, not per order.
    """
    B, K, n = orders.shape
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    if gh * gw != n:
        raise ValueError(f"orders cover {n} patches but the input has a {gh}x{gw} grid")
    S = _num_steps(n, per_step)
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
    chunk = chunk or (CPU_FORWARD_BATCH if x.device.type == "cpu" else GPU_FORWARD_BATCH)
    probs = masked_scores(model, x, keep.reshape(B, -1, gh, gw), target, chunk)  # [B, M]: hidden patches -> 0
    clean = probs[:, 0, None, None].expand(B, K, 1)
    blank = probs[:, 1, None, None].expand(B, K, 1)
    deleting, inserting = probs[:, 2:].reshape(B, 2, K, S - 1).unbind(dim=1)
    return torch.cat([clean, deleting, blank], dim=-1), torch.cat([blank, inserting, clean], dim=-1)


def deletion_insertion(
    model: VisionTransformer, x: Tensor, saliency: Tensor, target: int | Tensor, per_step: int | None = None
) -> tuple[Tensor, Tensor]:
    """Deletion and insertion curves [B, S + 1] each, for maps ``saliency`` [B, gh, gw].

    Point k has the k * ``per_step`` most salient patches removed (deletion) or shown
    (insertion); ``per_step`` defaults to one grid row (gw), giving S + 1 = gh + 1 points.
    The values are the softmax probabilities of ``target`` (an int or [B] classes).
    """
    B = x.shape[0]
    t = torch.as_tensor(target, dtype=torch.long, device=x.device).reshape(-1).expand(B)
    d, i = _curves(model, x, patch_order(saliency)[:, None], t, per_step or saliency.shape[-1])
    return d[:, 0], i[:, 0]


def _random_orders(n: int, generators: Sequence[torch.Generator]) -> Tensor:
    """[len(generators), n]: one random permutation of the patches per seed."""
    return torch.stack([torch.randperm(n, generator=g) for g in generators])


def _labels(paths: Sequence[str | os.PathLike]) -> list[int]:
    from .labels import class_from_filename

    out = []
    for p in paths:
        c = class_from_filename(Path(p).name)
        if c is None:
            raise ValueError(f"{Path(p).name}: no ImageNet class in the file name (expected <wnid>_<name>.JPEG)")
        out.append(c)
    return out


def check_request(methods: Sequence[str], target: str) -> None:
    """ValueError unless ``target`` is "predicted" or "label" and every method is known."""
    if target not in ("predicted", "label"):
        raise ValueError(f"target must be 'predicted' or 'label', not {target!r}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")


def target_batches(
    lm: LoadedModel, paths: Sequence[str | os.PathLike], target: str, batch_size: int, desc: str, progress: bool,
    errors: list[str],
) -> Iterator[tuple[Tensor, Tensor]]:
    """The readable images of ``paths`` in batches, each with its target classes: ``(x [b, 3, H, W],
    cls [b])`` on the model's device; ``target`` "label" reads the class from the file name,
    "predicted" takes the model's top-1. Unreadable images are left out, their messages
    appended to ``errors``."""
    from .inference import batches, load_inputs

    for chunk in batches(list(paths), batch_size, desc, progress):
        tensors, errs = load_inputs(chunk, lm.data_config)
        errors += [e for e in errs if e is not None]
        ok = [(path, xi) for path, xi in zip(chunk, tensors) if xi is not None]
        if not ok:
            continue
        x = torch.stack([xi for _, xi in ok]).to(lm.device)
        if target == "label":
            cls = torch.tensor(_labels([path for path, _ in ok]), device=lm.device)
        else:
            with torch.no_grad():
                cls = lm.model(x).logits.argmax(dim=-1)
        yield x, cls


def evaluate(
    lm: LoadedModel,
    paths: Sequence[str | os.PathLike],
    methods: Sequence[str] = DEFAULT_METHODS,
    target: str = "predicted",
    batch_size: int = 8,
    progress: bool = True,
    random_seeds: Sequence[int] = RANDOM_SEEDS,
) -> dict[str, Any]:
    """Mean deletion and insertion AUC of each method and of random orders over ``paths``.

    ``lm`` is a :class:`~vit_demo.weights.LoadedModel`; ``target`` is "predicted" (top-1 on
    the clean image) or "label" (from ``<wnid>_...`` file names). Images that cannot be read
    are left out and listed under "errors"; ``random_seeds``: one random patch order per seed,
    averaged into the "random" baseline (none: no baseline). Returns ``{"images": N, "target": ..., "points":
    S + 1, "methods": {name: {"deletion_auc", "insertion_auc", "deletion_curve",
    "insertion_curve"}, ..., "random": {...}}, "errors": [...]}``; the curves are the mean
    probability at each point, and each AUC is the mean of its curve.
    """
    check_request(methods, target)
    model, dev = lm.model, lm.device
    gh, gw = (s // model.cfg.patch_size for s in lm.data_config.input_size)
    n, points = gh * gw, _num_steps(gh * gw, gw) + 1
    generators = [torch.Generator().manual_seed(s) for s in random_seeds]
    curves = torch.zeros(2, len(methods) + len(generators), points, dtype=torch.float64)  # summed over images
    count, errors = 0, []
    for x, cls in target_batches(lm, paths, target, batch_size, "faithfulness", progress, errors):
        orders = [patch_order(METHODS[m](model, x, cls))[:, None] for m in methods]  # each [b, 1, n]
        if generators:
            orders.append(torch.stack([_random_orders(n, generators) for _ in range(len(x))]).to(dev))  # [b, seeds, n]
        d, i = _curves(model, x, torch.cat(orders, dim=1), cls, per_step=gw)  # [b, K, S + 1] each
        curves += torch.stack([d, i]).sum(dim=1).double().cpu()
        count += len(x)
    if count == 0:
        raise ValueError("no readable images to evaluate: " + "; ".join(errors[:3]))
    curves /= count
    k = len(methods)
    names = list(methods)
    if generators:
        curves = torch.cat([curves[:, :k], curves[:, k:].mean(dim=1, keepdim=True)], dim=1)  # seeds averaged
        names.append("random")
    results = {}
    for name, d, i in zip(names, curves[0], curves[1]):
        results[name] = {"deletion_auc": float(d.mean()), "insertion_auc": float(i.mean()),
                         "deletion_curve": d.tolist(), "insertion_curve": i.tolist()}
    return {"images": count, "target": target, "points": points, "methods": results, "errors": errors}


def format_results(r: dict[str, Any]) -> str:
    """A readable table of :func:`evaluate`'s result."""
    target = "the true label (from the file name)" if r["target"] == "label" else "the predicted class"
    lines = [
        f"deletion / insertion over {r['images']} images, {r['points']} points per curve, "
        f"probability of {target}",
        f"{'method':<14}{'deletion AUC (lower is better)':>32}{'insertion AUC (higher is better)':>34}",
    ]
    for name, m in r["methods"].items():
        lines.append(f"{name:<14}{m['deletion_auc']:>32.3f}{m['insertion_auc']:>34.3f}")
    lines += [f"skipped: {e}" for e in r["errors"]]
    return "\n".join(lines)


def spread(paths: Sequence[T], limit: int) -> list[T]:
    """``limit`` items evenly spaced through ``paths`` (1000 sorted files, limit 100: every 10th;
    a limit of 0 or less, or of at least their number: all of them)."""
    if limit <= 0 or limit >= len(paths):
        return list(paths)
    return [paths[i * len(paths) // limit] for i in range(limit)]


def images_and_methods(args: argparse.Namespace) -> tuple[list, list[str]]:
    """--images (spread over --limit) and --methods (names or ``all``), checked: shared by the
    ``faithfulness`` and ``sanity`` commands."""
    from .cli import UserError
    from .images import find_images

    paths = find_images([args.images])
    if not paths:
        raise UserError(f"no images found in {args.images}")
    if args.limit is not None:
        paths = spread(paths, args.limit)
    return paths, parse_methods(args.methods)


def parse_methods(spec: str) -> list[str]:
    """A --methods value: comma-separated names from explain.METHODS, or ``all`` (checked; shared
    by the ``faithfulness``, ``sanity`` and ``pointing`` commands)."""
    from .cli import UserError

    methods = list(METHODS) if spec.strip() == "all" else [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(METHODS)}, all")
    return methods


def add_images_and_methods_args(p: argparse.ArgumentParser, images_help: str) -> None:
    """--images, the model flags, --methods and --limit: what :func:`images_and_methods` reads,
    shared by the ``faithfulness`` and ``sanity`` commands."""
    from .cli import add_model_args

    p.add_argument("--images", required=True, help=images_help)
    add_model_args(p)
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated, from {', '.join(METHODS)}; or 'all' (default: all but {', '.join(SLOW_METHODS)})")
    p.add_argument("--limit", type=int, help="use N images evenly spaced through the sorted folder")


def cmd_faithfulness(args: argparse.Namespace) -> int:
    from .cli import UserError, load_from_args

    paths, methods = images_and_methods(args)
    if args.seeds < 0:
        raise UserError(f"--seeds must be 0 or more, got {args.seeds}")
    lm = load_from_args(args)
    r = evaluate(lm, paths, methods, args.target, args.batch_size, progress=True, random_seeds=range(args.seeds))
    print(json.dumps(r, indent=2) if args.json else format_results(r))
    return 0


def register(subparsers: Any) -> None:
    """Add the ``faithfulness`` sub-command to the CLI."""
    p = subparsers.add_parser("faithfulness", help="deletion/insertion scores of the explanation methods")
    add_images_and_methods_args(p, "folder (or image file) of <wnid>_<name>.JPEG photos")
    p.add_argument("--seeds", type=int, default=len(RANDOM_SEEDS),
                   help=f"random patch orders averaged into the 'random' baseline (default {len(RANDOM_SEEDS)}; 0: none)")
    p.add_argument("--target", default="predicted", choices=["predicted", "label"],
                   help="class whose probability is tracked: top-1 on the clean image, or the file name's class")
    p.add_argument("--batch-size", type=int, default=8, help="images per batch")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_faithfulness)
