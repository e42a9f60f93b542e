"""Connections that never finish their headers (issue 35, point 2), bodies that never finish and
connections from many addresses (issue 47, break 1), against the running ``--exposed`` app with
a short header time (``--header-seconds 3``), the log's repeat filter, and the census of
connections the rules count with (without a server).

Before: 2,000 such connections from one address all stayed open 60 s, and 20,000 took every
file descriptor (other clients timed out; asyncio logged a traceback per refused accept, 617
MB in 100 s). Now one address holds at most 100 connections, each closed when its headers are
late, and a repeated log line is kept at most 20 times a minute. Issue 47: a body sent one byte
at a time was waited for forever (25 addresses x 100 held a file limit of 2,048); now a body
must keep up 16 KB/s after a grace of ``--header-seconds`` (408, closed), and all addresses
together hold at most 60 % of the file limit, a new address's connection closing one of the
busiest address's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from attacks import Drip, open_files, raw_request, slow_connections, status_of, still_open

httpx = pytest.importorskip("httpx")

HEADER_S = 3


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--header-seconds", str(HEADER_S), "--no-warm-up"]
    with running_app(args) as a:
        yield a


def _config_times(url: str, n: int) -> list[float]:
    """Seconds for ``n`` requests of /config, each on a new connection (a kept-alive one idle
    past the 3 s header time here would be closed under the client's next request)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert httpx.get(url + "config", timeout=30).status_code == 200
        times.append(time.perf_counter() - t0)
    return times


def test_slow_connections_from_one_address(app) -> None:
    quiet = _config_times(app.url, 5)
    log_before = app.log_path.stat().st_size
    flood = slow_connections(app.port, 300)
    try:
        time.sleep(0.5)
        during = still_open(flood)
        busy = _config_times(app.url, 10)  # another client (127.0.0.1; the flood comes from 127.0.0.2)
        time.sleep(HEADER_S + 2.5)  # (+1 s: the grace after a stalled loop)
        after = still_open(flood)
    finally:
        for s in flood:
            s.close()
    p95, p95_quiet = float(np.percentile(busy, 95)), float(np.percentile(quiet, 95))
    grown = app.log_path.stat().st_size - log_before
    print(f"300 slow connections: {during} open after 0.5 s, {after} after {HEADER_S + 3} s; "
          f"another client's /config p95 {p95:.3f} s (quiet {p95_quiet:.3f} s); log +{grown} bytes")
    assert during <= 100 and after == 0, (during, after)
    assert p95 < max(2.0, 5 * p95_quiet), (busy, quiet)
    assert grown < 20_000 and app.alive()


def test_a_repeated_log_line_is_kept_20_times_a_minute() -> None:
    from vit_demo.app.server.quietlog import RepeatFilter

    f = RepeatFilter(per_minute=20, window_s=0.3)
    rec = lambda msg: logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)  # noqa: E731
    kept = [f.filter(rec(f"socket.accept() out of system resource\nsocket: fd={i}")) for i in range(1000)]
    assert sum(kept) == 20 and all(kept[:20])
    assert f.filter(rec("another message"))  # another kind has its own count
    time.sleep(0.35)
    first = rec("socket.accept() out of system resource\nsocket: fd=5")
    assert f.filter(first) and first.getMessage().startswith("(980 more like this were dropped in the last minute)")


def test_census_against_a_plain_count(monkeypatch) -> None:
    """The census the connection rules read, after 2,000 random opens and closes from 12 addresses
    (a proxy among them): every client's count, the total, and the busiest client (a proxy only when
    no one else holds as many) equal a plain count; ``admit`` refuses a capped client's connection
    past ``per_address`` and, with the file share full, closes the busiest client's oldest idle one."""
    import random

    from vit_demo.app.server import connections as cx

    rules = cx.ConnectionRules(per_address=5, exempt=("127.0.9.0/24",), fd_share=None)
    census, plain = cx.Census(), {}
    rng = random.Random(0)
    clients = [f"127.0.{8 + (i == 0)}.{i + 1}" for i in range(12)]  # the first: the proxy (exempt)
    for _ in range(2000):
        c = rng.choice(clients)
        if plain.get(c) and rng.random() < 0.45:
            conn = rng.choice(plain[c])
            plain[c].remove(conn)
            census.remove(c, conn)
        else:
            conn = object()
            plain.setdefault(c, []).append(conn)
            census.add(c, conn)
        counts = {k: len(v) for k, v in plain.items() if v}
        assert {k: census.count(k) for k in clients if census.count(k)} == counts
        assert census.total == sum(counts.values()) and census.most == max(counts.values(), default=0)
        busiest = census.busiest(rules)
        top = [k for k, n in counts.items() if n == census.most]
        assert (busiest in top and (busiest != clients[0] or top == [clients[0]])) if top else busiest is None
    assert rules.capped("127.0.8.2") and not rules.capped("127.0.9.1") and not rules.is_exempt("not an address")
    assert not cx.ConnectionRules().capped("127.0.8.2")  # a local app caps nobody

    # admit: the module's rules and census, as the protocol reads them
    evicted = []

    class Conn:  # a connection as oldest_idle_or_slowest sees it: its request cycle, the one it was idle in
        def __init__(self, cycle, idle_cycle):
            self.cycle, self.idle_cycle = cycle, idle_cycle

        def evict(self):
            evicted.append(self)

    busy, idle = Conn(1, 0), Conn(None, None)
    fresh = cx.Census()
    for conn in (busy, idle, Conn(2, 0)):
        fresh.add("127.0.8.2", conn)
    monkeypatch.setattr(cx, "CENSUS", fresh)
    monkeypatch.setattr(cx, "RULES", cx.ConnectionRules(per_address=3, fd_share=None))
    assert not cx.GuardedProtocol.admit("127.0.8.2", "127.0.8.2")  # its fourth: refused
    assert cx.GuardedProtocol.admit("127.0.8.3", "127.0.8.3") and not evicted
    fresh.high_water, fresh.limit_read_at = 3, time.monotonic() + 60  # the file share: full
    monkeypatch.setattr(cx, "RULES", cx.ConnectionRules(per_address=None))
    assert cx.GuardedProtocol.admit("127.0.8.3", "127.0.8.3") and evicted == [idle]  # the oldest idle one went
    assert cx.oldest_idle_or_slowest({busy: None}) is busy  # none idle: the oldest


def test_slow_bodies_are_closed(app) -> None:
    """150 POSTs from 3 addresses that declare 1 MiB and send a byte a second: before, all still
    open after 6 s (and forever); now closed once the grace (3 s) is over, the first one answered
    408, while an upload sent at 50 KB/s goes through."""
    drip = Drip(app.port, [f"127.0.47.{i}" for i in (1, 2, 3)], 50, every_s=1.0, reopen=False).start()
    late = raw_request(app.port, f"POST /gradio_api/queue/join HTTP/1.1\r\nHost: 127.0.0.1:{app.port}\r\n"
                                 "Content-Type: application/json\r\nContent-Length: 100", "127.0.47.9", b'{"data": [')
    try:
        time.sleep(0.5)
        during = drip.alive()
        honest = _slow_upload(app.url, 200 << 10, 50 << 10)
        time.sleep(max(0.0, HEADER_S + 3.5 - 0.5 - honest[1]))
        after = drip.alive()
        answer = status_of(late, timeout=5)
    finally:
        drip.stop()
        late.close()
    print(f"150 slow bodies: {during} open after 0.5 s, {after} after {HEADER_S + 3.5:.1f} s; the late one: HTTP "
          f"{answer}; an upload at 50 KB/s: HTTP {honest[0]} in {honest[1]:.1f} s")
    assert during >= 140 and after == 0, (during, after)
    assert answer == 408
    assert honest[0] == 200


def _slow_upload(url: str, nbytes: int, rate: int) -> tuple[int, float]:
    """An upload of ``nbytes`` of a PNG-named file sent at ``rate`` bytes a second: (status, seconds)."""
    import os

    def body():
        data = os.urandom(nbytes)
        for i in range(0, nbytes, rate // 10):
            time.sleep(0.1)
            yield data[i:i + rate // 10]

    t0 = time.perf_counter()
    pre = b'--b0\r\nContent-Disposition: form-data; name="files"; filename="x.png"\r\n\r\n'
    post = b"\r\n--b0--\r\n"
    r = httpx.post(url + "gradio_api/upload", content=_chain(pre, body(), post), timeout=60,
                   headers={"Content-Type": "multipart/form-data; boundary=b0",
                            "Content-Length": str(len(pre) + nbytes + len(post))})
    return r.status_code, time.perf_counter() - t0


def _chain(pre: bytes, middle, post: bytes):
    yield pre
    yield from middle
    yield post


@pytest.fixture(scope="module")
def patient(deit_tiny_path: Path):
    """The exposed app with a long header time (60 s): connections stay until the cap closes them."""
    args = ["--weights", str(deit_tiny_path), "--exposed", "--header-seconds", "60", "--no-warm-up"]
    with running_app(args) as a:
        yield a


def test_all_addresses_together_leave_room_for_a_new_one(patient) -> None:
    """12 addresses x 90 connections that never finish their headers (a header time of 60 s), against
    a file limit of 1,024: before, the app's files reached the limit (accept() failed; a new client
    could not connect); now at most 60 % of it are connections (a new one closes one of the
    busiest address's), the files stay under 80 % and a new address gets /config."""
    import resource

    app = patient
    soft, hard = resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (1024, hard))
    time.sleep(1.2)  # (the app reads its limit again every second)
    from concurrent.futures import ThreadPoolExecutor

    peak, t0 = open_files(app.proc.pid), time.perf_counter()
    socks: list = []
    try:
        with ThreadPoolExecutor(12) as pool:  # at once: well within the header time
            opening = [pool.submit(slow_connections, app.port, 90, f"127.0.48.{i + 1}") for i in range(12)]
            while not all(f.done() for f in opening):
                peak = max(peak, open_files(app.proc.pid))
                time.sleep(0.02)
            socks = [s for f in opening for s in f.result()]
        opened = time.perf_counter() - t0
        for _ in range(5):
            time.sleep(0.1)
            peak = max(peak, open_files(app.proc.pid))
        t0 = time.perf_counter()
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.49.1"), timeout=10) as http:
            code = http.get(app.url + "config").status_code
        took = time.perf_counter() - t0
    finally:
        for s in socks:
            s.close()
        resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
    print(f"1,080 connections from 12 addresses (opened in {opened:.1f} s), file limit 1,024: the app's files "
          f"peaked at {peak}; a new address's /config: HTTP {code} in {took:.2f} s")
    assert peak > 0.55 * 1024, peak  # (the cap was reached: the connections were not closed by a timer)
    assert peak < 0.8 * 1024, peak
    assert code == 200


def _fds_in(pid: int, folder: Path) -> int:
    """How many of process ``pid``'s file descriptors are files under ``folder``."""
    import os

    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(folder))
        except OSError:
            pass
    return n


def test_uploads_in_progress_hold_no_file_and_cut_ones_leave_none(app) -> None:
    """20 uploads from one address declaring 2 MB, each 120 KB into its body, then cut: before,
    each held an open temp file in the app's folder while it arrived (a socket and a file: the
    cap on connections was no cap on files) and its file stayed after the cut (575 files, 585
    MiB in the attack); now no file is held between chunks and none is left."""
    from attacks import PacedUploads

    uploads = app.folder() / "gradio"
    before = {p for p in uploads.rglob("*") if p.is_file()}
    attack = PacedUploads(app.port, ["127.0.50.11"], 20, declared=2 << 20, rate=60 << 10, tick_s=0.5, reopen=False)
    attack.start()
    try:
        time.sleep(2.2)
        held = _fds_in(app.proc.pid, uploads)
        sent = min(attack.sent.values())
    finally:
        attack.stop()
    time.sleep(1.5)
    left = [p for p in uploads.rglob("*") if p.is_file() and p not in before]
    print(f"20 uploads in progress ({sent // 1024} KB or more sent each): {held} open files in the app's folder; "
          f"after the cut: {len(left)} files left ({sum(p.stat().st_size for p in left) // 1024} KB)")
    assert sent > 60 << 10 and attack.opened == 20
    assert held <= 2, held  # (one may be open while a chunk is written)
    assert not left, left[:3]


def test_streams_yield_to_a_new_visitor(app) -> None:
    """At a file limit of 512 (soft and hard), 340 addresses each holding one heartbeat stream
    (GET /gradio_api/heartbeat/..., a line every 15 s for as long as the page is open), reopened
    when closed: before, they held every place of the connections' share (60 %, 307) and every new
    visitor was refused; now streams hold at most half of it, the oldest closing first, and a
    new visitor's /config answers. Runs last in this module: the app keeps the lower limit."""
    import resource

    from attacks import heartbeats

    resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (512, 512))
    time.sleep(1.2)  # (the app reads its limit again every second)
    attack = heartbeats(app.port, [f"127.51.{i // 200}.{i % 200 + 1}" for i in range(340)], every_s=0.5).start()
    codes = []
    try:
        time.sleep(1.0)
        for i in range(4):
            try:
                with httpx.Client(transport=httpx.HTTPTransport(local_address=f"127.0.52.{i + 1}"), timeout=8) as http:
                    codes.append(http.get(app.url + "config").status_code)
            except httpx.HTTPError as e:
                codes.append(type(e).__name__)
        held, files = attack.alive(), open_files(app.proc.pid)
    finally:
        attack.stop()
    print(f"340 heartbeat streams from 340 addresses at a file limit of 512: {held} held, {attack.closed} closed by "
          f"the server, the app's files {files}; new visitors' /config: {codes}")
    assert codes.count(200) >= 3, codes
    assert held <= 0.5 * 0.6 * 512 + 20, held
