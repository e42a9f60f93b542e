"""A training run in a child process of its own, reported as it goes (the app's Train tab).

:class:`LiveRun` starts :func:`vit_demo.train.loop.run` in a child process with its own torch
thread count and the snapshots :class:`~vit_demo.train.snapshots.Recorder` as its ``on_epoch``
hook. The child is forked from a fork server (:func:`start_server`): a process started fresh (no
thread or lock of the app's is copied into it) that has imported PyTorch and this package once,
so that a run starts in a fraction of a second instead of importing them again (4 to 12 s on
2 busy cores); where there is no fork server (Windows), a fresh interpreter (``spawn``).

The child sends what happens through a pipe: ``("stage", {"text", "share"})`` as it prepares
and trains (:mod:`vit_demo.progress` reports: "decoding the pictures 480/1797", "choosing the
input size: timing a step at 64 px (3 of 5 sizes)", "epoch 3: step 12 of 22"; at most a few a
second), ``("log", line)``, ``("plan", {"epochs", "eta_s", "budgeted"})`` when the run has its
plan (before the first epoch), ``("epoch", {"row", "epochs", "eta_s", "budgeted"})`` after every
epoch (``eta_s``: the seconds the epochs left take at the run's pace, the one estimate of the run's
end), ``("frame", {"path", "snapshot", ...})`` for every snapshot, then ``("done", {...})`` or
``("error", message)``. The caller reads them with :meth:`LiveRun.events` and stops the run at once
with :meth:`LiveRun.stop` (the child is killed: nothing of it runs on). The child watches its
parent (a pipe that closes when the parent ends) and its deadline: when the parent is gone or
the deadline has passed, it ends itself, so no run outlives the app that started it nor its time
limit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..progress import reporting
from .loop import TrainOptions, run
from .snapshots import Recorder

WATCH_S = 0.5  # how often the child looks at its parent and its deadline
STAGE_S = 0.25  # the child tells of a stage at most this often (a new stage at once)
PARENT_GONE, PAST_DEADLINE = 3, 4  # the child's exit codes when it ends itself
PRELOAD = ["vit_demo.train.live", "torch._dynamo"]  # what the fork server imports once (torch's optimisers import
# torch._dynamo when the first one is made: seconds a run would spend)


def start_method() -> str:
    """``forkserver`` where the platform has it (Linux, macOS), else ``spawn``."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def start_server() -> None:
    """Start the fork server and have it import :data:`PRELOAD` (in the background: it returns at
    once), so that the first run starts without waiting for them; the app calls it at start-up. A
    no-op without a fork server or when it runs already."""
    if start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


def watch(alive: Any, deadline: float) -> None:
    """In the child: end the process when ``alive`` (the read end of a pipe whose write end only the
    parent holds) reports its end, i.e. the parent is gone, or at ``deadline`` (``time.monotonic()``)."""
    def run() -> None:
        while True:
            try:
                gone = alive.poll(WATCH_S)
            except (EOFError, OSError):
                gone = True
            if gone:
                os._exit(PARENT_GONE)
            if time.monotonic() > deadline:
                os._exit(PAST_DEADLINE)

    threading.Thread(target=run, daemon=True, name="vit_demo-train-watch").start()


def stage_sender(send: Any) -> Any:
    """A :func:`~vit_demo.progress.reporting` callback that sends ``("stage", {"text", "share"})``:
    a new stage at once, the same stage's counts at most every :data:`STAGE_S`."""
    last = [0.0, ""]

    def stage(share: float, text: str) -> None:
        kind, now = re.sub(r"\d+", "#", text), time.monotonic()
        if kind != last[1] or now - last[0] >= STAGE_S:
            last[0], last[1] = now, kind
            send("stage", {"text": text, "share": share})
    return stage


def plan_of(s: Any, done: int) -> dict[str, Any]:
    """What the page is told of the run's plan after ``done`` epochs: the epochs, the seconds the
    ones left take at the run's pace, and whether a time budget sets them (they may change)."""
    epochs = int(s.recipe.epochs)
    eta = None if s.pace_s is None else s.pace_s * max(0, epochs - done)
    return {"epochs": epochs, "eta_s": eta, "budgeted": bool(s.budgeted)}


def child(conn: Any, opts: TrainOptions, snapshots: str, every: int | None, threads: int, seconds: float,
          alive: Any, cwd: str | None = None) -> None:
    """The child process: train as ``opts`` says (its paths relative to ``cwd`` when given), telling
    ``conn`` as it goes (the module docstring)."""
    watch(alive, time.monotonic() + seconds)
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
            send("epoch", {"row": dict(row), **plan_of(s, int(row["epoch"]))})
        else:
            send("plan", plan_of(s, 0))
            send("stage", {"text": "the untrained model's snapshot", "share": 0.0})
        rec(s, row, model)

    try:
        with reporting(stage_sender(send)):
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
        start_server()
        ctx = mp.get_context(start_method())
        self.receiver, sender = ctx.Pipe(duplex=False)
        alive, self.alive = ctx.Pipe(duplex=False)  # the child reads; only this process holds the writer
        self.proc = ctx.Process(target=child, args=(sender, opts, str(Path(snapshots).resolve()), every, threads,
                                                    seconds, alive, None if cwd is None else str(cwd)),
                                daemon=True, name="vit_demo-train")
        self.proc.start()
        sender.close()  # the child holds the only writer: its death ends the pipe
        alive.close()
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
        self.alive.close()
        self.ended = True

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
