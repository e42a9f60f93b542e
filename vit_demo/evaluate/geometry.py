"""Patch-box geometry, in one place for every evaluation on the patch grid (the pointing game,
the survey, the atlas): a box in picture pixels carried into model-input pixels by the eval
transform (resize + center crop), then onto the patch grid as each patch's covered share, the
patches whose centre it holds, or the cells of any coarser grid it touches."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..preprocess import DataConfig, center_box, resized_size


def box_to_input(box: Sequence[float], size: tuple[int, int], dc: DataConfig) -> tuple[float, float, float, float]:
    """A box [x0, y0, x1, y1] in picture pixels -> model-input pixels (resize + center crop)."""
    w, h = size
    rw, rh = resized_size(w, h, dc)
    ch, cw = dc.input_size
    left, top, _, _ = center_box(rw, rh, cw, ch)
    sx, sy = rw / w, rh / h
    x0, y0, x1, y1 = box
    clip = lambda v, hi: min(max(v, 0.0), float(hi))  # noqa: E731
    return clip(x0 * sx - left, cw), clip(y0 * sy - top, ch), clip(x1 * sx - left, cw), clip(y1 * sy - top, ch)


def patch_coverage(box: Sequence[float], grid: tuple[int, int], patch: int) -> Tensor:
    """[gh, gw] share of each patch's area inside ``box`` (model-input pixels)."""
    gh, gw = grid
    x0, y0, x1, y1 = (v / patch for v in box)
    cols, rows = torch.arange(gw, dtype=torch.float64), torch.arange(gh, dtype=torch.float64)
    ox = (torch.minimum(cols + 1, torch.tensor(x1)) - torch.maximum(cols, torch.tensor(x0))).clamp(min=0)
    oy = (torch.minimum(rows + 1, torch.tensor(y1)) - torch.maximum(rows, torch.tensor(y0))).clamp(min=0)
    return oy[:, None] * ox[None, :]


def hit_patches(box: Sequence[float], grid: tuple[int, int], patch: int) -> Tensor:
    """[gh, gw] bool: patches whose centre lies inside ``box`` (at least one: see the module doc)."""
    gh, gw = grid
    x0, y0, x1, y1 = (v / patch for v in box)
    cx, cy = torch.arange(gw) + 0.5, torch.arange(gh) + 0.5
    hits = ((cy >= y0) & (cy <= y1))[:, None] & ((cx >= x0) & (cx <= x1))[None, :]
    if not hits.any():
        i = min(gh - 1, max(0, int((y0 + y1) / 2)))
        j = min(gw - 1, max(0, int((x0 + x1) / 2)))
        hits[i, j] = True
    return hits


def cell_coverage(box: Sequence[float], input_size: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """[h, w] share of each cell of a ``grid`` over the model input inside ``box`` (input pixels)."""
    (H, W), (gh, gw) = input_size, grid
    x0, y0, x1, y1 = box
    sx, sy = gw / W, gh / H
    return patch_coverage((x0 * sx, y0 * sy, x1 * sx, y1 * sy), grid, 1)


def near_edge(row: int, col: int, grid: tuple[int, int]) -> bool:
    """Whether cell (row, col) of a ``grid`` lies in its outer quarter (on any side)."""
    gh, gw = grid
    qh, qw = max(1, gh // 4), max(1, gw // 4)
    return row < qh or row >= gh - qh or col < qw or col >= gw - qw


def peak_place(heat: Sequence[Sequence[float]] | Tensor) -> tuple[int, int, float]:
    """A non-negative map on a grid [h, w] -> (row, col) of its largest cell and the share of its
    mass within one cell of it (the 3x3 around it)."""
    m = torch.as_tensor(heat, dtype=torch.float64).clamp(min=0)
    h, w = m.shape
    r, c = divmod(int(m.flatten().argmax()), w)
    near = m[max(0, r - 1) : r + 2, max(0, c - 1) : c + 2].sum()
    return r, c, float(near / m.sum().clamp(min=1e-300))
