"""The Train tab and ``/train`` (issue 43): a small ViT trained in the app, for seconds here.

- In this process (vit_demo.app.trainer): the refusals in one plain line; one training at a time
  on the whole server; a cancelled run leaves nothing behind (no folder, no process, nothing on
  the menu); a finished one is on its session's menu only, loads, its files in the exports, and
  all of it goes when the session ends.
- Through gradio_client against an ``--exposed`` app with ``--train-minutes-max 0.15`` behind a
  trusted proxy (each X-Forwarded-For its own address): /train on a zip of class folders returns
  ``train --json``'s summary and the snapshot files; a second /train from another address is
  refused while the first runs, and a third address's /predict stays fast meanwhile; the default
  exposed app refuses /train.
- In Chromium (marked ``browser``): the tab trains, shows the live curves and the snapshots, the
  model joins the menu and the Attention tab shows its maps; screenshots at 1440x900 and 390x844.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import statistics
import time
import zipfile
from pathlib import Path

import numpy as np
import psutil
import pytest
from app_server import running_app
from conftest import noise_photos
from PIL import Image
from safetensors import safe_open

from vit_demo.app.context import AppConfig, Context
from vit_demo.app.jobs import Job
from vit_demo.app.registry import ModelError, ModelRegistry
from vit_demo.app.server.guard import InputError
from vit_demo.app.server.limits import Limits
from vit_demo.app.server.workspace import workspace
from vit_demo.app.trainer import (
    TRAIN_BUSY,
    TRAIN_OFF,
    Progress,
    check_request,
    forget,
    forget_old,
    train_steps,
)
from vit_demo.progress import Cancelled
from vit_demo.train.builtin import make_digits
from vit_demo.train.snapshots import Snapshot

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

TRAIN_MAX = 0.15  # minutes: the test app's --train-minutes-max (a run of seconds)
SUMMARY_KEYS = {"classes", "train_images", "val_images", "skipped_files", "epochs", "val_accuracy", "best_val_accuracy",
                "best_epoch", "seconds", "out", "device", "processes", "budget_seconds", "baseline_accuracy", "fit",
                "fit_note"}  # what `train --json` prints


def context(exposed: bool = False, train_minutes_max: float | None = None) -> Context:
    reg = ModelRegistry(hub_names=())
    lim = Limits.for_exposure(exposed, train_minutes_max=train_minutes_max)
    return Context(AppConfig(limits=lim), reg, reg.default_key())


def test_refusals_in_one_plain_line() -> None:
    assert context().cfg.limits.train_minutes == 10 and context(True).cfg.limits.train_minutes == 0
    cases = [(context(True), "digits", 1, None, TRAIN_OFF),  # exposed: off unless the host turns it on
             (context(True, 0.5), "digits", 1, None, "minutes: from 0.05 to 0.5 on this app"),
             (context(), "digits", 11, None, "minutes: from 0.05 to 10 on this app"),
             (context(), "digits", "soon", None, "minutes: give a number"),
             (context(), "cifar10", 1, None, "dataset: choose one of digits, shapes, zip"),
             (context(), "zip", 1, None, "needs a zip of class folders"),
             (context(), "digits", 1, "/tmp/x.zip", "give dataset 'zip'")]
    for ctx, dataset, minutes, zip_file, words in cases:
        with pytest.raises(InputError) as e:
            check_request(ctx, dataset, minutes, zip_file)
        assert words in str(e.value) and "\n" not in str(e.value)
    assert check_request(context(True, 0.5), "shapes", "0.25", None) == ("shapes", 0.25)


def test_train_minutes_flag() -> None:
    """app.py --train-minutes-max: 10 minutes on this computer, off when exposed unless given, 0 turns it off."""
    import app

    def minutes(*argv):
        return app.limits(app.parse_args(list(argv))).train_minutes

    assert (minutes(), minutes("--exposed"), minutes("--host", "0.0.0.0")) == (10, 0, 0)
    assert minutes("--exposed", "--train-minutes-max", "3") == 3 and minutes("--train-minutes-max", "0") == 0
    with pytest.raises(SystemExit):
        minutes("--train-minutes-max", "-1")


def test_progress_from_the_child_messages() -> None:
    """What the page shows of a run: the stage while it prepares (never "starting" over empty panels),
    the findings under the bar; then the epoch under way of an "about" plan (a time budget may still
    change it) with ONE time left, the child's own, counted down between its messages and shown in the
    bar only; the epochs' steps move the bar; a plan that is fixed says no "about"."""
    prog = Progress("digits", 1.0)
    prog.started -= 20  # the process took 20 s to start
    assert prog.text() == "preparing: starting the training process" and prog.status() == ""
    prog.take("stage", {"text": "decoding the pictures 480/1797", "share": 0.27})
    assert prog.text() == "preparing: decoding the pictures 480/1797" and prog.share <= 0.1
    prog.take("log", "scratch on digits: 1438 training and 359 validation pictures\nmore")
    assert prog.status() == "*scratch on digits: 1438 training and 359 validation pictures*"
    prog.take("plan", {"epochs": 66, "eta_s": 100.0, "budgeted": True})
    prog.take("stage", {"text": "the untrained model's snapshot", "share": 0.0})
    assert prog.text() == "preparing: the untrained model's snapshot · about 66 epochs planned, about 1:40"
    flat = np.full((4, 4, 4), 1 / 16, dtype=np.float32)
    snap = Snapshot(0, 10, {"epoch": 0}, flat, flat, np.full(4, 4.0), 4.0, [0] * 4, [0.1] * 4)
    pics = [np.zeros((8, 8, 3), np.uint8)] * 4
    prog.take("frame", {"path": "/x/epoch_0000.png", "snapshot": snap, "pictures": pics, "names": ["a", "b", "c", "d"]})
    prog.take("stage", {"text": "epoch 1: step 11 of 22", "share": 0.5})
    assert prog.text() == "epoch 1 of about 66 · about 1:40 left"
    assert prog.share == pytest.approx(0.1 + 0.85 * 0.5 / 66)
    prog.take("epoch", {"row": {"epoch": 1, "train_loss": 1.0, "val_loss": 0.9, "val_accuracy": 0.5}, "epochs": 72,
                        "eta_s": 71 * 1.5, "budgeted": True})  # the first epoch re-planned the run
    assert prog.text() == "epoch 2 of about 72 · about 1:46 left"
    prog.eta_at -= 10  # ten seconds later, no word from the child: the same estimate, counted down
    assert prog.text() == "epoch 2 of about 72 · about 1:36 left"
    assert prog.status() == "after epoch 1: validation accuracy **50.0%** · train loss 1.000"
    assert "1:36" not in prog.status() and "72" not in prog.status()  # one ETA, one plan: the bar's
    assert prog.frames == [("/x/epoch_0000.png", "before training")] and prog.strip().width > 2 * 96
    fixed = Progress("digits", 1.0)
    fixed.take("epoch", {"row": {"epoch": 1, "train_loss": 1.0, "val_loss": 0.9, "val_accuracy": 0.5}, "epochs": 10,
                         "eta_s": 9.0, "budgeted": False})
    assert fixed.text() == "epoch 2 of 10 · about 0:09 left"
    prog.take("epoch", {"row": {"epoch": 72, "train_loss": 0.5, "val_loss": 0.4, "val_accuracy": 0.9}, "epochs": 72,
                        "eta_s": 0.0, "budgeted": True})
    prog.take("stage", {"text": "finishing: logistic regression on the pixels (the baseline)", "share": 0.0})
    assert prog.finishing and prog.share == 0.97
    assert prog.text() == "finishing: logistic regression on the pixels (the baseline)"


def progress_of(ctx: Context, dataset: str, minutes: float, lines: list[str], bars: list[str] | None = None):
    """train_steps as a long action's work: its progress as page updates (what Job keeps); the
    status lines the page would show go to ``lines``, the bar's words to ``bars``."""
    def work():
        steps = train_steps(ctx, dataset, minutes)
        while True:
            try:
                p = next(steps)
            except StopIteration as stop:
                return stop.value  # the run (Job.result)
            lines.append(p.status())
            if bars is not None:
                bars.append(p.text())
            yield {"epochs": len(p.history), "frames": len(p.frames)}
    return Job(work)


def trainings() -> list[psutil.Process]:
    """This process's training children: forked by the fork server (vit_demo.train.live) or spawned;
    not the fork server itself, nor multiprocessing's resource tracker."""
    found = []
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(c.cmdline())
            forked = "forkserver" in cmd and "forkserver" in " ".join(c.parent().cmdline())
            if c.is_running() and c.status() != "zombie" and ("spawn_main" in cmd or forked):
                found.append(c)
    return found


@pytest.fixture
def one_thread():
    """The app's training process takes the app's threads per model run: one on a 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow  # trains
def test_one_at_a_time_cancel_leaves_nothing_and_a_run_goes_with_its_session(one_thread) -> None:
    ctx = context()
    exports = workspace().exports
    before = set(exports.iterdir())
    lines: list[str] = []
    job = progress_of(ctx, "digits", 2, lines)
    t0 = time.monotonic()
    job.thread.start()
    deadline = time.monotonic() + 240
    while not (job.live.get("frames") or job.done.is_set()) and time.monotonic() < deadline:
        time.sleep(0.2)  # until the untrained model's snapshot is on disk
    assert job.live.get("frames") and not job.done.is_set(), job.error
    print(f"the first snapshot after {time.monotonic() - t0:.1f} s")
    run_dirs = set(exports.iterdir()) - before
    assert len(run_dirs) == 1 and any(next(iter(run_dirs)).rglob("epoch_0000.png"))
    with pytest.raises(InputError, match="one training at a time"):
        next(train_steps(context(), "shapes", 1))  # another session, the same server
    assert TRAIN_BUSY.startswith("A model is being trained")
    job.stop.set()  # Cancel
    assert job.done.wait(30) and isinstance(job.error, Cancelled)
    assert set(exports.iterdir()) == before  # the run's folder went, frames and all
    assert not trainings()  # the training process too
    assert not [k for k in ctx.reg._specs if k.startswith("trained:")]  # nothing joined the menu

    t0, bars = time.monotonic(), []
    job = progress_of(ctx, "digits", 0.05, lines, bars)  # the lock is free again: a 3-s run to its end
    job.run()
    assert job.error is None, job.error
    run = job.result
    print(f"a 3-s run took {time.monotonic() - t0:.1f} s; the bar said: {bars}")
    # the bar says what the child does as it prepares, then the epoch of the plan and one time left
    assert any(b.startswith("preparing: decoding the pictures ") for b in bars), bars
    assert any(re.fullmatch(r"epoch \d+ of (about )?\d+( · about \d+:\d\d left)?", b) for b in bars), bars
    assert all("ETA" not in line and " left" not in line for line in lines), lines  # the ETA: the bar's alone
    folder = Path(run.folder)
    assert folder.parent == exports and all(Path(f).is_relative_to(folder) for f in run.files)  # the exports' budget
    assert set(run.summary) >= SUMMARY_KEYS and run.summary["out"] == "digits-vit.safetensors"
    assert run.summary["snapshots"]["epochs"][0] == 0 and len(run.frames) >= 2
    with safe_open(run.checkpoint, "pt") as f:
        meta = json.dumps(f.metadata())
    assert "trained here (scratch) on digits" in meta
    for said in (meta, json.dumps(run.summary), *lines):  # no server folder in what is shown or given
        assert str(workspace().root) not in said and "/tmp" not in said, said[:300]
    assert any("scratch on digits: 1438 training" in line for line in lines), lines[:3]
    assert not list(folder.rglob("*.train-state"))
    assert run.key in dict((k, v) for v, k in ctx.reg.choices([run.key])) and \
        run.key not in [k for _, k in ctx.reg.choices()]  # on its session's menu only
    lm = ctx.reg.get(run.key)
    assert lm.labels[:2] == ("digit0", "digit1") and lm.model.cfg.grid_size == (4, 4)
    assert Image.open(run.pictures[0]).size == (64, 64)  # a validation picture big enough to open in the app
    forget(ctx.reg, [run])  # the session ended (the state's delete_callback)
    assert not folder.exists() and not ctx.reg.is_loaded(run.key)
    with pytest.raises(ModelError):
        ctx.reg.spec(run.key)
    assert forget_old(ctx.reg, keep_s=0) == 0  # already gone: nothing left for the sweeper


# ----------------------------------------------------------------------------- a running app


@pytest.fixture(scope="module")
def app(deit_tiny_path: Path):
    args = ["--weights", str(deit_tiny_path), "--exposed", "--trusted-proxy", "127.0.0.1",
            "--train-minutes-max", str(TRAIN_MAX)]
    with running_app(args) as a:
        yield a


def client(app, address: str) -> Client:
    return Client(app.url, verbose=False, headers={"X-Forwarded-For": address})


@pytest.fixture(scope="module")
def digits_zip(tmp_path_factory) -> Path:
    """Three digits (20 real scans each) as class folders inside a top folder, and a file that is no picture."""
    root = tmp_path_factory.mktemp("zip")
    make_digits(root / "d", per_class=20)
    out = root / "three-digits.zip"
    with zipfile.ZipFile(out, "w") as z:
        for cls in ("digit1", "digit4", "digit7"):
            for p in sorted((root / "d" / cls).glob("*.png")):
                z.write(p, f"scans/{cls}/{p.name}")
        z.writestr("scans/readme.txt", "not a picture")
    return out



def predict_times(c: Client, pics: list[Path]) -> list[float]:
    out = []
    for p in pics:
        t0 = time.perf_counter()
        c.predict(handle_file(str(p)), api_name="/predict")
        out.append(time.perf_counter() - t0)
    return out


@pytest.mark.slow  # trains
def test_train_api_one_at_a_time_and_predictions_stay_fast(app, digits_zip: Path, tmp_path: Path) -> None:
    other = client(app, "10.0.9.3")
    quiet = predict_times(other, noise_photos(tmp_path, 8, 1))  # the same machine, no training
    first = client(app, "10.0.9.1").submit(dataset="zip", minutes=0.1, zip=handle_file(str(digits_zip)), api_name="/train")
    deadline = time.monotonic() + 120
    while first.status().code.name not in ("PROCESSING", "FINISHED") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    with pytest.raises(AppError) as refused:
        client(app, "10.0.9.2").predict(dataset="digits", minutes=0.1, api_name="/train")
    assert str(refused.value).strip() == TRAIN_BUSY
    busy: list[float] = []
    while not first.done():
        busy += predict_times(other, noise_photos(tmp_path, 2, 10 + len(busy)))
    summary, files = first.result()
    p95, p95_quiet = statistics.quantiles(busy, n=20)[18], statistics.quantiles(quiet, n=20)[18]
    print(f"/predict while training: {len(busy)} calls, p50 {statistics.median(busy):.2f} s, p95 {p95:.2f} s "
          f"(quiet p95 {p95_quiet:.2f} s); the run: {summary['epochs']} epochs in {summary['seconds']} s")
    assert len(busy) >= 5 and p95 < max(2.0, 5 * p95_quiet), (busy, quiet)
    assert set(summary) >= SUMMARY_KEYS | {"model", "snapshots"}
    # the zip's class folders (inside its top folder) are the classes; the text file is no picture
    assert summary["classes"] == ["digit1", "digit4", "digit7"] and summary["train_images"] + summary["val_images"] == 60
    assert summary["out"] == "my-zip-vit.safetensors" and summary["budget_seconds"] == 6.0
    assert "vit_demo_" not in json.dumps(summary)  # no server folder
    names = [Path(f).name for f in files]
    frames = [n for n in names if n.startswith("epoch_")]
    assert names[:4] == ["my-zip-vit.safetensors", "my-zip-snapshots.gif", "my-zip-snapshots.mp4", "my-zip-filmstrip.png"]
    assert frames == summary["snapshots"]["frames"] and len(frames) >= 2
    with Image.open(files[1]) as gif:
        assert gif.n_frames == len(frames)
    assert Path(files[2]).stat().st_size > 1000


def test_train_api_refusals(app, exposed_app) -> None:
    c = client(app, "10.0.9.4")
    with pytest.raises(AppError, match=f"minutes: from 0.05 to {TRAIN_MAX:g} on this app"):
        c.predict(dataset="digits", minutes=1, api_name="/train")
    with pytest.raises(AppError) as off:  # an exposed app without --train-minutes-max
        Client(exposed_app.url, verbose=False).predict(dataset="digits", minutes=1, api_name="/train")
    assert str(off.value).strip() == TRAIN_OFF
    assert app.alive() and exposed_app.alive()


# ----------------------------------------------------------------------------- in Chromium


@pytest.mark.browser
def test_train_tab_in_chromium(browser, app) -> None:
    from test_app_browser import TIMEOUT_MS, shot

    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    try:
        pg.goto(app.url)
        pg.wait_for_selector("#upload")
        pg.get_by_role("tab", name="Train").click()
        pg.click("#train-run")
        pg.wait_for_selector("#train-run-cancel", state="visible")
        pg.wait_for_selector("#train-curves img", timeout=180_000)  # the curves, live: the run still going
        assert pg.locator("#train-run-cancel").is_visible()
        pg.wait_for_function("document.querySelectorAll('#train-snapshots .thumbnail-item').length >= 1",
                             timeout=180_000)
        shot(pg, "train_1440_running")
        pg.wait_for_function("document.querySelector('#train-result') && "
                             "document.querySelector('#train-result').innerText.includes('Best validation accuracy')",
                             timeout=300_000)
        assert pg.locator("#train-snapshots .thumbnail-item").count() >= 3  # before training, epochs 1 and 2
        assert pg.locator("#train-filmstrip img").count() == 1
        shot(pg, "train_1440_done")
        pg.locator("#model input").click()
        pg.get_by_role("option", name=re.compile("digits · trained here")).wait_for()  # on the model menu
        pg.keyboard.press("Escape")
        pg.click("#train-explain")
        pg.wait_for_selector("#tabs button[aria-selected='true']:has-text('Attention')")
        pg.wait_for_function("document.querySelector('#model-info').innerText.includes('digits-vit')", timeout=120_000)
        pg.wait_for_selector("#attention img", timeout=120_000)
        shot(pg, "train_1440_attention")
        pg.set_viewport_size({"width": 390, "height": 844})
        pg.get_by_role("tab", name="Train").click()
        shot(pg, "train_390_phone")
    finally:
        ctx.close()


def test_a_zip_picture_over_the_megapixel_limit_is_dropped_before_training(tmp_path: Path) -> None:
    """The training child reads its pictures whole, so a zip's picture over ``--max-megapixels`` goes before
    it starts (by its header, never decoded), with a note; the others stay. Before: it was trained on."""
    from vit_demo.app.trainer import run_folder

    ctx = context()
    side = int((ctx.cfg.limits.max_pixels + 1e6) ** 0.5)  # just over the limit
    huge = tmp_path / "huge.png"
    Image.new("L", (side, side)).save(huge)  # a few hundred KB on disk, one pixel value
    with zipfile.ZipFile(tmp_path / "set.zip", "w") as z:
        for cls in ("a", "b"):
            for i in range(3):
                buf = io.BytesIO()
                Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(buf, "PNG")
                z.writestr(f"{cls}/{i}.png", buf.getvalue())
        z.write(huge, "a/huge.png")
    with run_folder(ctx, "zip", [str(tmp_path / "set.zip")]) as (_out, pics, notes):
        kept = sorted(p.name for p in pics.rglob("*.png"))
        assert kept == ["0.png", "0.png", "1.png", "1.png", "2.png", "2.png"], kept
        limit = f"the limit is {ctx.cfg.limits.max_megapixels:.0f} MP"
        assert any(n.startswith("skipped a/huge.png: image is") and n.endswith(limit) for n in notes), notes
