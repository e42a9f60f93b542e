"""The running app under pressure, on loopback only: no outbound connection at start-up,
16 concurrent clients with no cross-talk and bounded memory, and a full queue that answers
with a message instead of hanging."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from app_server import ROOT, running_app

gradio_client = pytest.importorskip("gradio_client")
psutil = pytest.importorskip("psutil")
from gradio_client import Client, handle_file  # noqa: E402

ARTIFACTS = ROOT / "artifacts"

# Loaded into the app's interpreter (via PYTHONPATH): every attempt to resolve or connect to a
# non-loopback address is written to a log and refused, as a closed network would.
SITECUSTOMIZE = textwrap.dedent('''
    import ipaddress, os, socket

    _LOG = os.environ["VIT_DEMO_CONNECT_LOG"]
    _LOCAL_NAMES = {None, "", "localhost", "localhost.localdomain", "0.0.0.0", "::"}

    def _record(what):
        with open(_LOG, "a") as f:
            f.write(what + "\\n")

    def _is_local(host):
        if isinstance(host, bytes):
            host = host.decode()
        if host in _LOCAL_NAMES:
            return True
        try:
            ip = ipaddress.ip_address(str(host).split("%")[0])
        except ValueError:
            return False
        return ip.is_loopback or ip.is_unspecified

    _connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _record(f"connect {address!r}")
            raise OSError(101, "network is unreachable (blocked by the offline test)")
        return _connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _record(f"connect_ex {address!r}")
            return 101
        return _connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_local(host):
            _record(f"resolve {host!r}")
            raise socket.gaierror(-2, "Name or service not known (blocked by the offline test)")
        return _getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
''')


def test_startup_makes_no_outbound_connection(deit_tiny_path: Path, package_photos: dict[str, Path], tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "connects.log"
    log.touch()
    # HF_HUB_OFFLINE deliberately unset: the app itself must not try, not just be told not to.
    env = {"PYTHONPATH": str(site), "VIT_DEMO_CONNECT_LOG": str(log), "HF_HUB_OFFLINE": "0"}
    # Control: the recorder does see an outbound attempt (the hub check a user triggers).
    probe = "from vit_demo.checkpoints.timm import hub_reachable; print(hub_reachable())"
    control = subprocess.run([sys.executable, "-c", probe],
                             cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert control.stdout.strip() == "False" and "huggingface.co" in log.read_text(), control.stderr
    log.write_text("")
    with running_app(["--weights", str(deit_tiny_path)], env=env) as app:
        client = Client(app.url, verbose=False)
        out = client.predict(handle_file(str(package_photos["coffee"])), api_name="/predict")
        assert out["topk"][0]["label"] == "espresso"
        server_log = app.log()
    attempts = log.read_text().strip()
    assert attempts == "", f"outbound attempts during start-up and a prediction:\n{attempts}\n{server_log}"
    assert "127.0.0.1" in server_log  # it told the user where it listens


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    """One plain app for the load test and then the hostile corpus (the load test measures memory
    from its own warm-up, and runs first: it finds the app fresh)."""
    with running_app(["--weights", str(deit_tiny_path)]) as a:
        yield a


def _expected_top1(deit_tiny, photos: list[Path]) -> dict[str, int]:
    from vit_demo.predict import predict_images

    return {Path(r["image"]).name: r["topk"][0]["index"] for r in predict_images(deit_tiny, photos, k=1, progress=False)}


def test_sixteen_concurrent_clients(app, deit_tiny, package_photos: dict[str, Path]) -> None:
    """16 clients x 10 requests, mixed photos: all answered, each with its own image's answer,
    and resident memory after the run within 300 MB of the memory after warm-up."""
    photos = list(package_photos.values())[:8]
    expected = _expected_top1(deit_tiny, photos)
    clients_n, per_client = 16, 10
    server = psutil.Process(app.proc.pid)
    warm = Client(app.url, verbose=False)
    for p in photos:  # warm-up: model loaded, every photo analysed once
        warm.predict(handle_file(str(p)), api_name="/predict")
    rss_warm = server.memory_info().rss
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def user(i: int) -> None:
        try:
            client = Client(app.url, verbose=False)
        except Exception as e:  # noqa: BLE001 - record, the assertion below reports it
            with lock:
                failures.append(f"client {i}: could not connect: {e}")
            return
        for j in range(per_client):
            p = photos[(i + 3 * j) % len(photos)]
            t0 = time.perf_counter()
            try:
                out = client.predict(handle_file(str(p)), k=1, api_name="/predict")
            except Exception as e:  # noqa: BLE001
                with lock:
                    failures.append(f"client {i} request {j}: {type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                if out["image"] != p.name or out["topk"][0]["index"] != expected[p.name]:
                    failures.append(f"client {i} request {j}: asked {p.name}, got {out['image']} "
                                    f"class {out['topk'][0]['index']}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=user, args=(i,)) for i in range(clients_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    rss_after = server.memory_info().rss
    assert app.alive(), app.log()
    assert not any(t.is_alive() for t in threads), "some clients never finished"
    assert not failures, "\n".join(failures[:20])
    assert len(latencies) == clients_n * per_client
    q = statistics.quantiles(latencies, n=20)
    report = {"requests": len(latencies), "wall_s": round(wall, 2), "p50_s": round(statistics.median(latencies), 3),
              "p95_s": round(q[18], 3), "rss_warm_mb": round(rss_warm / 2**20), "rss_after_mb": round(rss_after / 2**20)}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "load_test.json").write_text(json.dumps(report, indent=2))
    print("load test:", report)
    assert rss_after - rss_warm <= 300 * 2**20, report


def test_full_queue_answers_with_a_message(deit_tiny_path: Path, package_photos: dict[str, Path]) -> None:
    photos = list(package_photos.values())
    """A queue of 1 and one model run at a time: a burst of requests gets some 'queue is full'
    answers (not a hang), and the app serves normally once the burst is over."""
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError

    with running_app(["--weights", str(deit_tiny_path), "--max-queue", "1", "--concurrency", "1"]) as app:
        client = Client(app.url, verbose=False)
        client.predict(handle_file(str(photos[0])), api_name="/predict")  # model loaded
        clients = [Client(app.url, verbose=False) for _ in range(12)]  # connected first: then a real burst
        jobs = [c.submit(handle_file(str(photos[i % 5])), api_name="/analyze") for i, c in enumerate(clients)]
        ok, full, other = 0, [], []
        for job in jobs:
            try:
                job.result(timeout=300)
                ok += 1
            except (QueueError, AppError, Exception) as e:  # noqa: B014, BLE001 - classify below
                (full if "queue is full" in str(e).lower() else other).append(f"{type(e).__name__}: {e}")
        assert full, f"no request was turned away ({ok} succeeded, others: {other})"
        assert ok >= 1 and not other, other
        out = client.predict(handle_file(str(photos[1])), api_name="/predict")
        assert out["topk"][0]["index"] == 10 or out["topk"]  # still serving
        assert app.alive()


def test_hostile_corpus_through_the_running_app(app, package_photos: dict[str, Path], tmp_path: Path) -> None:
    """Every generated hostile file through /predict: bad files get a one-line human message,
    good ones a prediction (tiny images are refused by the app on purpose), and the app keeps
    serving after each."""
    import hostile
    from gradio_client.exceptions import AppError

    corpus = hostile.build_images(tmp_path / "corpus")
    tiny = {"one_pixel.png", "strip_3x5000.png"}  # under 16 px on a side: the app says so
    client = Client(app.url, verbose=False)
    for name in hostile.BAD + hostile.GOOD:
        if name in hostile.BAD or name in tiny:
            with pytest.raises(AppError) as err:
                client.predict(handle_file(str(corpus[name])), api_name="/predict")
            msg = str(err.value).strip()
            assert msg and "\n" not in msg and "Traceback" not in msg, (name, msg)
            if name in tiny:
                assert "at least 16 px" in msg, (name, msg)
        else:
            out = client.predict(handle_file(str(corpus[name])), api_name="/predict")
            assert len(out["topk"]) == 5 and 0 < out["topk"][0]["prob"] <= 1, name
    assert client.predict(handle_file(str(package_photos["coffee"])), api_name="/predict")["topk"][0]["label"] == "espresso"
    assert app.alive()
