"""Connections before they are requests: a bound on how many one address may hold open, and on
how long a connection may take to send its request headers.

Nothing else in the app sees a connection that has not sent its headers (the gate,
:mod:`vit_demo.app.server.middleware`, starts at the first request). uvicorn, which runs Gradio's
server, closes an idle kept-alive connection after 5 s, but waits for unfinished headers
forever: 2 x 10,000 such connections from one address took every file descriptor (the
process's limit was 20,000), ``/config`` and other clients' predictions timed out, and asyncio
logged a traceback per refused ``accept()`` (617 MB of log in 100 s).

:class:`GuardedProtocol` is uvicorn's own HTTP protocol (h11, or httptools when installed) with
two rules, applied as soon as the connection is accepted:

- an address holding :attr:`ConnectionRules.per_address` connections has its next one closed
  at once (none for a local app; never for ``--trusted-proxy`` addresses, nor for the share
  tunnel's 127.0.0.1, which carry many clients);
- a connection whose request headers are not complete :attr:`ConnectionRules.header_seconds`
  after it opened, or after its last response (keep-alive), is closed.

:func:`guard_connections` makes it the protocol of uvicorn's ``http="auto"``, which Gradio's
``launch()`` uses (a seam of uvicorn 0.54: ``uvicorn.config.HTTP_PROTOCOLS``). No Gradio here.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Any

import uvicorn.config
from uvicorn.protocols.http.auto import AutoHTTPProtocol

HEADER_SECONDS = 10.0  # to send a request's headers (a browser sends them at once)
PER_ADDRESS = 100  # connections one address may hold open, when exposed (a browser opens about 6)
STALL_S = 0.5  # a header timer this late means the event loop was stalled: one more second first


@dataclass(frozen=True)
class ConnectionRules:
    """``per_address``: None for no cap; ``exempt``: addresses or networks without the cap."""

    header_seconds: float = HEADER_SECONDS
    per_address: int | None = None
    exempt: tuple[str, ...] = ()

    def capped(self, host: str | None) -> bool:
        """Whether connections from ``host`` count against the cap."""
        if self.per_address is None or host is None:
            return False
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return True
        return not any(ip in ipaddress.ip_network(net, strict=False) for net in self.exempt)


RULES = ConnectionRules()
OPEN: dict[str, int] = {}  # address -> connections it holds open (counted ones only)


class GuardedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
    """uvicorn's HTTP protocol with the rules of the module docstring."""

    counted: str | None = None  # the address this connection is counted for
    refused = False
    idle_cycle: Any = None  # the request cycle when the connection last became idle
    header_timer: asyncio.TimerHandle | None = None
    due = 0.0  # when the headers are due (the loop's clock)
    graced = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        if RULES.capped(host):
            if OPEN.get(host, 0) >= (RULES.per_address or 0):
                self.refused = True
                transport.abort()  # before any state: nothing of it is kept
                return
            OPEN[host] = OPEN.get(host, 0) + 1
            self.counted = host
        super().connection_made(transport)
        self.await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.release()
        if self.header_timer is not None:
            self.header_timer.cancel()
        super().connection_lost(exc)

    def release(self) -> None:
        """This connection no longer counts against its address."""
        host, self.counted = self.counted, None
        if host is not None:
            left = OPEN.get(host, 1) - 1
            if left > 0:
                OPEN[host] = left
            else:
                OPEN.pop(host, None)

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


def guard_connections(rules: ConnectionRules) -> None:
    """Every connection of the server Gradio starts (uvicorn's ``http="auto"``) follows ``rules``."""
    global RULES
    RULES = rules
    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:GuardedProtocol"
