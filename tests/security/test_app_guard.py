"""No server file is readable through the app (issue 21, points 1, 2 and 6), tested with raw HTTP
against the running app, in both modes: local (the default, 127.0.0.1) and ``--exposed``.

- Every file input of every event (public or private: an attacker calls them all by index)
  refuses every path that is not a file this server stored for an upload, with and without
  Gradio's ``meta``: a server image, a non-image, a missing file, a folder, a path that climbs
  out of the upload folder, a symlink planted in it, a URL. All with ONE message, so that the
  answer does not tell whether a file exists. Control: the uploaded file itself is served.
- Local mode answers only requests addressed to 127.0.0.1 / localhost (or ``--allowed-host``):
  a DNS-rebinding page (``Host: evil.example``) gets nothing, not even a checkpoint loaded by path.
- ``X-Forwarded-For`` is believed only from ``--trusted-proxy`` (tests/security/test_app_lanes.py has
  the trusted case).
One server per mode (tests/conftest.py's ``local_app`` and ``exposed_app``, shared with
tests/app/test_app_mcp.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attacks import Raw, file_payload, values_for

httpx = pytest.importorskip("httpx")


def _attempts(app, raw: Raw, server_image: Path, weights: Path, tmp: Path) -> dict[str, object]:
    """name -> the path an attacker puts in a file payload (or the bare value)."""
    stored = raw.upload(server_image, "mine.png")  # where this server keeps uploads
    folder = str(app.local(stored).parent)
    planted = os.path.join(folder, "planted.png")
    if not os.path.lexists(planted):
        os.symlink(server_image, planted)  # as if a symlink had got into the upload folder
    climb = os.path.join(folder, *[".."] * len(Path(folder).parts), str(server_image).lstrip("/"))
    return {
        "server image": str(server_image),
        "server checkpoint": str(weights),
        "not an image": "/etc/passwd",
        "missing file": str(tmp / "no-such-file.png"),
        "a folder": str(tmp),
        "climbs out of the upload folder": climb,
        "climbs out from the name the app gave": os.path.dirname(stored) + "/.." * 12 + str(server_image),
        "symlink in the upload folder": planted,
        "URL": raw.url + "config",
        "file URL": f"file://{server_image}",
    }


def _refusals(app, raw: Raw, server_image: Path, weights: Path, tmp: Path) -> tuple[dict, list[str]]:
    """Every file input of every event x every attempt, with and without meta."""
    messages: dict[str, str] = {}
    served: list[str] = []
    attempts = _attempts(app, raw, server_image, weights, tmp)
    for event, positions in raw.file_inputs().items():
        for pos in positions:
            for what, path in attempts.items():
                for meta in (True, False):
                    data = values_for(raw, event, pos, file_payload(str(path), meta))
                    out = raw.call(event, data, session=f"{event}-{pos}-{what}-{meta}".replace(" ", "_"), timeout=120)
                    case = f"{event}[{pos}] {what} {'with' if meta else 'without'} meta"
                    if out.joined and out.success:
                        served.append(f"{case}: served {str(out.output)[:120]}")
                    else:
                        messages[case] = out.message
            # a bare string instead of a file object
            out = raw.call(event, values_for(raw, event, pos, str(server_image)), session=f"{event}-{pos}-bare")
            case = f"{event}[{pos}] bare path"
            if out.joined and out.success:
                served.append(f"{case}: served {str(out.output)[:120]}")
            else:
                messages[case] = out.message
    return messages, served


@pytest.mark.parametrize("mode", ["local", "exposed"])
def test_no_server_file_through_any_file_input(mode, local_app, exposed_app, package_photos, deit_tiny_path, tmp_path):
    from vit_demo.app.server.guard import REFUSED

    app = local_app if mode == "local" else exposed_app
    raw = Raw(app.url)
    inputs = raw.file_inputs()
    assert {"predict", "analyze"} <= set(inputs), inputs
    if mode == "local":
        assert any(name.startswith("on_checkpoint") for name in inputs), inputs  # the checkpoint upload, too
    secret = tmp_path / "secret.png"  # an image on the server that is not one of the app's examples
    secret.write_bytes(package_photos["chelsea"].read_bytes())
    messages, served = _refusals(app, raw, secret, deit_tiny_path, tmp_path)
    assert not served, "\n".join(served[:10])
    distinct = set(messages.values())
    assert distinct == {REFUSED}, {m[:150]: [c for c, v in messages.items() if v == m][:3] for m in distinct}
    assert "/" not in REFUSED and len(REFUSED) < 120
    # control: the file this client uploaded is served
    stored = raw.upload(package_photos["coffee"])
    out = raw.call("predict", [file_payload(stored), None, 3])
    assert out.success and out.output["data"][0]["topk"][0]["label"] == "espresso", out
    out = raw.call("predict", [file_payload(stored, meta=False), None, 3])
    assert out.success and len(out.output["data"][0]["topk"]) == 3, out
    assert app.alive()


def test_file_guard_rules(tmp_path: Path) -> None:
    """The rule itself, on a folder of its own: a stored file or an example, followed through
    symlinks; anything else refused with the same message."""
    from vit_demo.app.server.guard import REFUSED, FileGuard, Refused

    uploads, outside = tmp_path / "uploads", tmp_path / "outside"
    (uploads / "abc").mkdir(parents=True)
    outside.mkdir()
    stored = uploads / "abc" / "photo.png"
    stored.write_bytes(b"x")
    secret = outside / "secret.png"
    secret.write_bytes(b"y")
    example = outside / "example.png"
    example.write_bytes(b"z")
    (uploads / "abc" / "link.png").symlink_to(secret)
    (uploads / "linkdir").symlink_to(outside, target_is_directory=True)
    (outside / "to-upload.png").symlink_to(stored)
    guard = FileGuard([uploads], [example])
    assert guard.check(str(stored)) == os.path.realpath(stored)
    assert guard.check(str(example)) == os.path.realpath(example)
    assert guard.check(str(outside / "to-upload.png")) == os.path.realpath(stored)  # a link INTO the uploads
    for bad in [secret, uploads / "abc" / "link.png", uploads / "linkdir" / "secret.png", uploads / "abc",
                uploads / "abc" / ".." / ".." / "outside" / "secret.png", uploads / "missing.png", "",
                "http://127.0.0.1/x.png", "file:///etc/passwd", str(stored) + "\0", None, 3, ["a"], "x" * 5000]:
        with pytest.raises(Refused) as err:
            guard.check(bad if not isinstance(bad, Path) else str(bad))
        assert str(err.value) == REFUSED


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example"])
def test_local_app_refuses_foreign_hosts(local_app, host: str, deit_tiny_path: Path) -> None:
    """DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 reaches the port
    with its own Host (and Origin). Nothing answers it: not the page, not the config, not the queue."""
    port = local_app.port
    h = {"Host": host.replace(":80", f":{port}") if ":" in host else f"{host}:{port}", "Origin": f"http://{host}"}
    raw = Raw(local_app.url, headers=h)
    for path in ("", "config", "gradio_api/info", "gradio_api/file=" + str(deit_tiny_path)):
        r = raw.http.get(raw.url + path)
        assert r.status_code in (400, 403), (path, r.status_code, r.text[:200])
        assert "deit_tiny" not in r.text
    honest = Raw(local_app.url)
    fn = honest.fn_index("on_checkpoint")
    status, answer = raw.join(fn, [str(deit_tiny_path), None, None, None])
    assert status in (400, 403), (status, answer)


def test_local_app_answers_its_own_names(local_app) -> None:
    port = local_app.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"demo.lan:{port}", f"[::1]:{port}"):
        r = httpx.get(local_app.url + "config", headers={"Host": host}, timeout=30)
        assert r.status_code == 200, (host, r.status_code)


def test_forwarded_for_is_not_believed_without_trusted_proxy(exposed_app, tmp_path) -> None:
    """Uploads from one address, each with its own X-Forwarded-For: without --trusted-proxy they
    all count against 127.0.0.1's upload budget (--upload-budget-mb 2), so it runs out (with the
    proxy trusted, each header is its own client: tests/security/test_app_lanes.py)."""
    import numpy as np
    from PIL import Image

    noise = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(noise)
    codes = []
    for i in range(16):  # 16 x 270 KB = 4.3 MB
        raw = Raw(exposed_app.url, headers={"X-Forwarded-For": f"10.1.{i}.7"})
        with open(noise, "rb") as f:
            codes.append(raw.http.post(raw.url + "gradio_api/upload", files=[("files", (f"n{i}.png", f))]).status_code)
    assert codes.count(200) < 16 and set(codes) == {200, 429}, codes
