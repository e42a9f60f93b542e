"""Figures of maps and pictures for slides and papers (matplotlib): ``*_figure`` functions
return a :class:`matplotlib.figure.Figure`; :func:`~vit_demo.viz.export.save_figure` writes PNG
at a chosen pixel width, SVG or PDF, with the outer margin trimmed. Charts of numbers (curves,
bars, tables) are :mod:`~vit_demo.viz.charts`.

Figures are built on :class:`matplotlib.figure.Figure` directly: pyplot's global state is
never touched, so figures are safe to make from a server and never leak.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps, patheffects
from matplotlib.cm import ScalarMappable
from matplotlib.colorbar import Colorbar
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from .arrays import Picture, as_array, as_maps, patch_box, picture_array
from .export import renderer
from .previews import overlay_array
from .sequence import SequenceSlot, sequence_slots
from .style import (
    ACCENT,
    HIGHLIGHT,
    LABEL_SIZE,
    MUTED_COLOR,
    PANEL_TITLE_SIZE,
    TEXT_COLOR,
    TICK_SIZE,
    TITLE_SIZE,
    check_cmap,
    token_color,
)


def _figure(width_in: float, height_in: float) -> Figure:
    """A white figure whose layout packs fixed-aspect pictures tightly ("compressed");
    :func:`save_figure` then trims the outer margin."""
    return Figure(figsize=(width_in, height_in), layout="compressed", facecolor="white")


def _fit_height(fig: Figure) -> Figure:
    """Shrink the figure's height to its content and a margin: fixed-aspect pictures are sized
    by the width, and any height left over would otherwise open gaps around the title / caption."""
    pad = 0.12  # inches above and below the content, and under a title or caption
    for _ in range(2):
        r = renderer(fig)
        fig.draw_without_rendering()
        boxes = [ax.get_tightbbox(r) for ax in fig.axes if ax.get_visible()]
        if not boxes:
            return fig
        y0, y1 = min(b.y0 for b in boxes), max(b.y1 for b in boxes)
        need = (y1 - y0) / fig.dpi + 2 * pad
        for text in (getattr(fig, "_suptitle", None), getattr(fig, "_supxlabel", None)):
            if text is not None and text.get_text():
                need += text.get_window_extent(r).height / fig.dpi + pad
        if fig.get_figheight() - need < 0.05:
            break
        fig.set_figheight(need)
    return fig


def _image_axis(ax) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_visible(False)


def _panel_title(ax, text: str, size: float = PANEL_TITLE_SIZE) -> None:
    ax.set_title(text, fontsize=size, color=TEXT_COLOR, pad=6)


def _stroke(width: float = 2.5) -> list:
    return [patheffects.withStroke(linewidth=width, foreground="black")]


def _mark_patch(ax, index: int, grid: tuple[int, int], size: tuple[int, int]) -> None:
    x0, y0, x1, y1 = patch_box(index, grid, size)
    for color, lw in (("black", 4.0), (HIGHLIGHT, 2.2)):
        ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, edgecolor=color, linewidth=lw))


def _map_panel(ax, rgb: np.ndarray) -> None:
    """Show a map's pixels (:func:`~vit_demo.viz.previews.overlay_array`, the app's renderer:
    matplotlib resamples ONE picture per panel) on a bare axis in picture pixel coordinates."""
    h, w = rgb.shape[:2]
    ax.imshow(rgb, interpolation="bilinear", extent=(-0.5, w - 0.5, h - 0.5, -0.5))
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    _image_axis(ax)


def colour_bar(fig: Figure, ax, cmap: str, norm: Normalize, label: str, relative: bool = False,
               label_size: float = LABEL_SIZE - 1, **options) -> Colorbar:
    """An opaque colour bar of ``cmap`` over ``norm`` beside ``ax`` (the overlay's transparency
    would wash it out), in the figures' style: ``label``, ticks in the text colour, no outline;
    ``relative``: its two ends read "low" and "high". ``options``: :meth:`Figure.colorbar`'s."""
    cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, **options)
    cb.set_label(label, fontsize=label_size, color=TEXT_COLOR)
    cb.ax.tick_params(labelsize=TICK_SIZE, colors=TEXT_COLOR)
    cb.outline.set_visible(False)
    if relative:
        cb.set_ticks([norm.vmin, norm.vmax], labels=["low", "high"])
    return cb


def figure_title(fig: Figure, title: str | None) -> None:
    """The figure's bold title, when there is one."""
    if title:
        fig.suptitle(title, fontsize=TITLE_SIZE, color=TEXT_COLOR, fontweight="bold")


def heatmap_figure(
    picture: Picture,
    heat: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    colorbar: bool = True,
    title: str | None = None,
    label: str = "attention",
    show_input: bool = False,
    mark: int | None = None,
    caption: str | None = None,
) -> Figure:
    """A ``[gh, gw]`` map over the model-input picture (any grid shape, square or not).

    The map's pixels are the app's (:func:`~vit_demo.viz.previews.overlay_array`: the colours
    span the map's own min..max); the colour bar shows the map's actual values. ``smooth``:
    bilinear upsampling, else one flat square per patch. ``show_input``: the plain picture in a
    panel on the left. ``mark``: a patch to outline (the query patch). ``caption``: a smaller
    line under the picture(s).
    """
    check_cmap(cmap)
    m = as_maps(heat, (2,), "heat")
    rgb = overlay_array(picture, m, cmap, alpha, smooth)
    h, w = rgb.shape[:2]
    aspect = w / h
    panel = 5.0
    ncols = 2 if show_input else 1
    fig = _figure(panel * aspect * ncols + (1.1 if colorbar else 0.3), panel + (0.8 if title else 0.3) + (0.4 if caption else 0))
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    if show_input:
        axes[0].imshow(picture_array(picture), interpolation="bilinear")
        _image_axis(axes[0])
        _panel_title(axes[0], "model input", PANEL_TITLE_SIZE + 1)
    ax = axes[-1]
    _map_panel(ax, rgb)
    if mark is not None:
        _mark_patch(ax, mark, m.shape, (w, h))
    if show_input:
        _panel_title(ax, label, PANEL_TITLE_SIZE + 1)
    if colorbar:
        lo, hi = float(m.min()), float(m.max())
        norm = Normalize(lo, hi if hi > lo else lo + 1e-12, clip=True)
        colour_bar(fig, ax, cmap, norm, label, shrink=0.85, pad=0.02, aspect=25)
    figure_title(fig, title)
    if caption:
        fig.supxlabel(caption, fontsize=LABEL_SIZE - 1, color=MUTED_COLOR)
    return _fit_height(fig)


def _mosaic(tiles: np.ndarray, rows: int, cols: int, gap: int, fill: float | int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Tiles ``[n, th, tw, ...]`` into one array with ``gap``-pixel gaps, and their origins."""
    n, th, tw = tiles.shape[:3]
    out = np.full((rows * (th + gap) - gap, cols * (tw + gap) - gap) + tiles.shape[3:], fill, dtype=tiles.dtype)
    origins = []
    for i in range(n):
        r, c = divmod(i, cols)
        y, x = r * (th + gap), c * (tw + gap)
        out[y : y + th, x : x + tw] = tiles[i]
        origins.append((x, y))
    return out, origins


def heads_figure(
    picture: Picture | None,
    maps: Any,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    title: str | None = None,
    layer: int | None = None,
    mark: int | None = None,
) -> Figure:
    """All heads of one layer (``[H, gh, gw]``), or layers x heads (``[L, H, gh, gw]``), as
    one image with every panel titled "L4 H6" (layer and head as people count them, from 1;
    ``layer`` is the index, from 0).

    Each panel is the app's picture of its map (:func:`~vit_demo.viz.previews.overlay_array`,
    224 px on the longer side, 160 past 36 panels), scaled to its own min..max: the colour bar
    reads low..high. The longer of layers / heads runs across, which suits a slide.
    ``picture`` None shows the maps alone (16 px per patch).
    """
    check_cmap(cmap)
    a = as_maps(maps, (3, 4), "maps")
    whole = a.ndim == 4
    if not whole:
        a = a[None]
    L, H, gh, gw = a.shape
    layer_ids = list(range(L)) if whole else [layer]
    rows, cols, order = _panel_grid(L, H, whole)
    flat = np.stack([a[li, hi] for li, hi in order])
    rgb = overlay_array(picture, flat, cmap, alpha, smooth, None if picture is None else 224 if rows * cols <= 36 else 160)
    th, tw = rgb.shape[1:3]
    panel_in = float(np.clip(11.0 / cols, 1.1, 3.4))  # a tile's width on the page, inches
    fsize = PANEL_TITLE_SIZE + 1 if panel_in >= 2.5 else PANEL_TITLE_SIZE if panel_in >= 1.5 else PANEL_TITLE_SIZE - 2
    px_per_in = tw / panel_in
    label_px = round((fsize * 1.6 / 72) * px_per_in)  # room for a panel title above each tile
    tiles = np.full((len(order), th + label_px, tw, 3), 255, dtype=np.uint8)
    tiles[:, label_px:] = rgb
    mosaic, origins = _mosaic(tiles, rows, cols, max(2, round(0.08 * px_per_in)), 255)
    fig_w = mosaic.shape[1] / px_per_in + 0.1
    fig = _figure(fig_w, mosaic.shape[0] / px_per_in + (0.55 if title else 0.1) + 0.95)
    ax = fig.add_subplot()
    ax.imshow(mosaic, interpolation="bilinear" if smooth else "nearest")
    _image_axis(ax)
    for (li, hi), (x, y) in zip(order, origins):
        name = f"head {hi + 1}" if layer_ids[li] is None else f"L{layer_ids[li] + 1} H{hi + 1}"
        ax.text(x + tw / 2, y + label_px * 0.5, name, ha="center", va="center", fontsize=fsize, color=TEXT_COLOR)
        if mark is not None:
            _mark_panel(ax, mark, (gh, gw), (tw, th), (x, y + label_px))
    colour_bar(fig, ax, cmap, Normalize(0, 1), "attention (each panel scaled to its own min–max)", True,
               orientation="horizontal", shrink=min(0.5, 4.5 / fig_w + 0.15), aspect=30, pad=0.01)
    figure_title(fig, title)
    return _fit_height(fig)


def _panel_grid(L: int, H: int, whole: bool) -> tuple[int, int, list[tuple[int, int]]]:
    """Rows and columns of :func:`heads_figure`'s panels, and each panel's (layer, head), row
    by row: layers x heads, the longer of the two across, or one layer's heads in rows of <= 6."""
    if whole:
        across = L > H  # layers across (columns), heads down (rows)
        rows, cols = (H, L) if across else (L, H)
        order = [(c, r) if across else (r, c) for r in range(rows) for c in range(cols)]
    else:
        cols = H if H <= 6 else math.ceil(H / math.ceil(H / 6))
        rows = math.ceil(H / cols)
        order = [(0, i) for i in range(H)]
    return rows, cols, order


def _mark_panel(ax, index: int, grid: tuple[int, int], size: tuple[int, int], origin: tuple[float, float]) -> None:
    """Outline patch ``index`` in the panel of ``size`` (w, h) whose picture starts at ``origin``."""
    x0, y0, x1, y1 = patch_box(index, grid, size)
    for color, lw in (("black", 2.5), (HIGHLIGHT, 1.3)):
        ax.add_patch(Rectangle((origin[0] + x0, origin[1] + y0), x1 - x0, y1 - y0, fill=False, edgecolor=color, linewidth=lw))


def compare_figure(
    picture: Picture,
    maps: Mapping[str, Any],
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    title: str | None = None,
    show_input: bool = True,
    max_cols: int = 5,
) -> Figure:
    """Several methods side by side for one image: ``{"rollout": map, "chefer": map, ...}``,
    each ``[gh, gw]`` and scaled to its own min..max (the app's pixels,
    :func:`~vit_demo.viz.previews.overlay_array`), after the plain input (``show_input``), a
    colour bar reading low..high under them.
    """
    check_cmap(cmap)
    if not maps:
        raise ValueError("compare_figure needs at least one map")
    pic = picture_array(picture)
    h, w = pic.shape[:2]
    panels: list[tuple[str, np.ndarray | None]] = [("model input", None)] if show_input else []
    panels += [(str(k), as_maps(v, (2,), f"map {k!r}")) for k, v in maps.items()]
    cols = min(len(panels), max_cols)
    rows = math.ceil(len(panels) / cols)
    panel_in = 3.0
    fig = _figure(cols * panel_in * w / h + 0.3, rows * (panel_in + 0.45) + (0.8 if title else 0.2) + 0.7)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        name, m = panels[i]
        if m is None:
            ax.imshow(pic, interpolation="bilinear")
            _image_axis(ax)
        else:
            _map_panel(ax, overlay_array(pic, m, cmap, alpha, smooth))
        _panel_title(ax, name, PANEL_TITLE_SIZE + 1)
    colour_bar(fig, axes, cmap, Normalize(0, 1), "each map scaled to its own min–max", True, orientation="horizontal",
               shrink=min(0.45, 4.0 / (cols * panel_in)), aspect=30, pad=0.02)
    figure_title(fig, title)
    return _fit_height(fig)


def uniform_attention_distance(grid: tuple[int, int], patch_size: int) -> float:
    """Mean distance (pixels) between patch centres when every patch attends uniformly to
    every patch: a reference level for :func:`distance_figure`."""
    gh, gw = grid
    ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    pts = np.stack([ys.ravel(), xs.ravel()], 1).astype(np.float64) * patch_size
    d = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    return float(d.mean())


def distance_figure(
    distances: Any,
    title: str | None = None,
    reference: float | None = None,
) -> Figure:
    """Mean attention distance per head against depth (ViT paper, Fig. 7 right): x = layer,
    y = pixels, one dot per head (coloured by head), the layer mean as a grey line.

    ``distances``: ``[L, H]`` (a leading batch axis is averaged). ``reference``: a dashed
    level labelled "uniform attention": :func:`uniform_attention_distance` for the input's grid.
    """
    a = as_array(distances)
    if a.ndim == 3:
        a = a.mean(axis=0)
    if a.ndim != 2:
        raise ValueError(f"distances must be [L, H] (or [B, L, H]), got shape {tuple(a.shape)}")
    fig = _figure(9.0, 5.6)
    ax = fig.add_subplot()
    _distance_points(ax, a)
    if reference is not None:
        ax.axhline(
            reference,
            color="#444444",
            linestyle="--",
            linewidth=1.2,
            zorder=0,
            label=f"uniform attention ({reference:.0f} px)",
        )
    _distance_axes(ax, a.shape[0], max(float(a.max()), reference or 0.0))
    _side_legend(ax)
    figure_title(fig, title)
    return fig


def _distance_points(ax, a: np.ndarray) -> None:
    """The ``[L, H]`` distances: the mean over heads as a grey line, one dot per head and
    layer coloured by head (each head in the legend when there are at most 16)."""
    L, H = a.shape
    colours = colormaps["tab10" if H <= 10 else "tab20"] if H <= 20 else colormaps["viridis"].resampled(H)
    x = np.arange(L)
    ax.plot(x, a.mean(axis=1), color="#999999", linewidth=1.8, zorder=1, label="mean over heads")
    for h in range(H):
        ax.scatter(
            x,
            a[:, h],
            s=46,
            color=colours(h % colours.N),
            edgecolor="white",
            linewidth=0.6,
            zorder=3,
            label=f"head {h + 1}" if H <= 16 else None,
        )


def _distance_axes(ax, L: int, top: float) -> None:
    """Labels, ticks (layers labelled 1..L, as people count them), limits (pixels 0..``top`` and
    a little room) and a light horizontal grid; no top or right spine."""
    ax.set_xlabel("Network depth (layer)", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    ax.set_ylabel("Mean attention distance (pixels)", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    ax.set_xticks(np.arange(L), [str(i + 1) for i in range(L)])
    ax.set_xlim(-0.6, L - 0.4)
    ax.set_ylim(0, top * 1.08 + 1e-9)
    ax.tick_params(labelsize=TICK_SIZE, colors=TEXT_COLOR)
    ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)


def _side_legend(ax) -> None:
    """The axes' legend right of the plot, frameless, in two columns past 14 entries."""
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
            fontsize=TICK_SIZE,
            ncol=1 if len(labels) <= 14 else 2,
        )


def pos_embed_figure(similarity: Any, title: str | None = None) -> Figure:
    """Cosine similarity of each patch's position embedding with all the others (ViT paper,
    Fig. 7 centre): a gh x gw grid of small gh x gw maps, one shared -1..1 colour scale (viridis).

    ``similarity``: ``[gh*gw, gh, gw]`` (row ``i`` = patch ``i``'s map) or ``[gh, gw, gh, gw]``.
    Rows and columns are labelled from 0, like the patch numbers elsewhere.
    """
    cmap = "viridis"
    a = as_array(similarity)
    if a.ndim == 3:
        gh, gw = a.shape[1:]
        if a.shape[0] != gh * gw:
            raise ValueError(f"similarity [{a.shape[0]}, {gh}, {gw}] should have {gh * gw} maps")
    elif a.ndim == 4:
        gh, gw = a.shape[:2]
        a = a.reshape(gh * gw, *a.shape[2:])
    else:
        raise ValueError(f"similarity must be [gh*gw, gh, gw] or [gh, gw, gh, gw], got {tuple(a.shape)}")
    sh, sw = a.shape[1:]
    k = max(1, 64 // max(sh, sw))  # pixels per cell, so gaps can be thin
    tiles = np.repeat(np.repeat(a, k, axis=1), k, axis=2)
    gap = max(2, round(k * max(sh, sw) * 0.12))
    mosaic, origins = _mosaic(tiles.astype(np.float32), gh, gw, gap, np.nan)
    cm = colormaps[cmap].with_extremes(bad="white")
    fig = _figure(9.4 * max(1.0, gw / gh) ** 0.5, 8.6 * max(1.0, gh / gw) ** 0.5)
    ax = fig.add_subplot()
    ax.imshow(np.ma.masked_invalid(mosaic), cmap=cm, vmin=-1, vmax=1, interpolation="nearest")
    th, tw = sh * k, sw * k
    ax.set_xticks([x + tw / 2 for x, _ in origins[:gw]], [str(c) for c in range(gw)])
    ax.set_yticks([y + th / 2 for _, y in origins[::gw]], [str(r) for r in range(gh)])
    ax.tick_params(length=0, labelsize=TICK_SIZE, colors=TEXT_COLOR)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_xlabel("Input patch column", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    ax.set_ylabel("Input patch row", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    colour_bar(fig, ax, cmap, Normalize(-1, 1), "Cosine similarity", label_size=LABEL_SIZE, shrink=0.8, pad=0.02,
               aspect=30, ticks=[-1, -0.5, 0, 0.5, 1])
    figure_title(fig, title)
    return fig


def topk_figure(
    predictions: Sequence[Mapping[str, Any]] | Mapping[str, float],
    title: str | None = "Top predictions",
) -> Figure:
    """Horizontal bars of the top-k classes, most likely on top (in the accent colour), with
    percentages.

    ``predictions``: ``[{"label", "prob", "index"?}, ...]`` (as :func:`vit_demo.labels.topk`
    returns) or ``{label: prob}``.
    """
    items = (
        [{"label": k, "prob": float(v)} for k, v in predictions.items()]
        if isinstance(predictions, Mapping)
        else [dict(p) for p in predictions]
    )
    if not items:
        raise ValueError("topk_figure needs at least one prediction")
    items.sort(key=lambda p: -p["prob"])
    k = len(items)
    fig = _figure(8.5, 0.55 * k + 1.3 + (0.5 if title else 0))
    ax = fig.add_subplot()
    y = np.arange(k)[::-1]
    colours = [ACCENT] + ["#a9c6e0"] * (k - 1)
    probs = np.array([p["prob"] for p in items]) * 100
    ax.barh(y, probs, color=colours, height=0.68)
    for yi, v in zip(y, probs):
        ax.text(v + 1.2, yi, f"{v:.1f}%", va="center", fontsize=TICK_SIZE + 1, color=TEXT_COLOR)
    names = [p["label"] + (f"  ({p['index']})" if p.get("index") is not None else "") for p in items]
    ax.set_yticks(y, names)
    ax.set_xlim(0, 112)
    ax.set_xticks([0, 25, 50, 75, 100])
    ax.set_xlabel("Probability (%)", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    ax.tick_params(labelsize=TICK_SIZE + 1, colors=TEXT_COLOR)
    ax.tick_params(axis="y", length=0)
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    ax.grid(True, axis="x", color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, fontsize=TITLE_SIZE, color=TEXT_COLOR, fontweight="bold", loc="left", pad=10)
    return fig


STRIP_PATCHES = 16  # a longer sequence's strip shows its first and last patches around "···"


def patch_grid_figure(
    picture: Picture,
    patch_size: int,
    prefix_names: Sequence[str] = ("[class]",),
    highlight: int | None = None,
    title: str | None = None,
) -> Figure:
    """How the picture becomes a sequence (ViT paper, Fig. 1): the picture cut into
    ``patch_size`` patches, numbered row-major, and below it the token sequence the
    transformer reads: the prefix tokens (``prefix_names``, e.g. ``TokenLayout.names()``),
    then the patches left-to-right, top-to-bottom, each with its position in the sequence.
    Sequences of more than :data:`STRIP_PATCHES` patches show the first and last few around "···".
    """
    pic = picture_array(picture)
    p = int(patch_size)
    gh, gw = pic.shape[0] // p, pic.shape[1] // p
    if gh < 1 or gw < 1:
        raise ValueError(f"a {pic.shape[1]}x{pic.shape[0]} picture holds no {p}-px patch")
    n = gh * gw
    pic = pic[: gh * p, : gw * p]
    prefix = list(prefix_names)
    if highlight is not None:
        patch_box(highlight, (gh, gw), (gw, gh))  # range check
    tail = STRIP_PATCHES // 4
    slots = sequence_slots(prefix, n, STRIP_PATCHES - tail, tail)
    fig, ax, ax_s, pic_w = _patch_grid_axes(pic.shape[:2], len(slots))
    _draw_patch_grid(ax, pic, p, highlight)
    _number_patches(ax, (gh, gw), p, pic_w * 72 / gw)
    _image_axis(ax)
    fig.suptitle(
        title or f"{p}x{p}-pixel patches: a {gh}x{gw} grid = {n} patches",
        y=1 - 0.12 / fig.get_figheight(),
        va="top",
        fontsize=TITLE_SIZE,
        color=TEXT_COLOR,
        fontweight="bold",
    )
    _sequence_strip(ax_s, pic, p, slots, highlight)
    _strip_caption(ax_s, prefix, n, len(slots))
    return fig


def _patch_grid_axes(size: tuple[int, int], slots: int) -> tuple[Figure, Any, Any, float]:
    """A fixed layout (inches) for a picture of ``size`` (h, w): title, picture, gap and a strip
    of ``slots`` tokens. Returns the figure, the picture's axes, the strip's axes and the
    picture's width in inches."""
    h, w = size
    fig_w = 12.0
    pic_w = min(6.4 * w / h, fig_w - 1.0)
    pic_h = pic_w * h / w
    top, gap = 0.6, 0.3
    strip_w = fig_w - 1.0
    strip_h = strip_w * 2.9 / (slots * 1.22 + 0.3)
    fig_h = top + pic_h + gap + strip_h + 0.15
    fig = Figure(figsize=(fig_w, fig_h), facecolor="white")
    ax = fig.add_axes(((fig_w - pic_w) / 2 / fig_w, (fig_h - top - pic_h) / fig_h, pic_w / fig_w, pic_h / fig_h))
    ax_s = fig.add_axes((0.75 / fig_w, 0.15 / fig_h, strip_w / fig_w, strip_h / fig_h))
    return fig, ax, ax_s, pic_w


def _draw_patch_grid(ax, pic: np.ndarray, p: int, highlight: int | None) -> None:
    """The picture and its grid lines in picture pixel coordinates (crisp as vectors), the
    ``highlight`` patch tinted and outlined."""
    h, w = pic.shape[:2]
    gh, gw = h // p, w // p
    ax.imshow(pic, interpolation="bilinear", extent=(0, w, h, 0))
    ax.vlines(np.arange(1, gw) * p, 0, h, colors="white", linewidth=0.9, alpha=0.75)
    ax.hlines(np.arange(1, gh) * p, 0, w, colors="white", linewidth=0.9, alpha=0.75)
    if highlight is not None:
        r, c = divmod(int(highlight), gw)
        ax.add_patch(Rectangle((c * p, r * p), p, p, facecolor=HIGHLIGHT, alpha=0.3, edgecolor="none"))
        for color, lw in (("black", 4.0), (HIGHLIGHT, 2.2)):
            ax.add_patch(Rectangle((c * p, r * p), p, p, fill=False, edgecolor=color, linewidth=lw))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)


def _number_patches(ax, grid: tuple[int, int], p: int, cell_pt: float) -> None:
    """Each patch's number at its centre, white with a dark rim, sized to a cell of
    ``cell_pt`` points."""
    gh, gw = grid
    n = gh * gw
    digits = len(str(n - 1))
    fsize = float(np.clip(cell_pt * 0.72 / (0.66 * digits + 0.15), 3.0, 11.0))
    for i in range(n):
        r, c = divmod(i, gw)
        ax.text(
            (c + 0.5) * p,
            (r + 0.5) * p,
            str(i),
            ha="center",
            va="center",
            fontsize=fsize,
            color="white",
            fontweight="bold",
            path_effects=_stroke(max(0.8, fsize / 4.5)),
        )


_STEP, _BOX = 1.22, 1.0  # a token slot's pitch and box in the strip's units


def _sequence_strip(ax, pic: np.ndarray, p: int, slots: list[SequenceSlot], highlight: int | None) -> None:
    """The token sequence: prefix boxes, patch thumbnails, patch numbers and positions."""
    fig = ax.get_figure()
    box_pt = ax.get_position().width * fig.get_figwidth() * 72 / (len(slots) * _STEP + 0.3)  # one unit in points
    small = float(np.clip(box_pt * 0.24, 6.0, 9.0))  # numbers under the tokens
    longest = max((len(s.name) for s in slots if s.kind == "prefix"), default=7)
    name_size = float(np.clip(box_pt * 0.86 / (0.56 * longest), 4.5, 9.0))  # one size for every prefix name
    gw = pic.shape[1] // p
    for k, slot in enumerate(slots):
        x0 = k * _STEP
        if slot.kind == "prefix":
            _strip_prefix(ax, x0, slot.name, name_size)
        elif slot.kind == "patch":
            r, c = divmod(slot.patch, gw)
            _strip_patch(ax, x0, pic[r * p : (r + 1) * p, c * p : (c + 1) * p], slot.patch, slot.patch == highlight, small)
        else:
            ax.text(x0 + _BOX / 2, _BOX / 2, "···", ha="center", va="center", fontsize=18, color=MUTED_COLOR, fontweight="bold")
            continue
        ax.text(
            x0 + _BOX / 2,
            _BOX + 0.33,
            str(slot.position),
            ha="center",
            va="center",
            fontsize=small,
            color="white",
            bbox=dict(boxstyle="round,pad=0.25", facecolor="#9b8fb8", edgecolor="none"),
        )


def _strip_prefix(ax, x0: float, name: str, size: float) -> None:
    """A prefix token: a rounded box in the token's colour, its name inside."""
    box = FancyBboxPatch(
        (x0 + 0.04, 0.04),
        _BOX - 0.08,
        _BOX - 0.08,
        facecolor=token_color(name),
        boxstyle="round,pad=0.02,rounding_size=0.12",
        edgecolor="none",
    )
    ax.add_patch(box)
    ax.text(x0 + _BOX / 2, _BOX / 2, name, ha="center", va="center", fontsize=size, color="white", fontweight="bold")


def _strip_patch(ax, x0: float, cut: np.ndarray, index: int, lit: bool, size: float) -> None:
    """A patch: its pixels, framed (cyan when ``lit``), its number above."""
    ax.imshow(cut, extent=(x0, x0 + _BOX, _BOX, 0), interpolation="nearest")
    frame = Rectangle((x0, 0), _BOX, _BOX, fill=False, edgecolor=HIGHLIGHT if lit else "#888888", linewidth=2.4 if lit else 0.6)
    ax.add_patch(frame)
    ax.text(x0 + _BOX / 2, -0.18, str(index), ha="center", va="bottom", fontsize=size, color=TEXT_COLOR)


def _strip_caption(ax, prefix: list[str], n: int, slots: int) -> None:
    """The row labels ("patch", "position") and the caption under the strip; fixes its limits."""
    ax.text(-0.3, -0.18, "patch", ha="right", va="bottom", fontsize=9, color=MUTED_COLOR, style="italic")
    ax.text(-0.3, _BOX + 0.33, "position", ha="right", va="center", fontsize=9, color=MUTED_COLOR, style="italic")
    order = "left to right, top to bottom"
    caption = (
        f"The sequence the transformer reads: {' '.join(prefix)} + {n} patches ({order}) = {len(prefix) + n} tokens"
        if prefix
        else f"The sequence the transformer reads: {n} patches ({order})"
    )
    ax.text(slots * _STEP / 2, 1.9, caption, ha="center", va="center", fontsize=LABEL_SIZE - 1, color=TEXT_COLOR)
    ax.set_xlim(-0.3, slots * _STEP)
    ax.set_ylim(2.15, -0.75)
    ax.set_aspect("equal")
    ax.axis("off")


def input_figure(original: Picture, model_input: Picture, original_title: str, input_title: str, caption: str) -> Figure:
    """The user's picture beside what the model sees (shown pixel for pixel), the preprocessing
    in words under them."""
    fig = Figure(figsize=(10, 5.4), layout="constrained", facecolor="white")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.imshow(picture_array(original))
    ax1.set_title(original_title, fontsize=PANEL_TITLE_SIZE + 1)
    ax2.imshow(picture_array(model_input), interpolation="nearest")
    ax2.set_title(input_title, fontsize=PANEL_TITLE_SIZE + 1)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.supxlabel(caption, fontsize=TICK_SIZE, color=MUTED_COLOR)
    return fig
