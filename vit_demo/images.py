"""Load any image a user may upload, safely, as an upright 8-bit RGB picture.

One error type, :class:`ImageError`, carries a one-line human message for everything that is
not a usable image (not an image at all, truncated, too large, a decompression bomb).
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps

MAX_FILE_BYTES = 64 * 1024 * 1024  # 64 MiB on disk
MAX_PIXELS = 64_000_000  # 8000x8000; 8000x6000 (48 MP) is fine, 20000x20000 is refused
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}

ImageSource = str | os.PathLike | bytes | Image.Image | np.ndarray


class ImageError(ValueError):
    """The input is not an image this app can use; the message says why, in one line."""


def mib(n: int) -> str:
    """A size in MiB as people read it: whole when it is whole, else one decimal (never "25 MiB;
    the limit is 25 MiB" for a file of 25.3 MiB)."""
    v = n / 2**20
    return f"{v:.0f} MiB" if v == round(v) else f"{v:.1f} MiB" if v >= 0.1 else f"{n / 1024:.0f} KiB"


def _open(src: ImageSource, max_bytes: int = MAX_FILE_BYTES) -> Image.Image:
    if isinstance(src, Image.Image):
        return src
    if isinstance(src, np.ndarray):
        if src.dtype != np.uint8 and src.dtype.kind == "f":
            src = (np.clip(src, 0, 1) * 255).round().astype(np.uint8)
        try:
            return Image.fromarray(src)
        except (TypeError, ValueError) as e:
            raise ImageError(f"array of shape {src.shape} and dtype {src.dtype} is not an image") from e
    if isinstance(src, bytes):
        data, name = src, "upload"
        if len(data) > max_bytes:
            raise ImageError(f"{name}: file is {mib(len(data))}; the limit is {mib(max_bytes)}")
        fp: io.BytesIO | Path = io.BytesIO(data)
    else:
        fp = Path(src)
        name = fp.name
        if not fp.is_file():
            raise ImageError(f"{src}: no such file")
        size = fp.stat().st_size
        if size > max_bytes:
            raise ImageError(f"{name}: file is {mib(size)}; the limit is {mib(max_bytes)}")
        data = b""
    if (isinstance(fp, Path) and fp.stat().st_size == 0) or (isinstance(fp, io.BytesIO) and not data):
        raise ImageError(f"{name}: the file is empty (0 bytes)")
    try:
        img = Image.open(fp)  # reads the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"{name}: image declares too many pixels to decode safely") from e
    except Image.UnidentifiedImageError as e:  # its message is just the full path: say it in words
        raise ImageError(f"{name}: not an image file this app can read (unknown format or corrupt header)") from e
    except Exception as e:  # PIL raises OSError, SyntaxError, struct.error...
        msg = str(e).strip().split("\n")[0][:200]
        if "truncated" in msg.lower():
            raise ImageError(f"{name}: the file is truncated (incomplete image header)") from e
        raise ImageError(f"{name}: not a readable image ({type(e).__name__}: {msg})") from e
    return img


def load_image(src: ImageSource, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_FILE_BYTES) -> Image.Image:
    """Return ``src`` as an 8-bit RGB PIL image, EXIF-rotated upright (files over ``max_bytes``
    are refused before they are read).

    Greyscale, 16-bit, palette, CMYK and transparent images are converted (transparency is
    composited on white); animated images give their first frame. Raises :class:`ImageError`.
    """
    img = _open(src, max_bytes)
    name = Path(getattr(img, "filename", "") or "image").name
    w, h = img.size
    if w < 1 or h < 1:
        raise ImageError(f"{name}: image has no pixels ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(
            f"{name}: image is {w}x{h} px ({w * h / 1e6:.0f} MP); the limit is {max_pixels / 1e6:.0f} MP"
        )
    try:
        if getattr(img, "n_frames", 1) > 1:
            img.seek(0)  # animated: first frame
        img.load()
        img = ImageOps.exif_transpose(img) or img
        return to_rgb(img)
    except ImageError:
        raise
    except Exception as e:
        msg = str(e).split("\n")[0]
        if "truncated" in msg.lower():
            raise ImageError(f"{name}: the file is truncated (incomplete image data)") from e
        raise ImageError(f"{name}: could not decode the image ({type(e).__name__}: {msg})") from e


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB, keeping what a viewer would show."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # high bit depth greyscale
        a = np.asarray(img, dtype=np.float64)
        if img.mode == "F":
            lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
            a = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        elif img.mode.startswith("I;16") or a.max() > 255:
            a = a / 257.0  # 16-bit range -> 8-bit (always for I;16: a dark 16-bit image stays dark)
        a = np.nan_to_num(a).clip(0, 255).round().astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV...


def find_images(paths: list[str | os.PathLike]) -> list[Path]:
    """Expand folders into the image files they contain (sorted); keep files as given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
        else:
            out.append(p)
    return out


# A truncated file must be an error, never silently padded with grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False
# PIL's bomb warning becomes an error (process-wide filter: catch_warnings is not thread-safe).
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)
