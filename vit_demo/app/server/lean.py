"""Gradio's bookkeeping per browser session, kept lean.

For every session it has seen (up to ``state_session_capacity``, 1000 here), Gradio 6.31 keeps
a copy of every component's configuration (``SessionState.config_values``): 290 KB of Python
objects for this page, counted in no budget of the app's (200 fresh sessions: 58 MB; 1000:
290 MB). Gradio reads that copy only to make deep links (``/gradio_api/deep_link``), a route
this app closes (:mod:`vit_demo.app.server.middleware`), and building it took 23 ms of CPU per new
session (0.3 s of wall time at load 12). :func:`lean_sessions` makes new sessions without it (with another
Gradio version: built by Gradio's own code, then dropped at once). A seam of Gradio 6.31
(``gradio.state_holder.SessionState``, which its ``StateHolder`` makes each session from);
where it is missing, nothing changes.
"""

from __future__ import annotations

import os
from copy import copy
from typing import Any

import gradio as gr
import gradio.state_holder as state_holder

SEAM_VERSION = "6.31.0"  # the Gradio whose SessionState.__init__ LeanSessionState repeats


class _Nothing(dict):
    """A mapping that keeps nothing: what Gradio stores in it is dropped, what it looks up is empty."""

    def __setitem__(self, key: Any, value: Any) -> None:
        return None

    def __getitem__(self, key: Any) -> dict:
        return {}


def lean_sessions() -> bool:
    """Gradio's sessions made from now on keep no copy of the page's configuration; False where
    this Gradio has no such seam."""
    base = getattr(state_holder, "SessionState", None)
    if base is None:
        return False
    if getattr(base, "lean", False):
        return True

    exact = gr.__version__ == SEAM_VERSION  # Gradio's __init__ as this module copies it

    class LeanSessionState(base):  # type: ignore[misc, valid-type]
        """Gradio's session state without ``config_values`` (see the module docstring)."""

        lean = True

        def __init__(self, blocks: Any) -> None:
            if not exact:  # another Gradio: its own __init__ builds the copy, dropped at once
                super().__init__(blocks)
                self.config_values = _Nothing()
                return
            self.blocks_config = copy(blocks.default_config)  # Gradio 6.31's __init__, without the copy
            self.config_values = _Nothing()
            self.state_data: dict[int, Any] = {}
            self._state_ttl: dict[int, Any] = {}
            self.is_closed = False
            self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600

    state_holder.SessionState = LeanSessionState
    return True
