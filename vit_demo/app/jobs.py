"""Long actions (the deck, RISE, causal LRP, animations, side by side, timm): a button, a
progress bar right under it, and a cancel button.

:class:`LongAction` lays them out and wires them. A click at once (no queue) disables the button,
shows the bar and the cancel button; then the work runs in a worker thread while the event's
handler, a generator, reads its :mod:`vit_demo.progress` reports and redraws the bar ("slide 3
of 9", "masks 96/256") a few times a second. The pictures on the page stay as they are (no
"processing" veil: ``show_progress="hidden"``) until the new ones arrive in one update, with the
button enabled again. Cancel tells the worker, whose next report raises
:class:`~vit_demo.progress.Cancelled`, so the work ends within a second instead of running on
unseen; the run's event then ends, and only then does the page say "Stopped." and take clicks.

Every long action runs in the slow lane (:mod:`vit_demo.app.server.lanes`: one job per client, its own
number of jobs at a time) and its work under the slow lane's time limit, with room for its working
memory in the analyses' budget: :meth:`Job.run` is the one place every long action's work runs.
A training (the Train tab) runs in a lane of its own, under its own time limit, without that room
(its work is in a child process), and shows more than the bar while it runs: its work is a
generator whose every ``yield`` of ``{component: value}`` reaches the page at the next redraw
(the curves, the snapshots), and whose ``return`` is the final update.
"""

from __future__ import annotations

import contextlib
import html
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from ..progress import Cancelled, reporting, time_limit
from .common import readable_error
from .context import Component, Context

POLL_S = 0.25  # how often the bar is redrawn while the work runs
CANCEL_WAIT_S = 10.0  # at most this long, Cancel waits for the work to stop
_RUNNING: dict[tuple[str, str], Job] = {}  # (browser session, button) -> its job, while it runs
_RUNNING_LOCK = threading.Lock()


class Job:
    """Work running in a thread, its progress and its outcome."""

    def __init__(self, work: Callable[[], Any], seconds: float | None = None,
                 room: Callable[[], Any] | None = None) -> None:
        self.work, self.seconds, self.room = work, seconds, room
        self.share, self.text = 0.0, "starting"
        self.result: Any = None
        self.live: dict = {}  # updates a generator's work yielded, not shown yet
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.done = threading.Event()  # the work has finished (or failed, or stopped)
        self.ended = threading.Event()  # ... and the event that shows it too
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="vit_demo-job", daemon=True)

    def report(self, share: float, text: str) -> None:
        if self.stop.is_set():
            raise Cancelled("stopped by the user")
        self.share, self.text = share, text

    def run(self) -> None:
        try:
            room = self.room() if self.room is not None else contextlib.nullcontext()
            with time_limit(self.seconds), room, reporting(self.report):
                out = self.work()
                self.result = self.follow(out) if inspect.isgenerator(out) else out
        except BaseException as e:  # noqa: BLE001 - handed to the event's handler, which shows it
            self.error = e
        finally:
            self.done.set()


    def follow(self, gen: Any) -> Any:
        """Run a generator's work: each update it yields is kept for the page; its return value is the result."""
        while True:
            try:
                update = next(gen)
            except StopIteration as stop:
                return stop.value
            with self.lock:
                self.live.update(update or {})

    def take_live(self) -> dict:
        """The updates yielded since the last call."""
        with self.lock:
            out, self.live = self.live, {}
        return out


def bar_html(share: float, text: str) -> str:
    """The progress bar: a filled track, the step in words and the percentage."""
    pct = max(0, min(100, round(100 * share)))
    words = html.escape(text[:1].upper() + text[1:]) if text else ""
    return (f'<div class="job-bar" role="progressbar" aria-valuemin="0" aria-valuemax="100" aria-valuenow="{pct}">'
            f'<div class="job-fill" style="width: {pct}%"></div>'
            f'<span class="job-text">{words} · {pct}%</span></div>')


class LongAction:
    """A button for work over about a second, with its progress bar and cancel button."""

    def __init__(self, label: str, elem_id: str, variant: str = "secondary", size: str = "md",
                 waiting: str = "waiting for the model", min_width: int = 160, seconds: float | None = None,
                 room: bool = True) -> None:
        """``seconds``: the work's time limit (default: the slow lane's); ``room``: whether the work
        needs room in the analyses' memory budget (work in a child process does not)."""
        self.label, self.elem_id, self.variant, self.size, self.waiting = label, elem_id, variant, size, waiting
        self.min_width, self.seconds, self.room = min_width, seconds, room

    def layout(self) -> None:
        with gr.Row(elem_classes="job-row"):
            self.btn = gr.Button(self.label, elem_id=self.elem_id, variant=self.variant, size=self.size, scale=0,
                                 min_width=self.min_width)
            self.cancel = gr.Button("✕ Cancel", elem_id=f"{self.elem_id}-cancel", variant="stop", size="sm",
                                    visible=False, scale=0, min_width=90)
        self.bar = gr.HTML("", elem_id=f"{self.elem_id}-progress", elem_classes="job-progress")

    def idle(self, note: str = "") -> dict:
        return {self.btn: gr.update(interactive=True), self.cancel: gr.update(visible=False), self.bar: note}

    def wire(self, ctx: Context, work: Callable[..., dict], inputs: list[Component], outputs: list[Component],
             preprocess: bool = True, lane: dict | None = None) -> Any:
        """On a click: ``work(*values of inputs)`` -> ``{component: value}`` for ``outputs``, in a
        worker thread (a generator: its yields shown as it goes, its return at the end).
        ``preprocess``: Gradio's checks of the inputs (off: the raw values, e.g. a menu's value
        that an upload is changing). ``lane``: the event's lane (default the slow lane).
        Returns the event (to chain on)."""
        me = [self.btn, self.cancel, self.bar]

        def busy():
            return {self.btn: gr.update(interactive=False), self.cancel: gr.update(visible=True),
                    self.bar: bar_html(0, self.waiting)}

        start = self.btn.click(busy, None, me, queue=False, api_visibility="private", show_progress="hidden")
        # "multiple": a click right after a Cancel goes through (the slow lane's door still allows
        # each client one job at a time)
        run = start.then(self.handler(ctx, work), inputs, [*outputs, *me], api_visibility="private",
                         show_progress="hidden", preprocess=preprocess, trigger_mode="multiple",
                         **(ctx.slow if lane is None else lane))

        def on_cancel(request: gr.Request):
            """Stop the work (at its next report) and wait until its event has ended, so that the
            next click is not refused as this client's second slow job. No Gradio ``cancels``:
            its cancel names the event, not the run, and could stop the next click's run."""
            with _RUNNING_LOCK:
                job = _RUNNING.get((getattr(request, "session_hash", None) or "", self.elem_id))
            if job is not None:
                job.stop.set()
                job.ended.wait(CANCEL_WAIT_S)
                time.sleep(POLL_S)  # Gradio's own bookkeeping of the ended event
            return self.idle("Stopped.")

        self.stopped = self.cancel.click(on_cancel, None, me, queue=False, api_visibility="private",
                                         show_progress="hidden")  # a tab may chain onto it (.then)
        return run

    def handler(self, ctx: Context, work: Callable[..., dict]) -> Callable[..., Any]:
        """The run event's handler: starts the :class:`Job` and redraws the bar until it is done."""

        def handler(request: gr.Request, *args):
            job = Job(lambda: work(*args), self.seconds or ctx.cfg.limits.job_seconds,
                      ctx.reg.slow_job_room if self.room else None)
            key = (getattr(request, "session_hash", None) or "", self.elem_id)
            try:
                yield {self.bar: bar_html(0, "starting")}
                with _RUNNING_LOCK:
                    _RUNNING[key] = job
                job.thread.start()
                shown = None
                while not job.done.wait(POLL_S):
                    live = job.take_live()
                    if (job.share, job.text) != shown or live:
                        shown = (job.share, job.text)
                        yield {**live, self.bar: bar_html(*shown)}
                if isinstance(job.error, Cancelled):
                    return  # the user's Cancel: its own event says "Stopped."
                if job.error is not None:
                    yield self.idle()
                    err = readable_error(job.error, self.elem_id)
                    raise err from job.error if err is not job.error else None
                yield {**job.take_live(), **(job.result or {}), **self.idle()}
            finally:
                job.stop.set()  # a closed page: the worker ends at its next report
                with _RUNNING_LOCK:
                    if _RUNNING.get(key) is job:
                        del _RUNNING[key]
                job.ended.set()

        handler.__name__ = handler.__qualname__ = getattr(work, "__name__", "handler")  # the event keeps the work's name
        return handler
