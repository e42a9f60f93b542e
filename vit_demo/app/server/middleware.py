"""The gate in front of every HTTP route of the app (an ASGI middleware on Gradio's FastAPI app).

Before any route of Gradio's runs, :class:`Gate`:

- answers only requests addressed to the app's own names when it serves this computer only
  (``Host`` 127.0.0.1, localhost or ``[::1]``, plus ``--allowed-host``): a DNS-rebinding page,
  whose name now points at 127.0.0.1, gets 403 and nothing else;
- refuses request bodies over ``max_body`` bytes (1 MiB: the largest real one is a few KB of
  JSON) on every route but the upload route: a declared length at once (413, nothing read), an
  undeclared one as soon as it passes the limit, so a 100 MiB body costs the app 1 MiB at most;
- refuses a request that carries both ``Content-Length`` and ``Transfer-Encoding`` (400, and the
  connection closed), as HTTP/1.1 says a server may: uvicorn read such a body as chunked, to its
  end, while the upload budget had charged the 200 bytes its Content-Length declared;
- keeps each client's uploads within a budget over a sliding window (:class:`UploadBudget`,
  when the app is exposed), charging the bytes as they arrive: an upload whose declared length
  is past the client's share is refused (429) before it is read; one that passes it while it
  is read is cut there (429, the connection closed, the app told the client left). A declared
  length charges nothing by itself: headers without a body cost no budget, their client's nor
  the all-clients total, and a client under :attr:`UploadBudget.reserve` is never refused
  because of the total, so a few clients cannot lock every other out of uploads;
- closes the routes of Gradio's that this app never uses (screen recordings, the code editor,
  component servers, streaming input, deep links: a session's components written to a file
  for anyone who names the session);
- refuses a session hash (a body's ``session_hash``, a query's, the heartbeat's path) that is not
  1 to :data:`MAX_SESSION` letters, digits, ``-`` or ``_`` (400; Gradio's own clients send 11 to
  36): Gradio kept any string up to the body limit as a key of its sessions, and 1,100 hashes of
  900 KB from one address kept 0.8 GB;
- (``sessions``, the door's count of new sessions: :class:`vit_demo.app.server.lanes.SessionDoor`)
  lets a request of the routes that make a session's state before any check of Gradio's
  (:data:`SESSION_ROUTES`: ``/gradio_api/run/*``, ``/gradio_api/call/*``, which resolve their
  function through the session) name a new session only within its address's count, and forgets
  the session again when the route refused it: 1,100 such requests from one address (Gradio
  answers them 404, after making the state) had made Gradio forget every other visitor's session;
- caps every error response at :data:`MAX_ERROR` bytes, so that no error (the framework's own
  validation errors repeat the whole request) sends back more than a few dozen characters of
  what came in;
- (``--mcp``) takes an MCP request's body (a picture as a base64 data URL) up to ``mcp_body``
  bytes and charges it to the client's upload budget as it arrives, as an upload: Gradio writes the picture
  to disk before the tool runs. Gradio's MCP server then calls the app through its own client
  from this computer: those requests carry :data:`LOOPBACK_SECRET` (and the address of the MCP
  caller, :data:`FOR_HEADER`, which the gate sets on every MCP request and nobody else can),
  so their upload is not charged twice and the queue sees the caller's address, not 127.0.0.1;
  a caller that already has its tool calls in progress (:class:`CallerCap`, exposed) gets 429
  before its request is read (a refused call costs no parsing, no picture decoded or written),
  after :data:`BUSY_WAIT_S`: a caller that calls again and again is slowed to its pace.

The client is the connection's address (an IPv6 one by its /64:
:func:`~vit_demo.app.server.clients.client_group`), or the one a ``--trusted-proxy`` forwarded
(uvicorn applies ``X-Forwarded-For`` only from the addresses in ``FORWARDED_ALLOW_IPS``: app.py sets it).
No Gradio here.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from .clients import client_group

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

MAX_BODY = 1 << 20  # bytes of a request body (not an upload)
MAX_ERROR = 300  # bytes of an error response's body
CLOSED_ROUTES = ("/gradio_api/process_recording", "/gradio_api/vibe-edit", "/gradio_api/undo-vibe-edit",
                 "/gradio_api/vibe-code", "/gradio_api/component_server", "/gradio_api/stream/",
                 "/gradio_api/deep_link")
UPLOAD_ROUTE = "/gradio_api/upload"
HEARTBEAT_ROUTE = "/gradio_api/heartbeat/"
SESSION_ROUTES = ("/gradio_api/run/", "/gradio_api/api/", "/gradio_api/call/")  # POSTs that make a session's state first
MAX_SESSION = 128  # characters of a session hash (Gradio's page sends 11, its Python client 36)
SESSION_HASH = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_SESSION}}}")
BAD_SESSION = (f"A session hash is 1 to {MAX_SESSION} letters, digits, '-' or '_' (Gradio's clients send 11 to 36): "
               "reload the page.")
MCP_ROUTE = "/gradio_api/mcp"
LOOPBACK_SECRET = secrets.token_urlsafe(32)  # this process's own MCP client says so with it
SECRET_HEADER, FOR_HEADER = "x-vit-demo-loopback", "x-vit-demo-for"
BUSY_WAIT_S = 1.0  # how long a busy caller's refused request is held before its answer (no CPU meanwhile)
CALLS_BUSY = ("This caller already has its tool calls in progress ({n} at a time on this app): wait for one to "
              "finish, then call again (the app is open to the public and shares its work among its callers).")


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without the port (``[::1]:7860`` -> ``::1``), lower case."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class UploadBudget:
    """How much each client may take within ``window_s`` seconds (bytes of uploads; or new
    sessions, :mod:`vit_demo.app.server.lanes`), and all clients together (``total``). A client
    that has taken at most ``reserve`` in the window is never refused because of the total: each
    new client keeps that share, whatever the others took."""

    def __init__(self, per_client: int, total: int | None = None, window_s: float = 600, reserve: int = 0) -> None:
        self.per_client, self.total, self.window_s, self.reserve = int(per_client), total, window_s, int(reserve)
        self._log: dict[str, deque[list]] = defaultdict(deque)  # client -> [[when, amount], ...], oldest first
        self._sums: dict[str, int] = defaultdict(int)
        self._all = 0
        self._lock = threading.Lock()

    def _used(self, key: str, now: float) -> int:
        log = self._log.get(key)
        while log and now - log[0][0] > self.window_s:
            _, n = log.popleft()
            self._sums[key] -= n
            self._all -= n
        if log is not None and not log:
            del self._log[key]
            self._sums.pop(key, None)
        return self._sums.get(key, 0)

    def used(self, client: str) -> int:
        """What ``client`` has taken within the window."""
        with self._lock:
            return self._used(client, time.monotonic())

    def left(self, client: str) -> int:
        """What ``client`` may still take (its own share; the total is checked as it takes)."""
        return self.per_client - self.used(client)

    def take(self, client: str, nbytes: int) -> bool:
        """Charge ``nbytes`` to ``client`` if it (and the total, past the client's reserve) stays
        within budget; else False."""
        now = time.monotonic()
        with self._lock:
            mine = self._used(client, now) + nbytes
            if mine > self.per_client:
                return False
            if self.total is not None and mine > self.reserve and self._all + nbytes > self.total:
                for k in list(self._log):  # the others' old entries leave first
                    self._used(k, now)
                if self._all + nbytes > self.total:
                    return False
            log = self._log[client]
            if log and now - log[-1][0] < 1.0:  # (an upload's chunks: one entry a second)
                log[-1][1] += nbytes
            else:
                log.append([now, nbytes])
            self._sums[client] += nbytes
            self._all += nbytes
            return True


class CallerCap:
    """At most ``n`` MCP tool calls in progress per caller (client). The app's own MCP client
    counts a call from its submit to the end of its job (:meth:`wrap`, keyed by the caller that
    the gate wrote into the call's headers, :data:`FOR_HEADER`); a call past the cap is refused at
    once (:data:`CALLS_BUSY`), before it takes one of the threads of Gradio's MCP client (40,
    shared by every caller) or a place in the queue, and the gate refuses a busy caller's next
    requests before reading them (:meth:`full`). Without it, one address held 16 places of the
    queue (its share) and another caller's calls waited behind them. ``elsewhere(caller)``: the
    caller's tool events in flight that came another way (the page's queue, called by their
    index: :class:`vit_demo.app.server.lanes.Door` sets it and applies the same cap to them)."""

    def __init__(self, n: int) -> None:
        self.n, self.lock = n, threading.Lock()
        self.busy: dict[str, int] = {}  # caller -> its calls in progress (through MCP)
        self.elsewhere: Callable[[str], int] = lambda _caller: 0

    def in_progress(self, caller: str) -> int:
        """The caller's tool calls in progress, however they were made."""
        with self.lock:
            mine = self.busy.get(caller, 0)
        return mine + self.elsewhere(caller)

    def full(self, caller: str) -> bool:
        return self.in_progress(caller) >= self.n

    def release(self, caller: str) -> None:
        with self.lock:
            left = self.busy.get(caller, 1) - 1
            if left > 0:
                self.busy[caller] = left
            else:
                self.busy.pop(caller, None)

    def wrap(self, submit: Callable) -> Callable:
        """``submit`` (a gradio_client ``Client``'s) within the cap: a ValueError past it (Gradio's
        MCP server answers it as an MCP error)."""

        def capped(*args: Any, headers: dict | None = None, **kwargs: Any) -> Any:
            caller = (headers or {}).get(FOR_HEADER, "")
            others = self.elsewhere(caller)
            with self.lock:
                if self.busy.get(caller, 0) + others >= self.n:
                    raise ValueError(CALLS_BUSY.format(n=self.n))
                self.busy[caller] = self.busy.get(caller, 0) + 1
            try:
                job = submit(*args, headers=headers, **kwargs)
            except BaseException:
                self.release(caller)
                raise
            job.future.add_done_callback(lambda _done: self.release(caller))
            return job

        return capped


async def _plain(send: Send, status: int, text: str, close: bool = False) -> None:
    """A short JSON answer; ``close``: the connection closes after it (a body left unread)."""
    body = json.dumps({"detail": text}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})


UPLOADS_USED = "Upload budget used up: this client has uploaded its share for now. Try again in a few minutes."
PICTURES_USED = "Upload budget used up: this client has sent its share of pictures for now. Try again in a few minutes."


class Gate:
    """The ASGI middleware of the module docstring. ``allowed_hosts``: the names the app answers
    to (None: any, an exposed app); ``budget``: the upload budget (None: no budget)."""

    def __init__(self, app: Any, allowed_hosts: Iterable[str] | None = None, max_body: int = MAX_BODY,
                 budget: UploadBudget | None = None, closed: Iterable[str] = CLOSED_ROUTES,
                 mcp_body: int = MAX_BODY, calls: CallerCap | None = None, sessions: Any = None) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None else {host_name(h) for h in allowed_hosts}
        self.max_body, self.budget, self.closed, self.mcp_body = max_body, budget, tuple(closed), mcp_body
        self.calls, self.sessions = calls, sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers", [])}
        if self.allowed is not None and host_name(headers.get("host", "")) not in self.allowed:
            return await _plain(send, 403, "This app answers only to its own address.")
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        if "transfer-encoding" in headers and "content-length" in headers:  # two framings: refused (RFC 9112, 6.1)
            return await _plain(send, 400, "A request may not carry both Content-Length and Transfer-Encoding.",
                                close=True)
        path = scope.get("path", "")
        if any(path == c or path.startswith(c if c.endswith("/") else c + "/") for c in self.closed):
            return await _plain(send, 404, "Not found.")
        length = headers.get("content-length")
        declared = int(length) if length and length.isdigit() else None
        scope, loopback = for_caller(scope, headers)
        if path == MCP_ROUTE or path.startswith(MCP_ROUTE + "/"):
            return await self.mcp(scope, receive, send, declared)
        if path.rstrip("/") == UPLOAD_ROUTE:
            if self.budget is None or loopback:
                return await self.app(scope, receive, _capped(send))
            if declared is None:
                return await _plain(send, 411, "An upload must say its length.", close=True)
            client = client_of(scope)
            if declared > self.budget.left(client):  # refused before it is read; nothing charged
                return await _plain(send, 429, UPLOADS_USED, close=True)
            return await self.charged(scope, receive, send, client)
        if declared is not None and declared > self.max_body:
            return await _plain(send, 413, f"Request body too large (the limit is {self.max_body // 1024} KB).",
                                close=True)
        body, more = await _read_up_to(receive, self.max_body)
        if more is None:
            return None  # the client left (or was too slow): nobody to answer
        if more:
            return await _plain(send, 413, f"Request body too large (the limit is {self.max_body // 1024} KB).",
                                close=True)
        session, bad = session_of(scope, body)
        if bad:
            return await _plain(send, 400, BAD_SESSION)
        if (session and self.sessions is not None and not loopback and scope.get("method") == "POST"
                and path.startswith(SESSION_ROUTES)):
            return await self.new_session(scope, _replay(body, receive), send, session)
        return await self.app(scope, _replay(body, receive), _capped(send))

    async def new_session(self, scope: Scope, receive: Receive, send: Send, session: str) -> None:
        """A route that makes ``session``'s state before Gradio checks anything: a new session is
        counted by the door first (429 past its address's count), and forgotten when the route
        refuses the request (it ran nothing, and nothing of it is kept)."""
        capped = _capped(send)
        if self.sessions.known(session):
            return await self.app(scope, receive, capped)
        why = self.sessions.admit(session, client_of(scope))
        if why:
            return await _plain(send, 429, why)
        status = [500]

        async def noted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message.get("status", 200)
            await capped(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            if status[0] >= 400:
                self.sessions.forget(session)

    async def charged(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        """The upload route with every chunk of the body charged to ``client`` as it arrives: past
        the budget, the app is told the client left and the client gets 429 (connection closed)."""
        over = {"yes": False, "answered": False}
        counted = charging(receive, self.budget, client, over)

        async def answer(message: dict) -> None:
            if over["yes"]:
                return None  # the app's answer to a cut upload: ours goes instead
            over["answered"] = True
            return await capped(message)

        capped = _capped(send)
        try:
            await self.app(scope, counted, answer)
        except Exception:  # the app's error for a body cut short (a ClientDisconnect)
            if not over["yes"]:
                raise
        if over["yes"] and not over["answered"]:
            await _plain(send, 429, UPLOADS_USED, close=True)

    async def mcp(self, scope: Scope, receive: Receive, send: Send, declared: int | None) -> None:
        """An MCP request: its body within ``mcp_body`` and the client's upload budget (charged as
        it arrives), the caller written into its headers for the app's own MCP client to pass on."""
        client = client_of(scope)
        if self.calls is not None and self.calls.full(client):
            await asyncio.sleep(BUSY_WAIT_S)  # a caller that asks again at once does so once a second at most
            return await _plain(send, 429, CALLS_BUSY.format(n=self.calls.n))
        if declared is not None and declared > self.mcp_body:
            return await _plain(send, 413, f"Request body too large (the limit is {self.mcp_body >> 20} MB).",
                                close=True)
        if self.budget is not None and declared is not None and declared > self.budget.left(client):
            return await _plain(send, 429, PICTURES_USED, close=True)
        over = {"yes": False}
        counted = receive if self.budget is None else charging(receive, self.budget, client, over)
        body, more = await _read_up_to(counted, self.mcp_body)
        if over["yes"]:
            return await _plain(send, 429, PICTURES_USED, close=True)
        if more is None:
            return None
        if more:
            return await _plain(send, 413, f"Request body too large (the limit is {self.mcp_body >> 20} MB).",
                                close=True)
        kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (SECRET_HEADER.encode(), FOR_HEADER.encode())]
        scope = {**scope, "headers": [*kept, (FOR_HEADER.encode(), client.encode("latin1", "replace"))]}
        return await self.app(scope, _replay(body, receive), _capped(send))


def session_of(scope: Scope, body: bytes) -> tuple[str | None, bool]:
    """The session hash a request names (its JSON body's ``session_hash``, its query's, the
    heartbeat route's path), and whether one it names is not a hash (:data:`SESSION_HASH`)."""
    found: list[Any] = []
    path = scope.get("path", "")
    if path.startswith(HEARTBEAT_ROUTE):
        found.append(path[len(HEARTBEAT_ROUTE):])
    query = scope.get("query_string", b"")
    if query:
        found += parse_qs(query.decode("latin1")).get("session_hash", [])
    if body.lstrip()[:1] == b"{":
        try:
            value = json.loads(body)
        except ValueError:  # not JSON: the route says so
            value = None
        if isinstance(value, dict) and value.get("session_hash") is not None:
            found.append(value["session_hash"])
    bad = any(not isinstance(s, str) or not SESSION_HASH.fullmatch(s) for s in found)
    return (None, True) if bad else (found[0] if found else None, False)


def client_of(scope: Scope) -> str:
    """The client a request counts for: its address (an IPv6 one by its /64), ``?`` when unknown."""
    return client_group((scope.get("client") or ("?",))[0]) or "?"


def charging(receive: Receive, budget: UploadBudget, client: str, over: dict) -> Receive:
    """``receive`` with every chunk of the body charged to ``client`` as it arrives; the first
    chunk past the budget sets ``over["yes"]``, and from then on the app hears ``http.disconnect``."""

    async def counted() -> dict:
        if over["yes"]:
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.request":
            n = len(message.get("body", b""))
            if n and not budget.take(client, n):
                over["yes"] = True
                return {"type": "http.disconnect"}
        return message

    return counted


def from_own_client(headers: Any) -> bool:
    """Whether a request's headers mark it as this app's own MCP client's (see :func:`for_caller`)."""
    secret = headers.get(SECRET_HEADER, "") if headers is not None else ""
    return bool(secret) and hmac.compare_digest(secret, LOOPBACK_SECRET)


def for_caller(scope: Scope, headers: dict[str, str]) -> tuple[Scope, bool]:
    """A request of this app's own MCP client (from this computer, with :data:`LOOPBACK_SECRET`)
    as coming from the MCP caller it works for; (scope, whether it is one)."""
    client = (scope.get("client") or ("?",))[0]
    if client not in ("127.0.0.1", "::1") or not from_own_client(headers):
        return scope, False
    caller = headers.get(FOR_HEADER, "").strip()
    return ({**scope, "client": (caller, 0)} if caller else scope), True


async def _read_up_to(receive: Receive, limit: int) -> tuple[bytes, bool | None]:
    """The request's body, read while it stays within ``limit`` (True: it went past; None: the
    client left before its end, or sent it too slowly: :mod:`vit_demo.app.server.connections`)."""
    chunks, n = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", None
        chunk = message.get("body", b"")
        n += len(chunk)
        if n > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the buffered body once, then what the connection says."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _capped(send: Send) -> Send:
    """A send that cuts an error response's body to :data:`MAX_ERROR` bytes (a longer one is
    replaced by a short note): no error repeats much of what came in."""
    state: dict[str, Any] = {"error": False, "start": None, "body": b""}

    async def capped(message: dict) -> None:
        if state.get("done"):
            return None
        if message["type"] == "http.response.start":
            if message.get("status", 200) < 400:
                return await send(message)
            state.update(error=True, start=message)
            return None
        if not state["error"] or message["type"] != "http.response.body":
            return await send(message)
        state["body"] += message.get("body", b"")
        if message.get("more_body", False) and len(state["body"]) <= MAX_ERROR:
            return None
        body = state["body"]
        if len(body) > MAX_ERROR:
            body = json.dumps({"detail": "The request was refused."}).encode()
        start = dict(state["start"])
        start["headers"] = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length",
                                                                                             b"content-encoding")]
        start["headers"].append((b"content-length", str(len(body)).encode()))
        await send(start)
        await send({"type": "http.response.body", "body": body})
        state["done"] = True  # sent: anything after it is dropped

    return capped
