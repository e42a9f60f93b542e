"""What an app reachable by others may be asked to do: who may reach it, what it keeps, what it accepts.

``app.py`` turns its flags into one :class:`Limits`; the app's build applies it: the memory
budgets (scaled to the machine by default, :func:`vit_demo.budget.default_budgets`), the names a
local app answers to and the proxies it believes, the size of images, uploads and request
bodies, the two lanes of the queue (:mod:`vit_demo.app.server.lanes`) and the disk the app may fill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...budget import MB, default_budgets

DEFAULT_MAX_UPLOAD_MB = 25  # an image file; a 48-MP JPEG is about 15 MB
CHECKPOINT_MAX_MB = 1024  # when checkpoint uploads are allowed: a ViT-L is 1.2 GB in float32... and 0.6 in half
DEFAULT_MAX_MEGAPIXELS = 40  # decoded pixels of an image (a 64-MP picture takes 192 MB to decode)
LOCAL_NAMES = ("127.0.0.1", "localhost", "::1")
TRAIN_MINUTES_LOCAL = 10.0  # the Train tab's longest run on this computer (exposed: off unless --train-minutes-max)


@dataclass(frozen=True)
class Limits:
    """Memory budgets and what users may send. ``exposed``: reachable from other computers
    (``--share``, a non-loopback ``--host``), which switches checkpoint uploads off unless
    ``allow_checkpoint_upload``, caps every address's share of the queue and of the uploads, and
    drops the check of the ``Host`` a request names (unless ``allowed_hosts`` are given); hub
    downloads are off unless ``allow_downloads`` (then within ``downloads_mb``), and Gradio's
    OpenAPI schema is not served unless ``openapi``."""

    exposed: bool = False
    allow_checkpoint_upload: bool = True
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB
    cache_mb: float = field(default_factory=lambda: default_budgets()["cache_mb"])
    models_mb: float = field(default_factory=lambda: default_budgets()["models_mb"])
    sessions_mb: float = field(default_factory=lambda: default_budgets()["sessions_mb"])
    session_minutes: float = 30  # an idle session forgets its image after this long
    max_queue: int = 32
    concurrency: int = 2  # jobs of the model lane at a time
    slow_concurrency: int = 1  # jobs of the slow lane at a time (decks, slow methods, animations, exports)
    job_seconds: float = 180  # the time limit of one job of the slow lane
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS
    upload_budget_mb: float = 100  # per client and 10 minutes, when exposed
    exports_mb: float = 512  # disk for the app's pictures, slides, decks and animations (oldest go first)
    header_seconds: float = 10  # a connection's request headers must arrive within this long
    connections_per_address: int = 100  # connections one client (address, IPv6 /64) may hold open, when exposed
    allow_downloads: bool = False  # exposed: hub models may be downloaded (off unless --allow-downloads)
    downloads_mb: float = 2048  # disk for the hub models an exposed app downloads while it runs
    openapi: bool = False  # exposed: Gradio's OpenAPI schema served anyway (--openapi)
    allowed_hosts: tuple[str, ...] = ()  # names a local app answers to, besides 127.0.0.1 / localhost
    trusted_proxies: tuple[str, ...] = ()  # addresses whose X-Forwarded-For is believed
    bind: str = "127.0.0.1"  # the address the server listens on (a local app answers to it too)
    train_minutes_max: float | None = None  # the Train tab's longest run; None: 10 local, off (0) when exposed

    @classmethod
    def for_exposure(cls, exposed: bool, allow_checkpoint_upload: bool = False, **kw: Any) -> Limits:
        """Checkpoint uploads on when local, off when exposed unless explicitly allowed."""
        return cls(exposed=exposed, allow_checkpoint_upload=allow_checkpoint_upload or not exposed, **kw)

    @property
    def downloads(self) -> bool:
        """Whether users may make the app download hub models: always on this computer, on an
        exposed app only with ``allow_downloads``."""
        return self.allow_downloads or not self.exposed

    @property
    def downloads_bytes(self) -> int | None:
        """The disk an exposed app's downloads may take (None: a local app, no budget)."""
        return int(self.downloads_mb * MB) if self.exposed else None

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
    def train_minutes(self) -> float:
        """The longest training the Train tab and ``/train`` may run, in minutes (0: training is off):
        ``--train-minutes-max``, or :data:`TRAIN_MINUTES_LOCAL` on this computer and off when exposed."""
        if self.train_minutes_max is not None:
            return float(self.train_minutes_max)
        return 0.0 if self.exposed else TRAIN_MINUTES_LOCAL

    @property
    def max_pixels(self) -> int:
        return int(self.max_megapixels * 1e6)

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mb * MB)

    @property
    def models_bytes(self) -> int:
        return int(self.models_mb * MB)

    @property
    def sessions_bytes(self) -> int:
        return int(self.sessions_mb * MB)

    @property
    def exports_bytes(self) -> int:
        return int(self.exports_mb * MB)

    @property
    def upload_budget_bytes(self) -> int | None:
        """What one client may upload in 10 minutes (None: no budget, a local app). Never less
        than one file of the largest size accepted."""
        if not self.exposed:
            return None
        return max(int(self.upload_budget_mb * MB), self.max_file_size)

    @property
    def answers_to(self) -> tuple[str, ...] | None:
        """The ``Host`` names the app answers to (None: any, an exposed app without
        ``allowed_hosts``)."""
        if self.exposed and not self.allowed_hosts:
            return None
        return (*LOCAL_NAMES, self.bind, *self.allowed_hosts)

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
