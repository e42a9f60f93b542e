"""Who gets in, and where the work waits: the door of the app's queue and its two lanes.

Every queued event, UI or API, public or private, comes in through Gradio's ``Queue.push``;
:func:`guard_queue` puts one door in front of it that, in order:

1. refuses a request whose values do not fit its event (:class:`~vit_demo.app.server.guard.JoinGuard`:
   server files, odd shapes, over-long strings), before anything runs;
2. (exposed) lets one address open at most :data:`NEW_SESSIONS` new sessions per 10 minutes
   (:class:`SessionDoor`, which the gate asks too for the routes that make a session's state
   before the queue: :mod:`vit_demo.app.server.middleware`): Gradio keeps every session's state
   values (no longer its copy of the page: :mod:`vit_demo.app.server.lean`), up to
   :data:`vit_demo.app.page.SESSION_CAPACITY` sessions, those holding no value forgotten first;
3. keeps each client to ONE job in the slow lane at a time (a second one is refused until the
   first has finished; exposed, an address may hold two, for two browser tabs), and to ONE live
   stream (the Live tab's camera, lane :data:`~vit_demo.app.server.streams.LIVE`), waiting or running;
   a running stream counts in its client's share of the queue (4.);
4. caps how many requests one session, and (exposed) one address, may have waiting, so that a
   flood is told "queue is full" while other clients still get in;
5. (exposed) once a request has joined, lets the clients of its lane take turns
   (:meth:`Door.take_turns`): Gradio's queue is first come, first served, and one address's
   share of it (16 places) made another client wait behind all of them;
6. (exposed ``--mcp``) keeps a client's tool events (``capped``: the MCP tools' events, which
   the page's queue takes by their index too) within the MCP callers' cap
   (:class:`~vit_demo.app.server.middleware.CallerCap`), counted together with its MCP calls
   in progress: called through the queue, one address had 8 of them in flight.

A client is an address, an IPv6 one by its /64 (:func:`~vit_demo.app.server.clients.client_group`).

The lanes are Gradio concurrency groups: ``model`` (predictions, the upload's analysis, the
explorer's class maps: short and frequent) and ``slow`` (slide decks, slow methods, animations,
side-by-side figures, slide exports: seconds to minutes, :data:`SLOW_EVENTS`), each with its own
number of jobs at a time, so that predictions never wait behind a deck. Events that only wait for
the class-specific maps an upload started in the background (:data:`WAITS`), then draw them, have a
group of their own: waiting, they held a place of the model lane for seconds. A training (the Train tab,
``/train``: minutes, in a process of its own) has a group of its own, :data:`TRAIN`, so that decks do
not wait ten minutes behind it: one training runs on the whole server at a time (its lock refuses a
second one at once), under its own time limit (:mod:`vit_demo.app.trainer`). Every job of the slow
lane runs under a time limit (:func:`limit_slow_jobs`, :func:`vit_demo.progress.time_limit`).
No Gradio import: the queue is reached through ``demo._queue``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from ...progress import time_limit
from .clients import client_group
from .guard import JoinGuard
from .middleware import CALLS_BUSY, CallerCap, UploadBudget, from_own_client
from .streams import LIVE, LIVE_BUSY

MODEL, SLOW = "model", "slow"  # the concurrency ids of the two lanes
WAITS = "waits"  # events that wait for work the model's own threads do (the class maps of an upload), then draw it
WAITS_AT_ONCE = 8  # such events at a time: they hold no model slot while they wait (vit_demo.analysis.start_class_maps)
TRAIN = "train"  # the Train tab's and /train's events: one training on the server at a time (vit_demo.app.trainer)
SLOW_PER_HOST = 2  # slow jobs one address may have in flight, when exposed
NEW_SESSIONS = 60  # new sessions one address may open per 10 minutes, when exposed (a tab is one)
TOO_MANY_SESSIONS = "Too many new sessions from this address: wait a few minutes, or keep using the page you have open."
SLOW_BUSY = ("This client already has a slow job (a slide deck, a slow method, an animation, a side-by-side figure "
             "or a slide export) in progress: wait for it to finish, then ask again.")


def client_key(session: str | None, host: str | None, exposed: bool) -> str | None:
    """Who a request is from: its address when the app is exposed (sessions are free to make),
    its session otherwise (every local client is this computer)."""
    return (host or session) if exposed else session


def _host(event: Any) -> str | None:
    """The client a queued event is from: its address, an IPv6 one by its /64."""
    return _request_host(getattr(event, "request", None))


def _request_host(request: Any) -> str | None:
    return client_group(getattr(getattr(request, "client", None), "host", None))


def _waiting(queue: Any) -> list[Any]:
    return [e for q in queue.event_queue_per_concurrency_id.values() for e in q.queue]


def _running(queue: Any, lane: str) -> list[Any]:
    """The events of ``lane`` that are running."""
    return [e for job in getattr(queue, "active_jobs", []) or [] if job for e in job
            if getattr(e, "concurrency_id", None) == lane]


def _slow_in_flight(queue: Any) -> list[Any]:
    """The slow lane's events, waiting or running."""
    lane = queue.event_queue_per_concurrency_id.get(SLOW)
    waiting = list(lane.queue) if lane is not None else []
    return waiting + _running(queue, SLOW)


def _live_in_flight(queue: Any) -> list[Any]:
    """The live streams, waiting or running."""
    lane = queue.event_queue_per_concurrency_id.get(LIVE)
    return (list(lane.queue) if lane is not None else []) + _running(queue, LIVE)


class SessionDoor:
    """New sessions per client: exposed, :data:`NEW_SESSIONS` per 10 minutes, counted wherever a
    request would make one (the queue's door, and the gate for the routes that make a session's
    state first). ``store``: Gradio's sessions (:class:`vit_demo.app.server.lean.GradioSessions`:
    ``known(session)``, ``forget(session)``); None: every session counts as new."""

    def __init__(self, store: Any = None, exposed: bool = True) -> None:
        self.store, self.exposed = store, exposed
        self.budget = UploadBudget(NEW_SESSIONS, window_s=600)

    def known(self, session: str) -> bool:
        """Whether Gradio already keeps ``session``'s state."""
        return self.store is not None and self.store.known(session)

    def admit(self, session: str | None, client: str | None) -> str | None:
        """None when ``client`` may use ``session`` (a known one, or a new one within its count),
        else why not (:data:`TOO_MANY_SESSIONS`)."""
        if not self.exposed or not session or not client or self.known(session):
            return None
        return None if self.budget.take(client, 1) else TOO_MANY_SESSIONS

    def forget(self, session: str) -> None:
        """A new session whose request was refused: Gradio keeps nothing of it (if it holds nothing)."""
        if self.store is not None:
            self.store.forget(session)


class Door:
    """The checks of the module docstring, for one app. ``per_client`` / ``per_host``: requests
    one session / one address may have waiting (None: no address cap); exposed, one address has
    at most :data:`SLOW_PER_HOST` slow jobs in flight."""

    def __init__(self, queue: Any, fns: dict, join_guard: JoinGuard | None, per_client: int,
                 per_host: int | None, exposed: bool, calls: CallerCap | None = None,
                 capped: tuple[str, ...] = (), sessions: SessionDoor | None = None) -> None:
        self.queue, self.fns, self.join_guard = queue, fns, join_guard
        self.per_client, self.per_host, self.exposed = per_client, per_host, exposed
        self.sessions = sessions or SessionDoor(QueueSessions(queue), exposed)
        self.calls, self.capped = calls, frozenset(capped)
        if calls is not None:
            calls.elsewhere = self.tool_events

    def tool_events(self, host: str | None) -> int:
        """``host``'s capped events (the tools') waiting or running that did not come from the
        app's own MCP client (those count in :attr:`CallerCap.busy`)."""
        if not self.capped or not host:
            return 0
        queue = self.queue
        events = _waiting(queue) + [e for job in list(getattr(queue, "active_jobs", []) or []) if job for e in job]
        return sum(1 for e in events if _host(e) == host and self.is_capped(e)
                   and not from_own_client(getattr(getattr(e, "request", None), "headers", None)))

    def is_capped(self, event: Any) -> bool:
        return getattr(getattr(event, "fn", None), "api_name", None) in self.capped

    def client(self, event: Any) -> str | None:
        """Who a queued event is from (:func:`client_key`)."""
        return client_key(getattr(event, "session_hash", None), _host(event), self.exposed)

    def take_turns(self, lane: str | None) -> None:
        """The waiting requests of ``lane`` in turns (exposed): every client's n-th request (its running
        jobs in the lane counted first) before any client's (n+1)-th, in the order they came
        otherwise, so a client's own requests keep their order. Called as a request joins, from
        the event loop, between two of its steps: the queue's worker sees the list before or after."""
        waiting = getattr(self.queue.event_queue_per_concurrency_id.get(lane), "queue", None)
        if not self.exposed or not waiting or len(waiting) < 2:  # (a local app: every client is this computer)
            return
        seen = collections.Counter(self.client(e) for e in _running(self.queue, lane))
        turns = []
        for e in waiting:
            who = self.client(e)
            turns.append(seen[who])
            seen[who] += 1
        order = sorted(range(len(waiting)), key=turns.__getitem__)  # stable: the order they came within a turn
        waiting[:] = [waiting[i] for i in order]

    def refusal(self, body: Any, request: Any) -> tuple[str, str] | None:
        """(message, Gradio's state for it) when the request must be turned away, else None."""
        fn = self.fns.get(getattr(body, "fn_index", None))
        if fn is None:
            return "No such event.", "error"
        if self.join_guard is not None:
            why = self.join_guard.problem([c._id for c in fn.inputs], getattr(body, "data", None),
                                          converted=bool(getattr(fn, "preprocess", False)))
            if why:
                return why, "error"
        session = getattr(body, "session_hash", None)
        host = _request_host(request)
        own = self.exposed and from_own_client(getattr(request, "headers", None))
        if own:
            session = None  # Gradio's MCP client: one session for every caller; the caller's address counts
        if (self.calls is not None and not own and host and getattr(fn, "api_name", None) in self.capped
                and self.calls.in_progress(host) >= self.calls.n):
            return CALLS_BUSY.format(n=self.calls.n), "queue_full"

        if self.exposed and self.sessions.admit(session, host):
            return TOO_MANY_SESSIONS, "queue_full"
        if getattr(fn, "concurrency_id", None) == SLOW:
            slow = _slow_in_flight(self.queue)
            if session and sum(e.session_hash == session for e in slow) >= 1:
                return SLOW_BUSY, "queue_full"
            if self.exposed and host and sum(_host(e) == host for e in slow) >= SLOW_PER_HOST:
                return SLOW_BUSY, "queue_full"
        live = _live_in_flight(self.queue)
        if getattr(fn, "concurrency_id", None) == LIVE and (
                (session and any(e.session_hash == session for e in live))
                or (self.exposed and host and any(_host(e) == host for e in live))):
            return LIVE_BUSY, "queue_full"
        waiting = _waiting(self.queue) + _running(self.queue, LIVE)  # a running stream holds its client's place
        if session and sum(e.session_hash == session for e in waiting) >= self.per_client:
            return (f"Queue is full for this client: it already has {self.per_client} requests waiting. "
                    "Wait for them to finish."), "queue_full"
        if self.per_host is not None and host and sum(_host(e) == host for e in waiting) >= self.per_host:
            return (f"Queue is full for this address: it already has {self.per_host} requests waiting. "
                    "Wait for them to finish."), "queue_full"
        return None


class QueueSessions:
    """Gradio's sessions as the queue's blocks hold them (a door made without a store of its own)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def known(self, session: str) -> bool:
        holder = getattr(getattr(self.queue, "blocks", None), "state_holder", None)
        return holder is None or session in holder  # (True when it cannot tell)

    def forget(self, session: str) -> None:
        return None


def guard_queue(demo: Any, per_client: int, per_host: int | None = None, join_guard: JoinGuard | None = None,
                exposed: bool = False, calls: CallerCap | None = None, capped: tuple[str, ...] = (),
                sessions: SessionDoor | None = None) -> Door | None:
    """Put a :class:`Door` in front of ``demo``'s queue (call after ``demo.queue()``); ``calls``
    and ``capped``: the MCP callers' cap, and the api names of the events it covers; ``sessions``:
    the count of new sessions the gate shares."""
    queue = getattr(demo, "_queue", None)
    if queue is None or not hasattr(queue, "push") or not hasattr(queue, "event_queue_per_concurrency_id"):
        warnings.warn("this Gradio's queue has another shape: no per-client caps and no checks at the door "
                      "(the handlers still check every file)", stacklevel=2)
        return None
    door = Door(queue, demo.fns, join_guard, per_client, per_host, exposed, calls, capped, sessions)
    push = queue.push
    lock = asyncio.Lock()  # count and enqueue as one step: concurrent joins must not all pass the count

    async def guarded_push(body: Any, request: Any, username: str | None):
        async with lock:
            try:
                refused = door.refusal(body, request)
            except AttributeError:  # a Gradio whose queued events look different: its own caps only
                refused = None
            if refused is not None:
                return False, refused[0], refused[1]
            joined = await push(body, request, username)
            with contextlib.suppress(AttributeError):  # (a queue of another shape: first come, first served)
                door.take_turns(getattr(door.fns.get(getattr(body, "fn_index", None)), "concurrency_id", None))
            return joined

    queue.push = guarded_push
    return door


def time_limited(fn: Callable, seconds: float, room: Callable[[], Any] | None = None) -> Callable:
    """``fn`` run under :func:`vit_demo.progress.time_limit` (its signature kept for Gradio),
    and within ``room()`` (the memory it may need, counted in a budget) when given."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with time_limit(seconds), (room() if room is not None else contextlib.nullcontext()):
            return fn(*args, **kwargs)

    return run


def limit_slow_jobs(demo: Any, seconds: float, room: Callable[[], Any] | None = None) -> int:
    """Every event of the slow lane gets a time limit of ``seconds`` (and its working memory
    counted through ``room``); returns how many. A generator (a long action's handler,
    :mod:`vit_demo.app.jobs`) is left as it is: its worker thread runs the work under the same
    limit and room."""
    n = 0
    for fn in demo.fns.values():
        if getattr(fn, "concurrency_id", None) == SLOW and fn.fn is not None and not inspect.isgeneratorfunction(fn.fn):
            fn.fn = time_limited(fn.fn, seconds, room)
            n += 1
    return n
