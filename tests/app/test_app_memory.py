"""Sessions cannot hold the app's memory (issue 21, points 3 and 4), against the running app:
eight sessions analyse one small PNG of 64 MP (``--max-megapixels 64``; the default cap is 40):
each keeps the picture reduced at load (at most 1536 x 1536), so the eight hold less than
600 MB more than before; once idle past ``--session-minutes`` (0.2 here) they forget it and
the memory returns. Without the reduction they held 8 x 192 MB for six hours."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from attacks import Raw, file_payload, rss_mb
from PIL import Image

pytest.importorskip("psutil")


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> Path:
    """8000 x 8000 px (64 MP) in a small file: a smooth gradient with a few shapes."""
    p = tmp_path_factory.mktemp("huge") / "huge.png"
    small = np.zeros((80, 80, 3), dtype=np.uint8)
    small[..., 0] = np.linspace(0, 255, 80)[None, :]
    small[..., 1] = np.linspace(255, 0, 80)[:, None]
    small[20:40, 30:60, 2] = 200
    Image.fromarray(small).resize((8000, 8000), Image.Resampling.NEAREST).save(p, optimize=False)
    assert p.stat().st_size < 5e6
    return p


def _analyze(raw: Raw, payload: dict, session: str, size: str = "") -> None:
    comps = {c["id"]: c for c in raw.config()["components"]}
    ids = raw.events()["analyze"]["inputs"]
    data = [(comps[c].get("props") or {}).get("value") if comps[c].get("type") != "state" else None for c in ids]
    data[0] = payload
    out = raw.call("analyze", data, session=session, timeout=600)
    assert out.success and size in str(out.output), (out.message, str(out.output)[:300])


def test_eight_sessions_with_a_64_mp_picture(deit_tiny_path: Path, huge_png: Path, package_photos) -> None:
    args = ["--weights", str(deit_tiny_path), "--max-megapixels", "64", "--session-minutes", "0.2"]
    with running_app(args) as app:
        raw = Raw(app.url)
        small = file_payload(raw.upload(package_photos["coffee"]))
        _analyze(raw, small, "warm")  # model loaded, every renderer warmed
        time.sleep(1)
        base = rss_mb(app.proc.pid)
        payload = file_payload(raw.upload(huge_png))
        errors: list[BaseException] = []

        def user(i: int) -> None:
            try:
                _analyze(raw, payload, f"user{i}", "your 8000×8000 px image")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
        assert not errors, errors
        time.sleep(1)
        held = rss_mb(app.proc.pid)
        time.sleep(0.2 * 60 + 8)  # idle past --session-minutes, and a sweep
        after = rss_mb(app.proc.pid)
        print(f"RSS: {base:.0f} MiB before, {held:.0f} MiB with 8 sessions holding a 64-MP picture "
              f"(+{held - base:.0f}), {after:.0f} MiB once they expired (+{after - base:.0f})")
        assert held - base < 600, (base, held)
        assert after - base < 150, (base, held, after)
        out = raw.call("on_deck", [None], session="user0")  # its picture is gone: it is asked for again
        assert out.refused and "Upload an image first" in out.message, out.message
