"""Predictions: images -> top-k classes, batched, with progress on long runs."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .images import ImageError, load_image
from .preprocess import DataConfig, preprocess
from .weights import LoadedModel


def load_inputs(paths: Sequence[str | os.PathLike], dc: DataConfig) -> tuple[list[torch.Tensor | None], list[str | None]]:
    """Preprocessed tensors (None where the image failed) and the error messages."""
    tensors: list[torch.Tensor | None] = []
    errors: list[str | None] = []
    for p in paths:
        try:
            tensors.append(preprocess(load_image(p), dc)[0])
            errors.append(None)
        except ImageError as e:
            tensors.append(None)
            errors.append(str(e))
    return tensors, errors


def batches(items: Sequence[Any], size: int, desc: str = "", progress: bool = True) -> Iterator[Sequence[Any]]:
    """``items`` in chunks of ``size``, with a tqdm bar (stderr) when there is more than one."""
    starts = range(0, len(items), size)
    bar = tqdm(starts, desc=desc, unit="batch", disable=not progress or len(starts) <= 1, leave=False)
    for i in bar:
        yield items[i : i + size]


def topk(probs: torch.Tensor, k: int, labels: Sequence[str]) -> list[dict[str, Any]]:
    """[classes] probabilities -> [{"index", "label", "prob"}], most likely first."""
    k = min(k, probs.numel())
    p, idx = probs.topk(k)
    return [{"index": int(i), "label": labels[int(i)], "prob": float(v)} for v, i in zip(p, idx)]


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
