"""What an app reachable by others may be asked to do: upload sizes, checkpoint uploads, queues.

``app.py`` turns its flags into one :class:`Limits`; the app's build applies it. Gradio's own
queue caps the total number of waiting requests (``max_size``) for every queued event, API calls
included (``api_open=False`` closes the REST routes that would skip the queue). On top of that,
:func:`fair_queue` caps how many requests one client may have waiting, so that a client that
floods the API is told "queue is full" while other clients still get in.
"""

from __future__ import annotations

import asyncio
import warnings
from dataclasses import dataclass
from typing import Any

from ..budget import DEFAULT_CACHE_MB, DEFAULT_MODELS_MB, MB

DEFAULT_MAX_UPLOAD_MB = 25  # an image file; a 48-MP JPEG is about 15 MB
CHECKPOINT_MAX_MB = 1024  # when checkpoint uploads are allowed: a ViT-L is 1.2 GB in float32... and 0.6 in half


@dataclass(frozen=True)
class Limits:
    """Memory budgets and what users may send. ``exposed``: reachable from other computers
    (``--share``, a non-loopback ``--host``), which switches checkpoint uploads off unless
    ``allow_checkpoint_upload`` and caps every client's share of the queue."""

    exposed: bool = False
    allow_checkpoint_upload: bool = True
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB
    cache_mb: float = DEFAULT_CACHE_MB
    models_mb: float = DEFAULT_MODELS_MB
    max_queue: int = 32
    concurrency: int = 2

    @classmethod
    def for_exposure(cls, exposed: bool, allow_checkpoint_upload: bool = False, **kw: Any) -> Limits:
        """Checkpoint uploads on when local, off when exposed unless explicitly allowed."""
        return cls(exposed=exposed, allow_checkpoint_upload=allow_checkpoint_upload or not exposed, **kw)

    @property
    def max_upload_bytes(self) -> int:
        """The largest image file accepted."""
        return int(self.max_upload_mb * MB)

    @property
    def max_file_size(self) -> int:
        """Gradio's ``launch(max_file_size=...)``: the cap on any uploaded file, enforced before it
        is stored. Images only, unless checkpoints may be uploaded (then the image cap is checked
        when the image is opened)."""
        if self.allow_checkpoint_upload:
            return max(self.max_upload_bytes, CHECKPOINT_MAX_MB * MB)
        return self.max_upload_bytes

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * MB)

    @property
    def models_bytes(self) -> int:
        return int(self.models_mb * MB)

    @property
    def per_client_queue(self) -> int:
        """Requests one browser tab / API session may have waiting: enough for the app's own
        event chains and a dragged slider, far from the whole queue."""
        return max(1, min(8, self.max_queue // 4))

    @property
    def per_host_queue(self) -> int | None:
        """Requests one address may have waiting when exposed (a flood that opens a new session
        per request); None when local (every client is this computer)."""
        return max(1, self.max_queue // 2) if self.exposed else None


def _waiting(queue: Any) -> list[Any]:
    return [e for q in queue.event_queue_per_concurrency_id.values() for e in q.queue]


def _host(event: Any) -> str | None:
    client = getattr(getattr(event, "request", None), "client", None)
    return getattr(client, "host", None)


def fair_queue(demo: Any, per_client: int, per_host: int | None = None) -> None:
    """Refuse a request ("queue is full") when its session already has ``per_client`` requests
    waiting, or its address ``per_host`` (None: no per-address cap). Call after ``demo.queue()``;
    wraps Gradio's ``Queue.push`` (the one place every queued request, UI or API, comes in)."""
    queue = getattr(demo, "_queue", None)
    if queue is None or not hasattr(queue, "push") or not hasattr(queue, "event_queue_per_concurrency_id"):
        warnings.warn("this Gradio's queue has another shape: no per-client cap (the global one still holds)",
                      stacklevel=2)
        return
    push = queue.push
    lock = asyncio.Lock()  # count and enqueue as one step: concurrent joins must not all pass the count

    async def fair_push(body: Any, request: Any, username: str | None):
        async with lock:
            try:
                waiting = _waiting(queue)
            except AttributeError:  # a Gradio whose queued events look different: the global cap only
                return await push(body, request, username)
            session = getattr(body, "session_hash", None)
            if session and sum(e.session_hash == session for e in waiting) >= per_client:
                return False, (f"Queue is full for this client: it already has {per_client} requests waiting. "
                               "Wait for them to finish."), "queue_full"
            host = getattr(getattr(request, "client", None), "host", None)
            if per_host is not None and host and sum(_host(e) == host for e in waiting) >= per_host:
                return False, (f"Queue is full for this address: it already has {per_host} requests waiting. "
                               "Wait for them to finish."), "queue_full"
            return await push(body, request, username)

    queue.push = fair_push
