"""Raw HTTP against a running app, the way an attacker talks to it: no gradio_client, no browser.

``Raw(url)`` speaks Gradio's own protocol: upload files (``POST gradio_api/upload``), join the
queue for ANY event by its index (``POST gradio_api/queue/join``: public or "private", an
attacker sees them all in ``/config``), and read the session's event stream
(``GET gradio_api/queue/data``) until the event completes. Extra headers (``Host``,
``X-Forwarded-For``) go with every request. Used by the security tests (tests/test_app_guard.py,
tests/test_app_lanes.py, ...) and by ``benchmarks/bench_attacks.py``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_META = {"_type": "gradio.FileData"}
FILE_TYPES = {"image", "file", "gallery", "video", "audio", "model3d"}  # components whose values are files


@dataclass
class Outcome:
    """What came back for one request: refused at the door (``joined`` False, ``status`` the HTTP
    code), or run (``success`` and the event's ``output``: its data, or its error message)."""

    joined: bool
    status: int
    success: bool = False
    output: Any = None
    message: str = ""
    seconds: float = 0.0

    @property
    def refused(self) -> bool:
        return not self.joined or not self.success


class Raw:
    """One client (one session unless told otherwise) of the app at ``url`` (from the loopback
    address ``source``: another client)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout: float = 120,
                 source: str | None = None) -> None:
        import httpx

        self.url = url if url.endswith("/") else url + "/"
        transport = httpx.HTTPTransport(local_address=source) if source else None  # another loopback address
        self.http = httpx.Client(timeout=timeout, headers=headers or {}, transport=transport)
        self.session = uuid.uuid4().hex
        self._config: dict | None = None

    def close(self) -> None:
        self.http.close()

    # -- what the page says about itself

    def config(self) -> dict:
        if self._config is None:
            r = self.http.get(self.url + "config")
            r.raise_for_status()
            self._config = r.json()
        return self._config

    def fn_index(self, name: str) -> int:
        """The index of the event named ``name`` (its api_name, public or private)."""
        for i, d in enumerate(self.config()["dependencies"]):
            if d.get("api_name") == name:
                return d.get("id", i)
        raise KeyError(f"no event named {name!r}")

    def events(self) -> dict[str, dict]:
        return {d.get("api_name") or str(d.get("id", i)): d for i, d in enumerate(self.config()["dependencies"])}

    def component_types(self) -> dict[int, str]:
        return {c["id"]: c.get("type", "") for c in self.config()["components"]}

    def file_inputs(self) -> dict[str, list[int]]:
        """event name -> positions of its inputs that take files (images, files)."""
        types = self.component_types()
        out = {}
        for name, d in self.events().items():
            pos = [i for i, cid in enumerate(d["inputs"]) if types.get(cid) in FILE_TYPES]
            if pos:
                out[name] = pos
        return out

    def n_inputs(self, name: str) -> int:
        return len(self.events()[name]["inputs"])

    # -- the protocol

    def upload(self, path: Path, name: str | None = None) -> str:
        """Store a file through the upload route; returns the server's path for it."""
        with open(path, "rb") as f:
            r = self.http.post(self.url + "gradio_api/upload", files=[("files", (name or path.name, f))])
        r.raise_for_status()
        return r.json()[0]

    def join(self, fn: int | str, data: list, session: str | None = None, event_data: Any = None) -> tuple[int, str]:
        """(HTTP status, event id or the refusal's message)."""
        fn_index = self.fn_index(fn) if isinstance(fn, str) else fn
        body = {"data": data, "fn_index": fn_index, "session_hash": session or self.session}
        if event_data is not None:
            body["event_data"] = event_data
        r = self.http.post(self.url + "gradio_api/queue/join", json=body)
        if r.status_code == 200:
            return 200, r.json()["event_id"]
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        return r.status_code, detail if isinstance(detail, str) else json.dumps(detail)

    def results(self, event_ids: set[str], session: str | None = None, timeout: float = 300) -> dict[str, dict]:
        """Each event's ``process_completed`` message, read from the session's stream."""
        done: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while set(event_ids) - set(done) and time.monotonic() < deadline:
            with self.http.stream("GET", self.url + "gradio_api/queue/data",
                                  params={"session_hash": session or self.session},
                                  timeout=max(1.0, deadline - time.monotonic())) as r:
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed":
                        done[msg["event_id"]] = msg
                    elif msg.get("msg") == "close_stream":
                        break
        return done

    def call(self, fn: int | str, data: list, session: str | None = None, timeout: float = 300,
             event_data: Any = None) -> Outcome:
        """Join and wait: the :class:`Outcome`."""
        t0 = time.perf_counter()
        status, answer = self.join(fn, data, session, event_data)
        if status != 200:
            return Outcome(False, status, message=str(answer), seconds=time.perf_counter() - t0)
        msg = self.results({answer}, session, timeout).get(answer)
        if msg is None:
            return Outcome(True, 200, False, None, "never completed", time.perf_counter() - t0)
        out = msg.get("output") or {}
        return Outcome(True, 200, bool(msg.get("success")), out, str(out.get("error") or ""), time.perf_counter() - t0)


def file_payload(path: str, meta: bool = True, name: str | None = None) -> dict:
    """A file value as the browser sends it (with Gradio's ``meta``), or without ``meta``."""
    d: dict[str, Any] = {"path": path, "orig_name": name or Path(path).name}
    if meta:
        d["meta"] = dict(FILE_META)
    return d


def values_for(raw: Raw, name: str, file_pos: int, payload: Any) -> list:
    """Inputs for event ``name``: ``payload`` at ``file_pos`` (a list of it for a multi-file
    input), and each other input at its component's current value in ``/config``."""
    cfg = raw.config()
    comps = {c["id"]: c for c in cfg["components"]}
    ids = raw.events()[name]["inputs"]
    out = []
    for i, cid in enumerate(ids):
        comp = comps.get(cid, {})
        if i == file_pos:
            multiple = (comp.get("props") or {}).get("file_count") == "multiple"
            out.append([payload] if multiple and payload is not None else payload)
        elif comp.get("type") in FILE_TYPES or comp.get("type") == "state":
            out.append(None)
        else:
            out.append((comp.get("props") or {}).get("value"))
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of a process, MiB."""
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def thread_heaps(pid: int) -> tuple[int, float]:
    """glibc's heaps of the threads' arenas in process ``pid``: how many, and how many MiB of them
    are resident. Each is an anonymous 64 MiB reservation aligned to 64 MiB (its used part
    read-write, the rest ``---p``), read from ``/proc/<pid>/smaps``."""
    span = 64 << 20
    blocks: dict[int, list[int]] = {}  # aligned start -> [bytes mapped from it without a gap, resident KiB]
    last_end = -1
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's first line
                start, end = (int(x, 16) for x in head[0].split("-"))
                anonymous = len(head) == 5
                base = start - start % span
                if anonymous and start == base and head[1] == "rw-p":
                    blocks[base], current = [end - start, 0], base
                elif anonymous and start == last_end and base in blocks and current == base:
                    blocks[base][0] += end - start
                else:
                    current = None
                last_end = end
            elif head[0] == "Rss:" and current is not None:
                blocks[current][1] += int(head[1])
    heaps = [kib for size, kib in blocks.values() if size == span]
    return len(heaps), sum(heaps) / 1024


def slow_connections(port: int, n: int, source: str = "127.0.0.2", deadline_s: float = 60) -> list:
    """``n`` connections from ``source`` (another loopback address than the other clients'),
    each sending the start of a request's headers and never the end (slowloris). Connections
    the server refuses at once are kept too (closed), so that :func:`still_open` counts them."""
    import socket

    socks = []
    stop = time.monotonic() + deadline_s
    for _ in range(n):
        if time.monotonic() > stop:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /config HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:
            pass
        socks.append(s)
    return socks


def still_open(socks: list) -> int:
    """How many of ``socks`` the server has not closed (nothing to read and no end of stream)."""
    import socket

    n = 0
    for s in socks:
        try:
            s.setblocking(False)
            n += s.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            n += 1
        except OSError:
            pass
    return n


def crash_spawned_children(pid: int, stop: threading.Event, killed: list[int]) -> None:
    """Until ``stop`` is set or one is killed: send SIGSEGV (a native crash) to every spawned
    child of process ``pid`` (multiprocessing's ``spawn_main``, e.g. the survey's clustering) as
    soon as it appears; their pids go into ``killed``. Run it in a thread."""
    import psutil

    server = psutil.Process(pid)
    while not stop.is_set() and not killed:
        for child in server.children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    os.kill(child.pid, signal.SIGSEGV)
                    killed.append(child.pid)
            except (psutil.Error, OSError):
                continue
        time.sleep(0.005)


# ----------------------------------------------------------------------------- issue 47: bodies, uploads, connections


def raw_request(port: int, head: str, source: str = "127.0.0.1", body: bytes = b"", timeout: float = 5):
    """A socket from ``source`` that has sent ``head`` (a request's line and headers, without the
    blank line) and ``body``; the blank line is added. The caller reads and closes it."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(head.encode() + b"\r\n\r\n" + body)
    return s


def status_of(sock, timeout: float = 30) -> int:
    """The HTTP status a server answered on ``sock`` (0: closed or no answer within ``timeout``)."""
    sock.settimeout(timeout)
    try:
        line = sock.recv(64).split(b"\r\n")[0].split()
        return int(line[1]) if len(line) > 1 and line[1].isdigit() else 0
    except OSError:
        return 0


class Drip:
    """``per_source`` connections from each of ``sources`` that send a request's headers (a POST
    declaring ``declared`` bytes) and then its body one byte every ``every_s`` seconds, reopened
    as the server closes them, until :meth:`stop` (a thread). ``declared`` None: only the headers
    of an upload of ``upload_bytes``, and no body byte at all (a header-only upload)."""

    def __init__(self, port: int, sources: list[str], per_source: int, path: str = "/gradio_api/queue/join",
                 declared: int | None = 1 << 20, every_s: float = 5.0, reopen: bool = True,
                 upload_bytes: int = 25 << 20, stream: bool = False) -> None:
        self.port, self.sources, self.per_source, self.path = port, sources, per_source, path
        self.declared, self.every_s, self.reopen, self.upload_bytes = declared, every_s, reopen, upload_bytes
        self.stream = stream  # a GET of ``path`` (a stream the server sends on), each under a session of its own
        self.socks: dict[tuple[str, int], Any] = {}
        self.opened = self.closed = self.refused = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="drip")

    def head(self) -> str:
        if self.stream:
            return f"GET {self.path}{uuid.uuid4().hex[:16]} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}"
        if self.declared is None:
            return (f"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                    f"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: {self.upload_bytes}")
        return (f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {self.declared}")

    def open(self, key: tuple[str, int]) -> None:
        try:
            self.socks[key] = raw_request(self.port, self.head(), key[0], timeout=2)
            self.opened += 1
        except OSError:
            self.refused += 1
            self.socks.pop(key, None)

    def start(self) -> Drip:
        for src in self.sources:
            for i in range(self.per_source):
                self.open((src, i))
        self.thread.start()
        return self

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            for key in [(s, i) for s in self.sources for i in range(self.per_source)]:
                if self.stopping.is_set():
                    return
                sock = self.socks.get(key)
                alive = sock is not None
                if alive and self.declared is not None and not self.stream:
                    try:
                        sock.sendall(b"[")
                    except OSError:
                        alive = False
                elif alive:
                    alive = drained(sock) if self.stream else still_open([sock]) == 1
                if not alive:
                    if sock is not None:
                        sock.close()
                        self.closed += 1
                    if self.reopen:
                        self.open(key)

    def alive(self) -> int:
        if self.stream:
            return sum(drained(s) for s in list(self.socks.values()))
        return still_open(list(self.socks.values()))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        for s in self.socks.values():
            s.close()


def drained(sock: Any) -> bool:
    """Whether the server still holds ``sock`` open, reading away what it sent (a stream's lines;
    a peek would see them before the end of the stream)."""
    import socket

    try:
        sock.setblocking(False)
        while True:
            if sock.recv(65536, socket.MSG_DONTWAIT) == b"":
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def chunked_upload(port: int, nbytes: int, source: str = "127.0.0.1", declared: int = 200,
                   name: str = "x.png") -> int:
    """An upload of ``nbytes`` sent chunked with a ``Content-Length: declared`` beside it (two framings
    at once); the HTTP status."""
    boundary = "b0undary"
    pre = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    post = f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {declared}\r\n"
            "Transfer-Encoding: chunked")
    sock = raw_request(port, head, source, timeout=60)
    try:
        block = os.urandom(1 << 20)
        parts = [pre] + [block[: min(len(block), nbytes - i)] for i in range(0, nbytes, len(block))] + [post]
        for p in parts:
            sock.sendall(f"{len(p):x}\r\n".encode() + p + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    try:
        return status_of(sock, 60)
    finally:
        sock.close()


def open_files(pid: int) -> int:
    """How many file descriptors process ``pid`` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def huge_tiff_zip(path: Path, n: int = 16, side: int = 8000) -> Path:
    """A zip of ``n`` float TIFFs of ``side`` x ``side`` px (64 MP at 8000), one value each: a few
    hundred KB, each 256 MB once decoded."""
    import io
    import zipfile

    from PIL import Image

    buf = io.BytesIO()
    Image.new("F", (side, side), 0.5).save(buf, "TIFF", compression="tiff_adobe_deflate")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(n):
            z.writestr(f"huge/{i:02d}.tif", buf.getvalue())
    return path


# ----------------------------------------------------------------------------- streams, slow uploads, session hashes


def heartbeats(port: int, sources: list[str], per_source: int = 1, every_s: float = 1.0) -> Drip:
    """``per_source`` of Gradio's heartbeat streams (``GET /gradio_api/heartbeat/<session>``: a line
    every 15 s for as long as the connection stays) from each of ``sources``, each reopened (a new
    session) as the server closes it, until :meth:`Drip.stop`; call ``.start()``."""
    return Drip(port, sources, per_source, path="/gradio_api/heartbeat/", every_s=every_s, stream=True)


class PacedUploads:
    """``per_source`` uploads from each of ``sources``, each declaring ``declared`` bytes (its honest
    Content-Length) and sending its body at ``rate`` bytes a second (``reopen``: each reopened as
    the server closes it), until :meth:`stop` (which cuts those still going); a thread.
    ``codes``: the statuses of the uploads the server answered."""

    def __init__(self, port: int, sources: list[str], per_source: int, declared: int = 25 << 20,
                 rate: int = 17 << 10, tick_s: float = 0.25, reopen: bool = True) -> None:
        self.port, self.sources, self.per_source = port, sources, per_source
        self.declared, self.rate, self.tick_s, self.reopen = declared, rate, tick_s, reopen
        self.socks: dict[tuple[str, int], Any] = {}
        self.sent: dict[tuple[str, int], int] = {}
        self.opened = self.closed = self.refused = 0
        self.codes: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="paced-uploads")

    def open(self, key: tuple[str, int]) -> None:
        pre = (f"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"p{key[1]}.png\"\r\n"
               "Content-Type: image/png\r\n\r\n").encode()
        head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Content-Type: multipart/form-data; boundary=b0\r\nContent-Length: {self.declared}")
        try:
            self.socks[key] = raw_request(self.port, head, key[0], pre, timeout=2)
            self.sent[key] = len(pre)
            self.opened += 1
        except OSError:
            self.refused += 1
            self.socks.pop(key, None)

    def start(self) -> PacedUploads:
        for src in self.sources:
            for i in range(self.per_source):
                self.open((src, i))
        self.thread.start()
        return self

    def run(self) -> None:
        chunk, end = os.urandom(max(1, int(self.rate * self.tick_s))), b"\r\n--b0--"
        while not self.stopping.wait(self.tick_s):
            for key in [(s, i) for s in self.sources for i in range(self.per_source)]:
                if self.stopping.is_set():
                    return
                sock = self.socks.get(key)
                try:
                    if sock is None:
                        raise OSError
                    part = chunk[: self.declared - len(end) - self.sent[key]]
                    sock.sendall(part)
                    self.sent[key] += len(part)
                    if self.sent[key] >= self.declared - len(end):  # the whole file: the form's end, its answer
                        sock.sendall(end)
                        self.codes.append(status_of(sock, 5))
                        raise OSError
                except OSError:
                    if sock is not None:
                        sock.close()
                        self.closed += 1
                        self.socks.pop(key, None)
                    if self.reopen:
                        self.open(key)

    def alive(self) -> int:
        return still_open(list(self.socks.values()))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        for s in self.socks.values():
            s.close()


def run_posts(url: str, n: int, source: str, session: Any = None, threads: int = 8) -> dict[int, int]:
    """``n`` POSTs to ``/gradio_api/run/predict`` from ``source``, each with a fresh session hash
    (or ``session(i)``'s): how many got each status."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    codes: dict[int, int] = {}
    lock = threading.Lock()

    def batch(part: range) -> None:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=60) as http:
            for i in part:
                hash_ = session(i) if session is not None else uuid.uuid4().hex
                try:
                    code = http.post(url + "gradio_api/run/predict",
                                     json={"data": [], "fn_index": None, "session_hash": hash_}).status_code
                except Exception:  # noqa: BLE001 - the server closed it
                    code = 0
                with lock:
                    codes[code] = codes.get(code, 0) + 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(batch, [range(k, n, threads) for k in range(threads)]))
    return codes
