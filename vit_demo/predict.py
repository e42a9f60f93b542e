"""Predictions: image files -> top-k classes, batched, with progress on long runs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .labels import topk
from .preprocess import load_inputs
from .progress import batches

if TYPE_CHECKING:
    from .checkpoints.load import LoadedModel


@torch.inference_mode()
def predict_images(
    lm: LoadedModel, paths: Sequence[str | os.PathLike], k: int = 5, batch_size: int = 16, progress: bool = True
) -> list[dict[str, Any]]:
    """One ``{"image", "topk"}`` (or ``{"image", "error"}``) per path, in order."""
    if lm.model.cfg.num_classes == 0:
        raise ValueError(f"{lm.name} is headless (no classifier): it has no predictions to show")
    out: list[dict[str, Any]] = []
    for chunk in batches(list(paths), batch_size, "predict", progress):
        tensors, errors = load_inputs(chunk, lm.input_config)  # a NaFlex model: each picture's own aspect ratio
        probs = iter(probabilities(lm, [t for t in tensors if t is not None]))
        for p, t, err in zip(chunk, tensors, errors):
            if t is None:
                out.append({"image": str(p), "error": err})
            else:
                r = {"image": str(p), "topk": topk(next(probs), k, lm.labels)}
                out.append(r | ({"input_size": list(t.shape[1:])} if lm.model.cfg.naflex else {}))
    return out


def probabilities(lm: LoadedModel, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each input's class probabilities, in order; inputs of one size run as one batch (a NaFlex
    model's inputs differ in size, a fixed-size model's are one batch)."""
    by_size: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        by_size.setdefault(tuple(t.shape), []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    for idx in by_size.values():
        for i, p in zip(idx, lm.model(torch.stack([tensors[i] for i in idx]).to(lm.device)).logits.softmax(-1).cpu()):
            out[i] = p
    return out


def format_predictions(results: list[dict[str, Any]]) -> str:
    """Human-readable table of :func:`predict_images` results."""
    lines = []
    for r in results:
        lines.append(Path(r["image"]).name)
        if "error" in r:
            lines.append(f"  error: {r['error']}")
            continue
        if "input_size" in r:  # NaFlex: the picture's aspect ratio kept
            lines[-1] += f"  (seen at {r['input_size'][1]}x{r['input_size'][0]} px, its aspect ratio kept)"
        for t in r["topk"]:
            lines.append(f"  {t['prob'] * 100:6.2f}%  {t['label']}  (class {t['index']})")
    return "\n".join(lines)
