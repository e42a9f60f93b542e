"""Pictures side by side: up to four images with one method, or one image under two models.

Everything shown together uses the same settings: the same method, layer and colormap.
Each map is scaled to its own min..max by default (so every panel shows where ITS evidence is);
``shared_scale=True`` puts them on ONE colour scale (the min..max over all the maps shown), where
a brighter panel means a larger value, and one hot spot can darken the rest. The colour bar says
which. Each panel carries its prediction.

- :func:`method_map` computes one map and the top predictions for (model, image, settings),
  for any registered method (:mod:`vit_demo.methods`);
- :func:`~vit_demo.viz.panels.images_figure` / :func:`~vit_demo.viz.panels.models_figure` are
  the pure renderers (numbers in, figure out);
- :func:`compare_images` / :func:`compare_models` do both in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from matplotlib.figure import Figure
from PIL import Image

from .. import methods
from ..labels import topk
from ..methods.attention import cls_attention
from ..preprocess import preprocess
from ..viz.panels import MAX_PANELS, Panel, images_figure, models_figure

MAX_IMAGES = MAX_PANELS


def method_map(
    lm, image: Image.Image, method: str = "chefer", layer: int | None = None, head: int | None = None,
) -> Panel:
    """``method``'s map of ``image`` under ``lm`` (a LoadedModel), with its top-3 predictions.

    ``layer`` / ``head``: for ``attention`` (default the last layer, mean of heads). A
    class-specific method explains the top-1 prediction.
    """
    spec = methods.get(method)
    model = lm.model
    if spec.class_specific and model.cfg.num_classes == 0:
        raise ValueError(f"{lm.name} is headless: {method} needs class scores")
    x, picture = preprocess(image, lm.data_config)
    x = x[None].to(lm.device)
    with torch.no_grad():
        out = model(x, capture=method == "attention")
    t = int(out.logits.argmax(-1)[0]) if spec.class_specific else None
    if method == "attention" and (layer is not None or head is not None):
        m = cls_attention(out.attentions, out.layout, model.cfg.depth - 1 if layer is None else layer, head)
    else:
        m = spec(model, x, t)
    preds = topk(out.logits.float().softmax(-1)[0].cpu(), 3, lm.labels) if model.cfg.num_classes else []
    return Panel(picture, m[0].detach().float().cpu().numpy(), preds, lm.name, t)


def _title(method: str, layer: int | None, depth: int) -> str:
    text = methods.get(method).title
    if method == "attention":
        shown = depth if layer is None else layer % depth + 1  # people count layers from 1
        text += f", layer {shown} of {depth}, mean of heads"
    return text


def compare_images(
    lm, images: Sequence[Image.Image], names: Sequence[str] | None = None, method: str = "chefer",
    cmap: str = "inferno", alpha: float = 0.6, shared_scale: bool = False,
) -> Figure:
    """Up to four images under one model (a LoadedModel), same method and settings (``attention``:
    the last layer, mean of heads), each picture above its map."""
    if not 1 <= len(images) <= MAX_IMAGES:
        raise ValueError(f"compare 1 to {MAX_IMAGES} images, not {len(images)}")
    panels = [method_map(lm, img, method) for img in images]
    title = f"{_title(method, None, lm.model.cfg.depth)}\n{lm.name}"
    return images_figure(panels, names, title, _label(method), cmap, alpha, shared_scale)


def compare_models(
    lms: Sequence, image: Image.Image, method: str = "rollout", layer: int | None = None,
    cmap: str = "inferno", alpha: float = 0.6, shared_scale: bool = False,
) -> Figure:
    """One image under two (up to four) models, same method and settings.

    ``layer`` (``attention``, mean of heads) counts from 0 and must exist in every model
    (default: each model's last layer).
    """
    for lm in lms:
        if layer is not None and not -lm.model.cfg.depth <= layer < lm.model.cfg.depth:
            raise ValueError(f"layer {layer} is outside {lm.name}'s 0..{lm.model.cfg.depth - 1}")
    panels = [method_map(lm, image, method, layer) for lm in lms]
    return models_figure(panels, _title(method, layer, lms[0].model.cfg.depth), _label(method), cmap, alpha,
                         shared_scale)


def _label(method: str) -> str:
    return {"attention": "attention weight", "rollout": "rollout"}.get(method, "relevance")
