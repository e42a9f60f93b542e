"""What a request may name and carry: the files it may point at, and the shape of its values.

Gradio checks that a file payload was uploaded only when it carries Gradio's ``"meta"`` marker;
the same payload without it reaches the handler untouched, and a plain Gradio app then opens
any path on the server. So the app decides itself, for every file input of every event, public
or private (an attacker can call them all by their index):

- :class:`FileGuard`: a file is usable only if, with every symlink followed, it lies in the
  folder where this server stores uploads (Gradio's upload and cache folder) or is one of the
  app's own example photos. Everything else is refused with ONE message, :data:`REFUSED`, the
  same whether the path exists or not, so that the answer tells nothing about the server's files.
- :class:`JoinGuard`: checks a queued request before it joins the queue: the number of values,
  every file object (at any depth) through the :class:`FileGuard`, file inputs that are files,
  and every other value a plain scalar of bounded length (so that no error message can echo
  more than a few dozen characters of what was sent); for an event whose values Gradio
  converts before its handler sees them (``preprocess``), a number input's value a number and
  a one-file input's value one file: Gradio's own conversion failed on the rest with an error
  of no words (``/compare`` with ``k="abc"``, a list of three zips to ``/train``).

No Gradio here: the app passes in its upload folder and which components take files or text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...images import ImageError
from .streams import is_frame

REFUSED = "That file is not available to this app: upload it, or pick one of the examples."
MAX_PATH = 4096  # characters: no real path is longer
MAX_VALUE = 64  # characters of a menu value, a colormap, a choice: any error echoes at most this much
MAX_TEXT = 1024  # characters of a text box (a checkpoint path, an architecture name)
MAX_FILES = 16  # file objects in one value (the side-by-side takes 3)
ECHO = 40  # characters of a user's value (a file name, a model name) that a message may repeat


class Refused(ImageError):
    """A file payload that names a file the app will not open (always :data:`REFUSED`)."""

    def __init__(self) -> None:
        super().__init__(REFUSED)


class InputError(ValueError):
    """A value a person can fix (``k`` out of range, an unknown choice), in one plain line."""


def clip(text: Any, n: int = ECHO) -> str:
    """At most ``n`` characters of a user's value, for a message (``…`` marks a cut)."""
    s = str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def whole(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as a whole number in ``[lo, hi]``, or :class:`InputError` saying so."""
    try:
        f = float(value)
        if f != int(f):
            raise ValueError
        n = int(f)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a whole number from {lo} to {hi}.") from None
    if not lo <= n <= hi:
        raise InputError(f"{name} must be a whole number from {lo} to {hi} (got {clip(n, 12)}).")
    return n


def _real(path: str | os.PathLike) -> str:
    return os.path.realpath(os.fspath(path))


class FileGuard:
    """The files a request may name: those under ``folders`` (where uploads are stored) and the
    ``files`` themselves (the examples), compared after following every symlink."""

    def __init__(self, folders: Iterable[str | os.PathLike], files: Iterable[str | os.PathLike] = ()) -> None:
        self.folders = [_real(f) for f in folders]
        self.files = {_real(f) for f in files}

    def check(self, path: Any) -> str:
        """The real path of a file the app may open, or :class:`Refused`."""
        if not isinstance(path, str) or not path or len(path) > MAX_PATH or "\0" in path or "://" in path:
            raise Refused()
        try:
            real = _real(path)
            if real in self.files and os.path.isfile(real):
                return real
            inside = any(real.startswith(folder + os.sep) for folder in self.folders)
            if inside and os.path.isfile(real):
                return real
        except (OSError, ValueError):
            pass
        raise Refused()

    def allows(self, path: Any) -> bool:
        try:
            self.check(path)
            return True
        except Refused:
            return False


def file_objects(value: Any, depth: int = 0) -> Iterable[dict]:
    """Every dict in ``value`` (at any depth) that looks like a file: it has a ``path``, a
    ``url`` or Gradio's ``meta``."""
    if depth > 8:
        yield {"path": None}  # nested deeper than any real value: refused as a file would be
        return
    if isinstance(value, dict):
        if {"path", "url", "meta"} & value.keys():
            yield value
        for v in value.values():
            yield from file_objects(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from file_objects(v, depth + 1)


class JoinGuard:
    """Checks one queued request's values against its event's inputs (see the module docstring).
    ``file_ids``: the components whose values are files; ``text_ids``: free-text boxes;
    ``state_ids``: session states (Gradio ignores what a client sends for them); ``frame_ids``: a
    camera's streamed frames (:func:`~vit_demo.app.server.streams.is_frame`, at most ``frame_chars``)."""

    def __init__(self, files: FileGuard, file_ids: Iterable[int], text_ids: Iterable[int] = (),
                 state_ids: Iterable[int] = (), number_ids: Iterable[int] = (), slider_ids: Iterable[int] = (),
                 one_file_ids: Iterable[int] = (), labels: dict[int, str] | None = None,
                 frame_ids: Iterable[int] = (), frame_chars: int = 0) -> None:
        self.guard = files
        self.file_ids, self.text_ids, self.state_ids = set(file_ids), set(text_ids), set(state_ids)
        self.number_ids, self.slider_ids = set(number_ids), set(slider_ids)  # (a number may be None, a slider not)
        self.one_file_ids, self.labels = set(one_file_ids), labels or {}
        self.frame_ids, self.frame_chars = set(frame_ids), frame_chars

    def problem(self, input_ids: list[int], data: Any, converted: bool = False) -> str | None:
        """Why the request must be refused (one line, nothing of its values), or None.
        ``converted``: Gradio converts the values before the handler (the event's ``preprocess``)."""
        if not isinstance(data, list) or len(data) != len(input_ids):
            return f"This event takes {len(input_ids)} values."
        for cid, value in zip(input_ids, data):
            if cid in self.state_ids:
                continue
            if cid in self.frame_ids:
                if not is_frame(value, self.frame_chars):
                    return REFUSED
                continue
            why = self.unconvertible(cid, value) if converted else None
            if why:
                return why
            if cid in self.file_ids:
                if not self.files_ok(value):
                    return REFUSED
                continue
            if list(file_objects(value)):
                return REFUSED
            limit = MAX_TEXT if cid in self.text_ids else MAX_VALUE
            if not (value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= limit)):
                return "A value of this request does not fit its control (too long, or not a plain value)."
        return None

    def unconvertible(self, cid: int, value: Any) -> str | None:
        """What Gradio's conversion of ``value`` for component ``cid`` would fail on, in words."""
        name = clip(self.labels.get(cid) or "This value", ECHO)
        if cid in self.slider_ids or (cid in self.number_ids and value is not None):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
                return f"{name} must be a number."
        if cid in self.one_file_ids and isinstance(value, list):
            return f"{name} takes one file, not a list."
        return None

    def files_ok(self, value: Any) -> bool:
        """A file input's value: nothing, one file object, or a short list of them, each naming
        a file the :class:`FileGuard` allows."""
        items = value if isinstance(value, list) else [value]
        if value is None or (isinstance(value, list) and not value):
            return True
        if len(items) > MAX_FILES or not all(isinstance(i, dict) for i in items):
            return False
        found = [f for i in items for f in file_objects(i)]
        return len(found) >= len(items) and all(self.guard.allows(f.get("path")) for f in found)


def example_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The example photos as real paths (what :class:`FileGuard` compares against)."""
    return [Path(_real(p)) for p in paths]
