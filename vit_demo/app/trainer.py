"""A training from the page or the API (the Train tab, ``/train``): a small ViT from scratch on a
built-in set or a zip of class folders, for a budget of minutes, watched as it learns.

:func:`train_steps` runs one: the request checked (:func:`check_request`: training on at all, the
minutes within ``--train-minutes-max``, the data named), ONE training at a time on the whole
server (:data:`TRAIN_BUSY` at once for a second one, whoever asks), the pictures taken in a new
export folder (a zip under the Whole folder tab's rules, :func:`vit_demo.app.uploads.received`;
a built-in set written once per app), then ``train`` in a child process of its own
(:class:`vit_demo.train.live.LiveRun`: forked from a fork server that has PyTorch imported, which
:func:`get_ready` starts when the Train tab opens; its own torch threads, killed at once on
Cancel, past its time limit or when the page goes) while this thread turns its messages into
:class:`Progress` for the page, a few times a second: what the child is doing as it prepares,
then the epoch of its plan and its one ETA. At the end: the snapshots as a filmstrip, a GIF and an MP4,
the checkpoint on the session's own model menu (:meth:`vit_demo.app.registry.ModelRegistry.add_trained`)
and the run as a :class:`Trained` record. Everything a run writes is in its export folder, within
the exports' disk budget; a run that fails, is cancelled or is stopped leaves nothing (the folder
goes, the child is killed, nothing joins the menu); a finished one goes with its session
(:func:`forget`) or after :data:`KEEP_S`, whichever comes first.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .. import viz
from ..present.animate import write_slideshow
from ..progress import TimeUp, check, report
from ..train.budget import format_eta
from ..train.builtin import MAKERS, WORDS, ensure
from ..train.live import LiveRun, start_server
from ..train.loop import STATE_SUFFIX, TrainOptions
from ..train.snapshots import FILM_TILE, Snapshot, filmstrip
from ..viz.charts import training_figure
from .context import Context
from .exports import EXPORT_AGE_S, export_dir, within_budget
from .registry import ModelRegistry
from .server.guard import InputError
from .server.workspace import workspace
from .uploads import drop_oversized, received

DATASETS = (*MAKERS, "zip")  # what a training may learn: a built-in set, or the user's zip of class folders
MIN_MINUTES = 0.05  # the shortest budget /train takes (3 s: tests); the page's slider starts at 1
KEEP_S = EXPORT_AGE_S  # a finished run's files and menu entry stay this long at most (exports go after it)
SLIDE_TILE = 128  # px: a map in the filmstrip to download (for slides)
POLL_S = 0.25  # how often the child's messages are read (and Cancel and the time limit checked)
TRAIN_OFF = ("Training is off on this app: it is open to other computers. Whoever runs it can turn it on with "
             "--train-minutes-max N.")
TRAIN_BUSY = ("A model is being trained on this app already (one training at a time on the whole server): "
              "try again when it has finished.")
_LOCK = threading.Lock()  # one training at a time, server-wide
_RUNS: dict[str, tuple[str, float]] = {}  # registry key -> (run folder, when it finished): what forget_old sweeps
_RUNS_LOCK = threading.Lock()


def time_limit_s(minutes: float) -> float:
    """The wall-clock limit of a run of ``minutes``: twice its budget and three minutes more (the
    child's start, the data, the pixel baseline, the files; a busy machine)."""
    return 120 * minutes + 180


def check_request(ctx: Context, dataset: Any, minutes: Any, zip_file: Any) -> tuple[str, float]:
    """``(dataset, minutes)`` of a request, or :class:`InputError` with one plain line."""
    top = ctx.cfg.limits.train_minutes
    if top <= 0:
        raise InputError(TRAIN_OFF)
    if dataset not in DATASETS:
        raise InputError(f"dataset: choose one of {', '.join(DATASETS)}")
    try:
        m = float(minutes)
    except (TypeError, ValueError):
        raise InputError("minutes: give a number of minutes") from None
    if not MIN_MINUTES <= m <= top:
        raise InputError(f"minutes: from {MIN_MINUTES:g} to {top:g} on this app")
    if dataset == "zip" and not zip_file:
        raise InputError("dataset 'zip' needs a zip of class folders (one folder of pictures per class)")
    if dataset != "zip" and zip_file:
        raise InputError(f"a zip was given with dataset '{dataset}': give dataset 'zip' to train on it")
    return dataset, m


# ----------------------------------------------------------------------------- while it runs


@dataclass
class Progress:
    """What the page shows of a run while it goes: the bar's words (:meth:`text`: the stage, or the
    epoch, the plan and the one ETA) and the line of findings under it (:meth:`status`)."""

    dataset: str
    minutes: float
    started: float = field(default_factory=time.monotonic)
    stage: str = "starting the training process"  # what the child is doing now (its "stage" messages)
    stage_share: float = 0.0  # ... and how far into it (an epoch's steps)
    said: str = ""  # the child's last log line before the epochs (the size it chose, the data, the model)
    history: list[dict[str, float]] = field(default_factory=list)
    epochs: int = 0  # planned (a budgeted run's plan may change: "about")
    budgeted: bool = True
    eta_s: float | None = None  # the child's estimate of the epochs left, in seconds ...
    eta_at: float = 0.0  # ... made at this time (time.monotonic())
    frames: list[tuple[str, str]] = field(default_factory=list)  # (PNG, caption)
    snaps: list[Snapshot] = field(default_factory=list)
    pictures: list[Any] = field(default_factory=list)  # the fixed validation pictures (uint8 arrays)
    names: list[str] = field(default_factory=list)
    finishing: bool = False

    def take(self, kind: str, data: Any) -> None:
        """One message of the child (:mod:`vit_demo.train.live`)."""
        if kind == "stage":
            self.stage, self.stage_share = str(data["text"])[:200], float(data.get("share") or 0.0)
        elif kind == "log" and not self.history:
            self.said = str(data).splitlines()[0][:300]
        elif kind in ("plan", "epoch"):
            if kind == "epoch":
                self.history.append(data["row"])
                self.stage_share = 0.0
            self.epochs, self.budgeted = int(data["epochs"]), bool(data.get("budgeted", True))
            self.eta_s, self.eta_at = data.get("eta_s"), time.monotonic()
            self.finishing = bool(self.history) and self.history[-1]["epoch"] >= self.epochs
        elif kind == "frame":
            snap = data["snapshot"]
            if data.get("pictures") is not None:
                self.pictures, self.names = list(data["pictures"]), list(data["names"])
            self.snaps.append(snap)
            self.frames.append((data["path"], "before training" if snap.epoch == 0 else f"epoch {snap.epoch}"))

    @property
    def share(self) -> float:
        """The bar: the first 10 % while the process starts and prepares, then the epochs (and the
        steps of the one under way), the last few % for the files."""
        if self.finishing:
            return 0.97
        if not self.epochs or not self.stage.startswith("epoch "):
            return min(0.1, 0.1 * (time.monotonic() - self.started) / max(1.0, 60 * self.minutes))
        return 0.1 + 0.85 * min(1.0, (len(self.history) + self.stage_share) / self.epochs)

    def eta(self) -> str:
        """The one ETA: the child's estimate of the epochs left at the run's pace, counted down since
        it came; "" before the run has a plan."""
        if self.eta_s is None:
            return ""
        return format_eta(max(0.0, self.eta_s - (time.monotonic() - self.eta_at)))

    def plan(self) -> str:
        """``epoch 5 of about 45``: the epoch under way, and "about" while a time budget may still
        change the plan (the first epoch re-plans it, a later one only shortens it: not the last)."""
        now = min(len(self.history) + 1, self.epochs)
        about = "about " if self.budgeted and (not self.history or now < self.epochs) else ""
        return f"epoch {now} of {about}{self.epochs}"

    def text(self) -> str:
        """The bar's words: what is being done; in the epochs, the plan and the time left."""
        if self.finishing:
            what = self.stage.removeprefix("finishing: ") if self.stage.startswith("finishing") else \
                "the baseline, the checkpoint and the files"
            return f"finishing: {what}"
        if not self.epochs:
            return f"preparing: {self.stage}"
        eta = self.eta()
        if not self.stage.startswith("epoch ") and not self.history:
            planned = f"about {self.epochs} epoch{'s' if self.epochs != 1 else ''} planned"
            return f"preparing: {self.stage} · {planned}" + (f", about {eta}" if eta else "")
        if not eta:
            return self.plan()
        return f"{self.plan()} · " + ("any moment now" if eta == "0:00" else f"about {eta} left")

    def status(self) -> str:
        """The line under the bar: what the run found before it trained (the size, the data, the
        model), then the last epoch's accuracy and loss (the epochs and the time left are the bar's)."""
        if not self.history:
            return f"*{self.said}*" if self.said else ""
        h = self.history[-1]
        acc = h.get("val_accuracy")
        acc_words = f"validation accuracy **{acc:.1%}**" if acc is not None and acc == acc else "no validation pictures"
        return f"after epoch {h['epoch']}: {acc_words} · train loss {h['train_loss']:.3f}"

    def curves(self) -> Image.Image | None:
        if not self.history:
            return None
        return viz.figure_to_image(training_figure(self.history, title=f"{self.dataset}: training as it goes"), 900)

    def strip(self, tile: int = FILM_TILE) -> Image.Image | None:
        return filmstrip(self.pictures, self.snaps, tile=tile) if self.snaps and self.pictures else None


@dataclass
class Trained:
    """A finished run: its model's menu key, its folder, the summary (``train --json``'s) and its files."""

    key: str
    folder: str
    summary: dict[str, Any]
    checkpoint: str
    gif: str
    mp4: str
    filmstrip: str
    frames: list[str]
    pictures: list[str]  # the fixed validation pictures as PNGs (to open in the other tabs)

    @property
    def files(self) -> list[str]:
        """What ``/train`` returns: the checkpoint, the GIF, the MP4, the filmstrip and the frames."""
        return [self.checkpoint, self.gif, self.mp4, self.filmstrip, *self.frames]


# ----------------------------------------------------------------------------- the run


def datasets_folder() -> Path:
    """Where the built-in sets are written, once per app (not served, not in the exports)."""
    return workspace().root / "datasets"


_READY = threading.Event()  # get_ready() has begun


def get_ready() -> None:
    """What lets the first run start sooner, begun in the background (it returns at once) the first
    time the Train tab opens: the fork server started with PyTorch imported
    (:func:`vit_demo.train.live.start_server`), and the built-in sets written. A run that comes first
    does both itself."""
    if _READY.is_set():
        return
    _READY.set()

    def work() -> None:
        with contextlib.suppress(Exception):  # the run does it again and says what fails
            start_server()
            for name in MAKERS:
                ensure(name, datasets_folder())

    threading.Thread(target=work, daemon=True, name="vit_demo-train-ready").start()


@contextlib.contextmanager
def run_folder(ctx: Context, dataset: str, files: Any) -> Iterator[tuple[Path, Path, list[str]]]:
    """``(the run's new export folder, the pictures, notes)``; the folder goes if the run fails."""
    if dataset == "zip":
        with received(ctx, files if isinstance(files, list) else [files]) as (out, pics, notes):
            yield out, pics, notes + drop_oversized(pics, ctx.cfg.limits)  # the child reads them whole
        return
    out = export_dir()
    try:
        link = out / dataset  # the set, under its own name in the run's folder (the run names no server folder)
        link.symlink_to(ensure(dataset, datasets_folder()), target_is_directory=True)
        yield out, link, []
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def train_steps(ctx: Context, dataset: Any, minutes: Any, files: Any = None) -> Generator[Progress, None, Trained]:
    """One training (the module docstring): yields its :class:`Progress` as it goes, returns the
    :class:`Trained` run. Reports to :mod:`vit_demo.progress` (a Cancel or the time limit stops it
    there); raises :class:`InputError` with one plain line for a refusal or a failed run."""
    dataset, minutes = check_request(ctx, dataset, minutes, files)
    if not _LOCK.acquire(blocking=False):
        raise InputError(TRAIN_BUSY)
    try:
        forget_old(ctx.reg)
        prog = Progress(dataset, minutes)
        report(0.0, "preparing: unpacking the zip and checking its pictures" if dataset == "zip" else
               f"preparing: the {dataset} (written once on this computer)")
        with run_folder(ctx, dataset, files) as (out, pics, notes):
            name = "digits" if dataset == "digits" else "shapes" if dataset == "shapes" else "my-zip"
            ckpt = out / f"{name}-vit.safetensors"
            # paths relative to the run's folder: the log, the summary and the checkpoint name no server folder
            opts = TrainOptions(data=pics.name, out=ckpt.name, minutes=minutes, device=ctx.cfg.device, seed=0)
            live = LiveRun(opts, out / "snapshots", time_limit_s(minutes) + 30, torch.get_num_threads(), cwd=out)
            done = yield from follow(live, prog, out, time_limit_s(minutes))
            return finish(ctx, prog, done, ckpt, name, notes)
    finally:
        _LOCK.release()


def follow(live: LiveRun, prog: Progress, out: Path, seconds: float) -> Generator[Progress, None, dict[str, Any]]:
    """Read the child's messages into ``prog`` until it is done (yielding after each read that
    changed something) and return its last one; the child is killed whatever happens."""
    deadline = time.monotonic() + seconds
    done = None
    with live:
        while done is None:
            events = live.events(POLL_S)
            for kind, data in events:
                if kind == "error":
                    raise InputError(f"The training failed: {str(data).replace(str(out), 'the upload')[:400]}")
                if kind == "done":
                    done = data
                prog.take(kind, data)
            report(prog.share, prog.text())
            if time.monotonic() > deadline:
                raise TimeUp(f"The training took longer than the {seconds:.0f} s it may take on this app, and was stopped.")
            if events:
                yield prog
    return done


def finish(ctx: Context, prog: Progress, done: dict[str, Any], ckpt: Path, name: str, notes: list[str]) -> Trained:
    """The files of a finished run (filmstrip, GIF, MP4), its model on the menu, its record."""
    out = ckpt.parent
    report(0.97, "finishing: writing the GIF and the MP4")
    Path(str(ckpt) + STATE_SUFFIX).unlink(missing_ok=True)  # resuming is the CLI's: the state goes
    frames = [Path(p) for p in done["frames"]]
    gif, mp4 = write_slideshow(frames, out / "snapshots" / f"{name}-snapshots")
    strip = out / "snapshots" / f"{name}-filmstrip.png"
    prog.strip(tile=SLIDE_TILE).save(strip)
    check()
    summary = dict(done["summary"])
    best = summary.get("best_val_accuracy")
    label = f"{name} · trained here" + (f" ({best:.1%} on validation)" if best is not None else "")
    spec = ctx.reg.add_trained(ckpt, label)
    with _RUNS_LOCK:
        _RUNS[spec.key] = (str(out), time.time())
    summary.update({"out": ckpt.name, "model": spec.key, "data": name, "notes": notes,
                    "snapshots": {"epochs": [s.epoch for s in prog.snaps], "frames": [p.name for p in frames],
                                  "filmstrip": strip.name, "gif": gif.name, "mp4": mp4.name}})
    within_budget()
    return Trained(spec.key, str(out), summary, str(ckpt), str(gif), str(mp4), str(strip), [str(p) for p in frames],
                   list(done["pictures"]))


def run_to_end(steps: Generator[Progress, None, Trained]) -> Trained:
    """Drive :func:`train_steps` without a page (``/train``): its final record."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


# ----------------------------------------------------------------------------- when the session ends


def forget(reg: ModelRegistry, runs: Any) -> None:
    """A session's runs leave: their models off the menu and out of memory, their folders removed
    (the ``delete_callback`` of the session's state of runs)."""
    for run in runs or []:
        if isinstance(run, Trained):
            reg.remove(run.key)
            shutil.rmtree(run.folder, ignore_errors=True)
            with _RUNS_LOCK:
                _RUNS.pop(run.key, None)


def forget_old(reg: ModelRegistry, keep_s: float = KEEP_S) -> int:
    """Runs older than ``keep_s`` leave too (a session Gradio dropped without telling); returns how many."""
    now = time.time()
    with _RUNS_LOCK:
        old = [(k, f) for k, (f, t) in _RUNS.items() if now - t > keep_s]
        for k, _ in old:
            _RUNS.pop(k, None)
    for key, folder in old:
        reg.remove(key)
        shutil.rmtree(folder, ignore_errors=True)
    return len(old)


def dataset_choices() -> list[tuple[str, str]]:
    """The data menu: the built-in sets in words, then the user's zip."""
    return [(f"{n}: {WORDS[n]}", n) for n in MAKERS] + [("my own zip of class folders (one folder per class)", "zip")]
