"""Maps of several images (or of one image under several models) side by side, one column each:
the picture above its map, its prediction under it; each map on its own scale unless
``shared_scale`` (one hot spot on one scale darkens every other map, and a class reads "the model
ignores the cup"), the colour bar saying which. Pure renderers: :mod:`vit_demo.present.side_by_side` computes the panels."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from .figures import colour_bar, figure_title
from .previews import overlay_image
from .style import LABEL_SIZE, PANEL_TITLE_SIZE, TEXT_COLOR, check_cmap

MAX_PANELS = 4
TILE = 448  # px a side of each panel's pictures


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


def _scale(panels: Sequence[Panel], shared: bool) -> list[tuple[float, float]]:
    if shared:
        lo, hi = min(float(p.map.min()) for p in panels), max(float(p.map.max()) for p in panels)
        return [(lo, hi)] * len(panels)
    return [(float(p.map.min()), float(p.map.max())) for p in panels]


def _grid_figure(
    panels: Sequence[Panel], heads: Sequence[str], captions: Sequence[str], title: str | None, label: str,
    cmap: str, alpha: float, shared_scale: bool, show_inputs: bool = True,
) -> Figure:
    """Plain pictures on the top row (``show_inputs``), maps below, one column per panel,
    captions under them; every picture at :data:`TILE` px."""
    check_cmap(cmap)
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
            top.imshow(p.picture.convert("RGB").resize((TILE, TILE), Image.Resampling.BICUBIC))
        top.set_title(textwrap.fill(heads[i], 30), fontsize=PANEL_TITLE_SIZE + 1, color=TEXT_COLOR, fontweight="bold")
        bottom.imshow(overlay_image(p.picture, p.map, cmap, alpha, size=(TILE, TILE), vmin=lo, vmax=hi))
        bottom.set_xlabel(captions[i], fontsize=LABEL_SIZE, color=TEXT_COLOR, labelpad=6)
        for ax in (top, bottom):
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
    norm, scale = ((Normalize(*scales[0]), "one scale for every panel") if shared_scale else
                   (Normalize(0, 1), "each panel scaled to its own min–max"))
    cb = colour_bar(fig, axes[-1, :].tolist(), cmap, norm, f"{label} ({scale})", not shared_scale,
                    orientation="horizontal", shrink=min(0.6, 0.25 * n + 0.2), aspect=30, pad=0.04)
    if shared_scale:
        cb.ax.xaxis.set_major_locator(MaxNLocator(nbins=4 if n <= 2 else 7))
    figure_title(fig, title)
    return fig


def images_figure(
    panels: Sequence[Panel], names: Sequence[str] | None = None, title: str | None = None, label: str = "value",
    cmap: str = "inferno", alpha: float = 0.6, shared_scale: bool = False, show_inputs: bool = True,
) -> Figure:
    """Up to four images, one method: each image's picture above its map (``show_inputs``),
    its prediction under it; each map on its own scale, or one colour scale for all
    (``shared_scale``)."""
    if not 1 <= len(panels) <= MAX_PANELS:
        raise ValueError(f"compare 1 to {MAX_PANELS} images, not {len(panels)}")
    names = list(names) if names is not None else [f"image {i + 1}" for i in range(len(panels))]
    return _grid_figure(panels, names, [p.caption(1) for p in panels], title, label, cmap, alpha, shared_scale,
                        show_inputs)


def models_figure(
    panels: Sequence[Panel], title: str | None = None, label: str = "value", cmap: str = "inferno",
    alpha: float = 0.6, shared_scale: bool = False,
) -> Figure:
    """One image under several models (two, usually): each model's map and its top-3, each on
    its own scale unless ``shared_scale``."""
    if not 1 <= len(panels) <= MAX_PANELS:
        raise ValueError(f"compare 1 to {MAX_PANELS} models, not {len(panels)}")
    return _grid_figure(panels, [p.model for p in panels], [p.caption(3) for p in panels], title, label, cmap, alpha,
                        shared_scale)


