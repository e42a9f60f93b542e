"""Do the maps point at what the model uses? Deletion and insertion over a folder of photos.

The curves and their protocol are :mod:`~vit_demo.evaluate.curves`; here they run over many
images, batched, with the target class of each image either the model's top-1 on the clean
image ("predicted") or the true class read from the file name ("label"; gradient-based maps
explain that same class). The random baseline averages one random patch order per seed
(3 seeds by default, :data:`~vit_demo.evaluate.curves.RANDOM_SEEDS`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from .. import methods as registry
from ..labels import class_from_filename
from ..preprocess import load_inputs
from ..progress import batches
from .curves import RANDOM_SEEDS, auc_table, method_curves, num_steps

if TYPE_CHECKING:
    from ..checkpoints.load import LoadedModel

T = TypeVar("T")
TARGETS = ("predicted", "label")


def labels_from_names(paths: Sequence[str | os.PathLike]) -> list[int]:
    """ImageNet class indices read from ``<wnid>_<name>.JPEG`` file names (ValueError otherwise)."""
    out = []
    for p in paths:
        c = class_from_filename(Path(p).name)
        if c is None:
            raise ValueError(f"{Path(p).name}: no ImageNet class in the file name (expected <wnid>_<name>.JPEG)")
        out.append(c)
    return out


def check_request(methods: Sequence[str], target: str) -> None:
    """ValueError unless ``target`` is "predicted" or "label" and every method is registered."""
    if target not in TARGETS:
        raise ValueError(f"target must be 'predicted' or 'label', not {target!r}")
    known = registry.names()
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(known)}")


def target_batches(
    lm: LoadedModel, paths: Sequence[str | os.PathLike], target: str, batch_size: int, desc: str, progress: bool,
    errors: list[str],
) -> Iterator[tuple[Tensor, Tensor]]:
    """The readable images of ``paths`` in batches, each with its target classes: ``(x [b, 3, H, W],
    cls [b])`` on the model's device; ``target`` "label" reads the class from the file name,
    "predicted" takes the model's top-1. Unreadable images are left out, their messages
    appended to ``errors``."""
    for chunk in batches(list(paths), batch_size, desc, progress):
        tensors, errs = load_inputs(chunk, lm.data_config)
        errors += [e for e in errs if e is not None]
        ok = [(path, xi) for path, xi in zip(chunk, tensors) if xi is not None]
        if not ok:
            continue
        x = torch.stack([xi for _, xi in ok]).to(lm.device)
        if target == "label":
            cls = torch.tensor(labels_from_names([path for path, _ in ok]), device=lm.device)
        else:
            with torch.no_grad():
                cls = lm.model(x).logits.argmax(dim=-1)
        yield x, cls


def method_maps(model, x: Tensor, target: Tensor, names: Sequence[str]) -> list[Tensor]:
    """Each method's maps [B, gh, gw] for ``target`` [B], sharing their passes (:func:`vit_demo.methods.reuse`)."""
    with registry.reuse(model, x):
        return [registry.get(m)(model, x, target) for m in names]


def evaluate(
    lm: LoadedModel,
    paths: Sequence[str | os.PathLike],
    methods: Sequence[str] | None = None,
    target: str = "predicted",
    batch_size: int = 8,
    progress: bool = True,
    random_seeds: Sequence[int] = RANDOM_SEEDS,
) -> dict[str, Any]:
    """Mean deletion and insertion AUC of each method and of random orders over ``paths``.

    ``methods``: registered names (default: the single-pass ones, :func:`vit_demo.methods.single_pass`);
    ``target`` is "predicted" (top-1 on the clean image) or "label" (from ``<wnid>_...`` file
    names). Images that cannot be read are left out and listed under "errors"; ``random_seeds``:
    one random patch order per seed, averaged into the "random" baseline (none: no baseline).
    Returns ``{"images": N, "target": ..., "points": S + 1, "methods": {name: {"deletion_auc",
    "insertion_auc", "deletion_curve", "insertion_curve"}, ..., "random": {...}}, "errors": [...]}``;
    the curves are the mean probability at each point, and each AUC is the mean of its curve.
    """
    methods = list(registry.single_pass() if methods is None else methods)
    check_request(methods, target)
    model = lm.model
    gh, gw = (s // model.cfg.patch_size for s in lm.data_config.input_size)
    points = num_steps(gh * gw, gw) + 1
    generators = [torch.Generator().manual_seed(s) for s in random_seeds]
    curves = torch.zeros(2, len(methods) + len(generators), points, dtype=torch.float64)  # summed over images
    count, errors = 0, []
    for x, cls in target_batches(lm, paths, target, batch_size, "faithfulness", progress, errors):
        d, i = method_curves(model, x, method_maps(model, x, cls, methods), cls, generators)  # [b, K, S + 1] each
        curves += torch.stack([d, i]).sum(dim=1).double().cpu()
        count += len(x)
    if count == 0:
        raise ValueError("no readable images to evaluate: " + "; ".join(errors[:3]))
    curves /= count
    return {"images": count, "target": target, "points": points, "methods": auc_table(methods, curves[0], curves[1]),
            "errors": errors}


def format_results(result: dict[str, Any]) -> str:
    """A readable table of :func:`evaluate`'s result."""
    target = "the true label (from the file name)" if result["target"] == "label" else "the predicted class"
    lines = [
        f"deletion / insertion over {result['images']} images, {result['points']} points per curve, "
        f"probability of {target}",
        f"{'method':<14}{'deletion AUC (lower is better)':>32}{'insertion AUC (higher is better)':>34}",
    ]
    for name, m in result["methods"].items():
        lines.append(f"{name:<14}{m['deletion_auc']:>32.3f}{m['insertion_auc']:>34.3f}")
    lines += [f"skipped: {e}" for e in result["errors"]]
    return "\n".join(lines)


def spread(paths: Sequence[T], limit: int) -> list[T]:
    """``limit`` items evenly spaced through ``paths`` (1000 sorted files, limit 100: every 10th;
    a limit of 0 or less, or of at least their number: all of them)."""
    if limit <= 0 or limit >= len(paths):
        return list(paths)
    return [paths[i * len(paths) // limit] for i in range(limit)]
