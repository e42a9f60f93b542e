"""Connections before they are answered: how many one client and all clients together may hold
open, how long a connection may take to send its request headers, and how slowly its body.

Nothing else in the app sees a connection that has not sent its headers (the gate,
:mod:`vit_demo.app.server.middleware`, starts at the first request), and the gate's read of a
body waits for as long as the client takes. uvicorn, which runs Gradio's server, closes an idle
kept-alive connection after 5 s, but waits for unfinished headers, and for a body, forever: 2 x
10,000 connections that never finished their headers from one address took every file descriptor
(the process's limit was 20,000); 25 addresses x 100 connections that sent their body one byte
every 5 s held a limit of 2,048 for as long as they liked, another client's predictions timed
out, and ``accept()`` failed 17,000 times a second.

:class:`GuardedProtocol` is uvicorn's own HTTP protocol (h11, or httptools when installed) with
these rules, applied as soon as the connection is accepted:

- a client (an address, an IPv6 /64: :func:`~vit_demo.app.server.clients.client_group`) holding
  :attr:`ConnectionRules.per_address` connections has its next one closed at once (none for a
  local app; never for ``--trusted-proxy`` addresses, nor for the share tunnel's 127.0.0.1,
  which carry many clients);
- all clients together hold at most :attr:`ConnectionRules.fd_share` of the process's file
  limit (``RLIMIT_NOFILE``, read again every second), and less when the process's other files
  (counted in ``/proc/self/fd`` at the same time) leave less than :func:`room` free: past it, a
  new connection closes the oldest idle or slowest connection of a client that holds more than
  its own (the one that holds the most: :class:`Census`); when every client holds about as many,
  the response stream open longest (:class:`Streams`) for a client that holds fewer than
  :data:`FEW`; else it is itself closed; so no number of addresses can take every file
  descriptor, and a new client always gets in (asyncio accepts :data:`ACCEPT_BURST` connections
  at most in one go: :class:`BoundedConfig`);
- a response that streams (an event stream, or a body of unknown length: Gradio's heartbeat,
  which sends a line every 15 s for as long as the page is open, the queue's event streams, the
  MCP server's) holds its connection for as long as the client likes, where no header or body
  timer applies: all clients together hold at most :data:`STREAM_SHARE` of the connections'
  share as streams, one client (exposed) :data:`STREAMS_PER_CLIENT`; past either, the stream
  open longest (the client's own, past its cap) is closed, and a browser's page opens it again
  when it needs it. 700 addresses each holding one heartbeat took every place of a file limit of
  1,024, and every new visitor was refused;
- a connection whose request headers are not complete :attr:`ConnectionRules.header_seconds`
  after it opened, or after its last response (keep-alive), is closed;
- once a request's headers are in, its body must keep up :attr:`ConnectionRules.body_rate`
  bytes a second on average after a grace of ``header_seconds`` (so a 1 MiB body has
  ``header_seconds`` + 64 s), with no gap longer than ``header_seconds``; time the server itself
  does not read (its buffer full) does not count. A body too slow is answered 408 (when nothing
  was answered yet) and the connection closed: the app's ``receive`` says ``http.disconnect``.

:func:`guard_connections` makes it the protocol of uvicorn's ``http="auto"``, which Gradio's
``launch()`` uses (seams of uvicorn 0.54: ``uvicorn.config.HTTP_PROTOCOLS``, and ``uvicorn.Config``
for the backlog). No Gradio here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

import uvicorn.config
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .clients import client_group

HEADER_SECONDS = 10.0  # to send a request's headers (a browser sends them at once)
BODY_RATE = 16 << 10  # bytes a second a request body must keep up on average, after its grace
FD_SHARE = 0.6  # of the process's file limit: connections of all clients together (the rest: the app's own files)
STREAM_SHARE = 0.5  # of the connections' share: response streams of all clients together (heartbeats, event streams)
STREAMS_PER_CLIENT = 32  # response streams one client may hold open, when exposed (a browser tab holds about 2)
FEW = 8  # connections a browser holds at most: a client holding fewer is one a stream may yield its place to
ACCEPT_BURST = 64  # connections asyncio accepts in one go (uvicorn's backlog, 2,048 by default), before any is seen
STALL_S = 0.5  # a timer this late means the event loop was stalled: one more second first
LIMIT_EVERY_S = 1.0  # how often the file limit is read again (a host may change it while the app runs)
BODY_408 = b'{"detail": "The request body came too slowly: the connection closes."}'
TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
               + str(len(BODY_408)).encode() + b"\r\nconnection: close\r\n\r\n" + BODY_408)


@dataclass(frozen=True)
class ConnectionRules:
    """``per_address``: None for no cap; ``exempt``: addresses or networks without the cap;
    ``body_rate``: bytes a second a body must average; ``fd_share``: of the file limit, for the
    connections of all clients together (None: no total)."""

    header_seconds: float = HEADER_SECONDS
    per_address: int | None = None
    exempt: tuple[str, ...] = ()
    body_rate: int = BODY_RATE
    fd_share: float | None = FD_SHARE

    def capped(self, host: str | None) -> bool:
        """Whether connections from ``host`` count against the cap."""
        if self.per_address is None or host is None:
            return False
        return not self.is_exempt(host)

    def is_exempt(self, host: str | None) -> bool:
        """Whether ``host`` is a ``--trusted-proxy`` or the share tunnel (many clients behind one address)."""
        if host is None:
            return False
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(ip in ipaddress.ip_network(net, strict=False) for net in self.exempt)


class Census:
    """The open connections of every client, oldest first, and how many in all; which client holds
    the most in O(1) (the clients by count, in buckets)."""

    def __init__(self) -> None:
        self.by_client: dict[str, dict[Any, None]] = {}  # client -> its connections, in the order they opened
        self.buckets: dict[int, dict[str, None]] = {}  # count -> the clients holding that many
        self.most = 0
        self.total = 0
        self.limit_read_at = -1.0
        self.high_water: int | None = None

    def count(self, client: str) -> int:
        return len(self.by_client.get(client, ()))

    def _move(self, client: str, old: int, new: int) -> None:
        if old:
            bucket = self.buckets[old]
            bucket.pop(client, None)
            if not bucket:
                del self.buckets[old]
        if new:
            self.buckets.setdefault(new, {})[client] = None
        self.most = max(self.most, new)
        while self.most and self.most not in self.buckets:
            self.most -= 1

    def add(self, client: str, conn: Any) -> None:
        conns = self.by_client.setdefault(client, {})
        conns[conn] = None
        self.total += 1
        self._move(client, len(conns) - 1, len(conns))

    def remove(self, client: str, conn: Any) -> None:
        conns = self.by_client.get(client)
        if conns is None or conn not in conns:
            return
        del conns[conn]
        self.total -= 1
        self._move(client, len(conns) + 1, len(conns))
        if not conns:
            del self.by_client[client]

    def busiest(self, rules: ConnectionRules) -> str | None:
        """A client holding the most connections (one that is no proxy, when there is one)."""
        clients = self.buckets.get(self.most)
        if not clients:
            return None
        return next((c for c in clients if not rules.is_exempt(c)), next(iter(clients)))

    def full(self, rules: ConnectionRules) -> bool:
        """Whether all clients together hold their share of the file limit."""
        self.read_limit(rules)
        return self.high_water is not None and self.total >= self.high_water

    def read_limit(self, rules: ConnectionRules) -> None:
        """The connections' high-water mark, from the file limit and the process's other files (once
        a second): the smaller of ``fd_share`` of the limit and what the other files leave free,
        :func:`room` kept for a new client."""
        now = time.monotonic()
        if rules.fd_share is None or now - self.limit_read_at <= LIMIT_EVERY_S:
            return
        self.limit_read_at = now
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            self.high_water = None
            return
        others = max(0, (open_descriptors() or self.total) - self.total)  # the app's own files, uploads' included
        self.high_water = max(16, min(int(rules.fd_share * soft), soft - others - room(soft)))

    def stream_cap(self) -> int | None:
        """Response streams all clients together may hold (None: no cap, no file limit)."""
        return None if self.high_water is None else max(8, int(STREAM_SHARE * self.high_water))


def room(soft: int) -> int:
    """File descriptors kept free, whatever the connections: a new client's connection, the files of
    its request."""
    return max(16, soft // 16)


def open_descriptors() -> int | None:
    """How many file descriptors this process holds (None where ``/proc`` cannot say)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


class Streams:
    """The connections whose response is a stream still going, oldest first, per client too."""

    def __init__(self) -> None:
        self.open: dict[Any, str] = {}  # connection -> its client, in the order the streams started
        self.by_client: dict[str, dict[Any, None]] = {}

    def add(self, conn: Any, client: str) -> None:
        self.open[conn] = client
        self.by_client.setdefault(client, {})[conn] = None

    def remove(self, conn: Any) -> None:
        client = self.open.pop(conn, None)
        if client is None:
            return
        mine = self.by_client.get(client, {})
        mine.pop(conn, None)
        if not mine:
            self.by_client.pop(client, None)

    def count(self, client: str) -> int:
        return len(self.by_client.get(client, ()))

    def oldest(self, client: str | None = None) -> Any:
        """The stream open longest (of ``client``, when given), or None."""
        pool = self.open if client is None else self.by_client.get(client, {})
        return next(iter(pool), None)

    def over(self, client: str, per_client: int | None, total: int | None) -> list[Any]:
        """The streams to close so that ``client`` holds at most ``per_client`` and all together at
        most ``total``: the client's oldest past its own cap, then the oldest of all."""
        out: list[Any] = []
        mine = list(self.by_client.get(client, {}))
        if per_client is not None and len(mine) > per_client:
            out += mine[: len(mine) - per_client]
        if total is not None and len(self.open) - len(out) > total:
            gone = set(out)
            out += [c for c in self.open if c not in gone][: len(self.open) - len(out) - total]
        return out


RULES = ConnectionRules()
CENSUS = Census()
STREAMS = Streams()


class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with the rules of the module docstring."""

    counted: str | None = None  # the client this connection is counted for
    capped = False  # whether its client has the per-client caps (exposed, no proxy)
    refused = False
    streaming = False  # its response is a stream still going (in STREAMS)
    sent_cycle: Any = None  # the request whose response is watched
    idle_cycle: Any = None  # the request cycle when the connection last became idle
    header_timer: asyncio.TimerHandle | None = None
    due = 0.0  # when the headers are due (the loop's clock)
    graced = False
    body_cycle: Any = None  # the request whose body is watched
    body_timer: asyncio.TimerHandle | None = None
    body_start = body_last = body_credit = 0.0  # (the loop's clock; seconds the server did not read)
    body_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        client = client_group(host) or "?"
        if not self.admit(client, host):
            self.refused = True
            transport.abort()  # before any state: nothing of it is kept
            return
        CENSUS.add(client, self)
        self.counted, self.capped = client, RULES.capped(host)
        super().connection_made(transport)
        self.await_headers()

    @staticmethod
    def admit(client: str, host: str | None) -> bool:
        """Whether a new connection of ``client`` may open (closing another client's when all
        together hold their share of the file limit)."""
        if RULES.capped(host) and CENSUS.count(client) >= (RULES.per_address or 0):
            return False
        if CENSUS.full(RULES):
            mine, victim = CENSUS.count(client), CENSUS.busiest(RULES)
            if victim is not None and mine + 1 < CENSUS.count(victim):  # a client that holds more than this one
                oldest_idle_or_slowest(CENSUS.by_client[victim]).evict()
                return True
            stream = STREAMS.oldest()
            if stream is None or mine >= FEW:
                return False  # this client is (about) the busiest itself: its new connection goes
            stream.evict()  # every client holds about as many: a stream, which a page opens again when it needs it
        return True

    def evict(self) -> None:
        """Close this connection now, to make room for another client's."""
        self.release()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.release()
        for timer in (self.header_timer, self.body_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def release(self) -> None:
        """This connection no longer counts against its client."""
        client, self.counted = self.counted, None
        if client is not None:
            CENSUS.remove(client, self)
        self.stream_ended()

    # -- the response

    def watch_response(self, cycle: Any) -> None:
        """A new request: its response, if it streams, counts among the streams until its end."""
        self.sent_cycle = cycle
        send = cycle.send

        async def watched(message: dict) -> None:
            kind = message.get("type")
            if kind == "http.response.start" and is_stream(message.get("headers") or ()):
                self.stream_started()
            elif kind == "http.response.body" and not message.get("more_body", False):
                self.stream_ended()
            await send(message)

        cycle.send = watched  # (read when the request's task starts, after this)

    def stream_started(self) -> None:
        client = self.counted
        if client is None or self.streaming:
            return
        self.streaming = True
        STREAMS.add(self, client)
        CENSUS.read_limit(RULES)
        per_client = STREAMS_PER_CLIENT if self.capped else None
        for old in STREAMS.over(client, per_client, CENSUS.stream_cap()):
            if old is not self:
                old.evict()

    def stream_ended(self) -> None:
        if self.streaming:
            self.streaming = False
            STREAMS.remove(self)

    # -- the headers

    def await_headers(self) -> None:
        """Close the connection unless a new request's headers arrive within the time allowed."""
        if self.header_timer is not None:
            self.header_timer.cancel()
        self.idle_cycle, self.graced = self.cycle, False
        self.due = self.loop.time() + RULES.header_seconds
        self.header_timer = self.loop.call_later(RULES.header_seconds, self.headers_due)

    def headers_due(self) -> None:
        self.header_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.loop.time() - self.due > STALL_S and not self.graced:  # the loop itself was late (a busy
            self.graced = True  # machine): the headers may be waiting unread; one more second
            self.header_timer = self.loop.call_later(1.0, self.headers_due)
            return
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket: no longer ours
            self.release()
            return
        if self.cycle is self.idle_cycle:  # no request's headers since the connection became idle
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.await_headers()

    # -- the body

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle is self.body_cycle:
            self.body_bytes += len(data)
            self.body_last = self.loop.time()
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self.idle_cycle and cycle is not self.body_cycle:
            self.watch_body(cycle)
        if cycle is not None and cycle is not self.idle_cycle and cycle is not self.sent_cycle:
            self.watch_response(cycle)

    def watch_body(self, cycle: Any) -> None:
        """A new request's headers are in: its body (if it has one to come) must keep up."""
        self.body_cycle = cycle
        if not getattr(cycle, "more_body", False):
            return
        now = self.loop.time()
        self.body_start = self.body_last = now
        self.body_bytes, self.body_credit = 0, 0.0
        self.arm_body(RULES.header_seconds, now)

    def arm_body(self, delay: float, now: float) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
        self.body_timer = self.loop.call_later(max(0.05, delay), self.body_due, now + max(0.05, delay))

    def body_due(self, scheduled: float) -> None:
        self.body_timer = None
        cycle = self.body_cycle
        if (self.transport is None or self.transport.is_closing() or cycle is not self.cycle
                or not getattr(cycle, "more_body", False) or getattr(cycle, "response_complete", False)):
            return
        now = self.loop.time()
        if now - scheduled > STALL_S or getattr(getattr(self, "flow", None), "read_paused", False):
            self.body_credit += now - scheduled + 1.0  # a late loop, or the server not reading: not the client's time
            self.arm_body(1.0, now)
            return
        grace = RULES.header_seconds
        due = min(self.body_start + grace + self.body_bytes / max(1, RULES.body_rate),  # the average rate
                  self.body_last + grace) + self.body_credit  # the longest gap
        if now < due:
            self.arm_body(due - now, now)
            return
        self.body_late(cycle)

    def body_late(self, cycle: Any) -> None:
        """Answer 408 (if nothing was answered yet) and close; the app's receive says disconnect."""
        if not getattr(cycle, "response_started", True):
            cycle.response_started = True
            self.transport.write(TIMEOUT_408)
        cycle.disconnected = True
        event = getattr(cycle, "message_event", None)
        if event is not None:
            event.set()
        self.transport.close()


def is_stream(headers: Any) -> bool:
    """Whether a response with these headers streams: an event stream, or a body of unknown length."""
    names = {bytes(k).lower(): bytes(v) for k, v in headers}
    return b"content-length" not in names or names.get(b"content-type", b"").startswith(b"text/event-stream")


def oldest_idle_or_slowest(conns: dict[GuardedProtocol, None]) -> GuardedProtocol:
    """Of one client's connections (oldest first): the oldest that is between requests or still
    sending a request (headers or body), else the oldest."""
    for conn in conns:
        cycle = conn.cycle
        if cycle is None or cycle is conn.idle_cycle or getattr(cycle, "more_body", False):
            return conn
    return next(iter(conns))


class BoundedConfig(uvicorn.config.Config):
    """uvicorn's settings with a backlog of :data:`ACCEPT_BURST`. asyncio accepts up to the backlog's
    number of connections at once, each a file descriptor, before any of them reaches
    :class:`GuardedProtocol`: with uvicorn's 2,048, one burst took a file limit of 2,048 whatever
    the cap on connections said. The listening queue is as long (the kernel's: a client past it
    retries its connect)."""

    def __init__(self, *args: Any, backlog: int = ACCEPT_BURST, **kwargs: Any) -> None:
        super().__init__(*args, backlog=min(backlog, ACCEPT_BURST), **kwargs)


def guard_connections(rules: ConnectionRules) -> None:
    """Every connection of the server Gradio starts (uvicorn's ``http="auto"``, through ``uvicorn.Config``,
    which Gradio's ``launch()`` calls) follows ``rules``."""
    global RULES
    RULES = rules
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedProtocol"
    uvicorn.Config = BoundedConfig


def raise_file_limit() -> tuple[int | None, int | None]:
    """Raise this process's soft file limit to its hard limit, as Go's runtime does at start (a
    service often starts with a soft limit of 1,024 under a hard one of many thousands): (the
    soft limit before, after; None: no limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(open("/proc/sys/fs/nr_open").read())  # noqa: SIM115 - the kernel's ceiling
        except (OSError, ValueError):
            target = soft
    if soft != resource.RLIM_INFINITY and target != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            pass
    after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    as_number = (lambda n: None if n == resource.RLIM_INFINITY else int(n))
    return as_number(soft), as_number(after)


def describe(rules: ConnectionRules, before: int | None, limit: int | None) -> str:
    """The start-up line: the file limit and what the rules make of it."""
    if limit is None:
        return "connections: no file limit"
    was = f", raised from {before}" if before is not None and before != limit else ""
    conns = int((rules.fd_share or 1.0) * limit)
    per = (f"; one address at most {rules.per_address} connections and {STREAMS_PER_CLIENT} streams"
           if rules.per_address is not None else "")
    return (f"connections: file limit {limit:,} open files{was}: at most {conns:,} connections in all, "
            f"{max(8, int(STREAM_SHARE * conns)):,} of them response streams{per}")
