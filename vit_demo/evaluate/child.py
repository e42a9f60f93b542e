"""Work in a child process of its own: a native crash there (a segmentation fault in a compiled
library) fails that work with a plain message instead of ending the process that asked for it.

:func:`in_child` runs ``fn(*args)`` in a fresh interpreter (``spawn``: nothing of the caller's
threads or locks is copied) and returns its result; an exception the function raises is raised
again here; a child that dies (a signal, ``os._exit``) raises :class:`ChildDied`. While it
waits, the caller's time limit and cancel are checked (:func:`vit_demo.progress.check`): a job
stopped there kills the child. The function and its arguments must pickle (a module-level
function, arrays, lists).

:class:`Child` starts the process before its work is known, so that it imports what the work will
need (scikit-learn: 1.5 CPU-seconds, 21 s of wall time on the shared machine under a load of 16)
while the caller does something else (the survey: the model's passes); :func:`in_child` is a
child started for its work at once.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
from collections.abc import Callable
from typing import Any

from ..progress import check

POLL_S = 0.1  # how often the caller checks its time limit while the child works


class ChildDied(RuntimeError):
    """The child process ended without an answer (a crash in native code, killed)."""

    def __init__(self, what: str, code: int | None) -> None:
        if code is not None and code < 0:
            try:
                how = f"signal {-code}, {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit code {code}"
        super().__init__(f"{what} crashed (its process ended with {how}) and was stopped; the app goes on.")
        self.code = code


def _run(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        result: tuple[bool, Any] = (True, fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
        result = (False, e)
    try:
        conn.send(result)
    except Exception as e:  # noqa: BLE001 - an exception that does not pickle: its words
        conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))
    conn.close()


def _serve(conn: Any, preload: tuple[str, ...]) -> None:
    for name in preload:  # what the work will import, while the caller still works
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        fn, args = conn.recv()
    except EOFError:  # closed without work
        return
    _run(conn, fn, args)


class Child:
    """A child process started ahead of its work (see the module docstring): it imports the
    modules ``preload`` names, then runs the one function :meth:`run` sends it. Close it (or use it
    as a context manager) when the work is not sent after all."""

    def __init__(self, preload: tuple[str, ...] = (), what: str = "The work") -> None:
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe(duplex=True)
        self.what = what
        self.proc = ctx.Process(target=_serve, args=(theirs, preload), daemon=True, name="vit_demo-child")
        self.proc.start()
        theirs.close()  # the child holds the only other end: its death ends the pipe

    def run(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` in the child, the caller's time limit and cancel checked while it works."""
        try:
            try:
                self.conn.send((work, args))
                while not self.conn.poll(POLL_S):
                    check()
                ok, value = self.conn.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError):
                self.proc.join(5)
                raise ChildDied(self.what, self.proc.exitcode) from None
        finally:
            self.close()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End the child (if it still runs) and the pipe."""
        if self.proc.is_alive():
            self.proc.join(0.2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_child(work: Callable[..., Any], *args: Any, what: str = "The work") -> Any:
    """``fn(*args)`` in a child process (see the module docstring); ``what`` names the work in
    :class:`ChildDied`'s message."""
    return Child(what=what).run(work, *args)
