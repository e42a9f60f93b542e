"""Progress on long work, wherever the user is looking.

Long loops say how far they are with :func:`report` (a share done and a few words, e.g.
``report(0.375, "masked forward passes", done=96, total=256)``); whoever started the work
decides where that goes with :func:`reporting`: a progress bar in the app, nothing in a test.
Work made of steps (a deck: slide after slide) gives each step its :func:`part` of the bar: the
step's own reports ("masked forward passes 96/236") then move the bar within that part, under
the step's name ("slide 7 of 9 · masked forward passes 96/236").
:func:`batches` is the command line's way: a tqdm bar on stderr over chunks of a list.

Long work can also be given a time limit (:func:`time_limit`): every :func:`report`, and every
:func:`check` (the app calls it before each forward pass of its models), then raises
:class:`TimeUp` once the time is up, and the work stops there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
Callback = Callable[[float, str], Any]  # (share done in [0, 1], what is being done, e.g. "masks 96/256")

_local = threading.local()


@contextmanager
def reporting(callback: Callback | None) -> Iterator[None]:
    """Within the block (on this thread), every :func:`report` calls ``callback(share, text)``.
    None: reports go nowhere. Blocks nest: the inner callback wins."""
    outer = getattr(_local, "callback", None)
    _local.callback = callback
    try:
        yield
    finally:
        _local.callback = outer


class TimeUp(RuntimeError):
    """Work that ran past its :func:`time_limit`; the message says so in words."""


@contextmanager
def time_limit(seconds: float | None, what: str = "This job") -> Iterator[None]:
    """Within the block (on this thread), :func:`check` and :func:`report` raise :class:`TimeUp`
    once ``seconds`` have passed (None or 0: no limit). An inner limit never extends an outer one."""
    outer = getattr(_local, "deadline", None)
    deadline = time.monotonic() + seconds if seconds else None
    if outer is not None and (deadline is None or outer[0] < deadline):
        deadline, what, seconds = outer
    _local.deadline = (deadline, what, seconds) if deadline is not None else None
    try:
        yield
    finally:
        _local.deadline = outer


def handed_over() -> tuple | None:
    """This thread's time limit, for the threads that do part of its work (:func:`under`). Not its
    :func:`reporting` callback: reports from several threads at once would make one bar jump about."""
    return getattr(_local, "deadline", None)


@contextmanager
def under(limit: tuple | None) -> Iterator[None]:
    """Within the block (on this thread), the time limit ``limit`` that :func:`handed_over` gave on
    another thread (None: none)."""
    outer = getattr(_local, "deadline", None)
    _local.deadline = limit
    try:
        yield
    finally:
        _local.deadline = outer


def check() -> None:
    """Raise :class:`TimeUp` if this thread's :func:`time_limit` has passed (cheap otherwise)."""
    limit = getattr(_local, "deadline", None)
    if limit is not None and time.monotonic() > limit[0]:
        raise TimeUp(f"{limit[1]} took longer than the {limit[2]:.0f} s a job may take on this app, and was stopped.")


def time_left() -> tuple[float, float] | None:
    """(seconds left, the limit's seconds) of this thread's :func:`time_limit`; None without one.
    Long work can say up front that it will not fit, instead of running to the limit."""
    limit = getattr(_local, "deadline", None)
    if limit is None:
        return None
    return limit[0] - time.monotonic(), limit[2]


def report(share: float, desc: str = "", done: int | None = None, total: int | None = None) -> None:
    """Tell the current :func:`reporting` callback (if any) that ``share`` of the work is done;
    the text is ``desc`` followed by ``done/total`` when they are given. Checks the time limit."""
    check()
    callback = getattr(_local, "callback", None)
    if callback is not None:
        text = f"{desc} {done}/{total}".strip() if done is not None and total is not None else desc
        callback(min(1.0, max(0.0, float(share))), text)


class Cancelled(Exception):
    """Raised inside the work by a :func:`reporting` callback when the user asked to stop."""


@contextmanager
def part(start: float, end: float, label: str) -> Iterator[None]:
    """Within the block (on this thread), the work's own reports fill ``start``..``end`` of the
    current callback's bar, their text after ``label``; the block begins by reporting ``start``.
    Outside any :func:`reporting` block it costs nothing."""
    outer = getattr(_local, "callback", None)
    if outer is None:
        yield
        return

    def inner(share: float, text: str) -> Any:
        return outer(start + (end - start) * share, f"{label} · {text}" if label and text and text != label
                     else text or label)

    outer(start, label)
    _local.callback = inner
    try:
        yield
    finally:
        _local.callback = outer


def batches(items: Sequence[T], size: int, desc: str = "", progress: bool = True) -> Iterator[Sequence[T]]:
    """``items`` in chunks of ``size``, with a tqdm bar (stderr) when there is more than one."""
    starts = range(0, len(items), size)
    bar = tqdm(starts, desc=desc, unit="batch", disable=not progress or len(starts) <= 1, leave=False)
    for i in bar:
        yield items[i : i + size]
