"""Attack a live app as an attacker would, and print what happened: one row per attack.

    python benchmarks/bench_attacks.py [--root DIR] [--json] [--only NAME ...]

Starts the app (``app.py --exposed``: bound to 127.0.0.1 with the limits of ``--share`` /
``--host 0.0.0.0``; a local app for the DNS-rebinding row) from this checkout, or from ``--root
DIR`` (another checkout, e.g. ``git archive`` of an older commit: the "before"; flags it does
not know are left out), and sends raw HTTP (tests/attacks.py): no gradio_client, no browser.
Rows (issue 21): server files through file payloads, DNS rebinding, forwarded headers, memory
held by sessions, huge pixel counts, a flood of slow jobs against another client's predictions,
time limits, big request bodies and echoed errors, upload floods, leftover temp folders, disk
used by exports, leaks; then the holds (Gradio's file routes, SSRF, the upload cap, checkpoint
loading when exposed, odd API values). Rows of issue 35 (``--only survey unpack connections``):
identical pictures in the Whole folder tab, crafted zips (overlapping entries, 500,000 entries,
files of zeros), paths in the survey's report and /config, FastAPI's schema, and 3,000
connections that never finish their headers. Rows of issue 33 (``--only mcp``): the MCP
tools of ``--exposed --mcp`` (URLs, server files, pictures past the upload budget, a flood of
tool calls against another client's). Rows of issue 35's second part (``--only paths sessions``):
the app's folder and Gradio's version in what an exposed app sends, a native crash in the
survey's clustering, 200 fresh sessions' memory (and glibc's heaps of the threads); ``--only
pages``: a TIFF of 50,000 pages. Rows of issue 47 (``app.py --exposed --mcp --job-seconds 30``):
``--only slowbody`` (25 x 100 bodies sent a byte every 5 s against a file limit of 2,048),
``chunked`` (uploads with two framings), ``lockout`` (header-only uploads against the
all-clients total), ``hugezip`` (a zip of 16 64-MP float TIFFs to the survey and the atlas),
``atlas100`` (an atlas of 100 photos against the time limit), ``small47`` (echoed MCP values,
the OpenAPI schema, tool events through the queue, a hub model named by anyone). Rows of issue
50 (the same app): ``--only hashes`` (1,100 POSTs with fresh session hashes from one address
against an analysed visitor's session), ``hugehash`` (1,100 session hashes of 900 KB: RSS 65 s
after), ``pacedup`` (7 addresses x 100 uploads at 17 KB/s for 60 s, file limit 1,024 soft and
hard), ``streams`` (700 addresses each holding a heartbeat stream, file limit 1,024),
``small50`` (/monitoring, the reload watcher, hostile /attention, /compare and /train values),
``trainpeak`` (the training child's RSS peak on a zip of 40-MP float TIFFs, and on the digits).
Takes 5-15 minutes on 2 cores (the "before" longer: its slow jobs run to the end).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from app_server import start_app  # noqa: E402
from attacks import Raw, crash_spawned_children, file_payload, rss_mb, thread_heaps  # noqa: E402
from PIL import Image  # noqa: E402

from vit_demo.app.server.workspace import folder_bytes  # noqa: E402

MB = 1 << 20
ROWS: list[dict] = []


def row(attack: str, happened: str, figure: str) -> None:
    ROWS.append({"attack": attack, "what happened": happened, "figure": figure})
    print(f"| {attack} | {happened} | {figure} |", flush=True)


def known_flags(root: Path) -> str:
    out = subprocess.run([sys.executable, str(root / "app.py"), "--help"], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    return out.stdout


def app_args(root: Path, args: list[str], help_text: str) -> list[str]:
    """``args`` without the flags (and their values) that the app at ``root`` does not know."""
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in help_text or flag == "--exposed":  # (a hidden flag: not in --help)
            out += args[i:i + 1 + takes_value]
        i += 1 + takes_value
    return out


def defaults(raw: Raw, name: str) -> list:
    comps = {c["id"]: c for c in raw.config()["components"]}
    return [(comps[c].get("props") or {}).get("value") if comps[c].get("type") != "state" else None
            for c in raw.events()[name]["inputs"]]


def analyze(raw: Raw, path: str, session: str | None = None, timeout: float = 600):
    data = defaults(raw, "analyze")
    data[0] = file_payload(path)
    return raw.call("analyze", data, session=session, timeout=timeout)


def noise_png(path: Path, w: int, h: int, seed: int = 0) -> Path:
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def photo(tmp: Path) -> Path:
    import skimage

    return Path(skimage.__file__).parent / "data" / "coffee.png"


# ----------------------------------------------------------------------------- the attacks


def server_files(url: str, tmp: Path) -> None:
    from attacks import values_for

    raw = Raw(url)
    secret = tmp / "secret.png"  # an image on the server that is not one of the app's examples
    secret.write_bytes(photo(tmp).read_bytes())
    served, tried = 0, 0
    for event, positions in raw.file_inputs().items():
        for pos in positions:
            for meta in (True, False):
                out = raw.call(event, values_for(raw, event, pos, file_payload(str(secret), meta)), session=f"f{tried}")
                tried += 1
                served += out.joined and out.success and "Cannot use this image" not in str(out.output)
    row("a server image named in a file payload: every file input of every event, with and without meta",
        "served" if served else "refused", f"{served} of {tried} attempts served it")
    (tmp / "notes.txt").write_text("not an image\n")
    answers = {what: raw.call("predict", [file_payload(str(path), meta=False), None, 5]).message
               for what, path in (("a text file", tmp / "notes.txt"), ("a missing file", tmp / "nope.png"))}
    same = len(set(answers.values())) == 1
    row("does the answer tell whether a server file exists?", "no: one message" if same else "yes: two messages",
        " / ".join(f"{k}: {v[:45]}" for k, v in answers.items()))


def rebinding(url: str, port: int, weights: str) -> None:
    evil = {"Host": f"evil.example:{port}", "Origin": "http://evil.example"}
    raw = Raw(url, headers=evil)
    r = raw.http.get(url + "config")
    try:
        fn = Raw(url).fn_index("on_checkpoint")
        out = raw.call(fn, [weights, None, None, None])
        loaded = "loaded" if out.success else f"refused (HTTP {out.status})"
    except KeyError:
        loaded = "no such event"
    row("DNS rebinding: a page on evil.example reaches the local app (Host: evil.example)",
        "answered" if r.status_code == 200 else "refused", f"/config: HTTP {r.status_code}; a checkpoint by server "
        f"path: {loaded}")


def forwarded_for(url: str, tmp: Path) -> None:
    """28 slow jobs, each from its own session and its own X-Forwarded-For, from one address."""
    stored = Raw(url).upload(photo(tmp))
    clients = []
    for i in range(28):
        raw = Raw(url, headers={"X-Forwarded-For": f"10.9.{i}.1"})
        analyze(raw, stored)
        clients.append(raw)
    accepted = 0
    for raw in clients:
        status, _ = raw.join("on_deck", [None])
        accepted += status == 200
    row("28 slide decks from one address, each with its own X-Forwarded-For (no --trusted-proxy)",
        "each header believed" if accepted > 16 else "one address", f"{accepted} of 28 accepted")


def memory(url: str, pid: int, tmp: Path) -> None:
    big = tmp / "huge.png"
    small = np.zeros((80, 80, 3), dtype=np.uint8)
    small[..., 0] = np.linspace(0, 255, 80)[None, :]
    Image.fromarray(small).resize((8000, 8000), Image.Resampling.NEAREST).save(big)
    raw = Raw(url)
    analyze(raw, raw.upload(photo(tmp)), "warm")
    time.sleep(1)
    before = rss_mb(pid)
    stored = raw.upload(big)
    peak = before
    for i in range(8):
        out = analyze(raw, stored, f"s{i}")
        peak = max(peak, rss_mb(pid))
        if not out.success or "Cannot use" in str(out.output):
            row("8 sessions analyse a 186 KB PNG of 8000x8000 px", "refused", out.message[:80])
            return
    time.sleep(2)
    held = rss_mb(pid)
    row(f"8 sessions analyse a {big.stat().st_size // 1024} KB PNG of 8000x8000 px (64 MP)",
        "held by the sessions" if held - before > 600 else "reduced at load, sessions within budget",
        f"RSS {before:.0f} -> {held:.0f} MiB (+{held - before:.0f})")


def float_tiff(url: str, pid: int, tmp: Path) -> None:
    p = tmp / "float.tif"
    small = np.sin(np.linspace(0, 6, 63, dtype=np.float32))[None, :] * np.cos(np.linspace(0, 4, 63, dtype=np.float32))[:, None]
    Image.fromarray(small, "F").resize((6300, 6300), Image.Resampling.NEAREST).save(p, compression="tiff_adobe_deflate")
    raw = Raw(url)
    stored = raw.upload(p)
    before = rss_mb(pid)
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak.append(rss_mb(pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample)
    t.start()
    out = raw.call("predict", [file_payload(stored), None, 5])
    stop.set()
    t.join()
    row(f"a {p.stat().st_size // 1024} KB float TIFF of 6300x6300 px (40 MP) to /predict",
        "predicted" if out.success else f"refused: {out.message[:60]}",
        f"{out.seconds:.1f} s, RSS peak +{max(peak) - before:.0f} MiB")


def tiff_pages(app, tmp: Path, n: int = 50_000) -> None:
    """A TIFF of ``n`` tiny pages (5 MB) to /predict: the CPU it costs (Pillow's page count grows
    with the square of the pages)."""
    import hostile

    p = tmp / "pages.tif"
    p.write_bytes(hostile.tiff_pages(n))
    raw = Raw(app.url)
    raw.call("predict", [file_payload(raw.upload(photo(tmp))), None, 3])  # the model loaded first
    stored = raw.upload(p)
    cpu0 = cpu_s(app.proc.pid)
    out = raw.call("predict", [file_payload(stored), None, 3])
    row(f"a TIFF of {n:,} pages of 16 x 16 px ({p.stat().st_size / MB:.1f} MB) to /predict",
        "predicted" if out.success else f"refused: {out.message[:60]}",
        f"{out.seconds:.1f} s, {cpu_s(app.proc.pid) - cpu0:.1f} CPU-s")


def flood(url: str, tmp: Path, seconds: float = 150) -> None:
    """One client (two sessions) keeps the slow work queued; another client asks for predictions."""
    attacker = Raw(url, headers={"X-Forwarded-For": "10.0.0.66"})
    victim = Raw(url, headers={"X-Forwarded-For": "10.0.0.7"})
    stored = attacker.upload(photo(tmp))
    for s in ("a1", "a2"):
        analyze(attacker, stored, s)
    slow = [n for n in attacker.events() if n in ("on_deck", "run", "run_1", "on_animate", "on_animate_1")]
    joined, refused = 0, 0
    for i in range(17):
        status, _ = attacker.join(slow[i % len(slow)], defaults(attacker, slow[i % len(slow)]), session=("a1", "a2")[i % 2])
        joined += status == 200
        refused += status != 200
    times, deadline = [], time.monotonic() + seconds
    for i in range(10):
        if time.monotonic() > deadline:
            break
        p = noise_png(tmp / f"v{i}.png", 64, 48, seed=i)
        out = victim.call("predict", [file_payload(victim.upload(p)), None, 3], timeout=max(1, deadline - time.monotonic()))
        times.append(out.seconds if out.success else float("inf"))
    done = [t for t in times if t != float("inf")]
    row("a flood of slow jobs (decks, RISE, causal LRP, animations) from one client: 17 asked",
        f"{joined} queued, {refused} refused", "")
    if len(done) >= 2:
        figure = (f"p50 {statistics.median(done):.2f} s, p95 {statistics.quantiles(done, n=20, method='inclusive')[18]:.2f} s, "
                  f"max {max(done):.2f} s ({len(done)} predictions)")
    else:
        figure = f"{len(done)} prediction(s) in {seconds:.0f} s: " + ", ".join(f"{t:.0f} s" for t in done)
    row("... meanwhile another client's /predict (new photo each time)",
        "answered" if len(done) >= 2 and max(done) < 5 else "waited behind the flood", figure)


def time_limit(url: str, tmp: Path, limit: str) -> None:
    raw = Raw(url)
    stored = raw.upload(photo(tmp))
    analyze(raw, stored)
    out = raw.call("run", defaults(raw, "run"), timeout=900)
    row(f"RISE (slow method) on an app with {limit}", "stopped at the limit" if "took longer" in out.message
        else ("finished" if out.success else out.message[:60]), f"{out.seconds:.1f} s")


def declared_body(url: str, nbytes: int) -> tuple[str, float]:
    """Send only the headers of a POST announcing ``nbytes`` of JSON (and the first 64 KB of it);
    (the server's status line, seconds until it came)."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        t0 = time.perf_counter()
        sock.sendall(f"POST /gradio_api/queue/join HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {nbytes}\r\n\r\n".encode() + b"[" * 65536)
        try:
            first = sock.recv(200).split(b"\r\n")[0].decode()
        except OSError as e:
            first = type(e).__name__
        return first, time.perf_counter() - t0


def bodies(url: str, pid: int) -> None:
    raw = Raw(url)
    time.sleep(2)
    before = rss_mb(pid)
    status, took = declared_body(url, 100 * MB)
    body = b'{"data": ["' + b"A" * (100 * MB) + b'"], "fn_index": 0, "session_hash": "x"}'
    try:
        code = raw.http.post(url + "gradio_api/queue/join", content=body,
                             headers={"Content-Type": "application/json"}).status_code
    except Exception as e:  # noqa: BLE001
        code = type(e).__name__
    time.sleep(2)
    row("a 100 MiB JSON body to /gradio_api/queue/join", f"to its headers: {status or 'no answer'}; to the "
        f"whole body: HTTP {code}", f"{took:.2f} s to answer the headers; RSS {before:.0f} -> {rss_mb(pid):.0f} MiB")
    marker = "Q" * MB
    out = raw.call("predict", [None, marker, 5])
    longest = max(len(out.message), 0)
    r = raw.http.post(url + "gradio_api/queue/join", json={"data": marker, "fn_index": 0, "session_hash": "s"})
    row("a 1 MB value sent to /predict (model name) and as a malformed body",
        "echoed back" if max(longest, len(r.text)) > 10_000 else "not echoed",
        f"error messages of {longest:,} and {len(r.text):,} bytes")


def uploads(url: str, root: Path, tmp: Path) -> None:
    f = noise_png(tmp / "big.png", 2600, 2600)  # ~20 MB of noise: under the 25 MB cap
    raw = Raw(url)
    stored, codes = 0, []
    t0 = time.perf_counter()
    for _ in range(12):
        with open(f, "rb") as fh:
            r = raw.http.post(url + "gradio_api/upload", files=[("files", ("big.png", fh))])
        codes.append(r.status_code)
        stored += f.stat().st_size * (r.status_code == 200)
    row(f"12 uploads of {f.stat().st_size / MB:.0f} MB from one client within a minute",
        f"{codes.count(200)} stored, {len(codes) - codes.count(200)} refused",
        f"{stored / MB:.0f} MB on disk in {time.perf_counter() - t0:.0f} s")


def leaks(url: str, root: Path, weights: str) -> None:
    raw = Raw(url)
    cfg = json.dumps(raw.config())
    info = raw.http.get(url + "gradio_api/info").text
    paths = sum(cfg.count(s) + info.count(s) for s in (str(root), "site-packages", weights))
    row("server paths in /config and the API docs (model keys, examples)", "leaked" if paths else "none",
        f"{paths} occurrences")
    stored = raw.upload(photo(Path(tempfile.gettempdir())))
    out = analyze(raw, stored)
    names = [Path(v["path"]).name for v in (out.output or {}).get("data", []) if isinstance(v, dict) and "path" in v]
    row("names of the pictures sent to the browser", "process id and counter" if any("view_" in n for n in names)
        else "random", names[0] if names else "")
    for k in ("abc", 2000):
        out = raw.call("predict", [file_payload(stored), None, k])
        row(f"k = {k!r} to /predict", "answered" if out.success else
            ("exception type shown" if "Error" in out.message else "plain message"), out.message[:90])


def temp_folders(root: Path, args: list[str], tmp: Path) -> None:
    before = {p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("vit_demo_") and p.is_dir()}
    app = start_app(args, root=root)
    raw = Raw(app.url)
    stored = raw.upload(photo(tmp))
    out = analyze(raw, stored)
    for name in [n for n in raw.events() if n.startswith("on_export")][:4]:
        raw.call(name, defaults(raw, name))
    app.proc.send_signal(signal.SIGTERM)
    app.proc.wait(timeout=60)
    after = {p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("vit_demo_") and p.is_dir()}
    left = after - before
    size = sum(f.stat().st_size for d in left for f in d.rglob("*") if f.is_file())
    row("temp folders left by an app that was stopped (SIGTERM) after an upload, an analysis and 4 exports",
        "left behind" if left else "removed", f"{len(left)} folders, {size / MB:.1f} MB"
        + ("" if out.success else " (analysis failed)"))


def holds(url: str, tmp: Path) -> None:
    raw = Raw(url)
    tricks = ["/etc/passwd", "../../../../etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd",
              "/proc/self/environ", "~/.ssh/id_rsa", "C:\\Windows\\win.ini", "file:///etc/passwd", "\\\\server\\share",
              "/tmp/../etc/passwd", "....//....//etc/passwd", "%252e%252e%252fetc%252fpasswd"]
    prefixes = ["gradio_api/file=", "gradio_api/file/", "file=", "gradio_api/file=/tmp/gradio/", "gradio_api/file=./",
                "gradio_api/file=static/", "gradio_api/file=..%2f", "gradio_api/proxy=", "assets/", "static/",
                "gradio_api/file=%2F", "gradio_api/stream/", "custom_component/", "gradio_api/file=%00",
                "gradio_api/file=//", "svelte/", "theme.css/", "gradio_api/file=../", "gradio_api/file=.\\",
                "gradio_api/file=~"]
    codes: dict[int, int] = {}
    for p in prefixes:
        for t in tricks:
            try:
                c = raw.http.get(url + p + t).status_code
            except Exception:  # noqa: BLE001
                c = 0
            codes[c] = codes.get(c, 0) + 1
    served = codes.get(200, 0)
    row(f"Gradio's file routes: {sum(codes.values())} path tricks (traversal, encodings, absolute paths)",
        "served" if served else "refused", ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    out = raw.call("predict", [{"path": "http://169.254.169.254/latest/meta-data/", "meta": {"_type": "gradio.FileData"},
                                "orig_name": "x.png"}, None, 5])
    proxy = raw.http.get(url + "gradio_api/proxy=http://169.254.169.254/").status_code
    row("SSRF: a URL in a file payload, and the proxy route", "refused" if out.refused and proxy >= 400 else "fetched",
        f"payload: {out.message[:50] or 'served'}; proxy: HTTP {proxy}")
    f = noise_png(tmp / "huge_upload.png", 3000, 3000)  # ~27 MB
    with open(f, "rb") as fh:
        r = raw.http.post(url + "gradio_api/upload", files=[("files", ("x.png", fh))])
    row(f"an upload of {f.stat().st_size / MB:.0f} MB (cap 25 MB)", f"HTTP {r.status_code}", "")
    ckpt = [n for n in raw.events() if n.startswith("on_checkpoint")]
    row("loading a checkpoint on the exposed app", "possible" if ckpt else "no such event", f"{len(ckpt)} events")
    stored = raw.upload(photo(tmp))
    odd = [None, "", "abc", -1, 0, 11, 2.5, 1e308, float("nan"), True, [], {}, [1, 2], {"a": 1}, "5", " 5 ",
           "1e3", "-0", "0x10", "\u202e5"]
    bad = 0
    n = 0
    for k in odd:
        for model in (None, "", "nope", 42, ["x"]):
            try:
                out = raw.call("predict", [file_payload(stored), model, k], timeout=60)
            except Exception:  # noqa: BLE001 - a NaN the client cannot even send
                continue
            n += 1
            msg = out.message if not out.success else ""
            bad += (not out.success) and ("\n" in msg or len(msg) > 300 or "Traceback" in msg)
    row(f"{n} odd API values (k, model) to /predict", "one-line answers" if not bad else "tracebacks or long echoes",
        f"{bad} bad answers")


# ----------------------------------------------------------------------------- issue 35: the Whole folder tab, connections


def survey(raw: Raw, stored: list[str], timeout: float = 900):
    from attacks import values_for

    data = values_for(raw, "on_run", 0, None)
    data[0] = [file_payload(p) for p in stored]
    return raw.call("on_run", data, timeout=timeout)


def cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def watched(pid: int, folder: Path, work: Callable):
    """``work()`` while the app's RSS and ``folder``'s size are sampled: (its result, RSS peak
    MiB, folder peak bytes)."""
    peak, stop = {"rss": rss_mb(pid), "disk": folder_bytes(folder)}, threading.Event()

    def sample():
        while not stop.is_set():
            try:
                peak["rss"], peak["disk"] = max(peak["rss"], rss_mb(pid)), max(peak["disk"], folder_bytes(folder))
            except Exception:  # noqa: BLE001 - the app died
                return
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        return work(), peak["rss"], peak["disk"]
    finally:
        stop.set()
        t.join(5)


def identical_pictures(app, tmp: Path) -> None:
    pic = tmp / "dot.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(pic)
    raw = Raw(app.url)
    stored = raw.upload(pic)
    try:
        out = survey(raw, [stored] * 12)
        what, figure = ("surveyed" if out.success else "refused"), f"{out.seconds:.1f} s"
        if out.success:
            figure += ": " + next((n.strip("*") for n in out.output["data"][1].split("\n\n") if "same" in n), "")
    except Exception as e:  # noqa: BLE001 - the server closed the stream
        what, figure = "error", type(e).__name__
    time.sleep(2)
    if not app.alive():
        what = f"the server died (exit {app.proc.returncode})"
    row("one 32 x 32 PNG uploaded once and named 12 times in the Whole folder tab", what, figure)


def overlapping_entries(app, tmp: Path) -> None:
    from test_survey import overlapping_zip

    archive = tmp / "overlap.zip"
    archive.write_bytes(overlapping_zip(400, 26 * MB))
    raw = Raw(app.url)
    stored = raw.upload(archive)
    cpu0 = cpu_s(app.proc.pid)
    out = survey(raw, [stored, stored])
    row(f"a {archive.stat().st_size // 1024} KB zip of 400 entries over one 26 MiB stream, named twice "
        "(--job-seconds 15)", "stopped" if "took longer" in out.message or "reads for one" in out.message
        else ("surveyed" if out.success else "refused"), f"{out.seconds:.1f} s, {cpu_s(app.proc.pid) - cpu0:.1f} "
        f"CPU-s: {out.message[:70]}")


def many_entries_zip(path: Path, n: int) -> Path:
    """A zip whose central directory lists ``n`` entries named "a", all over one empty member."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a", b"")
    data = buf.getvalue()
    end = data.rfind(b"PK\x05\x06")
    start = int.from_bytes(data[end + 16:end + 20], "little")
    cd, eocd = data[start:end], bytearray(data[end:end + 22])
    eocd[8:10] = eocd[10:12] = (0xFFFF).to_bytes(2, "little")  # (a count the end record cannot hold)
    eocd[12:16] = (len(cd) * n).to_bytes(4, "little")
    path.write_bytes(data[:start] + cd * n + bytes(eocd))
    return path


def many_entries(app, tmp: Path) -> None:
    archive = many_entries_zip(tmp / "many.zip", 500_000)
    raw = Raw(app.url)
    stored = raw.upload(archive)
    rss0, cpu0 = rss_mb(app.proc.pid), cpu_s(app.proc.pid)
    out, rss, _ = watched(app.proc.pid, app.folder(), lambda: survey(raw, [stored] * 16))
    row(f"a {archive.stat().st_size / 1e6:.1f} MB zip of 500,000 entries, named 16 times",
        "refused" if out.refused else "surveyed", f"{out.seconds:.1f} s, {cpu_s(app.proc.pid) - cpu0:.1f} CPU-s, "
        f"RSS peak +{rss - rss0:.0f} MiB: {out.message[:60]}")


def zero_files(app, tmp: Path) -> None:
    from test_survey import zeros_zip

    raw = Raw(app.url)
    stored = [raw.upload(zeros_zip(tmp / f"zeros{i}.zip", 20, 25 * MB)) for i in range(5)]
    folder = app.folder()
    before = folder_bytes(folder)
    out, _, disk = watched(app.proc.pid, folder, lambda: survey(raw, stored))
    time.sleep(1)
    row(f"5 zips of {Path(tmp / 'zeros0.zip').stat().st_size / 1e6:.1f} MB, each 20 files of 25 MiB of zeros named "
        ".png (--exports-mb 512)", "refused" if out.refused else "surveyed",
        f"the app's folder {before / 1e6:.0f} -> peak {disk / 1e6:,.0f} MB, {folder_bytes(folder) / 1e6:,.0f} MB "
        f"after; {out.seconds:.1f} s")


def survey_paths(app, tmp: Path) -> None:
    import zipfile

    import skimage

    data = Path(skimage.__file__).parent / "data"
    archive = tmp / "two.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(data / "coffee.png", "set/espresso/coffee.png")
        z.write(data / "chelsea.png", "set/cat/chelsea.png")
    raw = Raw(app.url)
    stored = raw.upload(archive)
    folder = str(app.folder())
    out = survey(raw, [stored])
    if out.success:
        with zipfile.ZipFile(app.local(out.output["data"][5]["path"])) as z:
            n = sum(z.read(f).decode().count(folder) for f in z.namelist() if f.endswith((".html", ".json")))
        row("absolute server paths in the survey's report.html and survey.json", "leaked" if n else "none",
            f"{n} occurrences of the app's folder")
    schema = raw.http.get(app.url + "openapi.json")
    row("FastAPI's /openapi.json (and /docs, /redoc)", f"HTTP {schema.status_code}", f"{len(schema.content):,} bytes; "
        f"/docs {raw.http.get(app.url + 'docs').status_code}, /redoc {raw.http.get(app.url + 'redoc').status_code}")


def served_paths(app, tmp: Path) -> None:
    """The app's folder in what the app sends: /config, the page, an upload's answer, an example
    picked and an analysis' pictures (the queue's event stream); and Gradio's version."""
    folder = app.folder().name
    raw = Raw(app.url)
    stored = raw.upload(photo(tmp))
    picked = raw.call("on_example", [], event_data={"index": 0, "value": None})
    texts = {"/config": raw.http.get(app.url + "config").text, "the page": raw.http.get(app.url).text,
             "an upload's answer": stored, "an example picked": json.dumps(picked.output),
             "an analysis": json.dumps(analyze(raw, stored).output)}
    counts = {k: v.count(folder) for k, v in texts.items()}
    works = picked.success and raw.call("predict", [file_payload(picked.output["data"][0]["path"]), None, 3]).success
    row("the app's folder (absolute paths) in what the exposed app sends", f"{sum(counts.values())} occurrences",
        ", ".join(f"{k} {n}" for k, n in counts.items()) + f"; an example picked and predicted: {'yes' if works else 'no'}")
    row("Gradio's version in /config and the page", raw.config().get("version", "none"), release_shown(app.url, raw))


def release_shown(url: str, raw: Raw) -> str:
    """Where the app names Gradio's exact release: /config, the page, the page's CSS and JS."""
    import re

    import gradio

    release = gradio.__version__
    forms = (release, release.replace(".", "-"))
    page = raw.http.get(url).text
    assets = set(re.findall(r'(?:src|href)="\./(assets/[^"]+)"', page))
    built = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    assets |= {"assets/" + f.name for f in built.iterdir() if f.suffix in (".js", ".css") and forms[1].encode() in f.read_bytes()}
    texts = {"/config": raw.http.get(url + "config").text, "the page": page,
             "its CSS and JS": "".join(raw.http.get(url + a).text for a in sorted(assets))}
    return ", ".join(f"{k} {sum(v.count(f) for f in forms)}" for k, v in texts.items()) + f" ({len(assets)} assets)"


def crashed_clustering(app, tmp: Path) -> None:
    """A SIGSEGV sent to the survey's clustering child as soon as it starts (a native crash
    there); another client predicts afterwards."""
    raw = Raw(app.url)
    stored = [raw.upload(noise_png(tmp / f"n{i}.png", 48, 48, seed=i)) for i in range(4)]
    killed: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=crash_spawned_children, args=(app.proc.pid, stop, killed), daemon=True)
    watcher.start()
    out = survey(raw, stored)
    stop.set()
    watcher.join(5)
    other = Raw(app.url)
    answer = other.call("predict", [file_payload(other.upload(photo(tmp))), None, 3]) if app.alive() else None
    row("a native crash (SIGSEGV) in the survey's clustering", "no child process: a crash there ends the server"
        if not killed else ("the survey failed, the server lives" if app.alive() else "the server died"),
        f"{out.message[:90] or ('surveyed' if out.success else '')}; another client's /predict: "
        f"{'answered' if answer is not None and answer.success else 'failed'}")


def fresh_sessions(app, tmp: Path, n: int = 200) -> None:
    """``n`` fresh sessions (each from its own forwarded address), each analysing a new 800 x 600
    picture, 4 at a time: the app's RSS at the start, its peak, and 90 s after the last."""
    from concurrent.futures import ThreadPoolExecutor

    pid = app.proc.pid

    def one(i: int) -> bool:
        raw = Raw(app.url, headers={"X-Forwarded-For": f"10.{i // 250}.{i % 250}.9"})
        p = tmp / f"s{i}.png"
        base = np.random.default_rng(i).integers(0, 256, (60, 80, 3), dtype=np.uint8)
        Image.fromarray(base).resize((800, 600), Image.Resampling.BILINEAR).save(p)
        try:
            return analyze(raw, raw.upload(p)).success
        finally:
            p.unlink()
            raw.close()

    Raw(app.url).config()
    time.sleep(5)
    start, peak, t0 = rss_mb(pid), 0.0, time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        ok = 0
        for done in pool.map(one, range(n)):
            ok += done
            peak = max(peak, rss_mb(pid))
    took = time.perf_counter() - t0
    time.sleep(90)  # (the session sweeper runs every minute)
    end = rss_mb(pid)
    heaps, resident = thread_heaps(pid)
    row(f"{n} fresh sessions, each analysing a new 800 x 600 picture (4 at a time)", f"{ok} analysed in {took:.0f} s",
        f"RSS {start:.0f} -> peak {peak:.0f} -> {end:.0f} MiB 90 s after (+{end - start:.0f}); "
        f"threads' own heaps: {heaps}, {resident:.0f} MiB resident")


def slow_connections_flood(app, n: int = 3000, hold_s: float = 60) -> None:
    """``n`` connections from 127.0.0.2 that never finish their headers, with the app's file
    limit lowered to 2,048 (the issue's 20,000 took 2 x 10,000 connections); another client
    (127.0.0.1) asks for /config every 2 s meanwhile."""
    import resource

    from attacks import slow_connections, still_open

    resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (2048, 2048))
    log0 = app.log_path.stat().st_size
    t0 = time.monotonic()
    socks = slow_connections(app.port, n)
    opened = time.monotonic() - t0
    times = []
    with __import__("httpx").Client(timeout=10) as http:
        while time.monotonic() - t0 < hold_s:
            t1 = time.perf_counter()
            try:
                ok = http.get(app.url + "config").status_code == 200
            except Exception:  # noqa: BLE001 - timed out
                ok = False
            times.append(time.perf_counter() - t1 if ok else float("inf"))
            time.sleep(2)
    left = still_open(socks)
    for s in socks:
        s.close()
    grown = app.log_path.stat().st_size - log0
    p95 = statistics.quantiles(times, n=20, method="inclusive")[18] if len(times) > 1 else float("inf")
    row(f"{n:,} connections from one address that never finish their headers (opened in {opened:.0f} s; "
        "the app's file limit 2,048)", f"{left:,} still open after {hold_s:.0f} s",
        f"another client's /config: p50 {statistics.median(times):.2f} s, p95 {p95:.2f} s "
        f"({sum(t != float('inf') for t in times)} of {len(times)} answered); log +{grown / 1e6:.2f} MB")


# ----------------------------------------------------------------------------- the MCP tools (issue 33)


def mcp_tools(app, tmp: Path) -> None:
    """``--exposed --mcp``, through a plain JSON-RPC client: a picture as a URL to a server on
    this computer, server files as pictures, pictures of noise from one address until its budget
    is used (the app's folder watched), and a flood of tool calls from one address while another
    calls predict."""
    import http.server
    import io

    from mcp_client import McpClient, data_url, parse, texts

    hits = []

    class Counting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = app.url + "gradio_api/mcp/"
    c = McpClient(url)
    tools = [t["name"] for t in c.call("tools/list")["tools"]]
    answers = [c.tool(t, image=f"http://127.0.0.1:{server.server_address[1]}/{t}.png") for t in tools]
    server.shutdown()
    row("a picture given to each MCP tool as an http URL to a server on 127.0.0.1",
        f"{sum(bool(a.get('isError')) for a in answers)} of {len(answers)} refused as MCP errors",
        f"the server saw {len(hits)} requests; \"{texts(answers[0])[0][:60]}...\"")
    paths = ["/etc/passwd", str(ROOT / "weights" / "deit_tiny_patch16_224.safetensors"), "../../../etc/hostname"]
    answers = [c.tool(t, image=p) for t in tools for p in paths]
    row("server files named as the picture of every MCP tool", f"{sum(bool(a.get('isError')) for a in answers)} "
        f"of {len(answers)} refused", f"longest answer {max(len(json.dumps(a)) for a in answers)} bytes")
    import psutil

    folder = next(Path(f.path).parent for f in psutil.Process(app.proc.pid).open_files() if f.path.endswith("/.lock"))
    attacker, other = McpClient(url, source="127.0.0.2"), McpClient(url, source="127.0.0.3")
    before, codes, t0 = folder_bytes(folder), [], time.perf_counter()
    for seed in range(30):
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (420, 420, 3), dtype=np.uint8)).save(buf, "PNG")
        r = attacker.post("tools/call", {"name": "predict", "arguments": {"image": data_url(buf.getvalue(), "image/png")}})
        codes.append("429" if r.status_code == 429 else "error" if parse(r).get("result", {}).get("isError") else "ok")
    grown = folder_bytes(folder) - before
    chelsea = data_url(photo(tmp).read_bytes(), "image/png")  # (coffee)
    still = other.tool("predict", image=chelsea)
    row(f"30 MCP predict calls with {len(buf.getvalue()) / MB:.2f} MiB pictures of noise from one address "
        f"({time.perf_counter() - t0:.0f} s)", f"{codes.count('ok')} answered, {codes.count('error')} tool errors, "
        f"{codes.count('429')} refused (HTTP 429; --upload-budget-mb 10); another address's predict: "
        f"{'refused' if still.get('isError') else 'answered'}", f"the app's folder +{grown / MB:.0f} MB")
    mcp_burst(url, other, chelsea)
    mcp_flood(url, other)


def mcp_burst(url: str, other, picture: str) -> None:
    """30 explain calls at once from one address (each another class), another address calling
    predict meanwhile."""
    import concurrent.futures

    from mcp_client import McpClient

    def call(i: int) -> str:
        try:
            r = McpClient(url, source="127.0.0.4").tool("explain", image=picture, method="chefer", class_index=i)
        except Exception:  # noqa: BLE001 - an HTTP refusal
            return "refused"
        return "refused" if r.get("isError") else "ok"

    times = []
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        flood = [pool.submit(call, i) for i in range(30)]
        time.sleep(1)
        for i in range(10):
            t1 = time.perf_counter()
            ok = not other.tool("predict", image=small_png(100 + i)).get("isError")
            times.append(time.perf_counter() - t1 if ok else float("inf"))
        outcome = [f.result() for f in flood]
    p95 = statistics.quantiles(times, n=20, method="inclusive")[18]
    row("30 MCP explain calls at once (each another class) from one address", f"{outcome.count('ok')} answered, "
        f"{outcome.count('refused')} refused", f"meanwhile another address's MCP predict: p50 "
        f"{statistics.median(times):.2f} s, p95 {p95:.2f} s ({sum(t != float('inf') for t in times)} of 10)")


def small_png(seed: int, side: int = 64) -> str:
    """A data URL of a small PNG of noise (a flood's pictures: the caller's upload budget lasts)."""
    import io

    from mcp_client import data_url

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return data_url(buf.getvalue(), "image/png")


def mcp_flood(url: str, other, threads: int = 30, calls: int = 10) -> None:
    """``threads`` callers from one address each calling explain again and again (small pictures,
    every call another class) while another address calls predict ``calls`` times."""
    import concurrent.futures

    from mcp_client import McpClient

    stop, outcome = threading.Event(), []

    def flood(i: int) -> None:
        client = McpClient(url, source="127.0.0.4")
        while not stop.is_set():
            try:
                r = client.tool("explain", image=small_png(i), method="chefer", class_index=i % 1000)
                outcome.append("refused" if r.get("isError") else "ok")
            except Exception:  # noqa: BLE001 - an HTTP refusal
                outcome.append("refused")
            i += threads

    times = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        busy = [pool.submit(flood, i) for i in range(threads)]
        time.sleep(2)
        for i in range(calls):
            t1 = time.perf_counter()
            ok = not other.tool("predict", image=small_png(100 + i)).get("isError")
            times.append(time.perf_counter() - t1 if ok else float("inf"))
        stop.set()
        for f in busy:
            f.result()
    p95 = statistics.quantiles(times, n=20, method="inclusive")[18]
    row(f"{threads} MCP callers on one address calling explain again and again (small pictures)",
        f"{outcome.count('ok')} answered, {outcome.count('refused')} refused", f"meanwhile another address's MCP predict: p50 "
        f"{statistics.median(times):.2f} s, p95 {p95:.2f} s ({sum(t != float('inf') for t in times)} of {calls})")


# ----------------------------------------------------------------------------- issue 47: bodies, uploads, folder jobs


class Victim:
    """Another client (127.0.0.1) asking /predict for a new small picture every ``every_s`` seconds
    in a thread until :meth:`stop`: each call's seconds (inf: failed, or over ``timeout``).
    ``same``: the same picture each time (its analysis kept: no memory of the victim's in a row
    that measures the app's)."""

    def __init__(self, url: str, tmp: Path, every_s: float = 2.0, timeout: float = 15.0, same: bool = False) -> None:
        self.url, self.tmp, self.every_s, self.timeout, self.same = url, tmp, every_s, timeout, same
        self.times: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            t0 = time.perf_counter()
            try:
                raw = Raw(self.url, timeout=self.timeout)
                p = noise_png(self.tmp / f"victim{i}.png", 64, 48, seed=1000 + (0 if self.same else i))
                out = raw.call("predict", [file_payload(raw.upload(p)), None, 3], timeout=self.timeout)
                raw.close()
                took = time.perf_counter() - t0
                self.times.append(took if out.success and took <= self.timeout else float("inf"))
            except Exception:  # noqa: BLE001 - timed out, refused, reset
                self.times.append(float("inf"))
            i += 1
            self.stopping.wait(max(0.0, self.every_s - (time.perf_counter() - t0)))

    def start(self) -> Victim:
        self.thread.start()
        return self

    def stop(self) -> str:
        self.stopping.set()
        self.thread.join(60)
        return p95_text(self.times)


def p95_text(times: list[float]) -> str:
    """p50, p95 and how many answered, of request times (inf: not answered)."""
    if len(times) < 2 or all(t == float("inf") for t in times):
        return f"{sum(t != float('inf') for t in times)} of {len(times)} answered"
    ordered = sorted(times)
    p95 = statistics.quantiles(ordered, n=20, method="inclusive")[18]
    return (f"p50 {statistics.median(ordered):.2f} s, p95 {p95:.2f} s "
            f"({sum(t != float('inf') for t in times)} of {len(times)} answered)")


def meanwhile(app, tmp: Path, work: Callable, same: bool = False):
    """``work()`` while another client asks /predict (:class:`Victim`) and the app's open files
    are counted: (its result, the victim's p50/p95, the peak of open files and its share of the
    limit)."""
    import resource

    from attacks import open_files

    limit = resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE)[0]
    victim, peak, stop = Victim(app.url, tmp, same=same).start(), [open_files(app.proc.pid)], threading.Event()

    def count() -> None:
        while not stop.wait(0.5):
            try:
                peak[0] = max(peak[0], open_files(app.proc.pid))
            except OSError:
                return

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        result = work()
    finally:
        stop.set()
        counter.join(5)
        times = victim.stop()
    return result, f"another client's /predict meanwhile: {times}; open files peak {peak[0]} ({peak[0] / limit:.0%})"


def can_upload(url: str, source: str, tmp: Path) -> str:
    """Whether a new client at ``source`` can upload a photo now: its HTTP status."""
    import httpx

    try:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=20) as http, \
                open(photo(tmp), "rb") as fh:
            return str(http.post(url + "gradio_api/upload", files=[("files", ("coffee.png", fh))]).status_code)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


def slow_bodies(app, tmp: Path, addresses: int = 25, per_address: int = 100, hold_s: float = 90) -> None:
    """Issue 47, break 1: ``addresses`` x ``per_address`` POSTs to /gradio_api/queue/join whose body
    comes one byte every 5 s (each reopened when the server closes it), the app's file limit
    lowered to 2,048; another client's /predict meanwhile, the app's open files sampled, and a new
    address's upload at the end."""
    import resource

    from attacks import Drip, open_files

    resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (2048, resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE)[1]))
    time.sleep(1.5)  # (the app reads its limit again every second)
    log0, fds0 = app.log_path.stat().st_size, open_files(app.proc.pid)
    drip = Drip(app.port, [f"127.0.2.{i + 1}" for i in range(addresses)], per_address).start()
    victim = Victim(app.url, tmp).start()
    peak, t0 = fds0, time.monotonic()
    while time.monotonic() - t0 < hold_s:
        peak = max(peak, open_files(app.proc.pid))
        time.sleep(0.5)
    newcomer = can_upload(app.url, "127.0.3.1", tmp)
    figure = victim.stop()
    alive = drip.alive()
    drip.stop()
    row(f"{addresses} addresses x {per_address} POST /gradio_api/queue/join sending their body one byte every 5 s, "
        f"reopened when closed, for {hold_s:.0f} s (the app's file limit 2,048)",
        f"open files: {fds0} at the start, peak {peak} ({peak / 2048:.0%} of the limit); at the end {alive} of the "
        f"attack's sockets connected (its side), {drip.closed} closed by the server; a new address's upload: HTTP {newcomer}",
        f"another client's /predict: {figure}; log +{(app.log_path.stat().st_size - log0) / 1e6:.2f} MB")


def chunked_uploads(app, tmp: Path, n: int = 40, size: int = 20 * MB) -> None:
    """Issue 47, break 2: one address sends ``n`` uploads of ``size`` bytes chunked, each with a
    ``Content-Length: 200`` beside its ``Transfer-Encoding: chunked``."""
    from attacks import chunked_upload

    folder = app.folder()
    before, t0 = folder_bytes(folder), time.perf_counter()
    codes, others = meanwhile(app, tmp, lambda: [chunked_upload(app.port, size, "127.0.4.1") for _ in range(n)])
    grown = folder_bytes(folder) - before
    row(f"{n} uploads of {size / MB:.0f} MiB from one address, each sent chunked with Content-Length: 200 beside "
        f"(--upload-budget-mb 100)", ", ".join(f"{codes.count(c)} x HTTP {c}" for c in sorted(set(codes))),
        f"the app's folder +{grown / MB:.0f} MiB in {time.perf_counter() - t0:.0f} s; {others}")


def upload_lockout(app, tmp: Path, addresses: int = 50, per_address: int = 4, hold_s: float = 30) -> None:
    """Issue 47, break 3: ``addresses`` x ``per_address`` uploads that declare 25 MB and send no body
    (reopened when closed); then new addresses upload a photo and call an MCP tool."""
    from attacks import Drip
    from mcp_client import McpClient, data_url

    drip = Drip(app.port, [f"127.0.5.{i + 1}" for i in range(addresses)], per_address, declared=None).start()
    _, others = meanwhile(app, tmp, lambda: time.sleep(hold_s))
    during = [can_upload(app.url, f"127.0.6.{i + 1}", tmp) for i in range(5)]
    mcp = McpClient(app.url + "gradio_api/mcp/", source="127.0.6.9")
    try:
        answer = mcp.tool("predict", image=data_url(photo(tmp).read_bytes(), "image/png"))
        tool = "error: " + str(answer["content"][0].get("text", ""))[:60] if answer.get("isError") else "answered"
    except Exception as e:  # noqa: BLE001 - HTTP 429
        tool = f"refused: {str(e)[:60]}"
    alive = drip.alive()
    drip.stop()
    time.sleep(2)
    after = [can_upload(app.url, f"127.0.7.{i + 1}", tmp) for i in range(3)]
    row(f"{addresses} addresses x {per_address} uploads declaring 25 MB and sending no body, for {hold_s:.0f} s "
        f"({alive} connected at the end, {drip.closed} closed by the server)",
        f"5 new addresses' uploads meanwhile: {', '.join(during)}; a new "
        f"address's MCP predict: {tool}", f"after the attack: {', '.join(after)}; {others}")


def huge_zip(app, tmp: Path, job_seconds: float, flags: str = "") -> None:
    """Issue 47, break 4: a zip of 16 float TIFFs of 8000 x 8000 px (64 MP each) to the survey and
    to the atlas: RSS peak and seconds against ``--job-seconds`` (``flags``: the app's others, said in the row)."""
    from attacks import huge_tiff_zip, values_for

    archive = huge_tiff_zip(tmp / "huge.zip")
    raw = Raw(app.url, timeout=600)
    raw.call("predict", [file_payload(raw.upload(photo(tmp))), None, 3])  # the model loaded first
    stored = raw.upload(archive)
    for name in ("on_run", "on_build"):
        time.sleep(3)
        rss0 = rss_mb(app.proc.pid)
        data = values_for(raw, name, 0, file_payload(stored))
        (out, rss, _), others = meanwhile(app, tmp, lambda name=name, data=data: watched(
            app.proc.pid, app.folder(), lambda: raw.call(name, data, timeout=900)), same=True)
        what = "survey" if name == "on_run" else "atlas"
        row(f"the {what} of a {archive.stat().st_size // 1024} KB zip of 16 float TIFFs of 8000 x 8000 px "
            f"(--job-seconds {job_seconds:.0f}{flags})", ("done" if out.success else out.message[:110]),
            f"{out.seconds:.1f} s, RSS peak +{rss - rss0:.0f} MiB; {others}")


def atlas_photos(app, tmp: Path, job_seconds: float, n: int = 100) -> None:
    """Issue 47, break 4's last part: an atlas of ``n`` photos of the shared ImageNet sample (a zip)
    against ``--job-seconds``."""
    import zipfile

    from attacks import values_for

    sample = ROOT.parent / "shared" / "imagenet-sample"
    if not sample.is_dir():
        row(f"an atlas of {n} photos", "skipped", f"needs {sample}")
        return
    archive = tmp / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(sample.glob("*.JPEG"))[:: max(1, 1000 // n)][:n]:
            z.write(p, f"photos/{p.name}")
    raw = Raw(app.url, timeout=600)
    raw.call("predict", [file_payload(raw.upload(photo(tmp))), None, 3])
    stored = raw.upload(archive)
    out = raw.call("on_build", values_for(raw, "on_build", 0, file_payload(stored)), timeout=900)
    row(f"an atlas of {n} ImageNet photos ({archive.stat().st_size / MB:.1f} MB zip; --job-seconds {job_seconds:.0f})",
        "done" if out.success else out.message[:140], f"{out.seconds:.1f} s")


def smaller_findings(app, tmp: Path) -> None:
    """Issue 47's smaller findings: a 100 KB non-string MCP argument, a 1,025-character model name,
    Gradio's OpenAPI schema, the tool events called through the page's queue, a hub model named by
    an anonymous caller."""
    from mcp_client import McpClient, data_url

    picture = data_url(photo(tmp).read_bytes(), "image/png")
    c = McpClient(app.url + "gradio_api/mcp/", source="127.0.8.1")
    r = c.post("tools/call", {"name": "predict", "arguments": {"image": picture, "k": ["x" * 100_000]}})
    r2 = c.post("tools/call", {"name": "predict", "arguments": {"image": picture, "model": "m" * 1025}})
    url_named = f":{app.port}/" in r2.text
    row("MCP: a 100 KB list as k; a 1,025-character model name", f"{len(r.content):,} bytes back; the internal "
        f"join URL {'named' if url_named else 'not named'}", r2.text.split('"text":"')[-1][:90])
    import httpx

    code = httpx.get(app.url + "gradio_api/openapi.json").status_code
    row("Gradio's /gradio_api/openapi.json on the exposed app", f"HTTP {code}", "")
    raw = Raw(app.url, headers={"X-Forwarded-For": "10.47.0.1"})
    stored = raw.upload(photo(tmp))
    fn = raw.fn_index("tool_explain")
    joined = [raw.join(fn, [file_payload(stored), "integrated-gradients", -1, ""], session=f"t{i}")[0] for i in range(10)]
    row("10 tool events (explain) joined through the page's queue by one address, at once",
        f"{joined.count(200)} in flight, {len(joined) - joined.count(200)} refused", "")
    out = raw.call("predict", [file_payload(stored), "hub:vit_small_patch16_224.dino", 3], timeout=120)
    row("an anonymous caller names a hub model (hub:vit_small_patch16_224.dino) on the exposed app",
        "download tried" if "download" in out.message or out.success else "refused", out.message[:100])


# ----------------------------------------------------------------------------- issue 50: sessions, files, streams


def newcomer(url: str, source: str, tmp: Path, timeout: float = 10) -> tuple[bool, bool]:
    """Whether a new visitor at ``source`` gets /config, and then a /predict of a photo (its
    upload, its join and its event stream), each within ``timeout`` seconds."""
    raw = Raw(url, timeout=timeout, source=source)
    try:
        config = raw.http.get(url + "config").status_code == 200
    except Exception:  # noqa: BLE001 - refused, reset, timed out
        return False, False
    try:
        out = raw.call("predict", [file_payload(raw.upload(photo(tmp))), None, 3], timeout=timeout)
        return config, out.success
    except Exception:  # noqa: BLE001
        return config, False
    finally:
        raw.close()


def analysed_victim(url: str, tmp: Path, source: str) -> Raw:
    """A visitor at ``source`` whose session has analysed a photo (its /compare answers)."""
    victim = Raw(url, source=source)
    out = analyze(victim, victim.upload(photo(tmp)))
    assert out.success, out.message
    return victim


def fresh_hashes(app, tmp: Path, n: int = 1100) -> None:
    """Break 1: ``n`` POSTs to /gradio_api/run/predict, each with a fresh session hash, from one
    address; then the victim's /compare (its analysed picture lives in its session)."""
    from attacks import run_posts

    victim = analysed_victim(app.url, tmp, "127.0.10.1")
    before = victim.call("compare", [5, None]).success
    t0 = time.perf_counter()
    codes = run_posts(app.url, n, "127.0.10.2")
    took = time.perf_counter() - t0
    after = victim.call("compare", [5, None])
    row(f"{n:,} POST /gradio_api/run/predict with fresh session hashes from one address, then an analysed "
        "visitor's /compare", "the visitor's session survived" if after.success else
        f"the visitor's session was forgotten: {after.message[:40]}",
        f"{', '.join(f'{v} x HTTP {k}' for k, v in sorted(codes.items()))} in {took:.1f} s; /compare before: "
        f"{'answered' if before else 'failed'}")


def huge_hashes(app, tmp: Path, n: int = 1100, size: int = 900_000, wait_s: float = 65) -> None:
    """Break 2: ``n`` POSTs to /gradio_api/run/predict from one address, each with a session hash
    of ``size`` characters; the app's RSS before, at its peak and ``wait_s`` seconds after."""
    from attacks import run_posts

    Raw(app.url).config()
    time.sleep(5)
    start = rss_mb(app.proc.pid)
    t0 = time.perf_counter()
    codes, rss, _ = watched(app.proc.pid, app.folder(), lambda: run_posts(
        app.url, n, "127.0.11.1", session=lambda i: f"{i:08d}" + "h" * (size - 8), threads=4))
    took = time.perf_counter() - t0
    time.sleep(wait_s)
    end = rss_mb(app.proc.pid)
    row(f"{n:,} POST /gradio_api/run/predict with session hashes of {size // 1000} KB from one address",
        ", ".join(f"{v} x HTTP {k}" for k, v in sorted(codes.items())) + f" in {took:.1f} s",
        f"RSS {start:,.0f} -> peak {rss:,.0f} -> {end:,.0f} MiB {wait_s:.0f} s after (+{end - start:,.0f})")


def file_limit(app, n: int = 1024) -> None:
    """The app's file limit, soft and hard, lowered to ``n`` (a host whose hard limit is ``n``)."""
    import resource

    resource.prlimit(app.proc.pid, resource.RLIMIT_NOFILE, (n, n))
    time.sleep(1.5)  # (the app reads its limit again every second)


def newcomers(url: str, tmp: Path, seconds: float, tries: int, net: str, peak: Callable[[], None]) -> tuple[int, int]:
    """``tries`` new visitors (each from its own address in ``net``.x), spread over ``seconds``:
    how many got /config and how many /predict; ``peak()`` is called between them."""
    config = predict = 0
    t0 = time.monotonic()
    for i in range(tries):
        while time.monotonic() - t0 < (i + 1) * seconds / (tries + 1):
            peak()
            time.sleep(0.5)
        got = newcomer(url, f"{net}.{i + 1}", tmp)
        config, predict = config + got[0], predict + got[1]
    while time.monotonic() - t0 < seconds:
        peak()
        time.sleep(0.5)
    return config, predict


def paced_uploads(app, tmp: Path, addresses: int = 7, per_address: int = 100, rate: int = 17 << 10,
                  hold_s: float = 60, limit: int = 1024, reopen: bool = False) -> None:
    """Break 3: at a file limit of ``limit`` (soft and hard), ``addresses`` x ``per_address`` uploads
    declaring 25 MB and sent at ``rate`` bytes a second (within the 16 KB/s rule; ``reopen``:
    each reopened when closed) for ``hold_s`` seconds, then cut; new visitors' /config and
    /predict meanwhile, the app's open files, and its folder after."""
    from attacks import PacedUploads, open_files

    file_limit(app, limit)
    folder = app.folder()
    before, fds0 = folder_bytes(folder), open_files(app.proc.pid)
    top = [fds0]
    log0 = app.log_path.read_text(errors="replace").count("Too many open files")
    attack = PacedUploads(app.port, [f"127.0.12.{i + 1}" for i in range(addresses)], per_address, rate=rate,
                          reopen=reopen).start()
    config, predict = newcomers(app.url, tmp, hold_s, 3, "127.0.13",
                                lambda: top.__setitem__(0, max(top[0], open_files(app.proc.pid))))
    attack.stop()
    time.sleep(3)
    after = folder_bytes(folder)
    emfile = app.log_path.read_text(errors="replace").count("Too many open files") - log0
    row(f"{addresses} addresses x {per_address} uploads declaring 25 MB sent at {rate >> 10} KB/s for {hold_s:.0f} s"
        f"{', reopened when closed' if reopen else ''}, then cut (file limit {limit:,}, soft and hard)",
        f"new visitors: /config {config} of 3, /predict {predict} of 3; open files {fds0} -> peak {top[0]:,} "
        f"({top[0] / limit:.0%}); {emfile} 'Too many open files'",
        f"{attack.opened:,} uploads opened, {attack.closed:,} closed by the server; the app's folder "
        f"{before / MB:.0f} -> {after / MB:.0f} MiB once the attack ended")


class OpenPage(threading.Thread):
    """A page opened before an attack: its heartbeat held (opened again a second after the server
    closes it, as the page's own does), and a /predict of its session every ``every_s`` seconds;
    ``answered`` of ``asked``."""

    def __init__(self, url: str, tmp: Path, source: str, every_s: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.raw, self.every_s, self.stopping = Raw(url, timeout=15, source=source), every_s, threading.Event()
        self.picture = file_payload(self.raw.upload(photo(tmp)))
        self.asked = self.answered = self.heartbeats = 0
        self.beat = threading.Thread(target=self.heartbeat, daemon=True)

    def heartbeat(self) -> None:
        while not self.stopping.is_set():
            self.heartbeats += 1
            try:
                with self.raw.http.stream("GET", self.raw.url + f"gradio_api/heartbeat/{self.raw.session}",
                                          timeout=None) as r:
                    for _ in r.iter_lines():
                        if self.stopping.is_set():
                            return
            except Exception:  # noqa: BLE001 - closed by the server
                pass
            self.stopping.wait(1.0)

    def run(self) -> None:
        self.beat.start()
        while not self.stopping.wait(self.every_s):
            self.asked += 1
            try:
                self.answered += self.raw.call("predict", [self.picture, None, 3], timeout=15).success
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> str:
        self.stopping.set()
        self.join(30)
        return f"{self.answered} of {self.asked} answered, its heartbeat opened {self.heartbeats} times"


def held_streams(app, tmp: Path, addresses: int = 700, hold_s: float = 45, limit: int = 1024) -> None:
    """Break 4: at a file limit of ``limit`` (soft and hard), one heartbeat stream from each of
    ``addresses`` addresses, reopened when closed, for ``hold_s`` seconds; new visitors' /config
    and /predict meanwhile (a try every few seconds), a page opened before the attack, the app's
    open files and CPU."""
    from attacks import heartbeats, open_files

    file_limit(app, limit)
    page = OpenPage(app.url, tmp, "127.0.14.200")
    page.start()
    time.sleep(3)
    fds0, cpu0 = open_files(app.proc.pid), cpu_s(app.proc.pid)
    top = [fds0]
    sources = [f"127.{20 + i // 250}.{i % 250}.1" for i in range(addresses)]
    t0 = time.perf_counter()
    attack = heartbeats(app.port, sources).start()
    opened = time.perf_counter() - t0
    held = attack.alive()
    config, predict = newcomers(app.url, tmp, hold_s, 8, "127.0.14",
                                lambda: top.__setitem__(0, max(top[0], open_files(app.proc.pid))))
    held_end, cpu, paged = attack.alive(), cpu_s(app.proc.pid) - cpu0, page.stop()
    attack.stop()
    row(f"{addresses} addresses each holding one heartbeat stream (GET /gradio_api/heartbeat/...), reopened when "
        f"closed, for {hold_s:.0f} s (file limit {limit:,}, soft and hard)",
        f"new visitors: /config {config} of 8, /predict {predict} of 8; a page opened before: /predict "
        f"{paged}; streams held: {held} after the opening ({opened:.1f} s), {held_end} at the end; "
        f"{attack.opened:,} opened, {attack.closed:,} closed by the server",
        f"open files {fds0} -> peak {top[0]:,} ({top[0] / limit:.0%}); the app's CPU {cpu / hold_s:.0%} of a core")


def small50(app, tmp: Path) -> None:
    """Round 4's smaller findings: /monitoring and the reload watcher on the exposed app; hostile
    /attention, /compare and /train values; a list of zips to /train."""
    import httpx

    codes = {}
    for route in ("monitoring", "monitoring/summary", "gradio_api/dev/reload"):
        try:
            with httpx.stream("GET", app.url + route, timeout=5) as r:
                codes[route] = f"HTTP {r.status_code}"
        except Exception as e:  # noqa: BLE001
            codes[route] = type(e).__name__
    row("Gradio's /monitoring, /monitoring/summary and /gradio_api/dev/reload on the exposed app",
        ", ".join(f"{k}: {v}" for k, v in codes.items()), "")
    raw = analysed_victim(app.url, tmp, "127.0.15.1")
    answers = {"/attention cmap=-1": raw.call("attention", [12, "all", "[class] token", 0, -1, 0.6, True, None]),
               "/attention alpha='abc'": raw.call("attention", [12, "all", "[class] token", 0, "inferno", "abc", True,
                                                                None]),
               "/compare k='abc'": raw.call("compare", ["abc", None])}
    zips = [file_payload(raw.upload(photo(tmp)))] * 3
    answers["/train with 3 zips"] = raw.call("train", ["zip", 1, zips, None])
    row("hostile values: " + ", ".join(answers), "every answer says what is wrong" if all(
        o.message and "Something went wrong" not in o.message for o in answers.values()) else "a generic or empty answer",
        "; ".join(f"{k}: {o.message[:60] or '(empty)'}" for k, o in answers.items()))


def child_peak(pid: int, work: Callable) -> tuple[object, float]:
    """``work()`` while the RSS of process ``pid``'s children is sampled: (its result, their peak MiB)."""
    import psutil

    peak, stop = [0.0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            try:
                kids = psutil.Process(pid).children(recursive=True)
                peak[0] = max(peak[0], sum(k.memory_info().rss for k in kids) / MB)
            except psutil.Error:
                continue

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        return work(), peak[0]
    finally:
        stop.set()
        t.join(5)


def training_reads(app, tmp: Path, per_class: int = 3, side: int = 6300) -> None:
    """Round 4's training finding: /train on a zip of float TIFFs of ``side`` x ``side`` px (40 MP at
    6300) against /train on the digits: the training child's RSS peak."""
    import zipfile

    small = np.sin(np.linspace(0, 6, 63, dtype=np.float32))[None, :] * np.cos(np.linspace(0, 4, 63, dtype=np.float32))[:, None]
    archive = tmp / "floats.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for c, cls in enumerate(("waves", "ripples")):
            for i in range(per_class):
                pic = Image.fromarray(small * (c + 1) + i, "F").resize((side, side), Image.Resampling.NEAREST)
                pic.save(tmp / "f.tif", compression="tiff_adobe_deflate")
                z.write(tmp / "f.tif", f"set/{cls}/{i}.tif")
    raw = Raw(app.url, timeout=600)
    stored = file_payload(raw.upload(archive))
    peaks = {}
    for what, data in (("the digits", ["digits", 0.1, None, None]), (f"{2 * per_class} float TIFFs of {side * side / 1e6:.0f} MP",
                                                                    ["zip", 0.1, stored, None])):
        out, peaks[what] = child_peak(app.proc.pid, lambda data=data: raw.call("train", data, timeout=600))
        peaks[what] = f"{peaks[what]:,.0f} MiB" + ("" if out.success else f" ({out.message[:60]})")
    row(f"/train on a zip of {2 * per_class} float TIFFs of {side} x {side} px ({archive.stat().st_size / MB:.1f} MB), "
        "and on the digits", "the training child's RSS peak", "; ".join(f"{k}: {v}" for k, v in peaks.items()))


# ----------------------------------------------------------------------------- running them


def run(root: Path, only: set[str] | None) -> None:
    help_text = known_flags(root)
    weights = str(root / "weights" / "deit_tiny_patch16_224.safetensors")
    base = ["--weights", weights]
    want = (lambda name: not only or name in only)
    print("| attack | what happened | figure |\n|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_attacks_") as t:
        tmp = Path(t)

        def with_app(args: list[str], body: Callable) -> None:
            app = start_app(app_args(root, base + args, help_text), timeout=300, root=root)
            try:
                body(app)
            finally:
                app.stop()

        if want("files") or want("leaks") or want("holds") or want("bodies"):
            def exposed(app):
                for name, fn in (("files", lambda: server_files(app.url, tmp)), ("leaks", lambda: leaks(app.url, root, weights)),
                                 ("bodies", lambda: bodies(app.url, app.proc.pid)), ("holds", lambda: holds(app.url, tmp))):
                    if want(name):
                        fn()
            with_app(["--exposed"], exposed)
        if want("rebinding"):
            with_app([], lambda app: rebinding(app.url, app.port, weights))
        if want("memory"):
            with_app(["--exposed", "--max-megapixels", "64"], lambda app: (memory(app.url, app.proc.pid, tmp),
                                                                          float_tiff(app.url, app.proc.pid, tmp)))
        if want("uploads"):
            with_app(["--exposed"], lambda app: uploads(app.url, root, tmp))
        if want("forwarded"):
            with_app(["--exposed"], lambda app: forwarded_for(app.url, tmp))
        if want("flood"):
            with_app(["--exposed", "--trusted-proxy", "127.0.0.1"], lambda app: flood(app.url, tmp))
        if want("timelimit"):
            with_app(["--exposed", "--job-seconds", "10"], lambda app: time_limit(
                app.url, tmp, "--job-seconds 10" if "--job-seconds" in help_text else "no time limit"))
        if want("temp"):
            temp_folders(root, app_args(root, base + ["--exposed"], help_text), tmp)
        if want("survey"):
            with_app(["--exposed", "--no-warm-up"], lambda app: identical_pictures(app, tmp))
            with_app(["--exposed"], lambda app: survey_paths(app, tmp))
        if want("pages"):
            with_app(["--exposed"], lambda app: tiff_pages(app, tmp))
        if want("paths"):
            with_app(["--exposed"], lambda app: (served_paths(app, tmp), crashed_clustering(app, tmp)))
        if want("sessions"):
            with_app(["--exposed", "--trusted-proxy", "127.0.0.1"], lambda app: fresh_sessions(app, tmp))
        if want("unpack"):
            for attack in (overlapping_entries, many_entries, zero_files):
                with_app(["--exposed", "--job-seconds", "15"], lambda app, attack=attack: attack(app, tmp))
        if want("connections"):
            with_app(["--exposed"], slow_connections_flood)
        if want("mcp"):
            with_app(["--exposed", "--mcp", "--upload-budget-mb", "10", "--max-upload-mb", "5"],
                     lambda app: mcp_tools(app, tmp))
        round3 = ["--exposed", "--mcp", "--job-seconds", "30"]  # issue 47's app
        if want("slowbody"):
            with_app(round3, lambda app: slow_bodies(app, tmp))
        if want("chunked"):
            with_app(round3, lambda app: chunked_uploads(app, tmp))
        if want("lockout"):
            with_app(round3, lambda app: upload_lockout(app, tmp))
        if want("hugezip"):
            with_app(round3, lambda app: huge_zip(app, tmp, 30))
            with_app([*round3, "--max-megapixels", "64"], lambda app: huge_zip(app, tmp, 30, ", --max-megapixels 64"))
        if want("atlas100"):
            with_app(round3, lambda app: atlas_photos(app, tmp, 30))
        if want("small47"):
            with_app([*round3, "--trusted-proxy", "127.0.0.1"], lambda app: smaller_findings(app, tmp))
        if want("hashes"):
            with_app(round3, lambda app: fresh_hashes(app, tmp))
        if want("hugehash"):
            with_app(round3, lambda app: huge_hashes(app, tmp))
        if want("pacedup"):
            with_app(round3, lambda app: paced_uploads(app, tmp))
            with_app(round3, lambda app: paced_uploads(app, tmp, reopen=True))
        if want("streams"):
            with_app(round3, lambda app: held_streams(app, tmp))
        if want("small50"):
            with_app([*round3, "--train-minutes-max", "1"], lambda app: small50(app, tmp))
        if want("trainpeak"):
            with_app([*round3, "--train-minutes-max", "1"], lambda app: training_reads(app, tmp))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app to attack (default: this one)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    ap.add_argument("--only", nargs="*", help="files leaks bodies holds rebinding memory uploads forwarded flood "
                                              "timelimit temp survey unpack connections mcp paths sessions pages "
                                              "slowbody chunked lockout hugezip atlas100 small47 "
                                              "hashes hugehash pacedup streams small50 trainpeak")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    run(args.root.resolve(), set(args.only) if args.only else None)
    print(f"\n{len(ROWS)} rows in {time.perf_counter() - t0:.0f} s; app: {args.root.resolve()}")
    if args.json:
        args.json.write_text(json.dumps(ROWS, indent=2))


if __name__ == "__main__":
    main()
