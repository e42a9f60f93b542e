"""An exposed app cannot be exhausted (issue 10), tested against the running app.

The server binds 127.0.0.1 only; the hidden ``--exposed`` flag gives it the limits it has with
``--share`` or a non-loopback ``--host``: no checkpoint upload (unless
``--allow-checkpoint-upload``), image uploads capped by ``--max-upload-mb``, and a cap on each
client's share of the queue, so that a client flooding the API is told "queue is full" while
another client is served. One server for the module (start-up dominates: ~10 s).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

CHECKPOINT_TYPES = {".safetensors", ".pth", ".pt", ".bin", ".npz"}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    """24 different procedural photos (smooth colour fields), 256 px, each its own analysis."""
    out = tmp_path_factory.mktemp("photos")
    paths = []
    yy, xx = np.mgrid[0:256, 0:256] / 256.0
    for i in range(24):
        rgb = np.stack([np.sin(xx * (i + 1)) , np.cos(yy * (i % 5 + 1)), (xx * yy) ** (1 + i % 3)], -1)
        p = out / f"field_{i:02d}.png"
        Image.fromarray((127.5 + 127.5 * np.clip(rgb, -1, 1)).astype(np.uint8)).save(p)
        paths.append(p)
    return paths


@pytest.fixture(scope="module")
def big_photo(tmp_path_factory) -> Path:
    """A 1.4 MB PNG (noise does not compress): over a 1 MB upload cap."""
    p = tmp_path_factory.mktemp("big") / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)).save(p)
    assert 1.2e6 < p.stat().st_size < 2e6
    return p


@pytest.fixture(scope="module")
def exposed_app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--max-upload-mb", "1", "--max-queue", "8",
            "--concurrency", "1"]
    with running_app(args) as app:
        yield app


def _config(url: str) -> dict:
    with urllib.request.urlopen(url + "config", timeout=30) as r:
        return json.loads(r.read())


def _checkpoint_inputs(config: dict) -> list[dict]:
    """The page's file components that take checkpoints."""
    return [c for c in config["components"] if c.get("type") == "file"
            and CHECKPOINT_TYPES & set((c.get("props") or {}).get("file_types") or [])]


def test_exposed_app_offers_no_checkpoint_upload(exposed_app) -> None:
    config = _config(exposed_app.url)
    assert not _checkpoint_inputs(config), _checkpoint_inputs(config)
    assert "--allow-checkpoint-upload" in json.dumps(config)  # the page says how to turn it on
    assert "WARNING" in exposed_app.log() and "checkpoint upload is off" in exposed_app.log()


def test_checkpoint_upload_when_allowed(deit_tiny_path: Path) -> None:
    """The control: the same page built with --allow-checkpoint-upload has the checkpoint upload
    (built in-process: no server needed to read its config)."""
    from vit_demo.app.build import AppConfig, build
    from vit_demo.app.server.limits import Limits

    demo, _, _ = build(AppConfig(weights=[str(deit_tiny_path)], limits=Limits.for_exposure(True, True)))
    assert _checkpoint_inputs(demo.get_config_file())


def test_oversized_image_refused(exposed_app, big_photo: Path, photos: list[Path]) -> None:
    """Over --max-upload-mb: Gradio refuses the upload itself (nothing stored), the API says so in
    one line; a photo under the cap is served."""
    client = Client(exposed_app.url, verbose=False)
    with pytest.raises(ValueError, match="exceeds the maximum file size of 1048576 bytes"):  # the client knows
        client.predict(handle_file(str(big_photo)), None, 5, api_name="/predict")
    # straight to the upload route, as another client would: refused with 413, before the file is kept
    body = big_photo.read_bytes()
    boundary = "vitdemoboundary"
    data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"noise.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + body + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(exposed_app.url + "gradio_api/upload", data=data,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=60)
    assert http.value.code == 413, http.value
    out = client.predict(handle_file(str(photos[0])), None, 5, api_name="/predict")
    assert len(out["topk"]) == 5


def test_rest_routes_do_not_skip_the_queue(exposed_app, photos: list[Path]) -> None:
    """The direct REST route (``/gradio_api/run/NAME``) would run a model outside the queue and
    its limits: it is closed."""
    req = urllib.request.Request(exposed_app.url + "gradio_api/run/predict", data=json.dumps({"data": []}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=60)
    assert http.value.code in (404, 405), http.value


class QueueSession:
    """One client session speaking Gradio's queue protocol itself: upload a file, join the queue
    (``POST gradio_api/queue/join``: 200 with an event id, or 503 "queue is full"), and read the
    session's event stream (``GET gradio_api/queue/data``) until every joined event has completed.

    gradio_client shares one stream per client and, when the server closes it (no event left
    pending) just as a new event joins, gives that event up with a CancelledError: a race of the
    client library under a flood, not of the app. The server keeps a session's messages until a
    reader comes, so this reader simply opens the stream again while events are still pending."""

    def __init__(self, url: str, api_name: str) -> None:
        import uuid

        import httpx

        self.url, self.http, self.session = url, httpx.Client(timeout=60), uuid.uuid4().hex
        deps = _config(url)["dependencies"]
        self.fn_index = next(d.get("id", i) for i, d in enumerate(deps) if d.get("api_name") == api_name)

    def upload(self, path: Path) -> dict:
        with path.open("rb") as f:
            r = self.http.post(self.url + "gradio_api/upload", files=[("files", (path.name, f))])
        r.raise_for_status()
        return {"path": r.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}

    def join(self, *data) -> tuple[int, str]:
        """(HTTP status, the event id or the refusal's message)."""
        r = self.http.post(self.url + "gradio_api/queue/join",
                           json={"data": list(data), "fn_index": self.fn_index, "session_hash": self.session})
        return r.status_code, r.json().get("event_id") if r.status_code == 200 else r.json().get("detail", r.text)

    def outcomes(self, event_ids: set[str], timeout: float = 300) -> dict[str, bool]:
        """Each joined event's success flag, read from the session's stream(s) until all came."""
        done: dict[str, bool] = {}
        deadline = time.monotonic() + timeout
        while set(event_ids) - set(done) and time.monotonic() < deadline:
            with self.http.stream("GET", self.url + "gradio_api/queue/data", params={"session_hash": self.session},
                                  timeout=max(1.0, deadline - time.monotonic())) as r:
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed":
                        done[msg["event_id"]] = bool(msg.get("success"))
                    elif msg.get("msg") == "close_stream":
                        break
        return done


def test_flood_is_turned_away_while_others_are_served(exposed_app, photos: list[Path], tmp_path: Path) -> None:
    """One client keeps the API flooded (never the same photo twice, so every request runs the
    model) while another client (same address, its own session) asks for three predictions: the
    flood gets "queue is full", the other client gets every answer, each for its own photo.
    (Without the per-client cap the flood fills the whole queue and the other client is refused.)
    The flood speaks the queue protocol itself (:class:`QueueSession`); the other client is
    gradio_client, as a user's script would be."""
    import threading

    from gradio_client.utils import QueueError

    rng = np.random.default_rng(1)
    fresh = []
    for i in range(200):
        p = tmp_path / f"flood_{i:03d}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p)
        fresh.append(p)
    flood, other = QueueSession(exposed_app.url, "predict"), Client(exposed_app.url, verbose=False)
    other.predict(handle_file(str(photos[0])), None, 5, api_name="/predict")  # model loaded
    joined, full, other_errors, stop = set(), 0, [], threading.Event()

    def flooding() -> None:
        nonlocal full
        for p in fresh:
            if stop.is_set():
                break
            code, answer = flood.join(flood.upload(p), None, 1)
            if code == 200:
                joined.add(answer)
            elif code == 503 and "queue is full" in str(answer).lower():
                full += 1
            else:
                other_errors.append(f"HTTP {code}: {answer}")

    thread = threading.Thread(target=flooding)
    thread.start()
    time.sleep(0.5)  # the flood is on
    served, refused = [], []
    for p in photos[1:4]:
        try:
            out = other.predict(handle_file(str(p)), None, 3, api_name="/predict")
            served.append(out["image"] == p.name and len(out["topk"]) == 3)
        except QueueError as e:
            refused.append(str(e))
    stop.set()
    thread.join()
    outcomes = flood.outcomes(joined)
    ok = sum(outcomes.values())
    other_errors += [f"event {e}: failed" for e, success in outcomes.items() if not success]
    other_errors += [f"event {e}: never completed" for e in joined - set(outcomes)]
    print(f"flood: {full} refused as full, {ok} of {len(joined)} joined served")
    assert not refused and served == [True] * 3, (refused, served)
    assert full >= 10 and ok >= 1 and not other_errors, (full, ok, other_errors[:3])
    assert exposed_app.alive()


def test_flags_to_limits() -> None:
    """app.py's flags: exposure switches checkpoint upload off unless allowed; the upload cap is
    what Gradio enforces when no checkpoint may be uploaded; one client never gets the whole queue."""
    import app

    def lim(*argv):
        return app.limits(app.parse_args(list(argv)))

    local, lan, shared = lim(), lim("--host", "0.0.0.0"), lim("--share")
    assert not local.exposed and local.allow_checkpoint_upload and local.per_host_queue is None
    assert lan.exposed and shared.exposed and not lan.allow_checkpoint_upload and not shared.allow_checkpoint_upload
    assert lim("--host", "0.0.0.0", "--allow-checkpoint-upload").allow_checkpoint_upload
    assert lim("--exposed").exposed and not lim("--host", "::1").exposed
    assert lan.max_file_size == 25 * 2**20 and local.max_file_size == 2**30  # a checkpoint may be 1 GB
    assert lim("--exposed", "--max-upload-mb", "5").max_file_size == 5 * 2**20
    custom = lim("--cache-mb", "256", "--models-mb", "512", "--max-queue", "8")
    assert (custom.cache_bytes, custom.models_bytes) == (256 * 2**20, 512 * 2**20)
    assert custom.per_client_queue == 2 < 8 and lan.per_host_queue == 16 < 32
    with pytest.raises(SystemExit):
        lim("--cache-mb", "-1")
