"""Load any image a user may upload, safely, as an upright 8-bit RGB picture; and unpack a zip
of pictures without trusting it (:func:`extract_pictures`).

One error type, :class:`ImageError`, carries a one-line human message for everything that is
not a usable image (not an image at all, truncated, too large, a decompression bomb).
"""

from __future__ import annotations

import io
import os
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image, ImageFile, ImageOps

MAX_FILE_BYTES = 64 * 1024 * 1024  # 64 MiB on disk
MAX_PIXELS = 64_000_000  # 8000x8000; 8000x6000 (48 MP) is fine, 20000x20000 is refused
WORK_PIXELS = 1536 * 1536  # a picture reduced at load to this many pixels (the app's uploads, training's reads)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
# The formats of those files, whatever a file is named (JPEG opens a camera's MPO too). Pillow reads
# some 40 formats by their content, each with a decoder of its own (TGA, SGI, PCX, DDS, PSD, FLI, EPS
# through Ghostscript...); a picture in another format is refused before any is used.
FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF", "PPM")
FRAMES_COUNTED = 1000  # a TIFF's pages counted at most (see count_frames)

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
        img = Image.open(fp, formats=FORMATS)  # reads the header only
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


def open_checked(src: ImageSource, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_FILE_BYTES) -> Image.Image:
    """``src`` opened lazily (its header read, nothing decoded) and checked as :func:`load_image`
    checks it: at most ``max_bytes``, a readable header, at least one pixel, at most ``max_pixels``.
    Raises :class:`ImageError` saying which."""
    img = _open(src, max_bytes)
    name = Path(getattr(img, "filename", "") or "image").name
    w, h = img.size
    if w < 1 or h < 1:
        raise ImageError(f"{name}: image has no pixels ({w}x{h})")
    if w * h > max_pixels:
        raise ImageError(
            f"{name}: image is {w}x{h} px ({w * h / 1e6:.0f} MP); the limit is {max_pixels / 1e6:.0f} MP"
        )
    return img


def load_image(src: ImageSource, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_FILE_BYTES,
               reduce_to: int | None = None) -> Image.Image:
    """Return ``src`` as an 8-bit RGB PIL image, EXIF-rotated upright (files over ``max_bytes``
    are refused before they are read, pictures over ``max_pixels`` before they are decoded).

    Greyscale, 16-bit, palette, CMYK and transparent images are converted (transparency is
    composited on white); animated images give their first frame. ``reduce_to``: reduce the
    picture at load to at most this many pixels, keeping its shape (a JPEG is decoded at a
    reduced scale straight away; others are reduced before any conversion, so a 40-MP float TIFF
    never becomes a 40-MP float64 array); ``img.info["original_size"]`` keeps the upright size
    of the file's picture. Raises :class:`ImageError`.
    """
    img = open_checked(src, max_pixels, max_bytes)
    name = Path(getattr(img, "filename", "") or "image").name
    w, h = img.size
    try:
        if getattr(img, "is_animated", False):  # (not n_frames: it walks every frame)
            img.seek(0)  # animated: first frame
        if reduce_to and w * h > reduce_to and img.format == "JPEG":
            f = (w * h / reduce_to) ** 0.5
            img.draft("RGB", (int(w / f), int(h / f)))  # libjpeg decodes at 1/2, 1/4 or 1/8 scale
        img.load()
        reduced = bounded(img, reduce_to) if reduce_to else img
        before = reduced.size
        upright = ImageOps.exif_transpose(reduced) or reduced
        out = to_rgb(upright)
        out.info["original_size"] = (w, h) if upright.size == before else (h, w)
        return out
    except ImageError:
        raise
    except Exception as e:
        msg = str(e).split("\n")[0]
        if "truncated" in msg.lower():
            raise ImageError(f"{name}: the file is truncated (incomplete image data)") from e
        raise ImageError(f"{name}: could not decode the image ({type(e).__name__}: {msg})") from e


def count_frames(img: Image.Image) -> int:
    """How many frames ``img`` has, a TIFF's counted up to :data:`FRAMES_COUNTED` (which means "at least").
    Pillow's ``n_frames`` walks every page of a TIFF, in time that grows with the square of
    their number (each page's place looked up in a list of all before it): a 5 MB file of
    50,000 tiny pages took 21 s of CPU, a 25 MB one minutes. Other formats' counts are cheap
    (WebP and APNG declare theirs; a GIF's 100,000 frames are skipped through in 0.3 s)."""
    if img.format != "TIFF":
        return int(getattr(img, "n_frames", 1))
    n = 0
    try:
        while n < FRAMES_COUNTED:
            img.seek(n)
            n += 1
    except EOFError:
        pass
    img.seek(0)
    return max(n, 1)


def bounded(img: Image.Image, max_pixels: int) -> Image.Image:
    """``img`` reduced to at most ``max_pixels`` pixels, its shape kept (box averaging by a
    whole factor first, which is fast and needs no more memory than its result, then Lanczos);
    modes the reduction does not take are converted first, to the smallest mode that keeps them."""
    if img.width * img.height <= max_pixels:
        return img
    sixteen = img.mode.startswith("I;16")
    if img.mode == "1":
        img = img.convert("L")
    elif sixteen:
        img = img.convert("I")
    elif img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    factor = int((img.width * img.height / max_pixels) ** 0.5)
    if factor >= 2:
        img = img.reduce(factor)
    if img.width * img.height > max_pixels:
        scale = (max_pixels / (img.width * img.height)) ** 0.5
        size = (max(1, int(img.width * scale)), max(1, int(img.height * scale)))
        img = img.resize(size, Image.Resampling.LANCZOS)
    if sixteen:  # back to 8 bits as to_rgb maps 16-bit pictures (a dark one stays dark)
        a = (np.asarray(img, dtype=np.float64) / 257.0).clip(0, 255).round().astype(np.uint8)
        img = Image.fromarray(a, "L")
    return img


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


def safe_parts(name: str) -> list[str]:
    """A zip member's name as at most two harmless path parts (its folder and its file): no
    ``..``, no absolute path, no hidden or system folder, only letters, digits and ``._- ``."""
    parts = [q for q in PurePosixPath(name.replace("\\", "/")).parts if q not in ("", ".", "..", "/")]
    if not parts or any(q.startswith(".") or q == "__MACOSX" for q in parts):
        return []
    return [re.sub(r"[^A-Za-z0-9._ -]", "_", q).strip(" ").lstrip(".")[:120] or "_" for q in parts[-2:]]


class Allowance:
    """What unpacking may still use, over every zip of one upload: members looked at (kept or
    not), bytes decompressed (kept or not: a member over its size cap was still read), bytes
    written to disk (a disk budget), and ``check``, called between chunks (a time limit that
    raises). Each zip's central directory is sized before it is parsed (:func:`index_size`).
    (A plain class, not a dataclass: this module is also loaded on its own, outside the package,
    by the hostile-image probe, and a dataclass needs its module registered.)"""

    def __init__(self, entries: int = 20_000, read: int = 1 << 30, written: int = 512 << 20,
                 check: Callable[[], None] | None = None) -> None:
        self.entries, self.read, self.written, self.check = entries, read, written, check
        self.stopped = False  # the check raised: unpacking ends there
        self.full = False  # the disk budget is used up: nothing more is written

    def take_read(self, nbytes: int) -> None:
        """Charge ``nbytes`` bytes read; ValueError once the upload has read its share."""
        self.read -= nbytes
        if self.read < 0:
            raise ValueError("the upload unpacks to more than this app reads for one survey")
        self.tick()

    def tick(self) -> None:
        """Run the check (a time limit): what it raises ends the unpacking."""
        if self.check is not None:
            try:
                self.check()
            except BaseException:
                self.stopped = True
                raise

    def take_written(self, nbytes: int) -> None:
        """Charge ``nbytes`` bytes about to be written; ValueError beyond the budget (and nothing more
        is written after that)."""
        if self.full or nbytes > self.written:
            self.full = True
            raise ValueError("the pictures would fill more disk than this app keeps for its files")
        self.written -= nbytes

    @property
    def spent(self) -> bool:
        """Whether nothing more may be read or written."""
        return self.read < 0 or self.full or self.stopped


CD_ENTRY = 46  # bytes: the least a member takes in a zip's central directory (its name and extras add to it)


def index_size(path: str | os.PathLike) -> int:
    """The size a zip's end record gives its central directory (zip64 too); 0 without an end record
    (zipfile says why). Python's zipfile parses every entry of that directory, whatever count the end
    record claims: 500,000 entries took seconds and 167 MB."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 16) - 22))
        tail = f.read()
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) < i + 22:
        return 0
    cd_size = int.from_bytes(tail[i + 12:i + 16], "little")
    j = i - 20  # a zip64 end record's locator sits right before the end record
    if j >= 0 and tail[j:j + 4] == b"PK\x06\x07":
        with open(path, "rb") as f:
            f.seek(int.from_bytes(tail[j + 8:j + 16], "little"))
            rec = f.read(56)
        if rec[:4] == b"PK\x06\x06" and len(rec) == 56:
            cd_size = max(cd_size, int.from_bytes(rec[40:48], "little"))
    return cd_size


def extract_pictures(archive: str | os.PathLike, dest: str | os.PathLike, max_files: int = 500,
                     max_bytes: int = MAX_FILE_BYTES, allowance: Allowance | None = None) -> tuple[list[Path], list[str]]:
    """Copy the image files of a zip into ``dest`` (``dest/<folder>/<file>``, the member's last
    folder kept as its class) without trusting the archive: names are rebuilt from safe parts
    (:func:`safe_parts`), nothing is written outside ``dest``, links and non-images are skipped,
    and the bytes actually read are counted against ``max_bytes`` per file and the ``allowance``
    (members looked at, bytes read and written, a time limit: a zip bomb's declared sizes are not
    believed). At most ``max_files`` pictures. Returns (the files written, notes on what was
    skipped). ImageError for a file that is not a zip."""
    dest, name = Path(dest), Path(archive).name
    allowance = allowance if allowance is not None else Allowance()
    written: list[Path] = []
    notes: list[str] = []
    try:
        if index_size(archive) > CD_ENTRY * max(0, allowance.entries):
            return [], [f"skipped {name}: it lists more files than this app looks at for one survey"]
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as e:
        raise ImageError(f"{name}: not a readable zip file ({e})") from e
    with zf:
        for info in zf.infolist():
            allowance.tick()
            allowance.entries -= 1
            if allowance.entries < 0:
                notes.append(f"only the first files of {name} were looked at")
                break
            parts = safe_parts(info.filename)
            is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
            if info.is_dir() or not parts or is_link or Path(parts[-1]).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            if len(written) >= max_files:
                notes.append(f"only the first {max_files} pictures of {name} are used")
                break
            target = dest.joinpath(*parts)
            while target.exists():
                target = target.with_name(f"{target.stem}_{len(written)}{target.suffix}")
            try:
                copy_member(zf, info, target, max_bytes, allowance)
            except (RuntimeError, zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
                if allowance.stopped:
                    raise
                notes.append(f"skipped {parts[-1]}: {e}")
                if allowance.spent:
                    notes.append(f"stopped unpacking {name}: {e}")
                    break
                continue
            written.append(target)
    return written, notes


def copy_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, limit: int, allowance: Allowance) -> int:
    """Copy one member to ``target``, reading at most ``limit`` bytes (ValueError beyond it), every
    chunk charged to the ``allowance`` before it is written; on any error the partial file goes,
    and its bytes are given back to the disk budget."""
    target.parent.mkdir(parents=True, exist_ok=True)
    n = kept = 0
    try:
        with archive.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                n += len(chunk)
                allowance.take_read(len(chunk))
                if n > limit:
                    raise ValueError(f"more than {limit / 2**20:.0f} MiB once unpacked")
                allowance.take_written(len(chunk))
                kept += len(chunk)
                out.write(chunk)
    except BaseException:
        target.unlink(missing_ok=True)
        allowance.written += kept
        raise
    return n


# A truncated file must be an error, never silently padded with grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False
# PIL's bomb warning becomes an error (process-wide filter: catch_warnings is not thread-safe).
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)
