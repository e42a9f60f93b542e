"""ImageNet-1k class names, from the data timm ships (offline)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch


@cache
def imagenet_labels() -> tuple[str, ...]:
    """Short human names in timm's class order ("tench", "goldfish", ...)."""
    from timm.data import ImageNetInfo

    return tuple(d.split(",")[0].strip() for d in ImageNetInfo().label_descriptions())


@cache
def imagenet_wnids() -> tuple[str, ...]:
    """WordNet ids in class order (sorted, as the ImageNet folders are)."""
    from timm.data import ImageNetInfo

    return tuple(ImageNetInfo().label_names())


def labels_for(num_classes: int) -> tuple[str, ...]:
    """Names for a classifier with ``num_classes`` outputs: ImageNet names for 1000 classes,
    otherwise ``class 0``, ``class 1``, ... (e.g. CLIP projections, ImageNet-21k heads)."""
    if num_classes == 1000:
        return imagenet_labels()
    return tuple(f"class {i}" for i in range(num_classes))


def class_from_filename(name: str) -> int | None:
    """Class index for a file named like ``n01440764_tench.JPEG`` (wnid first), else None."""
    wnid = name.split("_")[0]
    try:
        return imagenet_wnids().index(wnid)
    except ValueError:
        return None


def check_k(k: Any, classes: int, name: str = "k") -> int:
    """``k``, how many classes to list, as an int: a whole number of at least 1 (one above the model's
    ``classes`` lists them all); ValueError in one line naming the allowed range otherwise (``name``:
    how the caller spells it, e.g. ``--topk``)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Real) or not math.isfinite(k) or k != int(k) or k < 1:
        raise ValueError(f"{name} must be a whole number from 1 to {classes} (the model's classes), not {k!r}")
    return int(k)


def topk(probs: torch.Tensor, k: int, labels: Sequence[str]) -> list[dict[str, Any]]:
    """[classes] probabilities -> [{"index", "label", "prob"}], most likely first (``k``: see :func:`check_k`)."""
    k = min(check_k(k, probs.numel()), probs.numel())
    p, idx = probs.topk(k)
    return [{"index": int(i), "label": labels[int(i)], "prob": float(v)} for v, i in zip(p, idx)]
