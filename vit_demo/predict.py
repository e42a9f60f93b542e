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
        tensors, errors = load_inputs(chunk, lm.data_config)
        ok = [t for t in tensors if t is not None]
        probs = iter(lm.model(torch.stack(ok).to(lm.device)).logits.softmax(-1).cpu()) if ok else iter(())
        for p, t, err in zip(chunk, tensors, errors):
            if t is None:
                out.append({"image": str(p), "error": err})
            else:
                out.append({"image": str(p), "topk": topk(next(probs), k, lm.labels)})
    return out


def format_predictions(results: list[dict[str, Any]]) -> str:
    """Human-readable table of :func:`predict_images` results."""
    lines = []
    for r in results:
        lines.append(Path(r["image"]).name)
        if "error" in r:
            lines.append(f"  error: {r['error']}")
            continue
        for t in r["topk"]:
            lines.append(f"  {t['prob'] * 100:6.2f}%  {t['label']}  (class {t['index']})")
    return "\n".join(lines)
