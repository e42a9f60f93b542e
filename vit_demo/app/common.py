"""Small things every section of the app uses: readable errors, status notes, the pictures sent
to the browser (fast JPEG / PNG files), the uploaded file's name, and class names for display."""

from __future__ import annotations

import functools
import html
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import gradio as gr  # noqa: E402
from PIL import Image  # noqa: E402

from ..analysis import Analysis  # noqa: E402
from ..images import ImageError  # noqa: E402
from .registry import ModelError  # noqa: E402

log = logging.getLogger("vit_demo.app")

TIMING = os.environ.get("VIT_DEMO_TIMING", "") not in ("", "0")  # log each handler's time to stderr
VIEW_SIZE = 448  # px: longer side of the single-map pictures shown in the app


def note(title: str, text: str, kind: str = "warn") -> str:
    """A coloured notice for the status area (the text is escaped: it may hold a file name)."""
    return f'<div class="note {kind}"><b>{html.escape(title)}</b> {html.escape(text)}</div>'


def readable_error(e: Exception, where: str = "") -> gr.Error:
    """One readable line for the UI from any exception (an unexpected one's traceback goes to the log)."""
    if isinstance(e, gr.Error):
        return e
    if isinstance(e, (ImageError, ModelError)):
        return gr.Error(str(e), print_exception=False)
    log.error("%s failed:\n%s", where or "a handler", "".join(traceback.format_exception(e)))
    return gr.Error(f"Something went wrong ({type(e).__name__}: {str(e)[:300]}). The app is still running; "
                    "try again or pick another image.", print_exception=False)


def friendly(fn):
    """Turn unexpected exceptions into one readable line in the UI (the traceback goes to the log)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            err = readable_error(e, fn.__name__)
            if err is e:
                raise
            raise err from e
        finally:
            if TIMING:
                print(f"[timing] {fn.__name__}: {1000 * (time.perf_counter() - t0):.0f} ms", file=sys.stderr, flush=True)

    return wrapper


def payload_path(payload: Any) -> tuple[str | None, str | None]:
    """(path on the server, the user's file name) from an image component's raw value."""
    if payload is None:
        return None, None
    if isinstance(payload, str):
        return payload, Path(payload).name
    if isinstance(payload, dict):
        path = payload.get("path")
        return path, payload.get("orig_name") or (Path(path).name if path else None)
    path = getattr(payload, "path", None)
    return path, getattr(payload, "orig_name", None) or (Path(path).name if path else None)


# ----------------------------------------------------------------------------- pictures for the browser

_VIEW_DIR: Path | None = None
_view_count = 0
_view_lock = threading.Lock()


def sweep(folder: Path, max_age_s: float, suffixes: tuple[str, ...] | None = None) -> None:
    """Remove the files in ``folder`` older than ``max_age_s`` seconds (only those ending in one of
    ``suffixes``, when given); files that vanish or cannot be removed meanwhile are left alone."""
    now = time.time()
    for f in folder.iterdir():
        try:
            if (suffixes is None or f.suffix in suffixes) and f.is_file() and now - f.stat().st_mtime > max_age_s:
                f.unlink()
        except OSError:
            pass


def save_view(img: Image.Image, fmt: str = "jpeg") -> str:
    """Write a picture for the browser, fast: JPEG (quality 92, ~2 ms) for photos and heat maps,
    PNG at the lowest compression (~15 ms) for pictures with text and thin lines. PIL's default
    PNG compression costs 80-250 ms per picture, more than drawing it. Files older than ten
    minutes are removed (the app's server keeps its own copy)."""
    global _VIEW_DIR, _view_count
    with _view_lock:
        if _VIEW_DIR is None:
            _VIEW_DIR = Path(tempfile.mkdtemp(prefix="vit_demo_views_"))
        _view_count += 1
        n = _view_count
        if n % 200 == 0:
            sweep(_VIEW_DIR, 600)
    path = _VIEW_DIR / f"view_{os.getpid()}_{n:08d}.{'jpg' if fmt == 'jpeg' else 'png'}"
    if fmt == "jpeg":
        img.convert("RGB").save(path, "JPEG", quality=92)
    else:
        img.save(path, "PNG", compress_level=1)
    return str(path)


def jpeg(img: Image.Image) -> str:
    """Photos and heat maps go to the browser as JPEG files (2 ms; PIL's PNG takes 100+ ms)."""
    return save_view(img, "jpeg")


def png(img: Image.Image) -> str:
    """Pictures with text and thin lines: PNG, fastest compression."""
    return save_view(img, "png")


# ----------------------------------------------------------------------------- class names


@lru_cache(maxsize=8)
def _duplicates(labels: tuple[str, ...]) -> frozenset[str]:
    """Names that more than one class shares (ImageNet has two "crane"s and two "maillot"s)."""
    seen: set[str] = set()
    dup = {n for n in labels if n in seen or seen.add(n)}
    return frozenset(dup)


def display_label(a: Analysis, index: int) -> str:
    """A class's name as the app shows it (with its index where two classes share the name)."""
    name = a.labels[index]
    return f"{name} (class {index})" if name in _duplicates(a.labels) else name

