"""Each step's picture: a walk's numbers handed to its renderer in :mod:`vit_demo.viz.steps` (a step the
model does not have: a card saying what it does instead). ``draw_step(walk, name)`` is
:meth:`~.walk.Walk.render`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from ..viz import steps as S
from ..viz.strips import Pen, card_image


def on_grid(row: np.ndarray, keys: np.ndarray, facts: Any) -> tuple[np.ndarray, list[tuple[str, float]]]:
    """A row over the keys [M] as a patch map [gh, gw] (NaN where the query meets no key) and the
    prefix tokens' (name, value)."""
    P = len(facts.prefix)
    grid = np.full(facts.n_patches, np.nan, dtype=np.float32)
    patches = keys >= P
    grid[keys[patches] - P] = row[patches]
    prefix = [(facts.token_name(int(k)), float(x)) for k, x in zip(keys, row) if 0 <= k < P]
    return grid.reshape(facts.grid), prefix


def crop(walk: Any) -> np.ndarray:
    f, p = walk.facts, walk.facts.patch_size
    return walk.picture[f.row * p:(f.row + 1) * p, f.col * p:(f.col + 1) * p]


def patch_index(walk: Any) -> int:
    return walk.facts.row * walk.facts.grid[1] + walk.facts.col


def draw_patches(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    f = walk.facts
    n = f.n_patches + len(f.prefix)
    return S.patches_step_image(walk.picture, f.patch_size, patch_index(walk), pen, f.window,
                                f"token {f.token} of {n}")


def draw_pixels(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v = walk.values
    if walk.facts.embed == "stem":  # the stem's channels are no pixels: the picture shows the pixels' own numbers
        return S.pixels_step_image(crop(walk), v["pixels"], v["pixels"].reshape(-1), pen)
    return S.pixels_step_image(crop(walk), v["pixels"], v["patch_vector"], pen, walk.facts.embed != "linear")


def draw_projection(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v = walk.values
    return S.projection_step_image(v["projection_weight"], v["patch_vector"], v["projection_bias"], v["embedding"], pen)


def draw_position(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v = walk.values
    title = ("cosine similarity of the positions" if "position" in v else
             f"alike rotations (RoPE, {walk.facts.where})")
    return S.position_step_image(v["embedding"], v.get("position"), v["token"], v.get("position_similarity"),
                                 patch_index(walk), pen, "viridis", title)


def draw_qkv(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    own = np.flatnonzero(v["key_tokens"] == f.token)
    return S.qkv_step_image(v["normed"], v["query"], v["keys"], v["values"], int(own[0]) if own.size else -1, pen,
                            v.get("query_unturned"))


def draw_scores(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    keys, s = v["key_tokens"], np.asarray(v["scores"])
    parts = []
    if s.ndim == 2:  # differential attention: one map per half
        parts = [("scores of the second map", on_grid(s[1], keys, f)[0])]
        s = s[0]
    elif "bias" in v:
        parts = [("q . k / sqrt(D)", on_grid(s - v["bias"], keys, f)[0]), ("+ relative bias", on_grid(v["bias"], keys, f)[0])]
    grid, prefix = on_grid(s, keys, f)
    return S.scores_step_image(grid, patch_index(walk), pen, [n for n, _ in prefix], [x for _, x in prefix], parts, cmap)


def draw_softmax(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    a, keys = np.asarray(v["attention"]), v["key_tokens"]
    grid, _ = on_grid(a, keys, f)
    top = [(f.token_name(int(keys[i])), float(a[i])) for i in np.argsort(-a)[:6]]
    own = on_grid(np.asarray(walk.own.get("attention", a)), keys, f)[0]  # one scale at every temperature: the model's
    vmax = float(np.nanmax(own)) if np.isfinite(own).any() and np.nanmax(own) > 0 else None
    return S.attention_step_image(walk.picture, grid, patch_index(walk), pen, top, f.temperature, cmap, vmax)


def draw_weighted_sum(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    a, keys = np.asarray(v["attention"]), v["key_tokens"]
    top = np.argsort(-np.abs(a))[:6]
    return S.weighted_sum_step_image([float(a[i]) for i in top], [v["values"][i] for i in top],
                                     [f.token_name(int(keys[i])) for i in top], v["head_output"], max(0, a.size - 6), pen)


def draw_mlp(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    return S.mlp_step_image(walk.values["mlp_hidden"], pen)


def draw_residual(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    return S.residual_step_image(walk.values["residual_norms"], walk.facts.layer, pen)


def draw_readout(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    r, P = np.asarray(v["readout"]), len(f.prefix)
    title = {"token": "where [class] gathered from, last layer", "map": "what the attention pool reads"}.get(
        f.readout, "each patch's weight in the pooled readout")
    return S.readout_step_image(walk.picture, r[P:].reshape(f.grid), pen, f.prefix, r[:P], cmap, title)


def draw_lens(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    lens = np.asarray(v["lens"], dtype=np.float64)
    final = int(np.argmax(v["logits"]))
    p = np.exp(lens - lens.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return S.lens_step_image(p[:, final], [f.labels[int(i)] for i in lens.argmax(-1)], f.labels[final], pen)


def draw_logits(walk: Any, pen: Pen, cmap: str) -> Image.Image:
    v, f = walk.values, walk.facts
    p = np.asarray(v["probabilities"])
    top = np.argsort(-p)[:5]
    return S.logits_step_image([f.labels[int(i)] for i in top], [float(p[i]) for i in top],
                               [float(v["logits"][i]) for i in top], pen)


DRAW: dict[str, Callable[[Any, Pen, str], Image.Image]] = {
    "patches": draw_patches, "pixels": draw_pixels, "projection": draw_projection, "position": draw_position,
    "qkv": draw_qkv, "scores": draw_scores, "softmax": draw_softmax, "weighted_sum": draw_weighted_sum,
    "mlp": draw_mlp, "residual": draw_residual, "readout": draw_readout, "lens": draw_lens, "logits": draw_logits}


def draw_step(walk: Any, name: str, scale: float = 1.0, cmap: str = "inferno") -> Image.Image:
    """Step ``name``'s picture of ``walk`` at ``scale`` (1: about 960 px wide), maps in ``cmap``."""
    step, pen = walk.step(name), Pen(scale)
    if not step.exists:
        return card_image(step.title, step.text, pen(900), pen)
    return DRAW[name](walk, pen, cmap)
