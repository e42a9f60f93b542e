"""Gradio's bookkeeping per browser session, kept lean.

For every session it has seen (up to ``state_session_capacity``, 1000 here), Gradio 6.31 keeps
a copy of every component's configuration (``SessionState.config_values``): 290 KB of Python
objects for this page, counted in no budget of the app's (200 fresh sessions: 58 MB; 1000:
290 MB). Gradio reads that copy only to make deep links (``/gradio_api/deep_link``), a route
this app closes (:mod:`vit_demo.app.middleware`). :func:`lean_sessions` makes every new
session drop it at once. A seam of Gradio 6.31 (``gradio.state_holder.SessionState``, which
its ``StateHolder`` makes each session from); where it is missing, nothing changes.
"""

from __future__ import annotations

from typing import Any

import gradio.state_holder as state_holder


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

    class LeanSessionState(base):  # type: ignore[misc, valid-type]
        """Gradio's session state without ``config_values`` (see the module docstring)."""

        lean = True

        def __init__(self, blocks: Any) -> None:
            super().__init__(blocks)
            self.config_values = _Nothing()

    state_holder.SessionState = LeanSessionState
    return True
