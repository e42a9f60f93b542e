"""Gradio's uploads while they arrive: a temp file open only while a chunk is written to it, and
removed as soon as its upload is cut or refused.

Gradio 6.31's multipart parser (``gradio.route_utils.GradioMultiPartParser``) writes each file of
an upload to a ``NamedTemporaryFile`` as its bytes arrive, open until the whole upload is in: an
upload in progress held its socket and an open file, so the all-clients cap on connections
(:mod:`vit_demo.app.server.connections`) was no cap on files. 7 addresses x 100 uploads sent at
17 KB/s (within the body rate) took 1,024 of a file limit of 1,024 ("Too many open files", 169
uploads answered 500); and the temp file of an upload whose client left, or that the gate cut
(:mod:`vit_demo.app.server.middleware`), was never removed: 575 files, 585 MiB, kept until the
app exits. :func:`spool_uploads` makes the parser's temp files :class:`SpoolFile`: opened to
append each chunk and closed again (an upload in progress holds no file between chunks), and
removes every temp file of an upload (``gradio.routes.upload_fn``) that ends in an error.
Seams of Gradio 6.31 (``route_utils.NamedTemporaryFile``, ``routes.upload_fn``); where they are
missing, nothing changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import tempfile
from typing import Any

import gradio.route_utils as route_utils
import gradio.routes as routes

_MADE: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("spooled_uploads", default=None)


class SpoolFile:
    """A temp file that the parser writes in chunks, open only while one is written (and read)."""

    def __init__(self, folder: str | os.PathLike | None = None, suffix: str | None = None,
                 prefix: str | None = None) -> None:
        fd, self.name = tempfile.mkstemp(suffix=suffix, prefix=prefix, dir=folder)
        os.close(fd)
        self.pos, self.closed = 0, False
        made = _MADE.get()
        if made is not None:
            made.append(self.name)

    def write(self, data: bytes) -> int:
        with open(self.name, "r+b") as f:
            f.seek(self.pos)
            n = f.write(data)
        self.pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        with open(self.name, "rb") as f:
            f.seek(self.pos)
            data = f.read(size)
        self.pos += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        end = os.path.getsize(self.name)
        self.pos = max(0, {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: end}[whence] + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> SpoolFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def spool_file(mode: str = "w+b", buffering: int = -1, encoding: str | None = None, newline: str | None = None,
               suffix: str | None = None, prefix: str | None = None, dir: str | None = None,  # noqa: A002
               delete: bool = True, **kwargs: Any) -> Any:
    """``tempfile.NamedTemporaryFile`` as the parser calls it (binary, ``delete=False``): a
    :class:`SpoolFile`; any other call: the real one."""
    if delete or "b" not in mode:
        return tempfile.NamedTemporaryFile(mode, buffering, encoding, newline, suffix, prefix, dir, delete, **kwargs)
    return SpoolFile(dir, suffix, prefix)


def removing_on_error(upload_fn: Any) -> Any:
    """Gradio's ``upload_fn`` that removes the temp files it made when it ends in an error (the
    client left, the gate cut it, the body came too slowly, a bad name): a file already moved
    into Gradio's cache is a finished upload's, and stays."""

    @functools.wraps(upload_fn)
    async def upload(*args: Any, **kwargs: Any) -> Any:
        made: list[str] = []
        token = _MADE.set(made)
        try:
            return await upload_fn(*args, **kwargs)
        except BaseException:
            for name in made:
                with contextlib.suppress(OSError):
                    os.unlink(name)
            raise
        finally:
            _MADE.reset(token)

    upload.spooled = True
    return upload


def spool_uploads() -> bool:
    """Gradio's uploads from now on as the module docstring says; False where this Gradio has
    not these seams."""
    if not hasattr(route_utils, "NamedTemporaryFile") or not hasattr(routes, "upload_fn"):
        return False
    route_utils.NamedTemporaryFile = spool_file
    if not getattr(routes.upload_fn, "spooled", False):
        routes.upload_fn = removing_on_error(routes.upload_fn)
    return True
