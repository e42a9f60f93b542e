"""The server's log cannot be flooded: a message repeated more than :data:`PER_MINUTE` times a
minute is dropped, and the next one that passes says how many were.

Out of file descriptors, asyncio logs a traceback for every refused ``accept()`` of every loop
tick (up to 2048 a tick): 1.52 M tracebacks, 617 MB of log in 100 s from one address. A
message's kind is its logger and its first line (asyncio's lines after the first name the
socket, different every time). Standard library only.
"""

from __future__ import annotations

import logging
import threading
import time

PER_MINUTE = 20  # repeats of one message kept per minute
WINDOW_S = 60.0
KINDS = 1000  # message kinds remembered at once (the oldest window is forgotten first)
LOGGERS = ("asyncio", "uvicorn", "uvicorn.error", "uvicorn.access", "vit_demo.app")


class RepeatFilter(logging.Filter):
    """Keeps at most ``per_minute`` records of one kind per ``window_s`` seconds."""

    def __init__(self, per_minute: int = PER_MINUTE, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.per_minute, self.window_s = per_minute, window_s
        self.seen: dict[tuple[str, str], list[float]] = {}  # kind -> [window start, kept, dropped]
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg).split("\n", 1)[0][:200])
        now = time.monotonic()
        with self.lock:
            entry = self.seen.get(kind)
            if entry is None or now - entry[0] > self.window_s:
                dropped = int(entry[2]) if entry is not None else 0
                if len(self.seen) >= KINDS:
                    del self.seen[min(self.seen, key=lambda k: self.seen[k][0])]
                self.seen[kind] = [now, 1, 0]
                if dropped:
                    record.msg = f"({dropped} more like this were dropped in the last minute) {record.msg}"
                return True
            if entry[1] < self.per_minute:
                entry[1] += 1
                return True
            entry[2] += 1
            return False


def quiet_repeats() -> RepeatFilter:
    """Install one :class:`RepeatFilter` on the loggers :data:`LOGGERS` (where the records are made)."""
    f = RepeatFilter(PER_MINUTE)
    for name in LOGGERS:
        logging.getLogger(name).addFilter(f)
    return f
