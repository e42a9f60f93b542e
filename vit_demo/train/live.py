"""A training run in a child process of its own, reported as it goes (the app's Train tab).

:class:`LiveRun` starts :func:`vit_demo.train.loop.run` in a fresh interpreter (``spawn``: nothing of
the caller's threads or locks is copied) with its own torch thread count and the snapshots
:class:`~vit_demo.train.snapshots.Recorder` as its ``on_epoch`` hook, and the child sends what
happens through a pipe: ``("log", line)``, ``("epoch", {"row", "epochs"})`` after every epoch,
``("frame", {"path", "snapshot", ...})`` for every snapshot, then ``("done", {...})`` or
``("error", message)``. The caller reads them with :meth:`LiveRun.events` and stops the run at once
with :meth:`LiveRun.stop` (the child is killed: nothing of it runs on). The child watches its
parent and its deadline: when the parent is gone (killed) or the deadline has passed, it ends
itself, so no run outlives the app that started it nor its time limit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .loop import TrainOptions, run
from .snapshots import Recorder

WATCH_S = 0.5  # how often the child looks at its parent and its deadline
PARENT_GONE, PAST_DEADLINE = 3, 4  # the child's exit codes when it ends itself


def watch(parent: int, deadline: float) -> None:
    """In the child: end the process when ``parent`` is no longer its parent or at ``deadline``
    (``time.monotonic()``)."""
    def run() -> None:
        while True:
            time.sleep(WATCH_S)
            if os.getppid() != parent:
                os._exit(PARENT_GONE)
            if time.monotonic() > deadline:
                os._exit(PAST_DEADLINE)

    threading.Thread(target=run, daemon=True, name="vit_demo-train-watch").start()


def child(conn: Any, opts: TrainOptions, snapshots: str, every: int | None, threads: int, seconds: float,
          parent: int, cwd: str | None = None) -> None:
    """The child process: train as ``opts`` says (its paths relative to ``cwd`` when given), telling
    ``conn`` as it goes (the module docstring)."""
    watch(parent, time.monotonic() + seconds)
    if cwd is not None:
        os.chdir(cwd)
    import torch

    torch.set_num_threads(max(1, threads))

    def send(kind: str, data: Any) -> None:
        conn.send((kind, data))

    def on_frame(path: Path, snap: Any) -> None:
        first = len(rec.frames) == 1
        send("frame", {"path": str(path), "snapshot": snap, "pictures": rec.pictures if first else None,
                       "names": rec.names if first else None})

    rec = Recorder(snapshots, every, on_frame=on_frame)

    def on_epoch(s: Any, row: dict[str, Any], model: Any) -> None:
        if row["epoch"] > 0:
            send("epoch", {"row": dict(row), "epochs": int(s.recipe.epochs)})
        rec(s, row, model)

    try:
        summary = run(replace(opts, on_epoch=on_epoch, progress=False), lambda m: send("log", m))
        send("done", {"summary": summary, "frames": [str(p) for p in rec.frames],
                      "pictures": [str(p) for p in rec.picture_files()]})
    except BaseException as e:  # noqa: BLE001 - told to the parent, in words
        send("error", str(e) or type(e).__name__)
    finally:
        conn.close()


class LiveRun:
    """One training in a child process (the module docstring). ``seconds``: the child's own time
    limit, from its start; ``threads``: its torch threads; ``every``: epochs between snapshots
    (default: about ten over the run); ``cwd``: the child's working folder (``opts``' paths may be
    relative to it: then the log, the summary and the checkpoint's metadata name no server folder)."""

    def __init__(self, opts: TrainOptions, snapshots: str | os.PathLike, seconds: float, threads: int = 1,
                 every: int | None = None, cwd: str | os.PathLike | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.receiver, sender = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=child, args=(sender, opts, str(Path(snapshots).resolve()), every, threads,
                                                    seconds, os.getpid(), None if cwd is None else str(cwd)),
                                daemon=True, name="vit_demo-train")
        self.proc.start()
        sender.close()  # the child holds the only writer: its death ends the pipe
        self.ended = False

    def events(self, timeout: float = 0.25) -> list[tuple[str, Any]]:
        """What the child has said since the last call (waiting up to ``timeout`` for the first);
        a child that died without a word: ``("error", why)``."""
        out: list[tuple[str, Any]] = []
        if self.ended:
            return out
        try:
            if self.receiver.poll(timeout):
                while not self.ended and self.receiver.poll(0):
                    out.append(self.receiver.recv())
                    self.ended = out[-1][0] in ("done", "error")  # its last word: the pipe closes after it
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            why = {PARENT_GONE: "its app went away", PAST_DEADLINE: "it ran past its time limit"}.get(code)
            out.append(("error", f"the training stopped ({why or f'its process ended with code {code}'})"))
            self.ended = True
        return out

    def stop(self) -> None:
        """End the child now (killed if it is still running) and close the pipe."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.receiver.close()
        self.ended = True

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
