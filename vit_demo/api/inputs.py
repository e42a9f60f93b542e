"""What the Python API takes as an image: a path, a PIL image, a numpy array or a tensor, or a list
of them (a batch). Every picture is read by :func:`vit_demo.images.load_image`, the reader the
command line and the app use (EXIF rotation, greyscale, 16-bit, transparency, size limits), so
that a picture gives the same input tensor here as in ``python -m vit_demo predict``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from PIL import Image

from ..images import ImageError, load_image

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor, bytes]  # noqa: UP007 - a runtime alias
Images = Union[ImageLike, list, tuple]  # noqa: UP007

KINDS = "a path, a PIL image, a numpy array (HxW or HxWx3, uint8 or float in 0..1) or a tensor ([3,H,W] or [B,3,H,W])"


def read_images(image: Any) -> tuple[list[tuple[str, Image.Image]], bool]:
    """``image`` as ``[(name, RGB picture), ...]`` and whether it was ONE image (not a list or a
    batch tensor). ``name``: a file's name, else ``image 1``, ``image 2``... Raises
    :class:`~vit_demo.images.ImageError` (one line, naming the image) for what cannot be read,
    TypeError for what is not an image at all."""
    if isinstance(image, (list, tuple)):
        if not image:
            raise ValueError("an empty list of images: give at least one")
        items, single = list(image), False
    elif isinstance(image, (torch.Tensor, np.ndarray)) and image.ndim == 4:
        items, single = list(image), False
    else:
        items, single = [image], True
    out = []
    for i, item in enumerate(items):
        name = Path(item).name if isinstance(item, (str, os.PathLike)) else f"image {i + 1}"
        out.append((name, read_one(item, name)))
    return out, single


def read_one(item: Any, name: str) -> Image.Image:
    """One picture as 8-bit RGB; ImageError in one line when it cannot be read."""
    if isinstance(item, torch.Tensor):
        item = tensor_pixels(item, name)
    elif isinstance(item, np.ndarray):
        item = array_pixels(item, name)
    elif not isinstance(item, (str, os.PathLike, Image.Image, bytes)):
        raise TypeError(f"{name}: {type(item).__name__} is not an image; give {KINDS}, or a list of them")
    try:
        return load_image(item)
    except ImageError as e:
        msg = str(e).split("\n")[0]
        raise ImageError(msg if msg.startswith(name) or not isinstance(item, (str, os.PathLike)) else f"{name}: {msg}"
                         ) from None


def array_pixels(a: np.ndarray, name: str) -> np.ndarray:
    """A numpy picture as HxW or HxWxC (a CxHxW array is turned round); floats must lie in 0..1."""
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        raise ImageError(f"{name}: an array of shape {a.shape} is not a picture; give HxW, HxWx3 or 3xHxW")
    if a.dtype.kind == "f":
        lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
        if lo < -1e-3 or hi > 1 + 1e-3:
            raise ImageError(f"{name}: float pixels must lie in 0..1 (these span {lo:.2f}..{hi:.2f}; normalised "
                             f"already?); give the picture itself, or uint8 values 0..255")
        return np.nan_to_num(a).astype(np.float32)
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * 255
    if a.dtype != np.uint8:
        if a.min() < 0 or a.max() > 255:
            raise ImageError(f"{name}: integer pixels must lie in 0..255 (these span {a.min()}..{a.max()})")
        return a.astype(np.uint8)
    return a


def tensor_pixels(t: torch.Tensor, name: str) -> np.ndarray:
    """A tensor picture ([3,H,W] or [H,W], as torchvision's ToTensor gives it) as a numpy one."""
    a = t.detach().cpu()
    a = (a.float() if a.dtype in (torch.float16, torch.bfloat16) else a).numpy()
    if a.ndim == 3 and a.shape[0] in (1, 3):
        a = np.moveaxis(a, 0, -1)
    return array_pixels(a, name)
