"""One client cannot starve the others (issue 21, points 5 and 6), against the running
``--exposed`` app behind a trusted proxy (``--trusted-proxy 127.0.0.1``: each
``X-Forwarded-For`` is its own client, as behind a university's reverse proxy).

- A flood of slow jobs (slide decks, RISE, causal LRP, animations, side-by-side, slide exports)
  from one client, several sessions of it at once: it gets one job at a time (the rest refused
  at the door), and another client's ``/predict`` answers within 2 s (p95; on a loaded machine,
  within 5 times its p95 without the flood, measured in the same run) all along;
- every slow job stops at its time limit (``--job-seconds``) with a message that says so;
- X-Forwarded-For from the trusted proxy: each address has its own upload budget.
One server for the module.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from attacks import Raw, file_payload
from conftest import noise_photos
from PIL import Image

pytest.importorskip("httpx")

SLOW_EVENTS = ("on_deck", "run", "run_1", "on_animate", "on_animate_1", "on_images", "on_models", "on_export")


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--trusted-proxy", "127.0.0.1", "--job-seconds", "6",
            "--upload-budget-mb", "1", "--max-upload-mb", "1"]
    with running_app(args) as a:
        yield a



def _defaults(raw: Raw, name: str) -> list:
    comps = {c["id"]: c for c in raw.config()["components"]}
    return [(comps[c].get("props") or {}).get("value") if comps[c].get("type") != "state" else None
            for c in raw.events()[name]["inputs"]]


def _ready_session(raw: Raw, photo: Path, session: str) -> None:
    data = _defaults(raw, "analyze")
    data[0] = file_payload(raw.upload(photo))
    out = raw.call("analyze", data, session=session)
    assert out.success, out.message


def test_a_flood_of_slow_jobs_does_not_starve_predictions(app, tmp_path: Path) -> None:
    attacker = Raw(app.url, headers={"X-Forwarded-For": "10.0.0.66"})
    victim = Raw(app.url, headers={"X-Forwarded-For": "10.0.0.7"})
    sessions = [f"flood{i}" for i in range(3)]
    for s in sessions:
        _ready_session(attacker, noise_photos(tmp_path, 1, 100 + len(s))[0], s)
    slow = [n for n in attacker.events() if n in SLOW_EVENTS or n.startswith("on_export")]
    stop, joined, busy, other = threading.Event(), [], [], []

    def flood() -> None:
        i = 0
        while not stop.is_set():
            name, session = slow[i % len(slow)], sessions[i % len(sessions)]
            status, answer = attacker.join(name, _defaults(attacker, name), session=session)
            if status == 200:
                joined.append(answer)
            elif "slow job" in str(answer) or "queue is full" in str(answer).lower():
                busy.append(answer)
            else:
                other.append(f"{name}: {status} {answer}")
            i += 1
            time.sleep(0.05)

    def predictions(photos: list[Path]) -> list[float]:
        times = []
        for p in photos:  # a new photo each time: the model runs for every one
            out = victim.call("predict", [file_payload(victim.upload(p)), None, 3])
            assert out.success, out.message
            times.append(out.seconds)
        return times

    quiet = predictions(noise_photos(tmp_path, 10, 8))  # the same machine, the same moment, no flood
    thread = threading.Thread(target=flood)
    thread.start()
    try:
        time.sleep(2)  # the flood is on
        times = predictions(noise_photos(tmp_path, 20, 7))
    finally:
        stop.set()
        thread.join()
    p95, p95_quiet = statistics.quantiles(times, n=20)[18], statistics.quantiles(quiet, n=20)[18]
    print(f"flood: {len(joined)} slow jobs let in, {len(busy)} refused; victim /predict p50 "
          f"{statistics.median(times):.2f} s, p95 {p95:.2f} s (without the flood: p95 {p95_quiet:.2f} s)")
    assert not other, other[:3]
    assert len(busy) > 5 * max(1, len(joined)), (len(joined), len(busy))
    # the predictions share the CPU with one slow job, but never wait behind one (before: 484 s):
    # on an idle 2-core machine the p95 stays under 2 s; on a loaded one within 5x its own quiet p95
    assert p95 < max(2.0, 5 * p95_quiet), (times, quiet)
    assert app.alive()


def test_slow_jobs_stop_at_their_time_limit(app, tmp_path: Path) -> None:
    """RISE (thousands of forward passes) against --job-seconds 6: stopped, and told so."""
    raw = Raw(app.url, headers={"X-Forwarded-For": "10.0.0.8"})
    _ready_session(raw, noise_photos(tmp_path, 1, 3)[0], raw.session)
    t0 = time.perf_counter()
    out = raw.call("run", _defaults(raw, "run"))
    took = time.perf_counter() - t0
    print(f"RISE with a 6 s limit: stopped after {took:.1f} s: {out.message}")
    assert out.refused and "took longer than the 6 s" in out.message, out.message
    assert took < 30


def test_forwarded_for_is_believed_from_the_trusted_proxy(app, tmp_path: Path) -> None:
    """Behind the trusted proxy each forwarded address has its own budget (1 MB here): five
    addresses each store their 0.8 MB; the same address a second time is refused."""
    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (500, 500, 3), dtype=np.uint8)).save(noise)
    assert 0.6e6 < noise.stat().st_size < 1e6
    codes = []
    for i in range(5):
        raw = Raw(app.url, headers={"X-Forwarded-For": f"10.2.{i}.9"})
        with open(noise, "rb") as f:
            codes.append(raw.http.post(raw.url + "gradio_api/upload", files=[("files", ("n.png", f))]).status_code)
    assert codes == [200] * 5, codes
    with open(noise, "rb") as f:
        again = raw.http.post(raw.url + "gradio_api/upload", files=[("files", ("n.png", f))])
    assert again.status_code == 429


def test_clients_take_turns_in_a_lane(app, tmp_path: Path) -> None:
    """One address's six analyses in the model lane (two running, four waiting), then another
    client's prediction: it is the next to start once a running one ends, not the last. (Failed
    before: the queue was first come, first served, and it ran after the four waiting ones.)"""
    attacker = Raw(app.url, headers={"X-Forwarded-For": "10.0.3.66"})
    victim = Raw(app.url, headers={"X-Forwarded-For": "10.0.3.7"})
    photos = noise_photos(tmp_path, 7, seed=33)
    stored, mine = [attacker.upload(p) for p in photos[:6]], victim.upload(photos[6])
    ended: dict[str, float] = {}

    def wait(raw: Raw, session: str, event: str) -> None:
        raw.results({event}, session, timeout=300)
        ended[session] = time.monotonic()

    readers = []
    for i, path in enumerate(stored):
        data = _defaults(attacker, "analyze")
        data[0] = file_payload(path)
        status, event = attacker.join("analyze", data, session=f"turn{i}")
        assert status == 200, event
        readers.append(threading.Thread(target=wait, args=(attacker, f"turn{i}", event)))
        readers[-1].start()
    status, event = victim.join("predict", [file_payload(mine), None, 3], session="victim")
    assert status == 200, event
    readers.append(threading.Thread(target=wait, args=(victim, "victim", event)))
    readers[-1].start()
    for t in readers:
        t.join(300)
    assert len(ended) == 7, ended
    first = sum(t < ended["victim"] for s, t in ended.items() if s != "victim")
    assert first <= 2, f"{first} of the other address's analyses ended before this client's prediction"
