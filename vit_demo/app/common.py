"""Small things every section of the app uses: readable errors, status notes, the pictures sent
to the browser (fast JPEG / PNG files, random names, within the disk budget), opening an
upload (only a file the :class:`~vit_demo.app.server.guard.FileGuard` allows), and class names for display."""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
import logging
import os
import secrets
import sys
import threading
import time
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import gradio as gr  # noqa: E402
from PIL import Image  # noqa: E402

from .. import viz  # noqa: E402
from ..analysis import Analysis  # noqa: E402
from ..images import ImageError  # noqa: E402
from ..progress import TimeUp  # noqa: E402
from .registry import ModelError  # noqa: E402
from .server.guard import FileGuard, InputError, clip  # noqa: E402
from .server.limits import Limits  # noqa: E402
from .server.workspace import trim, workspace  # noqa: E402
from .session import Upload, open_image  # noqa: E402

log = logging.getLogger("vit_demo.app")

TIMING = os.environ.get("VIT_DEMO_TIMING", "") not in ("", "0")  # log each handler's time to stderr
VIEW_SIZE = 448  # px: longer side of the single-map pictures shown in the app


def note(title: str, text: str, kind: str = "warn") -> str:
    """A coloured notice for the status area (the text is escaped: it may hold a file name)."""
    return f'<div class="note {kind}"><b>{html.escape(title)}</b> {html.escape(text)}</div>'


SOMETHING_WRONG = ("Something went wrong with this request (the app's log has the details). The app is still "
                   "running: try again, or another image.")


def check_look(cmap: Any, alpha: Any) -> None:
    """The display controls' values as a client sent them: a colormap matplotlib knows and an
    opacity from 0 to 1; :class:`InputError` saying which otherwise (not "Something went wrong")."""
    try:
        viz.check_cmap(cmap if isinstance(cmap, str) else "")
    except ValueError:
        raise InputError("Colormap: choose one of inferno, magma, viridis, plasma, turbo, jet or gray.") from None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise InputError("Overlay opacity must be a number from 0 to 1.")


def readable_error(e: Exception, where: str = "") -> gr.Error:
    """One readable line for the UI from any exception; an unexpected one's traceback goes to the
    log and the user gets plain words that reveal nothing of the server."""
    if isinstance(e, gr.Error):
        return e
    if isinstance(e, (ImageError, ModelError, InputError, TimeUp)):
        return gr.Error(str(e), print_exception=False)
    log.error("%s failed:\n%s", where or "a handler", "".join(traceback.format_exception(e)))
    return gr.Error(SOMETHING_WRONG, print_exception=False)


@contextlib.contextmanager
def readable(name: str):
    """Around one handler's work: an exception leaves as :func:`readable_error`'s one line, and
    with ``$VIT_DEMO_TIMING`` the handler's time goes to the log."""
    t0 = time.perf_counter()
    try:
        yield
    except Exception as e:
        err = readable_error(e, name)
        if err is e:
            raise
        raise err from e
    finally:
        if TIMING:
            print(f"[timing] {name}: {1000 * (time.perf_counter() - t0):.0f} ms", file=sys.stderr, flush=True)


def friendly(fn):
    """Turn unexpected exceptions into one readable line in the UI (the traceback goes to the log).
    A generator function (an event that sends pictures as they come) stays one."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator(*args, **kwargs):
            with readable(fn.__name__):
                yield from fn(*args, **kwargs)

        return generator

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with readable(fn.__name__):
            return fn(*args, **kwargs)

    return wrapper


def payload_path(payload: Any) -> tuple[str | None, str | None]:
    """(path on the server, the user's file name, shortened) from an image component's raw value."""
    if payload is None:
        return None, None
    if isinstance(payload, str):
        path, name = payload, None
    elif isinstance(payload, dict):
        path, name = payload.get("path"), payload.get("orig_name")
    else:
        path, name = getattr(payload, "path", None), getattr(payload, "orig_name", None)
    if not isinstance(path, str):
        return None if path is None else "", None
    name = name if isinstance(name, str) and name else Path(path).name
    return path, short_name(name)


def short_name(name: str) -> str:
    """A user's file name as the app repeats it: at most 40 characters, the extension kept."""
    p = Path(name.replace("\\", "/")).name or "image"
    if len(p) <= 40:
        return p
    suffix = Path(p).suffix[:8]
    return clip(p[: 40 - len(suffix)], 40 - len(suffix)) + suffix


def open_upload(payload: Any, files: FileGuard | None, limits: Limits) -> Upload:
    """A file payload -> the user's picture: only a file ``files`` allows (an upload stored by
    this server, an example), within the limits of size and pixels (ImageError otherwise)."""
    path, name = payload_path(payload)
    if path is None:
        return open_image(None)
    real = files.check(path) if files is not None else path
    up = open_image(real, max_bytes=limits.max_upload_bytes, max_pixels=limits.max_pixels)
    up.name = name or up.name
    return up


# ----------------------------------------------------------------------------- pictures for the browser

_view_count = 0
_view_lock = threading.Lock()
VIEWS_MB = 256  # the pictures sent to the browser (Gradio serves them from there; the oldest go first)


def sweep(folder: Path, max_age_s: float) -> None:
    """Remove the files in ``folder`` older than ``max_age_s`` seconds; files that vanish or cannot
    be removed meanwhile are left alone."""
    now = time.time()
    for f in folder.iterdir():
        try:
            if f.is_file() and now - f.stat().st_mtime > max_age_s:
                f.unlink()
        except OSError:
            pass


def save_view(img: Image.Image, fmt: str = "jpeg") -> str:
    """Write a picture for the browser, fast: JPEG (quality 92, ~2 ms) for photos and heat maps,
    PNG at the lowest compression (~15 ms) for pictures with text and thin lines. PIL's default
    PNG compression costs 80-250 ms per picture, more than drawing it. The name is random (it
    says nothing of the server or of other users' pictures); files older than ten minutes go,
    and the oldest whenever the folder passes :data:`VIEWS_MB`."""
    global _view_count
    folder = workspace().views
    with _view_lock:
        _view_count += 1
        if _view_count % 200 == 0:
            sweep(folder, 600)
            trim(folder, VIEWS_MB << 20)
    folder.mkdir(parents=True, exist_ok=True)  # gone if a sweep removed it as empty: made again, not a failed upload
    path = folder / f"{secrets.token_hex(8)}.{'jpg' if fmt == 'jpeg' else 'png'}"
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

