"""The step-through's pictures (:mod:`vit_demo.inside`), one renderer a step, numpy + PIL only: a few
milliseconds each, so that the app draws every step of a click at once. Each takes the step's
numbers (arrays) and a :class:`~vit_demo.viz.strips.Pen` (its scale: 1 for the app, about 960 px
wide; 2 for a slide) and returns an RGB picture. Signed numbers (pixels, weights, vectors) are blue
below 0 and red above, each picture on a scale symmetric about 0; maps over the patch grid use the
colormap given, each on its own range.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

from .arrays import Picture, picture_array
from .previews import overlay_image, patch_grid_image
from .strips import (
    INK,
    MUTED,
    Pen,
    bars_image,
    framed,
    grid_map_image,
    label_image,
    line_chart_image,
    matrix_image,
    stack,
    strip_image,
)

WARN = (192, 57, 43)  # a caption that says the picture is no longer the model's


def titled(img: Image.Image, title: str, pen: Pen, note: str = "") -> Image.Image:
    """``img`` under a bold title (and a muted note under it)."""
    parts = [label_image(title, pen, 14, bold=True, width=img.width), img]
    return stack(parts + ([label_image(note, pen, 12, colour=MUTED, width=img.width)] if note else []), gap=pen(4))


def robust_limit(m: np.ndarray) -> float:
    """The colour scale's end for a large matrix: its 99th percentile of |value| (a few large numbers
    would wash out all the others; beyond it the colour saturates)."""
    return float(np.percentile(np.abs(m), 99)) or 1.0


def cell_size(grid: tuple[int, int], pen: Pen, room: int = 448) -> int:
    return max(4, min(pen(56), pen(room) // max(grid)))


GRID_SIDE = 440  # px at scale 1: the height of the patch grid in the patches step's picture


def patches_grid_size(grid: tuple[int, int], scale: float = 1.0) -> tuple[int, int]:
    """(width, height) of the patch grid at the top left of :func:`patches_step_image`'s picture for a
    ``grid`` of (rows, columns) patches: a click there picks a patch (:func:`~.arrays.patch_index_at`)."""
    side = Pen(scale)(GRID_SIDE)
    return round(grid[1] * side / grid[0]), side


def patches_step_image(picture: Picture, patch_size: int, index: int, pen: Pen, window: int = 0,
                       caption: str = "") -> Image.Image:
    """The picture cut into its patches, the chosen one lit; beside it the patch alone, enlarged."""
    pic = picture_array(picture)
    p = patch_size
    gw = pic.shape[1] // p
    grid = patch_grid_image(pic, p, numbers=False, highlight=index, window=window)
    grid = grid.resize(patches_grid_size((pic.shape[0] // p, gw), pen.scale), Image.Resampling.BICUBIC)
    r, c = divmod(index, gw)
    crop = Image.fromarray(pic[r * p:(r + 1) * p, c * p:(c + 1) * p]).resize((pen(200), pen(200)), Image.Resampling.NEAREST)
    right = titled(framed(crop, width=pen(2)), f"patch ({r}, {c})", pen, caption)
    return stack([grid, right], gap=pen(40), horizontal=True)


def pixels_step_image(crop: Picture, pixels: np.ndarray, vector: np.ndarray, pen: Pen, channel_first: bool = True
                      ) -> Image.Image:
    """The patch's pixels enlarged, its three normalised channels as signed maps, and the vector
    the projection reads as one strip (channel by channel when ``channel_first``)."""
    side = pen(170)
    pic = Image.fromarray(picture_array(crop)).resize((side, side), Image.Resampling.NEAREST)
    limit = float(np.abs(pixels).max()) or 1.0
    maps = [titled(framed(matrix_image(pixels[i], (side, side), limit)), name, pen)
            for i, name in enumerate(("red", "green", "blue"))]
    top = stack([titled(framed(pic), "the pixels", pen), *maps], gap=pen(18), horizontal=True)
    width = top.width
    strip = framed(strip_image(vector, (width, pen(34)), limit))
    note = (f"{vector.size} numbers: red, then green, then blue, each row by row" if channel_first
            else f"{vector.size} numbers: pixel by pixel, row by row, red-green-blue together")
    bottom = titled(strip, "patch_vector", pen, note + f"  ·  blue < 0 < red, |value| up to {limit:.2f}")
    return stack([top, bottom], gap=pen(16))


def projection_step_image(weight: np.ndarray, vector: np.ndarray, bias: np.ndarray, embedding: np.ndarray, pen: Pen
                          ) -> Image.Image:
    """W . v + b = e: the vector across the top, the weight matrix under it (one row a channel of the
    token), the bias and the embedding as columns beside it, row for row."""
    C, K = weight.shape
    mw, mh = pen(600), pen(300)
    v = titled(framed(strip_image(vector, (mw, pen(24)))), f"patch_vector ({K})", pen)
    w = titled(framed(matrix_image(weight, (mw, mh), robust_limit(weight))), f"W ({C} x {K}): each row a channel of the "
               "token", pen)
    col = pen(34)
    b = titled(framed(strip_image(bias, (col, mh), vertical=True)), "b", pen)
    e = titled(framed(strip_image(embedding, (col, mh), vertical=True)), f"embedding ({C})", pen)
    sign = lambda s: label_image(s, pen, 26, bold=True)  # noqa: E731
    body = stack([w, sign("+"), b, sign("="), e], gap=pen(12), horizontal=True)
    return stack([stack([v, Image.new("RGB", (body.width - v.width, 1), "white")], gap=0, horizontal=True), body],
                 gap=pen(6))


def position_step_image(embedding: np.ndarray, position: np.ndarray | None, token: np.ndarray,
                        similarity: np.ndarray | None, index: int, pen: Pen, cmap: str = "viridis",
                        similarity_title: str = "cosine similarity of the positions") -> Image.Image:
    """embedding + position = token as three strips (the same scale), and the similarity map of this
    patch's position code with every patch's (the chosen patch outlined)."""
    width = pen(420)
    limit = float(max(np.abs(embedding).max(), np.abs(token).max(), 1e-9))
    rows = [titled(framed(strip_image(embedding, (width, pen(30)), limit)), "embedding", pen)]
    if position is not None:
        rows += [label_image("+", pen, 22, bold=True),
                 titled(framed(strip_image(position, (width, pen(30)), limit)), "position", pen),
                 label_image("=", pen, 22, bold=True)]
    else:
        rows += [label_image("nothing added", pen, 14, colour=MUTED)]
    rows.append(titled(framed(strip_image(token, (width, pen(30)), limit)), "token", pen))
    left = stack(rows, gap=pen(4))
    if similarity is None:
        return left
    right = titled(grid_map_image(similarity, cell_size(similarity.shape, pen, 400), cmap, index, numbers=False,
                                  pen=pen), similarity_title, pen, "bright: alike, dark: unlike")
    return stack([left, right], gap=pen(40), horizontal=True)


def qkv_step_image(normed: np.ndarray, query: np.ndarray, keys: np.ndarray, values: np.ndarray, query_row: int,
                   pen: Pen, query_unturned: np.ndarray | None = None) -> Image.Image:
    """The normed token and its query as strips; every key and every value as a matrix, one row a
    token, the query's own token marked."""
    q = query.reshape(-1)
    top = [titled(framed(strip_image(normed, (pen(420), pen(26)))), f"x, normed ({normed.size})", pen),
           label_image("->", pen, 20, bold=True)]
    if query_unturned is not None:
        top += [titled(framed(strip_image(query_unturned.reshape(-1), (pen(200), pen(26)))), "q before RoPE", pen),
                label_image("turned", pen, 13, colour=MUTED)]
    top.append(titled(framed(strip_image(q, (pen(220), pen(26)))), f"q ({q.size})", pen))
    k2, v2 = flat_keys(keys), values.reshape(values.shape[0], -1)
    size = (pen(380), pen(260))
    kimg, vimg = framed(matrix_image(k2, size, robust_limit(k2))), framed(matrix_image(v2, size, robust_limit(v2)))
    for img, m in ((kimg, k2), (vimg, v2)):
        if query_row >= 0:
            y = round((query_row + 0.5) * img.height / m.shape[0])
            ImageDraw.Draw(img).line((0, y, img.width, y), fill=(0, 229, 255), width=pen(2))
    mats = stack([titled(kimg, f"keys: {k2.shape[0]} tokens x {k2.shape[1]}", pen, "cyan: the query's own token"),
                  titled(vimg, f"values: {v2.shape[0]} tokens x {v2.shape[1]}", pen)], gap=pen(30), horizontal=True)
    return stack([stack(top, gap=pen(10), horizontal=True), mats], gap=pen(16))


def flat_keys(keys: np.ndarray) -> np.ndarray:
    """Keys [M, D], or a differential attention's [2, M, d] as [M, 2d] (the two halves side by side)."""
    return np.concatenate(list(keys), axis=-1) if keys.ndim == 3 else keys


def prefix_list(names: Sequence[str], numbers: Sequence[float], pen: Pen, fmt: str = "{:.2f}") -> Image.Image | None:
    """The prefix tokens' numbers, one a line ("[class]  3.21"), or None without prefix tokens."""
    if not names:
        return None
    return stack([label_image(f"{n}  {fmt.format(x)}", pen, 14) for n, x in zip(names, numbers)], gap=pen(2))


def scores_step_image(grid_scores: np.ndarray, index: int, pen: Pen, prefix: Sequence[str] = (),
                      prefix_scores: Sequence[float] = (), parts: Sequence[tuple[str, np.ndarray]] = (),
                      cmap: str = "inferno") -> Image.Image:
    """The query's score for every patch key as a map with its numbers (grey: keys it does not
    meet), the prefix tokens' scores beside it, and ``parts`` (title, map): the sums it is made of
    (q . k and a bias) or a second map (differential attention), smaller."""
    main = titled(grid_map_image(grid_scores, cell_size(grid_scores.shape, pen), cmap, index, pen=pen),
                  "score of every patch key", pen, "bright: high score; cyan: the query's own patch")
    side = [p for p in (prefix_list(prefix, prefix_scores, pen),) if p is not None]
    for title, m in parts:
        side.append(titled(grid_map_image(m, cell_size(m.shape, pen, 200), cmap, index, numbers=False, pen=pen), title,
                           pen))
    return stack([main, stack(side, gap=pen(12))], gap=pen(30), horizontal=True) if side else main


def attention_step_image(picture: Picture, grid_attention: np.ndarray, index: int, pen: Pen,
                         top: Sequence[tuple[str, float]], temperature: float = 1.0, cmap: str = "inferno",
                         vmax: float | None = None) -> Image.Image:
    """The attention row over the picture (the query patch outlined) and the tokens it weights most
    as bars; at a temperature other than 1, a red caption says these are not the model's weights.
    ``vmax``: the colour scale's top (from 0), e.g. the model's own row's largest weight, so that
    another temperature shows as a spread or a sharpening (default: the row's own range)."""
    shown = np.nan_to_num(grid_attention, nan=0.0)
    lo = None if vmax is None else 0.0
    over = overlay_image(picture, shown, cmap, 0.6, smooth=False, size=pen(420), vmin=lo, vmax=vmax, mark=index)
    note = ("the model's own attention (T = 1)" if temperature == 1.0
            else f"T = {temperature:g}: NOT the model's attention")
    left = stack([over, label_image(note, pen, 14, bold=temperature != 1.0,
                                    colour=INK if temperature == 1.0 else WARN, width=over.width)], gap=pen(4))
    bars = bars_image([n for n, _ in top], [max(0.0, a) for _, a in top], pen(420), pen,
                      [f"{a * 100:.1f}%" for _, a in top], highlight=0)
    return stack([left, titled(bars, "the most weighted tokens", pen)], gap=pen(30), horizontal=True)


def weighted_sum_step_image(weights: Sequence[float], rows: Sequence[np.ndarray], names: Sequence[str],
                            output: np.ndarray, rest: int, pen: Pen) -> Image.Image:
    """o = sum a_i v_i: the largest terms a_i v_i as strips (one scale for all), the rest counted,
    and their sum, the head's output."""
    width = pen(560)
    limit = float(max([np.abs(output).max()] + [np.abs(a * r).max() for a, r in zip(weights, rows)]) or 1.0)
    lines = []
    for a, r, n in zip(weights, rows, names):
        lab = label_image(f"{a * 100:5.1f}% x v[{n}]", pen, 13, width=pen(250))
        lines.append(stack([lab, framed(strip_image(a * r, (width, pen(22)), limit))], gap=pen(8), horizontal=True))
    if rest:
        lines.append(label_image(f"+ {rest} smaller terms", pen, 13, colour=MUTED))
    total = stack([label_image("= o, the head's output", pen, 13, bold=True, width=pen(250)),
                   framed(strip_image(output, (width, pen(30)), limit), width=pen(2))], gap=pen(8), horizontal=True)
    return stack(lines + [total], gap=pen(6))


def mlp_step_image(hidden: np.ndarray, pen: Pen) -> Image.Image:
    """The MLP's hidden activations as one strip, and how they spread (a histogram of the values)."""
    h = np.asarray(hidden, dtype=np.float32).reshape(-1)
    width = pen(900)
    strip = titled(framed(strip_image(h, (width, pen(40)))), f"{h.size} hidden activations, in order", pen,
                   f"{(h > 0).mean() * 100:.0f}% above 0  ·  largest {h.max():.2f}, smallest {h.min():.2f}")
    counts, edges = np.histogram(h, bins=40)
    img = Image.new("RGB", (width, pen(200)), "white")
    draw = ImageDraw.Draw(img)
    top, bar = max(1, counts.max()), width / len(counts)
    for i, n in enumerate(counts):
        y = pen(180) * (1 - np.sqrt(n / top))
        colour = (214, 96, 77) if edges[i] >= 0 else (67, 147, 195)
        draw.rectangle((i * bar + 1, y, (i + 1) * bar - 1, pen(180)), fill=colour)
    font = pen.font(12)
    for x, v in ((0, edges[0]), (width, edges[-1])):
        draw.text((x, pen(192)), f"{v:.2f}", font=font, fill=MUTED, anchor="lm" if x == 0 else "rm")
    return stack([strip, titled(img, "how many activations have each value (square-root scale)", pen)], gap=pen(14))


def residual_step_image(norms: Sequence[float], layer: int, pen: Pen) -> Image.Image:
    """The token's residual stream length after the embedding and after every block (``layer``: the
    block the walk looks into, ringed)."""
    labels = ["emb"] + [str(i + 1) for i in range(len(norms) - 1)]
    chart = line_chart_image(norms, (pen(900), pen(300)), pen, labels, highlight=layer + 1, ylabel="|x|")
    return titled(chart, "length of the token's residual stream, after the embedding and after each layer", pen)


def lens_step_image(probs: Sequence[float], tops: Sequence[str], label: str, pen: Pen) -> Image.Image:
    """The final class's probability read after every layer, each layer's top class under it."""
    labels = [str(i + 1) for i in range(len(probs))]
    chart = line_chart_image(probs, (pen(900), pen(400)), pen, labels, highlight=len(probs) - 1,
                             ylabel=f"p('{label[:30]}')", ymax=1.0, notes=tops)
    return titled(chart, "probability of the final answer after each layer; under each: that layer's top class", pen)


def logits_step_image(labels: Sequence[str], probs: Sequence[float], logits: Sequence[float], pen: Pen) -> Image.Image:
    """The top classes: probability bars, each with its probability and logit."""
    bars = bars_image(list(labels), list(probs), pen(900), pen,
                      [f"{p * 100:.1f}%  (logit {z:.2f})" for p, z in zip(probs, logits)])
    return titled(bars, "the top classes: softmax(logits)", pen)


def readout_step_image(picture: Picture, grid: np.ndarray, pen: Pen, prefix: Sequence[str] = (),
                       prefix_weights: Sequence[float] = (), cmap: str = "inferno", title: str = "") -> Image.Image:
    """How much each patch weighs in what the classifier reads, over the picture; the prefix tokens'
    weights beside it."""
    over = titled(overlay_image(picture, grid, cmap, 0.6, smooth=False, size=pen(420)), title, pen)
    side = prefix_list(prefix, [w * 100 for w in prefix_weights], pen, "{:.1f}%")
    return stack([over, side], gap=pen(30), horizontal=True) if side is not None else over
