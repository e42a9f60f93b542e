"""Work in a child process of its own: a native crash there (a segmentation fault in a compiled
library) fails that work with a plain message instead of ending the process that asked for it.

:func:`in_child` runs ``fn(*args)`` in a fresh interpreter (``spawn``: nothing of the caller's
threads or locks is copied) and returns its result; an exception the function raises is raised
again here; a child that dies (a signal, ``os._exit``) raises :class:`ChildDied`. While it
waits, the caller's time limit and cancel are checked (:func:`vit_demo.progress.check`): a job
stopped there kills the child. The function and its arguments must pickle (a module-level
function, arrays, lists).
"""

from __future__ import annotations

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


def in_child(work: Callable[..., Any], *args: Any, what: str = "The work") -> Any:
    """``fn(*args)`` in a child process (see the module docstring); ``what`` names the work in
    :class:`ChildDied`'s message."""
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run, args=(sender, work, args), daemon=True, name="vit_demo-child")
    proc.start()
    sender.close()  # the child holds the only writer: its death ends the pipe
    try:
        while not receiver.poll(POLL_S):
            check()
        try:
            ok, value = receiver.recv()
        except EOFError:
            proc.join(5)
            raise ChildDied(what, proc.exitcode) from None
    finally:
        if proc.is_alive():
            proc.join(1)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        receiver.close()
    if not ok:
        raise value
    return value
