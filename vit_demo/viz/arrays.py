"""Maps and pictures as arrays: conversion, min-max scaling, resampling, blending, and the
patch geometry (which patch sits where in a picture). Shared by previews and figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Union

import numpy as np
from PIL import Image

Picture = Union[Image.Image, np.ndarray]  # noqa: UP007 - a runtime alias


def as_array(value: Any) -> np.ndarray:
    """``value`` (numpy array, torch tensor on any device, nested lists) as a float32 numpy array."""
    if hasattr(value, "detach"):  # torch tensor, without importing torch here
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def as_maps(value: Any, ndims: Sequence[int], what: str) -> np.ndarray:
    """``value`` as an array with one of ``ndims`` dimensions, dropping leading size-1 axes."""
    a = as_array(value)
    while a.ndim > max(ndims) and a.shape[0] == 1:
        a = a[0]
    if a.ndim not in ndims:
        want = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{what} must be {want}, got shape {tuple(a.shape)}")
    if a.shape[-1] < 1 or a.shape[-2] < 1:
        raise ValueError(f"{what} is empty: shape {tuple(a.shape)}")
    return np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)


def picture_array(picture: Picture) -> np.ndarray:
    """A picture as uint8 RGB ``[h, w, 3]`` (PIL image, uint8 array, or float array in 0..1)."""
    if isinstance(picture, Image.Image):
        return np.asarray(picture.convert("RGB"))
    a = np.asarray(picture)
    if a.dtype.kind == "f":
        a = (np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)
    elif a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=-1)
    if a.ndim != 3 or a.shape[-1] not in (3, 4):
        raise ValueError(f"picture must be [h, w, 3], got shape {a.shape}")
    return a[..., :3]


def normalize(maps: Any, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """Scale each ``[gh, gw]`` map (the last two axes) to 0..1 by its own min..max.

    ``vmin`` / ``vmax`` fix the range instead (values outside are clipped). A constant map
    becomes all zeros.
    """
    a = as_array(maps)
    lo = a.min(axis=(-2, -1), keepdims=True) if vmin is None else np.float32(vmin)
    hi = a.max(axis=(-2, -1), keepdims=True) if vmax is None else np.float32(vmax)
    span = np.asarray(hi - lo, dtype=np.float32)
    out = (a - lo) / np.where(span > 0, span, 1)
    return np.clip(np.where(span > 0, out, 0), 0, 1).astype(np.float32)


@lru_cache(maxsize=64)
def _resize_matrix(n_in: int, n_out: int, smooth: bool) -> np.ndarray:
    """``[n_out, n_in]`` weights resampling one axis: bilinear with pixel centres aligned (as
    PIL and ``torch.nn.functional.interpolate(align_corners=False)``), or nearest."""
    m = np.zeros((n_out, n_in), dtype=np.float32)
    rows = np.arange(n_out)
    if not smooth:
        m[rows, np.clip(((rows + 0.5) * n_in / n_out).astype(int), 0, n_in - 1)] = 1
    else:
        c = np.clip((rows + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(c).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        w = (c - lo).astype(np.float32)
        np.add.at(m, (rows, lo), 1 - w)
        np.add.at(m, (rows, hi), w)
    m.setflags(write=False)
    return m


def upsample(maps: Any, size: tuple[int, int], smooth: bool = True) -> np.ndarray:
    """Resample ``[..., gh, gw]`` maps to ``[..., h, w]`` (``size`` is ``(h, w)``): bilinear
    when ``smooth``, else nearest (blocky: one flat square per patch)."""
    a = as_array(maps)
    ry = _resize_matrix(a.shape[-2], int(size[0]), bool(smooth))
    rx = _resize_matrix(a.shape[-1], int(size[1]), bool(smooth))
    return ry @ a @ rx.T


def blend(picture: np.ndarray | None, colours: np.ndarray, alpha: float) -> np.ndarray:
    """``(1 - alpha) * picture + alpha * colours`` in uint8 (the picture broadcasts)."""
    if picture is None:
        return colours
    alpha = float(np.clip(alpha, 0, 1))
    out = colours.astype(np.float32)  # in place from here: the same sums, 4x faster than temporaries
    out *= alpha
    out += picture.astype(np.float32) * (1 - alpha)
    out += 0.5
    return out.astype(np.uint8)


def target_size(w: int, h: int, size: int | tuple[int, int] | None) -> tuple[int, int]:
    """Output ``(width, height)``: as is, the longer side = ``size``, or exactly ``size``."""
    if size is None:
        return w, h
    if isinstance(size, (int, np.integer)):
        s = int(size) / max(w, h)
        return max(1, round(w * s)), max(1, round(h * s))
    return int(size[0]), int(size[1])


def resized_picture(picture: Picture, size: tuple[int, int]) -> np.ndarray:
    """uint8 RGB ``[h, w, 3]`` of the picture at ``size`` (width, height), bicubic."""
    img = picture if isinstance(picture, Image.Image) else Image.fromarray(picture_array(picture))
    img = img.convert("RGB")
    if img.size != tuple(size):
        img = img.resize(tuple(size), Image.Resampling.BICUBIC)
    return np.asarray(img)


def patch_index_at(x: float, y: float, size: tuple[int, int], grid: tuple[int, int]) -> int:
    """The row-major patch index under pixel ``(x, y)`` of a picture of ``size`` (width,
    height) showing a ``grid`` of ``(gh, gw)`` patches (e.g. a click on a rendered image)."""
    gh, gw = grid
    col = min(gw - 1, max(0, int(x * gw / size[0])))
    row = min(gh - 1, max(0, int(y * gh / size[1])))
    return row * gw + col


def patch_box(index: int, grid: tuple[int, int], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """Pixel box (x0, y0, x1, y1) of patch ``index`` in a picture of ``size`` (w, h)."""
    gh, gw = grid
    if not 0 <= index < gh * gw:
        raise ValueError(f"patch {index} is outside the {gh}x{gw} grid (0..{gh * gw - 1})")
    r, c = divmod(int(index), gw)
    cw, ch = size[0] / gw, size[1] / gh
    return c * cw, r * ch, (c + 1) * cw, (r + 1) * ch
