"""The model's evaluation transform, as timm resolves it from a pretrained config.

resize (shorter side to floor(size / crop_pct), the configured interpolation) -> center crop
-> [0, 1] tensor -> normalise with the model's mean and std. Tested to give the same tensor
as ``timm.data.create_transform(**resolve_data_config(...))``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from .images import ImageError, load_image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_INTERP = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class DataConfig:
    """How an image becomes the model's input."""

    input_size: tuple[int, int] = (224, 224)  # (H, W) fed to the model
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    crop_mode: str = "center"  # "center" (keep aspect, crop) or "squash" (stretch, crop)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_size", tuple(int(s) for s in self.input_size))
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if self.interpolation not in _INTERP:
            raise ValueError(f"unsupported interpolation {self.interpolation!r}; one of {sorted(_INTERP)}")
        if self.crop_mode not in ("center", "squash"):
            raise ValueError(f"unsupported crop_mode {self.crop_mode!r}; 'center' or 'squash'")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")

    @property
    def scale_size(self) -> tuple[int, int]:
        return tuple(math.floor(s / self.crop_pct) for s in self.input_size)

    def with_size(self, size: tuple[int, int]) -> DataConfig:
        return replace(self, input_size=tuple(size))

    def describe(self) -> str:
        """The transform in words, for people."""
        h, w = self.input_size
        sh, sw = self.scale_size
        if self.crop_mode == "squash":
            resize = f"stretch to {sw}x{sh} px"
        elif sh == sw:
            resize = f"resize the shorter side to {sh} px"
        else:
            resize = f"resize (keeping the aspect ratio) to cover {sw}x{sh} px"
        fmt = lambda t: "(" + ", ".join(f"{v:.3f}" for v in t) + ")"  # noqa: E731
        return (
            f"{resize} ({self.interpolation}; crop_pct {self.crop_pct:g}), center-crop {w}x{h} px, "
            f"scale to [0, 1], normalise with mean {fmt(self.mean)} and std {fmt(self.std)}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(input_size=list(self.input_size), mean=list(self.mean), std=list(self.std))
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataConfig:
        return cls(**{k: data[k] for k in ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std") if k in data})

    @classmethod
    def from_timm(cls, config: dict[str, Any]) -> DataConfig:
        """From ``timm.data.resolve_data_config(...)``'s dict (input_size is (C, H, W))."""
        return cls(
            input_size=tuple(config["input_size"][-2:]),
            interpolation=config.get("interpolation", "bicubic"),
            crop_pct=config.get("crop_pct") or 0.875,
            crop_mode=config.get("crop_mode") or "center",
            mean=tuple(config["mean"]),
            std=tuple(config["std"]),
        )


def sequence_size(h: int, w: int, patch: int, max_patches: int) -> tuple[int, int]:
    """(H, W), each a multiple of ``patch``, of an h x w picture scaled as far as its patches
    stay within ``max_patches``: the aspect ratio kept up to the rounding up to whole patches.
    NaFlex's rule, with timm's binary search on the scale (``get_image_size_for_seq``), so that
    the sizes are timm's to the pixel."""

    def target(r: float) -> tuple[int, int]:
        return max(patch, patch * math.ceil(h * r / patch)), max(patch, patch * math.ceil(w * r / patch))

    def fits(r: float) -> bool:
        th, tw = target(r)
        return (th // patch) * (tw // patch) <= max_patches

    lo, hi = 1e-6, 100.0
    while hi - lo >= 1e-5:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return target(lo)


def fit_to_sequence(dc: DataConfig, size: tuple[int, int], patch: int) -> DataConfig:
    """NaFlex's evaluation transform for a picture of ``size`` (w, h), as timm's
    ``ResizeToSequence``: the whole picture resized (no crop), its aspect ratio kept, to whole
    patches within the patch budget of ``dc.input_size`` (384 x 384 px of 16-px patches: 576)."""
    budget = (dc.input_size[0] // patch) * (dc.input_size[1] // patch)
    return replace(dc, input_size=sequence_size(size[1], size[0], patch, budget), crop_pct=1.0, crop_mode="squash")


def resized_size(w: int, h: int, dc: DataConfig) -> tuple[int, int]:
    """(w, h) after the resize step, exactly as torchvision / timm compute it."""
    sh, sw = dc.scale_size
    if dc.crop_mode == "squash":
        return sw, sh
    if sh == sw:  # torchvision Resize(int): shorter side to sh, longer side truncated
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(sh * long / short)
        return (sh, new_long) if w <= h else (new_long, sh)
    ratio = min(h / sh, w / sw)  # timm ResizeKeepRatio (longest=0)
    return round(w / ratio), round(h / ratio)


def model_input_image(img: Image.Image, dc: DataConfig) -> Image.Image:
    """The RGB picture the model actually sees: resized and center-cropped (not normalised)."""
    w, h = img.size
    rw, rh = resized_size(w, h, dc)
    ch, cw = dc.input_size
    if rw < cw or rh < ch:  # a rounding corner case: pad with black, as CenterCrop does
        small = img.resize((rw, rh), _INTERP[dc.interpolation])
        img = Image.new("RGB", (max(rw, cw), max(rh, ch)))
        img.paste(small, ((img.width - rw) // 2, (img.height - rh) // 2))
        return img.crop(center_box(img.width, img.height, cw, ch))
    left, top, right, bottom = center_box(rw, rh, cw, ch)
    if rw * rh <= 16 * cw * ch:  # the usual case: resize then crop, exactly as torchvision
        return img.resize((rw, rh), _INTERP[dc.interpolation]).crop((left, top, right, bottom))
    # Extreme aspect ratios (e.g. 3x5000 px) would resize to a huge strip only to crop it:
    # resample just the source box that maps onto the crop. PIL's filter support still reaches
    # outside the box, so this equals resize-then-crop up to float rounding, PROVIDED the two
    # separable passes run in the same order (each pass rounds and clips to 8 bits, which
    # matters where bicubic overshoots): resize((rw, rh)) goes horizontal-first, except that
    # Pillow does very tall images (h > 100 w, shrinking) vertical-first. Mirror that here.
    # Work on the part of the source the filters can reach, so that the box coordinates stay
    # small (Pillow takes them as float32).
    sx, sy = w / rw, h / rh
    (c0, c1), (r0, r1) = _reach(left * sx, right * sx, sx, w, dc), _reach(top * sy, bottom * sy, sy, h, dc)
    x0, x1, y0, y1 = left * sx - c0, right * sx - c0, top * sy - r0, bottom * sy - r0
    part, interp = img.crop((c0, r0, c1, r1)), _INTERP[dc.interpolation]
    if h > 100 * w and rh < h:  # vertical pass first
        cols = part.resize((c1 - c0, ch), interp, box=(0, y0, c1 - c0, y1))
        return cols.resize((cw, ch), interp, box=(x0, 0, x1, ch))
    rows = part.resize((cw, r1 - r0), interp, box=(x0, 0, x1, r1 - r0))
    return rows.resize((cw, ch), interp, box=(0, y0, cw, y1))


_SUPPORT = {"nearest": 1.0, "box": 0.5, "bilinear": 1.0, "hamming": 1.0, "bicubic": 2.0, "lanczos": 3.0}


def _reach(a0: float, a1: float, scale: float, size: int, dc: DataConfig) -> tuple[int, int]:
    """Source pixels [lo, hi) the resampling filter reads for the source span [a0, a1)."""
    margin = _SUPPORT[dc.interpolation] * max(scale, 1.0) + 2
    return max(0, math.floor(a0 - margin)), min(size, math.ceil(a1 + margin))


def center_box(w: int, h: int, cw: int, ch: int) -> tuple[int, int, int, int]:
    top = int(round((h - ch) / 2.0))  # torchvision CenterCrop's rounding
    left = int(round((w - cw) / 2.0))
    return left, top, left + cw, top + ch


def to_tensor(pic: Image.Image, dc: DataConfig) -> torch.Tensor:
    """uint8 RGB picture -> normalised float tensor [3, H, W] (ToTensor + Normalize)."""
    x = torch.from_numpy(np.array(pic, dtype=np.uint8, copy=True)).permute(2, 0, 1).contiguous()
    x = x.to(torch.float32).div(255)
    mean = torch.tensor(dc.mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(dc.std, dtype=torch.float32)[:, None, None]
    return x.sub_(mean).div_(std)


def preprocess(img: Image.Image, dc: DataConfig) -> tuple[torch.Tensor, Image.Image]:
    """RGB image -> (input tensor [3, H, W], the model-input picture)."""
    pic = model_input_image(img, dc)
    return to_tensor(pic, dc), pic


def load_inputs(
    paths: Sequence[str | os.PathLike], dc: DataConfig | Callable[[tuple[int, int]], DataConfig]
) -> tuple[list[torch.Tensor | None], list[str | None]]:
    """Image files -> their input tensors [3, H, W] (None where the image failed) and the
    error messages (None where it did not). ``dc``: the transform, or a function of each
    picture's (w, h) that gives it (a NaFlex model's, which keeps the aspect ratio)."""
    tensors: list[torch.Tensor | None] = []
    errors: list[str | None] = []
    for p in paths:
        try:
            img = load_image(p)
            tensors.append(preprocess(img, dc if isinstance(dc, DataConfig) else dc(img.size))[0])
            errors.append(None)
        except ImageError as e:
            tensors.append(None)
            errors.append(str(e))
    return tensors, errors
