"""Pictures side by side: up to four images with one method, or one image under two models.

Everything shown together uses the same settings: the same method, layer, head, colormap and
ONE colour scale (the min..max over all the maps shown, unless ``shared_scale=False``), so that
a brighter panel means a larger value, not a different scale. Each panel carries its
prediction.

- :func:`method_map` computes one map and the top predictions for (model, image, settings);
- :func:`images_figure` / :func:`models_figure` are pure renderers (numbers in, figure out);
- :func:`compare_images` / :func:`compare_models` do both in one call.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from . import explain, viz

MAX_IMAGES = 4
MAP_METHODS = ("attention", "rollout", "grad-rollout", "chefer")
METHOD_TITLES = {
    "attention": "[class] attention",
    "rollout": "Attention rollout",
    "grad-rollout": "Gradient-weighted rollout",
    "chefer": "Relevance (Chefer et al. 2021)",
}


@dataclass
class Panel:
    """One image under one model: the picture the model saw, the map, the top predictions."""

    picture: Image.Image
    map: np.ndarray  # [gh, gw]
    predictions: list[dict[str, Any]]  # [{"label", "prob", "index"}], most likely first
    model: str = ""
    target: int | None = None  # the class a class-specific map explains

    def caption(self, k: int = 1) -> str:
        if not self.predictions:
            return "(no classifier)"
        return "\n".join(f"{p['label']}  {p['prob'] * 100:.1f}%" for p in self.predictions[:k])


def method_map(
    lm, image: Image.Image, method: str = "chefer", layer: int | None = None, head: int | None = None,
    target: int | None = None, k: int = 3,
) -> Panel:
    """``method``'s map of ``image`` under ``lm`` (a LoadedModel), with its top-``k`` predictions.

    ``layer`` / ``head``: for ``attention`` (default the last layer, mean of heads). ``target``:
    the class a class-specific method explains (default the top-1 prediction).
    """
    from .inference import topk
    from .preprocess import preprocess

    if method not in MAP_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(MAP_METHODS)}")
    x, picture = preprocess(image, lm.data_config)
    x = x[None].to(lm.device)
    model = lm.model
    if method in ("grad-rollout", "chefer"):
        if model.cfg.num_classes == 0:
            raise ValueError(f"{lm.name} is headless: {method} needs class scores")
        ag = explain.attention_gradients(model, x, target)
        fn = explain.chefer_relevance if method == "chefer" else explain.grad_rollout
        m, logits, t = fn(ag.attentions, ag.grads, ag.layout), ag.logits, int(ag.target[0])
    else:
        with torch.no_grad():
            out = model(x, capture=True)
        logits, t = out.logits, None
        if method == "rollout":
            m = explain.rollout(out.attentions, out.layout)
        else:
            m = explain.cls_attention(out.attentions, out.layout, model.cfg.depth - 1 if layer is None else layer, head)
    preds = topk(logits.float().softmax(-1)[0].cpu(), k, lm.labels) if model.cfg.num_classes else []
    return Panel(picture, m[0].detach().float().cpu().numpy(), preds, lm.name, t)


def _scale(panels: Sequence[Panel], shared: bool) -> list[tuple[float, float]]:
    if shared:
        lo, hi = min(float(p.map.min()) for p in panels), max(float(p.map.max()) for p in panels)
        return [(lo, hi)] * len(panels)
    return [(float(p.map.min()), float(p.map.max())) for p in panels]


def _grid_figure(
    panels: Sequence[Panel], heads: Sequence[str], captions: Sequence[str], title: str | None, label: str,
    cmap: str, alpha: float, shared_scale: bool, show_inputs: bool = True, tile: int = 448,
) -> Figure:
    """Plain pictures on the top row (``show_inputs``), maps below, one column per panel,
    captions under them."""
    viz.check_cmap(cmap)
    n = len(panels)
    scales = _scale(panels, shared_scale)
    col_in = 3.1
    rows = 2 if show_inputs else 1
    fig = Figure(figsize=(col_in * n + 0.4, rows * col_in + 1.6 + (0.5 if title else 0)), layout="compressed",
                 facecolor="white")
    axes = fig.subplots(rows, n, squeeze=False)
    for i, (p, (lo, hi)) in enumerate(zip(panels, scales)):
        top, bottom = axes[0, i], axes[-1, i]
        if show_inputs:
            top.imshow(p.picture.convert("RGB").resize((tile, tile), Image.Resampling.BICUBIC))
        top.set_title(textwrap.fill(heads[i], 30), fontsize=viz.PANEL_TITLE_SIZE + 1, color=viz.TEXT_COLOR, fontweight="bold")
        bottom.imshow(viz.overlay_image(p.picture, p.map, cmap, alpha, size=(tile, tile), vmin=lo, vmax=hi))
        bottom.set_xlabel(captions[i], fontsize=viz.LABEL_SIZE, color=viz.TEXT_COLOR, labelpad=6)
        for ax in (top, bottom):
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
    if shared_scale:
        lo, hi = scales[0]
        cb = fig.colorbar(ScalarMappable(Normalize(lo, hi), cmap), ax=axes[-1, :].tolist(), orientation="horizontal",
                          shrink=min(0.6, 0.25 * n + 0.2), aspect=30, pad=0.04)
        cb.set_label(f"{label} (one scale for every panel)", fontsize=viz.LABEL_SIZE - 1, color=viz.TEXT_COLOR)
        cb.ax.xaxis.set_major_locator(MaxNLocator(nbins=4 if n <= 2 else 7))
    else:
        cb = fig.colorbar(ScalarMappable(Normalize(0, 1), cmap), ax=axes[-1, :].tolist(), orientation="horizontal",
                          shrink=min(0.6, 0.25 * n + 0.2), aspect=30, pad=0.04)
        cb.set_ticks([0, 1], labels=["low", "high"])
        cb.set_label(f"{label} (each panel scaled to its own min–max)", fontsize=viz.LABEL_SIZE - 1, color=viz.TEXT_COLOR)
    cb.ax.tick_params(labelsize=viz.TICK_SIZE, colors=viz.TEXT_COLOR)
    cb.outline.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=viz.TITLE_SIZE, color=viz.TEXT_COLOR, fontweight="bold")
    return fig


def images_figure(
    panels: Sequence[Panel], names: Sequence[str] | None = None, title: str | None = None, label: str = "value",
    cmap: str = "inferno", alpha: float = 0.6, shared_scale: bool = True, show_inputs: bool = True,
) -> Figure:
    """Up to four images, one method: each image's picture above its map (``show_inputs``),
    its prediction under it; one colour scale for all (``shared_scale``)."""
    if not 1 <= len(panels) <= MAX_IMAGES:
        raise ValueError(f"compare 1 to {MAX_IMAGES} images, not {len(panels)}")
    names = list(names) if names is not None else [f"image {i + 1}" for i in range(len(panels))]
    return _grid_figure(panels, names, [p.caption(1) for p in panels], title, label, cmap, alpha, shared_scale,
                        show_inputs)


def models_figure(
    panels: Sequence[Panel], title: str | None = None, label: str = "value", cmap: str = "inferno",
    alpha: float = 0.6, shared_scale: bool = True,
) -> Figure:
    """One image under several models (two, usually): each model's map and its top-3."""
    if not 1 <= len(panels) <= MAX_IMAGES:
        raise ValueError(f"compare 1 to {MAX_IMAGES} models, not {len(panels)}")
    return _grid_figure(panels, [p.model for p in panels], [p.caption(3) for p in panels], title, label, cmap, alpha,
                        shared_scale)


def _title(method: str, layer: int | None, head: int | None, depth: int) -> str:
    text = METHOD_TITLES[method]
    if method == "attention":
        text += f", layer {depth - 1 if layer is None else layer}, " + ("mean of heads" if head is None else f"head {head}")
    return text


def compare_images(
    lm, images: Sequence[Image.Image], names: Sequence[str] | None = None, method: str = "chefer",
    layer: int | None = None, head: int | None = None, cmap: str = "inferno", alpha: float = 0.6,
    shared_scale: bool = True, show_inputs: bool = True,
) -> Figure:
    """Up to four images under one model (a LoadedModel), same method and settings."""
    if not 1 <= len(images) <= MAX_IMAGES:
        raise ValueError(f"compare 1 to {MAX_IMAGES} images, not {len(images)}")
    panels = [method_map(lm, img, method, layer, head) for img in images]
    title = f"{_title(method, layer, head, lm.model.cfg.depth)}\n{lm.name}"
    return images_figure(panels, names, title, _label(method), cmap, alpha, shared_scale, show_inputs)


def compare_models(
    lms: Sequence, image: Image.Image, method: str = "rollout", layer: int | None = None, head: int | None = None,
    cmap: str = "inferno", alpha: float = 0.6, shared_scale: bool = True,
) -> Figure:
    """One image under two (up to four) models, same method and settings.

    ``layer`` counts from 0 and must exist in every model (default: each model's last layer).
    """
    for lm in lms:
        if layer is not None and not -lm.model.cfg.depth <= layer < lm.model.cfg.depth:
            raise ValueError(f"layer {layer} is outside {lm.name}'s 0..{lm.model.cfg.depth - 1}")
    panels = [method_map(lm, image, method, layer, head) for lm in lms]
    return models_figure(panels, _title(method, layer, head, lms[0].model.cfg.depth), _label(method), cmap, alpha,
                         shared_scale)


def _label(method: str) -> str:
    return {"attention": "attention weight", "rollout": "rollout"}.get(method, "relevance")
