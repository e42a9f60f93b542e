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

Past its capacity Gradio forgot the least recently used session, whatever it held: 1,100
requests with new session hashes from one address (each made a session that held nothing) made
it forget a visitor's analysed picture. With :func:`lean_sessions` it forgets the least recently
used session that holds no value first (:func:`holds_values`; a page's first events put the
app's session in it), and the gate forgets at once a new session whose request was refused
(:class:`GradioSessions`).
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
    if exact:
        state_holder.StateHolder.update = update_keeping_values
    return True


def holds_values(session: Any) -> bool:
    """Whether a Gradio session holds a state value (one that is neither None nor empty)."""
    return any(v is not None and not (isinstance(v, (list, dict, tuple, set)) and not v)
               for v in list(getattr(session, "state_data", {}).values()))


def update_keeping_values(self: Any, session_id: str) -> None:
    """Gradio 6.31's ``StateHolder.update``, forgetting past its capacity the least recently used
    session that holds no value first (then the least recently used)."""
    with self.lock:
        data = self.session_data
        if session_id in data:
            data.move_to_end(session_id)
        while len(data) > self.capacity:
            gone = next((k for k, v in data.items() if k != session_id and not holds_values(v)), next(iter(data)))
            del data[gone]
            self.time_last_used.pop(gone, None)


class GradioSessions:
    """One app's sessions as Gradio keeps them (``demo.state_holder``, made at launch), for the
    door's count of new sessions (:class:`vit_demo.app.server.lanes.SessionDoor`)."""

    def __init__(self, demo: gr.Blocks) -> None:
        self.demo = demo

    def known(self, session: str) -> bool:
        """Whether Gradio keeps ``session`` (True before the launch: nothing to count yet)."""
        holder = getattr(self.demo, "state_holder", None)
        return holder is None or session in holder

    def forget(self, session: str) -> None:
        """Drop ``session`` if it holds no value and has no event in the queue."""
        holder = getattr(self.demo, "state_holder", None)
        queue = getattr(self.demo, "_queue", None)
        pending = getattr(queue, "pending_event_ids_session", {}).get(session)
        if holder is None or pending:
            return
        with holder.lock:
            kept = holder.session_data.get(session)
            if kept is not None and not holds_values(kept):
                del holder.session_data[session]
                holder.time_last_used.pop(session, None)
