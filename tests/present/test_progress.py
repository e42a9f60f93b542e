"""Progress reports (vit_demo.progress): parts of a bar, their labels, and stopping the work;
the app's long actions (vit_demo.app.jobs) run work in a thread and read these reports."""

from __future__ import annotations

import threading
import time

import pytest

from vit_demo.progress import Cancelled, part, report, reporting


def test_parts_fill_their_share_of_the_bar_under_their_label():
    seen: list[tuple[float, str]] = []
    with reporting(lambda share, text: seen.append((round(share, 3), text))):
        with part(0.0, 0.5, "slide 1 of 2"):
            report(0.5, "masks", done=128, total=256)
        with part(0.5, 1.0, "slide 2 of 2"), part(0.0, 0.5, ""):  # an unnamed part adds no label
            report(1.0, "writing")
    assert seen == [(0.0, "slide 1 of 2"), (0.25, "slide 1 of 2 · masks 128/256"), (0.5, "slide 2 of 2"),
                    (0.5, "slide 2 of 2"), (0.75, "slide 2 of 2 · writing")]
    with part(0.2, 0.4, "nobody listens"):  # outside reporting(): nothing happens, nothing fails
        report(1.0, "x")


def test_a_callback_can_stop_the_work_and_threads_do_not_share_callbacks():
    stop = threading.Event()

    def callback(share: float, text: str) -> None:
        if stop.is_set():
            raise Cancelled("stopped")

    def other_thread() -> None:
        report(0.5, "not mine")  # another thread's reports never reach this thread's callback

    with reporting(callback):
        t = threading.Thread(target=other_thread)
        stop.set()
        t.start()
        t.join()
        with pytest.raises(Cancelled):
            report(0.5, "mine")


def test_job_reports_progress_and_stops_at_the_next_report():
    from vit_demo.app.jobs import Job, bar_html

    def work():
        for i in range(200):
            report(i / 200, "step", done=i, total=200)
            time.sleep(0.01)
        return "done"

    job = Job(work)
    job.thread.start()
    time.sleep(0.2)
    assert 0 < job.share < 1 and job.text.startswith("step ")
    job.stop.set()
    assert job.done.wait(2), "the work must end at its next report"
    assert isinstance(job.error, Cancelled) and job.result is None
    html = bar_html(0.375, "slide 3 of 9 · masks 96/256")
    assert 'aria-valuenow="38"' in html and "width: 38%" in html and "Slide 3 of 9 · masks 96/256 · 38%" in html
    assert "&lt;b&gt;" in bar_html(0.1, "<b>")  # text is escaped
