"""The one object the server is set up with, in place of values stuck on the ``gr.Blocks``.

Start-up has three phases, each reading the same :class:`ServerSettings`:

1. ``app.py``, before Gradio is imported: its :attr:`~ServerSettings.limits` (from the flags) set
   the app's temp folder, the proxies believed, the connection rules and the quiet log;
2. :func:`vit_demo.app.build.build`: the page, its queue and the door of the queue within the
   limits; it fills in what only the page knows (the example photos served, the MCP server, the
   sections' warm-up) and returns the settings with the page;
3. :func:`vit_demo.app.page.launch_kwargs`: ``launch()``'s upload cap, the gate, the files
   served, the MCP server; then ``app.py``'s warm-up thread runs :attr:`~ServerSettings.warm_up`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .limits import Limits
from .middleware import CallerCap
from .streams import LiveStreams


def nothing_to_warm_up() -> None:
    """The default warm-up: none."""


@dataclass
class ServerSettings:
    """What an app's server is set up with (see the module docstring for who reads what)."""

    limits: Limits = field(default_factory=Limits)  # budgets, caps, who may reach the app (the flags)
    example_paths: list[str] = field(default_factory=list)  # the files launch(allowed_paths=...) serves
    mcp_lifespan: Callable[[Any], Any] | None = None  # --mcp: Gradio's MCP server, its tools trimmed (app.tools)
    mcp_calls: CallerCap | None = None  # exposed --mcp: each caller's calls in progress, which the gate reads too
    sessions: Any = None  # the count of new sessions per client (lanes.SessionDoor), which the gate asks too
    warm_up: Callable[[], None] = nothing_to_warm_up  # the sections' slow start-up work, after the model's
    streams: LiveStreams | None = None  # the Live tab's streams: the door of their frames (server.streams)

    @property
    def mcp(self) -> bool:
        """Whether Gradio's MCP server runs (``--mcp``)."""
        return self.mcp_lifespan is not None
