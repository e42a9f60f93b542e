"""Sessions only through the door (issue 50, breaks 1 and 2) and round 4's smaller findings,
against the running ``--exposed --mcp`` app (tests/conftest.py's ``exposed_app``; each attack
from a loopback address of its own).

Before: ``POST /gradio_api/run/<name>`` made a session's state for any new session hash before
it answered 404 (Gradio resolves the function through the session), unseen by the door's 60 new
sessions per address; Gradio keeps 1,000 sessions and forgot the least recently used, so 1,100
such POSTs from one address made it forget a visitor's analysed picture ("Upload an image
first."). A session hash was any string up to the 1 MiB body limit, kept as the session's key
(1,100 of 900 KB kept 0.8 GB). Now a hash is 1 to 128 letters, digits, ``-`` or ``_`` (400),
a new session of those routes counts in its address's 60 first (429 past them) and is forgotten
when the route refuses it, and Gradio forgets the sessions that hold nothing first. Also:
``/monitoring`` and the reload watcher closed when exposed, and hostile ``/attention``,
``/compare`` and ``/train`` values answered in words. The full-size attacks are
``benchmarks/bench_attacks.py --only hashes hugehash small50``.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from attacks import Raw, file_payload, run_posts

pytestmark = pytest.mark.slow  # an app in a subprocess


@pytest.fixture(scope="module")
def cup(tmp_path_factory, package_photos):
    """A small photo (the app takes pictures of 1 MB at most)."""
    from PIL import Image

    path = tmp_path_factory.mktemp("cup") / "cup.png"
    Image.open(package_photos["coffee"]).convert("RGB").resize((200, 150)).save(path)
    return path


@pytest.fixture(scope="module")
def victim(exposed_app, cup) -> Raw:
    """A visitor whose session has analysed a photo (its /compare and /attention answer)."""
    raw = Raw(exposed_app.url, source="127.0.50.1")
    comps = {c["id"]: c for c in raw.config()["components"]}
    data = [(comps[c].get("props") or {}).get("value") if comps[c].get("type") != "state" else None
            for c in raw.events()["analyze"]["inputs"]]
    data[0] = file_payload(raw.upload(cup))
    out = raw.call("analyze", data, timeout=300)
    assert out.success, out.message
    return raw


def test_one_address_cannot_make_gradio_forget_a_visitors_session(exposed_app, victim: Raw) -> None:
    """1,100 POSTs to /gradio_api/run/predict, each with a fresh session hash, from one address:
    before, 1,100 x 404 and the visitor's session forgotten; now 60 new sessions (forgotten at
    once: the route refused them) and 1,040 x 429, and the visitor's /compare still answers."""
    codes = run_posts(exposed_app.url, 1100, "127.0.50.2")
    out = victim.call("compare", [5, None], timeout=300)
    print(f"1,100 fresh session hashes from one address: {codes}; the visitor's /compare: "
          f"{'answered' if out.success else out.message}")
    assert out.success, out.message
    assert codes.get(429, 0) >= 1000, codes


def test_session_hashes_are_bounded(exposed_app) -> None:
    """A session hash of 900 KB (or 129 characters, or not a hash) is refused with 400 on every
    route that takes one, before Gradio keeps it; before, /run answered 404 after making a
    session keyed by it, /queue/join queued it. Gradio's own hashes (11 and 36 characters) pass."""
    url = exposed_app.url
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.50.3"), timeout=60) as http:
        for bad in ("h" * 900_000, "h" * 129, "a b", "../x", 7):
            for route in ("gradio_api/run/predict", "gradio_api/queue/join", "gradio_api/call/predict"):
                r = http.post(url + route, json={"data": [], "fn_index": 0, "session_hash": bad})
                assert r.status_code == 400 and "session hash" in r.json()["detail"], (route, str(bad)[:20], r.text[:100])
        for bad in ("h" * 129, "a%20b"):
            assert http.get(url + f"gradio_api/queue/data?session_hash={bad}").status_code == 400
            assert http.get(url + f"gradio_api/heartbeat/{bad}").status_code == 400
        for good in (uuid.uuid4().hex[:11], str(uuid.uuid4())):
            r = http.post(url + "gradio_api/run/predict", json={"data": [], "fn_index": None, "session_hash": good})
            assert r.status_code == 404, r.text[:100]  # (Gradio's own answer: /predict is a queued event)


def test_the_exposed_app_closes_monitoring_and_the_reload_watcher(exposed_app) -> None:
    """/monitoring/summary answered every visitor with every client's per-event counts, and
    /gradio_api/dev/reload is a stream that never ends: 404 on the exposed app."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.50.4"), timeout=10) as http:
        for route in ("monitoring", "monitoring/summary", "monitoring/x", "gradio_api/dev/reload"):
            with http.stream("GET", exposed_app.url + route) as r:
                assert r.status_code == 404, (route, r.status_code)


def test_hostile_values_get_words(victim: Raw, cup) -> None:
    """/attention with a colormap or an opacity that is no such thing, /compare with a k that is
    text, /train with a list of three zips: before, "Something went wrong" or an empty message;
    now one line that names what is wrong."""
    stored = victim.upload(cup)
    base = [12, "all", "[class] token", 0, "inferno", 0.6, True, None]
    cases = {"colormap": (("attention", [*base[:4], -1, *base[5:]]), "Colormap"),
             "opacity": (("attention", [*base[:5], "abc", *base[6:]]), "Overlay opacity"),
             "k": (("compare", ["abc", None]), "must be a number"),
             "zips": (("train", ["zip", 1, [file_payload(stored)] * 3, None]), "zip takes one file")}
    for what, ((name, data), words) in cases.items():
        out = victim.call(name, data, timeout=120)
        assert not out.success and words in out.message and "Something went wrong" not in out.message, \
            (what, out.message)
