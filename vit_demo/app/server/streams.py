"""Live streams (the Live tab's camera): what they may take, and the door of their frames.

Gradio streams a camera as ONE long event: it joins the queue once (the queue's door,
:mod:`vit_demo.app.server.lanes`, allows one stream per client and counts it in the client's
share of the queue), holds a place of the ``live`` lane while it runs (:attr:`StreamRules.at_once`
streams at a time on the server) for at most :attr:`StreamRules.seconds`, and is fed its frames by
``POST /gradio_api/stream/{event_id}``, a route that skips the queue's door. Each frame overwrites
the one before: a stream never builds a backlog, the event computes the newest frame it has.

:class:`StreamDoor` (an ASGI middleware, inside the gate) keeps that route for live streams only:

- a frame for an event that is not a live stream running now: 404 before its body is parsed;
- a frame sooner than the stream's rate allows (:attr:`StreamRules.fps`, a bucket of
  :data:`BURST`): 429, nothing parsed (the page ignores it and sends the next one);
- it notes when each frame came, so that the event drops a frame that waited past
  :attr:`StreamRules.max_wait_s` instead of showing it late (:meth:`LiveStreams.age`);
- every other route under ``/gradio_api/stream/`` (Gradio's media playlists) stays closed (404).

:class:`LiveStreams` also holds the compute slot: one frame computed at a time on the server,
whichever stream it is from; a frame that cannot have it before its wait is over is dropped.
No Gradio here.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

LIVE = "live"  # the live lane's concurrency id
SECONDS_ENV = "VIT_DEMO_LIVE_SECONDS"  # a stream's time limit in seconds (0: none), instead of the rules' own
STREAM_ROUTE = "/gradio_api/stream/"
FRAME_ROUTE = re.compile(r"^/gradio_api/stream/([0-9a-f]{32})(/close)?/?$")
BURST = 3  # frames a stream may send at once above its rate (the page's timer is not exact)
FORGET_S = 120.0  # a stream that sent nothing for this long is forgotten by the door
LIVE_BUSY = ("This client already has a live stream: stop it (or close the other tab that streams) before "
             "starting another.")
TOO_FAST = "Frames come faster than this app takes them: this one is dropped."


@dataclass(frozen=True)
class StreamRules:
    """What a live stream may take: ``at_once`` streams on the server at a time (the rest wait in
    the queue), each at most ``seconds`` long (None: until the page stops sending, then Start
    again), ``fps`` frames a second at most (the door's cap), paced by the page at one frame every
    ``every`` seconds; ``total_fps`` frames a second for all of them together, and computing frames
    at most ``share`` of the time (their part of the machine: a rollout frame is about 45 ms of CPU
    with Gradio's part, an amortised LRP frame ten times that); a frame older than ``max_wait_s``
    when its turn comes is dropped."""

    at_once: int
    seconds: float | None
    fps: float
    every: float
    max_wait_s: float = 0.5
    total_fps: float | None = None  # frames a second computed for all streams together (None: as many as fit)
    share: float | None = None  # of the time, at most this much computing frames (a slow map's frames count more)


LOCAL = StreamRules(at_once=2, seconds=None, fps=30.0, every=0.05)
EXPOSED = StreamRules(at_once=4, seconds=60.0, fps=8.0, every=0.125, total_fps=12.0, share=0.5)


def stream_rules(exposed: bool) -> StreamRules:
    """An exposed app's streams: 4 at a time, 60 s each, 8 frames a second each, 12 for all together
    and computing half of the time at most (about half of a 2-core machine); a local app's: 2 at a
    time, as long as the page sends, up to 30 frames a second (the page sends 20).
    ``$VIT_DEMO_LIVE_SECONDS`` sets another time limit (a host's choice; the tests' short one)."""
    rules = EXPOSED if exposed else LOCAL
    seconds = os.environ.get(SECONDS_ENV, "").strip()
    if seconds:
        rules = replace(rules, seconds=float(seconds) if float(seconds) > 0 else None)
    return rules


def is_frame(value: Any, max_chars: int) -> bool:
    """Whether a queued request's value for a camera input is a frame, as the page sends it:
    nothing, or ``{"url": "data:image/...;base64,..."}`` of at most ``max_chars`` characters and no
    ``path`` (a frame names no file on the server)."""
    if value is None:
        return True
    if not isinstance(value, dict) or value.get("path") is not None or "meta" in value:
        return False
    url = value.get("url")
    return isinstance(url, str) and url.startswith("data:image/") and len(url) <= max_chars


@dataclass
class Stream:
    """One running stream, as the door sees it."""

    tokens: float = float(BURST)
    filled: float = field(default_factory=time.monotonic)  # when the bucket was last filled
    arrived: float | None = None  # when its newest frame came (None: only the one it joined with)
    seen: float = field(default_factory=time.monotonic)


class LiveStreams:
    """The live streams of one app: the door's book of running streams and their frames' times,
    and the one compute slot (see the module docstring)."""

    def __init__(self, rules: StreamRules) -> None:
        self.rules = rules
        self.streams: dict[str, Stream] = {}
        self.lock = threading.Lock()
        self.slot = threading.Lock()
        self.next_at = 0.0  # when the next frame may start (rules.total_fps), time.monotonic
        self.refused = 0  # frames the door turned away (too fast, or no such stream)

    def running(self, event_id: str | None) -> None:
        """The event ``event_id`` is a live stream computing a frame now (called by its handler)."""
        if not event_id:
            return
        now = time.monotonic()
        with self.lock:
            s = self.streams.get(event_id)
            if s is None:
                self.streams[event_id] = Stream()
                for k in [k for k, v in self.streams.items() if now - v.seen > FORGET_S]:
                    del self.streams[k]
            else:
                s.seen = now

    def ended(self, event_id: str) -> None:
        with self.lock:
            self.streams.pop(event_id, None)

    def age(self, event_id: str | None) -> float:
        """Seconds since the newest frame of ``event_id`` came (0 when the door did not see it)."""
        s = self.streams.get(event_id) if event_id else None
        return time.monotonic() - s.arrived if s is not None and s.arrived is not None else 0.0

    def frame(self, event_id: str) -> bool:
        """A frame came for ``event_id``: whether the door lets it in (a running stream within its rate)."""
        now = time.monotonic()
        with self.lock:
            s = self.streams.get(event_id)
            if s is None:
                self.refused += 1
                return False
            s.tokens = min(float(BURST), s.tokens + (now - s.filled) * self.rules.fps)
            s.filled = now
            if s.tokens < 1:
                self.refused += 1
                return False
            s.tokens -= 1
            s.arrived = s.seen = now
            return True

    @contextmanager
    def compute(self, waited: float) -> Iterator[bool]:
        """The compute slot (one frame at a time, and within :attr:`StreamRules.total_fps`), if it
        comes before the frame's wait (``waited`` seconds so far) passes :attr:`StreamRules.max_wait_s`:
        yields True with the slot held, False (the frame dropped) otherwise. A frame waits for its
        turn rather than being dropped at once: the stream's next frames overwrite each other meanwhile."""
        deadline = time.monotonic() + self.rules.max_wait_s - waited
        left = deadline - time.monotonic()
        held = bool(left > 0 and self.slot.acquire(timeout=left))
        turn = held and self.paced(deadline)
        began = time.monotonic()
        try:
            yield turn
        finally:
            if held:
                if turn and self.rules.share:  # the next frame waits out the rest of this one's share of the time
                    self.next_at = max(self.next_at, began + (time.monotonic() - began) / self.rules.share)
                self.slot.release()

    def paced(self, deadline: float) -> bool:
        """(The slot held.) Wait for the next turn (:attr:`StreamRules.total_fps`, :attr:`StreamRules.share`),
        if it comes before ``deadline``; whether it came."""
        if not (self.rules.total_fps or self.rules.share):
            return True
        now = time.monotonic()
        start = max(now, self.next_at)
        if start > deadline:
            return False
        if start > now:
            time.sleep(start - now)
        if self.rules.total_fps:
            self.next_at = start + 1 / self.rules.total_fps
        return True


class StreamDoor:
    """The ASGI middleware of the module docstring, for the streams of ``live``."""

    def __init__(self, app: Any, live: LiveStreams) -> None:
        self.app, self.live = app, live

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        if not path.startswith(STREAM_ROUTE):
            return await self.app(scope, receive, send)
        m = FRAME_ROUTE.match(path)
        if m is None or scope.get("method") != "POST":
            return await _answer(send, 404, "Not found.")
        event_id, close = m.group(1), m.group(2)
        if close:  # (Gradio answers 404 itself for an event it does not know)
            self.live.ended(event_id)
            return await self.app(scope, receive, send)
        if not self.live.frame(event_id):
            known = event_id in self.live.streams
            return await _answer(send, 429 if known else 404, TOO_FAST if known else "Not found.")
        return await self.app(scope, receive, send)


async def _answer(send: Any, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
