"""One user's session: the uploaded image and what that user is looking at.

A :class:`Session` lives in the user's ``gr.State`` (never global); :func:`open_image` turns an
upload into an :class:`Upload` or one readable :class:`~vit_demo.images.ImageError`. A session
keeps the picture reduced at load (at most :data:`WORK_PIXELS`: what every view and every model
input is made from), and the pictures of all sessions together stay within one budget, idle
ones forgotten (:class:`SessionBudget`). No Gradio here.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ..analysis import Analysis
from ..budget import image_nbytes
from ..images import (
    FORMATS,
    FRAMES_COUNTED,
    MAX_FILE_BYTES,
    MAX_PIXELS,
    WORK_PIXELS,  # a session's picture (9.4 MB, 4 bytes an RGB pixel): the model sees 224 px, a slide 1200
    ImageError,
    count_frames,
    load_image,
)

MIN_SIDE = 16  # px: smaller pictures hold less than one patch of information
NARROW_COLUMNS = 2  # tiles a row on a phone's screen (Session.narrow)


@dataclass
class Upload:
    picture: Image.Image  # RGB, upright
    name: str
    size: tuple[int, int]  # original (width, height)
    notes: list[str] = field(default_factory=list)  # things the user should know (e.g. animated GIF)


def open_image(path: str | os.PathLike | None, max_bytes: int = MAX_FILE_BYTES, max_pixels: int = MAX_PIXELS) -> Upload:
    """A user's file -> an RGB picture of at most :data:`WORK_PIXELS` pixels, or :class:`ImageError`
    with a message for people (files over ``max_bytes``, the app's ``--max-upload-mb``, are
    refused before decoding, pictures over ``max_pixels``, ``--max-megapixels``, too)."""
    if path is None or not str(path):
        raise ImageError("no image: upload a photo or click one of the examples")
    p = Path(path)
    name = p.name
    notes = []
    try:
        with Image.open(p, formats=FORMATS) as probe:
            frames = count_frames(probe)
            fmt = probe.format or ""
    except Exception:  # load_image below says what is wrong, in words
        frames, fmt = 1, ""
    img = load_image(p, max_pixels=max_pixels, max_bytes=max_bytes, reduce_to=WORK_PIXELS)
    w, h = img.info.get("original_size", img.size)
    if min(w, h) < MIN_SIDE:
        raise ImageError(f"{name}: the image is only {w}x{h} px; it needs at least {MIN_SIDE} px on each side "
                         f"(one {MIN_SIDE}-px patch) to show anything")
    if frames > 1:
        many = f"{frames:,} or more" if fmt == "TIFF" and frames >= FRAMES_COUNTED else f"{frames}"
        notes.append(f"{name} is an animated {fmt or 'image'} with {many} frames: using the first frame")
    return Upload(img, name, (w, h), notes)


# ----------------------------------------------------------------------------- one user's session


@dataclass
class Session:
    """What one browser tab (or API client) is looking at; kept in its gr.State, never global.

    The session does not own its analysis: it holds a weak reference to the one in the
    registry's byte-bounded cache, so that sessions (kept for hours) add nothing to the cache's
    budget. When the cache has let it go, :attr:`analysis` computes it again from the upload
    through ``reanalyze`` (set by the app for every event), the same answer as before.
    """

    model_key: str | None = None
    upload: Upload | None = None
    query: int | None = None  # the query patch of the attention explorer (None: the [class] token)
    extra_models: list[str] = field(default_factory=list)  # checkpoints this session loaded itself
    open_tab: str = "patches"
    narrow: bool = False  # a phone's screen (the page says so at load): rows of tiles drawn in fewer columns
    rendered: dict[str, str] = field(default_factory=dict)  # lazily drawn tab -> analysis it shows
    drawn: dict[str, str] = field(default_factory=dict)  # tab -> analysis its show() pictures are of
    placeholders: dict[str, str] = field(default_factory=dict)  # tab -> analysis whose picture it drew unfinished
    model_views: dict[str, str] = field(default_factory=dict)  # a picture of the model alone -> the model it shows
    comparison: dict[str, Any] | None = None
    inside: dict[str, Any] = field(default_factory=dict)  # Step inside: its layer and head (the deck's too), what it shows
    shown: tuple[str | None, str] | None = None  # (uploaded file, model) last handled
    last_pick: tuple[str, float] | None = None  # (model key, time) of the last menu pick
    forgotten: bool = False  # the budget let its picture go (idle too long, or memory needed)

    _analysis: Any = field(default=None, repr=False)  # weakref.ref to the Analysis, or None
    reanalyze: Callable[[Session], Analysis] | None = field(default=None, repr=False, compare=False)

    @property
    def analysis(self) -> Analysis | None:
        a = self._analysis() if self._analysis is not None else None
        if a is None and self._analysis is not None and self.upload is not None and self.reanalyze is not None:
            a = self.reanalyze(self)  # evicted from the cache: the same photo and model again
            self._analysis = weakref.ref(a)
        return a

    def peek(self) -> Analysis | None:
        """The analysis if the cache still holds it (never computes)."""
        return self._analysis() if self._analysis is not None else None

    @analysis.setter
    def analysis(self, a: Analysis | None) -> None:
        self._analysis = weakref.ref(a) if a is not None else None

    @property
    def ready(self) -> bool:
        return self._analysis is not None and self.upload is not None

    def step_choice(self) -> dict[str, Any]:
        """What the Step inside tab follows, for the deck's Step inside slides: the query patch (None:
        the readout's) and the tab's layer and head (indices) when it showed them for this model."""
        choice: dict[str, Any] = {"patch": self.query}
        if self.inside.get("model") == self.model_key and "layer" in self.inside:
            choice.update(layer=self.inside["layer"], head=self.inside["head"])
        return choice

    @property
    def view_key(self) -> str:
        a = self.analysis
        return f"{a.model_name}|{a.key}" if a is not None else ""


def picture_nbytes(sess: Session) -> int:
    """Bytes of the pictures a session keeps (its upload)."""
    return 0 if sess.upload is None else image_nbytes(sess.upload.picture)


class SessionBudget:
    """The pictures of all sessions within ``max_bytes``, and for ``idle_s`` seconds after a
    session was last used: :meth:`touch` (every event) weighs the session again, then the
    sessions idle too long, and the least recently used ones while the total is over budget,
    forget their picture (:meth:`forget`; their next event asks for the image again). The
    sessions themselves stay Gradio's: this holds weak references only."""

    def __init__(self, max_bytes: int, idle_s: float) -> None:
        self.max_bytes, self.idle_s = int(max_bytes), float(idle_s)
        self._sessions: OrderedDict[int, tuple[weakref.ref, int, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.forgotten = 0

    def touch(self, sess: Session) -> None:
        """``sess`` was just used (and may hold a new picture): weigh it, then fit the budget."""
        now = time.monotonic()
        with self._lock:
            self._sessions[id(sess)] = (weakref.ref(sess), picture_nbytes(sess), now)
            self._sessions.move_to_end(id(sess))
            drop = self._over(now, id(sess))
        for s in drop:
            self.forget(s)

    def _over(self, now: float, keep: int) -> list[Session]:
        """Sessions to forget (lock held): gone or idle ones leave the books, then the least
        recently used until the total fits."""
        drop, total = [], 0
        for key, (ref, size, used) in list(self._sessions.items()):
            sess = ref()
            if sess is None:
                del self._sessions[key]
            elif key != keep and now - used > self.idle_s:
                del self._sessions[key]
                drop.append(sess)
            else:
                total += size
        for key, (ref, size, _) in list(self._sessions.items()):
            if total <= self.max_bytes:
                break
            if key != keep and size:
                del self._sessions[key]
                total -= size
                if (sess := ref()) is not None:
                    drop.append(sess)
        return drop

    def forget(self, sess: Session) -> None:
        if sess.upload is not None:
            self.forgotten += 1
        sess.upload = None
        sess.analysis = None
        sess.rendered, sess.drawn, sess.placeholders, sess.comparison, sess.shown = {}, {}, {}, None, None
        sess.forgotten = True

    def sweep(self) -> None:
        """Forget the idle sessions now (also done on every :meth:`touch`)."""
        with self._lock:
            drop = self._over(time.monotonic(), -1)
        for s in drop:
            self.forget(s)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(size for ref, size, _ in self._sessions.values() if ref() is not None)

    def __len__(self) -> int:
        return len(self._sessions)
