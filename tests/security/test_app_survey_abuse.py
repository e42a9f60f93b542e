"""The Whole folder tab against an attacker (issue 35), with raw HTTP against the running
``--exposed`` app (one server for the module: ``--exports-mb 20 --job-seconds 60``):

- one picture named 12 times: the survey of identical maps killed the server; now it completes
  with a plain note, and the server goes on;
- zips of files of zeros named .png: the exports' disk budget held only for exports, not for
  unpacked pictures; now the app's folder stays within it, and a failed survey's files go at once;
- a zip of 400 entries over one 26 MiB stream: each was read in full, uncounted, past the job's
  time limit; now unpacking stops within the limit;
- the survey's report and JSON name no server path; FastAPI's schema route is closed;
- Gradio's exact release is named nowhere the app sends (the config, the page, its CSS and JS).
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from app_server import running_app
from attacks import Raw, crash_spawned_children, file_payload, values_for
from PIL import Image
from test_survey import overlapping_zip, zeros_zip

from vit_demo.app.server.workspace import folder_bytes

pytest.importorskip("httpx")

MiB = 1 << 20
BUDGET_MB = 20
JOB_S = 60  # (a first survey loads the model too: 40 s on a busy machine)


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--exports-mb", str(BUDGET_MB), "--job-seconds", str(JOB_S),
            "--max-upload-mb", "2", "--upload-budget-mb", "50", "--no-warm-up"]
    with running_app(args) as a:
        yield a


def survey_call(raw: Raw, stored: list[str], timeout: float = 300):
    data = values_for(raw, "on_run", 0, None)
    data[0] = [file_payload(p) for p in stored]
    return raw.call("on_run", data, timeout=timeout)


def survey_beside(raw: Raw, stored: list[str], watch):
    """:func:`survey_call` while ``watch(stop)`` runs in a thread; ``stop`` is set when the call returns."""
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    try:
        return survey_call(raw, stored)
    finally:
        stop.set()
        watcher.join(5)


def test_identical_pictures_survey_and_the_server_lives(app, tmp_path: Path) -> None:
    """The issue's one request: one 32 x 32 PNG named 12 times. Before: a segmentation fault
    in t-SNE after 8 s, the server dead."""
    pic = tmp_path / "dot.png"
    Image.new("RGB", (32, 32), (200, 30, 30)).save(pic)
    raw = Raw(app.url)
    stored = raw.upload(pic)
    out = survey_call(raw, [stored] * 12)
    assert app.alive(), app.log()
    assert out.success, out.message
    status = out.output["data"][1]
    assert "**12 pictures**" in status and "All 12 maps are the same" in status, status
    assert Raw(app.url).http.get(app.url + "config").status_code == 200


def test_unpacked_pictures_stay_within_the_disk_budget(app, tmp_path: Path) -> None:
    """Three zips of 20 files of 1.5 MiB of zeros named .png (30 KB each): 90 MiB unpacked before,
    kept after the survey failed. Now the folder stays within --exports-mb (plus one file) and the
    failed survey's files go at once."""
    raw = Raw(app.url)
    stored = [raw.upload(zeros_zip(tmp_path / f"z{i}.zip", 20, 3 * MiB // 2)) for i in range(3)]
    folder = app.folder()
    exports = folder / "gradio" / "exports"
    start, peak = folder_bytes(exports), [0]
    kept = set(exports.rglob("pictures"))  # earlier surveys' pictures (a click on a tile opens one)

    def watch(done: threading.Event) -> None:
        while not done.is_set():
            peak[0] = max(peak[0], folder_bytes(exports))
            time.sleep(0.05)

    out = survey_beside(raw, stored, watch)
    print(f"exports folder: {start / MiB:.1f} MiB before, peak {peak[0] / MiB:.1f} MiB, "
          f"{folder_bytes(exports) / MiB:.1f} MiB after; {out.message}")
    assert out.refused and app.alive()
    assert "would fill more disk" in out.message, out.message
    assert peak[0] <= BUDGET_MB * MiB + 3 * MiB // 2, peak[0] / MiB
    assert set(exports.rglob("pictures")) == kept and folder_bytes(exports) <= start  # the failed survey's files went


def test_unpacking_stops_at_the_job_time_limit(app, tmp_path: Path) -> None:
    """400 entries over one 26 MiB stream, named twice: before, 800 x 25 MiB decompressed and
    skipped uncounted (42 s of CPU at --job-seconds 15). Now stopped by the time limit or by the
    bytes one survey may read, whichever comes first."""
    archive = tmp_path / "overlap.zip"
    archive.write_bytes(overlapping_zip(400, 26 * MiB))
    raw = Raw(app.url)
    stored = raw.upload(archive)
    t0 = time.perf_counter()
    out = survey_call(raw, [stored, stored])
    took = time.perf_counter() - t0
    print(f"overlapping zip named twice: {took:.1f} s: {out.message}")
    assert out.refused and app.alive()
    assert (f"took longer than the {JOB_S} s" in out.message
            or "unpacks to more than this app reads" in out.message), out.message
    assert took < JOB_S + 12


def test_report_names_no_server_path(app, tmp_path: Path, package_photos: dict[str, Path]) -> None:
    raw = Raw(app.url)
    archive = tmp_path / "two.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(package_photos["coffee"], "set/espresso/coffee.png")
        z.write(package_photos["chelsea"], "set/Egyptian cat/chelsea.png")
    stored = raw.upload(archive)
    out = survey_call(raw, [stored])
    assert out.success, out.message
    report = app.local(out.output["data"][5]["path"])
    with zipfile.ZipFile(report) as z:
        texts = {n: z.read(n).decode() for n in z.namelist() if n.endswith((".html", ".json"))}
    assert set(texts) == {"report/report.html", "report/survey.json"}
    folder = str(app.folder())
    for name, text in texts.items():
        assert folder not in text and "/tmp" not in text and str(Path.home()) not in text, name
    result = json.loads(texts["report/survey.json"])
    assert sorted(im["path"] for im in result["images"]) == ["Egyptian cat/chelsea.png", "espresso/coffee.png"]
    assert result["folder"] == "the upload"
    tile = raw.call("on_tile", [None, None], event_data={"index": 0, "value": None})  # a click opens the picture
    assert tile.success, tile.message
    opened = next(v for v in tile.output["data"] if isinstance(v, dict) and "path" in v)
    assert Image.open(app.local(opened["path"])).size == Image.open(package_photos["chelsea"]).size


def test_a_crash_in_the_clustering_fails_one_survey_not_the_server(app, tmp_path: Path, package_photos) -> None:
    """scikit-learn's part of a survey runs in a child process: a native crash there (a SIGSEGV
    sent to that child as soon as it starts) fails that survey with a plain message, and the
    server and another client's /predict go on. Before: there was no child (the issue's t-SNE
    crash ended the server)."""

    pictures = []
    for i in range(4):
        pictures.append(tmp_path / f"n{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(pictures[-1])
    raw = Raw(app.url)
    stored = [raw.upload(p) for p in pictures]
    killed: list[int] = []
    out = survey_beside(raw, stored, lambda stop: crash_spawned_children(app.proc.pid, stop, killed))
    assert killed, "no child process ran the survey's clustering"
    assert out.refused and "crashed" in out.message and "SIGSEGV" in out.message, out.message
    assert app.alive(), app.log()
    other = Raw(app.url)
    answer = other.call("predict", [file_payload(other.upload(package_photos["coffee"])), None, 3])
    assert answer.success and answer.output["data"][0]["topk"][0]["label"] == "espresso", answer.message


def test_no_framework_schema_and_no_server_path_in_what_the_app_sends(app, tmp_path: Path, package_photos) -> None:
    """FastAPI's /openapi.json answered (37 KB of routes and models); /docs and /redoc did not; nor,
    on an exposed app, Gradio's own /gradio_api/openapi.json now (issue 47: it answered).
    Gradio names each file it serves by its path in the app's folder: /config and the page held
    the example photos' paths, the upload route's answer and every picture sent back named the
    folder. Now the files are ``files/...``, and they still work: an example shown, picked and
    predicted, an upload predicted, gradio_client. Gradio's deep-link route (a session's
    components written to a file for anyone naming the session) is closed."""
    raw = Raw(app.url)
    for route in ("openapi.json", "docs", "redoc", "docs/oauth2-redirect", "gradio_api/openapi.json"):
        r = raw.http.get(app.url + route)
        assert r.status_code == 404 and len(r.content) < 300, (route, r.status_code)
    assert raw.http.get(app.url + "gradio_api/info").status_code == 200  # the page's own API page stays
    pic = tmp_path / "p.png"
    Image.new("RGB", (32, 32), (10, 200, 30)).save(pic)
    stored = raw.upload(pic)
    config = raw.config()
    shown = next(c for c in config["components"] if (c.get("props") or {}).get("elem_id") == "examples")
    examples = [d.get("image", d) for d in shown["props"]["value"]]  # Gradio's gallery items: {image, caption}
    picked = raw.call("on_example", [], event_data={"index": 0, "value": None})
    assert picked.success, picked.message
    photo = picked.output["data"][0]
    predicted = raw.call("predict", [file_payload(photo["path"]), None, 3])
    mine = raw.call("predict", [file_payload(stored), None, 3])
    assert predicted.success and mine.success, (predicted.message, mine.message)
    deep = raw.http.get(app.url + "gradio_api/deep_link", params={"session_hash": raw.session})
    assert deep.status_code == 404, deep.text[:100]  # (it wrote the session's components to a file)
    sent = {"upload": stored, "config": json.dumps(config), "page": raw.http.get(app.url).text,
            "info": raw.http.get(app.url + "gradio_api/info").text, "picked": json.dumps(picked.output),
            "predicted": json.dumps(predicted.output), "missing file": raw.http.get(app.url + "gradio_api/file=files/x.png").text}
    for what, text in sent.items():
        assert app.folder().name not in text and "/tmp/" not in text, (what, text[:300])
    assert stored.startswith("files/") and photo["path"].startswith("files/")
    assert examples and all(e["path"].startswith("files/") for e in examples), examples[:2]
    served = raw.http.get(examples[0]["url"])
    assert served.status_code == 200
    assert Image.open(io.BytesIO(served.content)).size == Image.open(package_photos["chelsea"]).size
    assert raw.http.get(app.url + "gradio_api/file=" + photo["path"]).status_code == 200
    from gradio_client import Client, handle_file

    client = Client(app.url, verbose=False)
    answer = client.predict(handle_file(str(package_photos["coffee"])), None, 3, api_name="/predict")
    assert answer["topk"][0]["label"] == "espresso", answer


def test_gradio_release_not_in_what_the_app_sends(app, tmp_path: Path) -> None:
    """/config and the page named Gradio's exact release ("version": "6.31.0"), and the page's CSS
    and JS its class name (gradio-container-6-31-0, in 6 files); a Range request read any part of
    them. Now they say the major version only, and gradio_client still reads it as a version above
    4.29 (the cancel route; without one it takes the app for Gradio 2) and predicts."""
    import gradio
    from gradio_client import Client, handle_file
    from packaging.version import Version

    release, major = gradio.__version__, gradio.__version__.split(".")[0]
    dashed = release.replace(".", "-")
    raw = Raw(app.url)
    assert raw.config()["version"] == major
    page = raw.http.get(app.url).text
    assert release not in page and dashed not in page and f'"version":"{major}"' in page
    built = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    carrying = sorted(f.name for f in built.iterdir() if f.suffix in (".js", ".css") and dashed.encode() in f.read_bytes())
    assert len(carrying) >= 2  # the CSS and the JS that makes the class name
    for name in carrying:
        whole = raw.http.get(app.url + "assets/" + name)
        part = raw.http.get(app.url + "assets/" + name, headers={"Range": "bytes=0-4000"})
        assert whole.status_code == 200 and part.status_code == 200, (name, whole.status_code, part.status_code)
        assert dashed not in whole.text and whole.text == part.text, name
        assert f"container-{major}" in whole.text or f"version:`{major}`" in whole.text, name
    client = Client(app.url, verbose=False)
    assert client.app_version == Version(major) > Version("4.29.0")
    pic = tmp_path / "p.png"
    Image.new("RGB", (32, 32), (10, 200, 30)).save(pic)
    assert len(client.predict(handle_file(str(pic)), None, 3, api_name="/predict")["topk"]) == 3
