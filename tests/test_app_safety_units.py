"""The safety machinery of the app, piece by piece, without a server (issue 21): the temp
folders and their disk budget, the sessions' memory budget, the work in flight counted in the
analysis cache, pictures reduced at load, time limits, budgets scaled to the machine, the server's paths
masked in what an exposed app sends."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit_demo.app.server import workspace as ws
from vit_demo.app.session import SessionBudget, Upload
from vit_demo.budget import ByteLRU, default_budgets
from vit_demo.images import load_image
from vit_demo.progress import TimeUp, check, report, time_limit

MB = 1 << 20


def test_stale_folders_go_live_ones_stay(tmp_path: Path) -> None:
    """A folder whose app still runs (its lock held by another process) stays; one whose app is
    gone, and an old version's folder unused for six hours, are removed; a recent old one stays."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from vit_demo.app.server.workspace import Workspace
        w = Workspace({str(tmp_path)!r})
        print(w.root, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        live = Path(holder.stdout.readline().strip())
        dead = ws.Workspace(tmp_path)
        dead._lockfile.close()  # its app ended without cleaning up (killed)
        dead._lockfile = None
        old = tmp_path / "vit_demo_views_abc"
        old.mkdir()
        (old / "view.jpg").write_bytes(b"x")
        os.utime(old, (time.time() - 7 * 3600,) * 2)
        recent = tmp_path / "vit_demo_exports_xyz"
        recent.mkdir()
        other = tmp_path / "something_else"
        other.mkdir()
        removed = ws.clean_stale(tmp_path)
        assert set(removed) == {dead.root, old}
        assert live.is_dir() and recent.is_dir() and other.is_dir() and not dead.root.exists()
    finally:
        holder.kill()
        holder.wait()
    assert ws.clean_stale(tmp_path) == [live]  # its app is gone now


def test_a_starting_app_is_never_taken_for_a_dead_one(tmp_path: Path) -> None:
    """Another process makes 300 workspaces while this one sweeps for stale folders all along:
    none of them is removed. Before the lock file was locked under a temporary name, a sweep
    could find it between its creation and its lock (10 of 400 removed in a trial; the maker
    then failed with FileNotFoundError, as an app did in a CI run: its gradio/views/ gone)."""
    maker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from vit_demo.app.server.workspace import Workspace
        made = [Workspace({str(tmp_path)!r}) for _ in range(300)]
        print(len(made), flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    removed = []
    try:
        while maker.poll() is None and len(list(tmp_path.iterdir())) < 300:
            removed += ws.clean_stale(tmp_path)
        assert maker.stdout.readline().strip() == "300" and removed == []
    finally:
        maker.kill()
        maker.wait()


def test_trim_removes_the_oldest_first(tmp_path: Path) -> None:
    now = time.time()
    for i in range(6):
        d = ws.fresh(tmp_path)
        f = d / f"f{i}.png"
        f.write_bytes(b"x" * MB)
        os.utime(f, (now - 100 + i, now - 100 + i))
        os.utime(d, (now - 100, now - 100))
    freed = ws.trim(tmp_path, int(2.5 * MB))
    left = sorted(p.name for p in tmp_path.rglob("*.png"))
    assert freed == 4 * MB and left == ["f4.png", "f5.png"]
    assert len([d for d in tmp_path.iterdir()]) == 2  # the emptied folders went too
    ws.trim(tmp_path, 0)  # never the newest file, whatever the budget
    assert [p.name for p in tmp_path.rglob("*.png")] == ["f5.png"]


def _session_with(pixels: int):
    from vit_demo.app.session import Session

    side = int(pixels ** 0.5)
    return Session(model_key="m", upload=Upload(Image.new("RGB", (side, side)), "x.png", (side, side)))


def test_session_budget_least_recently_used_and_idle() -> None:
    budget = SessionBudget(max_bytes=12 * MB, idle_s=3600)
    sessions = [_session_with(1_000_000) for _ in range(5)]  # 4 MB each (Pillow: 4 bytes an RGB pixel)
    for s in sessions:
        budget.touch(s)
    kept = [s.upload is not None for s in sessions]
    assert kept == [False, False, True, True, True] and budget.nbytes <= 12 * MB
    assert sessions[0].forgotten and sessions[0].analysis is None
    budget.touch(sessions[2])  # used again: the least recent is now sessions[3]
    budget.touch(_session_with(1_000_000))
    assert sessions[2].upload is not None and sessions[3].upload is None
    idle = SessionBudget(max_bytes=100 * MB, idle_s=0.05)
    s = _session_with(10_000)
    idle.touch(s)
    time.sleep(0.1)
    idle.sweep()
    assert s.upload is None and len(idle) == 0


def test_work_in_flight_counts_in_the_budget() -> None:
    lru: ByteLRU[str, bytes] = ByteLRU(100, len)
    for k in "abcd":
        lru.put(k, b"x" * 20)
    with lru.reserve(50, protect=["a"]):  # 80 kept + 50 in flight > 100: the oldest others leave
        assert lru.keys() == ["a", "d"] and lru.nbytes + lru.reserved <= 100
        lru.put("e", b"x" * 20)  # a put during the reservation fits within it too
        assert lru.nbytes + lru.reserved <= 100
    assert lru.reserved == 0


def test_analysis_cache_makes_room_for_the_analysis_in_flight(deit_tiny, monkeypatch) -> None:
    """The budget holds while the next analysis is computed, not only once it is stored."""
    from vit_demo import analysis
    from vit_demo.analysis import AnalysisCache, analysis_nbytes, forward_working_set

    pics = [Image.fromarray(np.full((64, 64, 3), 40 * i, dtype=np.uint8)) for i in range(4)]
    one = analysis_nbytes(AnalysisCache(1 << 30).get(deit_tiny, pics[0]))
    assert one <= forward_working_set(deit_tiny) < 2 * one
    cache = AnalysisCache(max_bytes=3 * one + one // 2)  # three fit, but not three and one in flight
    for p in pics[:3]:
        cache.get(deit_tiny, p)
    assert len(cache) == 3
    during = []
    real = analysis.analyze
    monkeypatch.setattr(analysis, "analyze", lambda lm, img: (during.append(cache.nbytes), real(lm, img))[1])
    cache.get(deit_tiny, pics[3])
    assert during == [2 * one]  # room was made BEFORE the fourth was computed
    assert len(cache) == 3 and cache.nbytes <= cache.max_bytes


def test_pictures_are_reduced_at_load(tmp_path: Path) -> None:
    """At most ``reduce_to`` pixels, the shape kept, the original size remembered; a JPEG is
    decoded at a reduced scale; a dark 16-bit picture stays dark; EXIF turns it upright."""
    big = tmp_path / "big.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (3000, 4000, 3), dtype=np.uint8)).save(big, quality=80)
    img = load_image(big, reduce_to=1536 * 1536)
    assert img.width * img.height <= 1536 * 1536 and abs(img.width / img.height - 4 / 3) < 0.01
    assert img.info["original_size"] == (4000, 3000)
    dark = tmp_path / "dark16.png"
    Image.fromarray(np.full((2000, 3000), 200, dtype=np.uint16)).save(dark)  # 200/65535: nearly black
    assert np.asarray(load_image(dark, reduce_to=100_000)).max() <= 1
    turned = tmp_path / "turned.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    Image.new("RGB", (3000, 1000), (200, 10, 10)).save(turned, exif=exif)
    up = load_image(turned, reduce_to=300_000)
    assert up.height > up.width and up.info["original_size"] == (1000, 3000)
    assert load_image(big).size == (4000, 3000)  # without reduce_to, as before (the command line)


def test_time_limit() -> None:
    with time_limit(0.05, "A test job"):
        check()
        report(0.5)
        time.sleep(0.1)
        with pytest.raises(TimeUp, match="A test job took longer than the 0 s"):
            check()
        with pytest.raises(TimeUp):
            report(0.9)
        with time_limit(100):  # an inner limit never extends an outer one
            with pytest.raises(TimeUp):
                check()
    check()  # no limit outside


def test_slow_jobs_keep_their_signature_for_gradio() -> None:
    from vit_demo.app.server.lanes import time_limited

    def handler(a, b=2, progress=None):
        return a + b

    wrapped = time_limited(handler, 10)
    assert inspect.signature(wrapped) == inspect.signature(handler) and wrapped(1) == 3


def test_default_budgets_scale_with_the_machine() -> None:
    big, laptop, tiny = default_budgets(64 << 30), default_budgets(8 << 30), default_budgets(2 << 30)
    assert big == {"cache_mb": 1024, "models_mb": 1536, "sessions_mb": 256}
    assert laptop == {"cache_mb": 512, "models_mb": 819.2, "sessions_mb": 128}
    assert tiny["cache_mb"] == 256 and tiny["models_mb"] == 512 and tiny["sessions_mb"] == 64
    assert default_budgets() and all(v > 0 for v in default_budgets().values())


def test_model_keys_name_files_never_paths(tmp_path: Path, deit_tiny_path: Path) -> None:
    """The menu's keys (what /config, the API docs and /predict's ``model`` carry): the file's name,
    cut and made unique when long or shared, never a folder; short enough for the door's limit."""
    import shutil

    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.server.guard import MAX_VALUE

    long = "deit_tiny_patch16_224_" + "x" * 60 + ".safetensors"
    files = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for name in (long, "deit_tiny_patch16_224.safetensors"):
            files.append(tmp_path / d / name)
            shutil.copy(deit_tiny_path, files[-1])
    reg = ModelRegistry(files, "deit_tiny_patch16_224", hub_names=("deit_small_patch16_224",))
    keys = [k for _, k in reg.choices()]
    assert len(set(keys)) == len(keys) and all(len(k) <= MAX_VALUE and str(tmp_path) not in k and "/" not in k
                                                 for k in keys), keys
    assert "file:deit_tiny_patch16_224.safetensors" in keys
    spec = reg.add_checkpoint(str(files[0]), uploaded=True)  # on the menu already: the same entry
    assert spec.key in keys


def test_gradio_sessions_keep_no_copy_of_the_page(monkeypatch) -> None:
    """Gradio kept a copy of every component's configuration per session (290 KB for the app's
    page, in no budget; only its deep-link route reads it, and the app closes that route): now
    a session keeps its state values only."""
    import tracemalloc

    import gradio as gr
    import gradio.state_holder as sh

    from vit_demo.app.server.lean import lean_sessions

    gradios = sh.SessionState
    while getattr(gradios, "lean", False):  # an app built earlier in this process made sessions lean already
        gradios = gradios.__mro__[1]
    monkeypatch.setattr(sh, "SessionState", gradios)  # Gradio's own for the first count; as it was after the test
    with gr.Blocks(analytics_enabled=False) as demo:
        for i in range(20):
            gr.Textbox("a value " * 40, label=f"box {i}")
        state = gr.State(None)

    def per_session(tag: str) -> tuple[float, list]:
        holder = sh.StateHolder()
        holder.set_blocks(demo)
        tracemalloc.start()
        sessions = [holder[f"{tag}{i}"] for i in range(10)]
        size = tracemalloc.get_traced_memory()[0] / 10
        tracemalloc.stop()
        return size, sessions

    full, _ = per_session("a")
    assert lean_sessions()
    lean, sessions = per_session("b")
    s = sessions[0]
    s[state._id] = {"picture": 1}
    assert s[state._id] == {"picture": 1} and not dict(s.config_values) and not list(s.components)
    print(f"per session: {full / 1024:.0f} KiB -> {lean / 1024:.1f} KiB")
    assert lean < full / 4, (full, lean)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_free_heap_goes_back_to_the_system() -> None:
    """Memory freed in holes of the C heap stayed resident (60-250 MB after 200 sessions); the
    app's sweeper now hands it back once a minute."""
    import psutil

    from vit_demo.budget import release_free_heap

    me = psutil.Process()
    blocks = [b"x" * (64 << 10) for _ in range(3200)]  # 200 MiB of 64 KiB blocks: under the mmap threshold
    kept = blocks[::32]  # a few stay in use, so the heap cannot shrink from its top
    del blocks
    held = me.memory_info().rss
    assert release_free_heap()
    freed = (held - me.memory_info().rss) / 2**20
    print(f"malloc_trim gave back {freed:.0f} MiB")
    assert freed > 100 and len(kept) == 100


HEAPS_PROBE = """
import ctypes, os, sys, threading
sys.path.insert(0, {tests!r})
from attacks import thread_heaps
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
ready, done = threading.Barrier(9), threading.Event()
def work():
    libc.malloc(4096)  # this thread's first block: glibc picks (or makes) its heap
    ready.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
ready.wait()
print(thread_heaps(os.getpid())[0])
done.set()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heaps, /proc")
def test_thread_heaps_are_counted() -> None:
    """benchmarks/bench_attacks.py counts glibc's heaps of the threads (docs/security.md: 10 of
    them, 275 MiB, after 200 sessions): 8 threads that allocate get 8 heaps of their own, and
    none beyond one more when glibc may make only 2 (MALLOC_ARENA_MAX)."""
    code = HEAPS_PROBE.format(tests=str(Path(__file__).resolve().parent))
    counts = []
    for cap in ({}, {"MALLOC_ARENA_MAX": "2"}):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **cap})
        assert out.returncode == 0, out.stderr[-2000:]
        counts.append(int(out.stdout.split()[-1]))
    assert counts[0] >= min(8, 8 * (os.cpu_count() or 1) - 1) and counts[1] == 1, counts


def test_a_tiff_of_many_pages_is_not_walked_through(tmp_path: Path) -> None:
    """Pillow counts a TIFF's pages by walking them all, in time that grows with the square of
    their number, and the app counted them twice per picture (the note on animated pictures,
    then the first frame): a 5 MB file of 50,000 pages took 21 s of CPU, a 25 MB upload minutes,
    outside any job's time limit. Now the first frame is found without a count, and the note
    counts up to 1,000 pages."""
    import hostile

    from vit_demo.app.session import open_image

    p = tmp_path / "pages.tif"
    p.write_bytes(hostile.tiff_pages(20_000))
    up = open_image(p)
    assert up.size == (16, 16) and np.asarray(up.picture)[0, :3, 0].tolist() == [0, 1, 2]
    assert up.notes == ["pages.tif is an animated TIFF with 1,000 or more frames: using the first frame"], up.notes
    few = tmp_path / "few.tif"
    few.write_bytes(hostile.tiff_pages(3))
    assert open_image(few).notes == ["few.tif is an animated TIFF with 3 frames: using the first frame"]


def test_upload_budget_keeps_a_share_for_every_new_client() -> None:
    """Issue 47: the all-clients total let a few clients lock every other out (50 addresses' header-only
    uploads filled it, and every new visitor got 429 for 10 minutes). Now a client under its reserve
    (one file of the largest size) is never refused because of the total; past it, the total counts."""
    from vit_demo.app.server.middleware import UploadBudget

    b = UploadBudget(per_client=4, total=8, reserve=2)
    assert b.take("a", 4) and b.take("b", 4)  # the total is full
    assert not b.take("a", 1)  # a's own share is used
    assert b.take("c", 2) and b.take("d", 1) and b.take("d", 1)  # new clients keep their reserve...
    assert not b.take("c", 1) and not b.take("d", 1)  # ... and no more while the total is full
    assert b.used("c") == 2 and b.left("c") == 2


def test_ipv6_clients_are_counted_by_their_64() -> None:
    """Issue 47: one IPv6 /64 holds 2^64 addresses: every per-client limit counts it as one client."""
    from vit_demo.app.server.clients import client_group

    assert client_group("2001:db8:1:2::5") == client_group("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert client_group("2001:db8:1:3::5") != client_group("2001:db8:1:2::5")
    assert client_group("::ffff:10.0.0.7") == "10.0.0.7" and client_group("10.0.0.7") == "10.0.0.7"
    assert client_group("?") == "?" and client_group(None) is None


def test_folder_jobs_read_pictures_as_an_upload(tmp_path: Path) -> None:
    """Issue 47: the survey and the atlas read each picture whole, past --max-megapixels (a 64-MP
    float TIFF took 1.75 GB). Now their loader is the upload's: the pixel limit from the header,
    the reduction to 1536 x 1536 at load."""
    from vit_demo.app.server.limits import Limits
    from vit_demo.app.uploads import picture_loader
    from vit_demo.images import ImageError

    load = picture_loader(Limits(exposed=True, max_megapixels=10))
    big = tmp_path / "big.png"
    Image.new("RGB", (3000, 2000), (10, 200, 30)).save(big)
    assert load(str(big)).width * load(str(big)).height <= 1536 * 1536
    huge = tmp_path / "huge.tif"
    Image.new("F", (4000, 3000), 0.5).save(huge, compression="tiff_adobe_deflate")
    with pytest.raises(ImageError, match="the limit is 10 MP"):
        load(str(huge))


def test_gradio_forgets_sessions_that_hold_nothing_first() -> None:
    """Past its capacity Gradio forgot the least recently used session, whatever it held: new
    sessions that hold nothing (a request refused after Gradio made its state) pushed out a
    visitor's analysed picture. Now those holding no value go first."""
    import gradio as gr
    import gradio.state_holder as sh

    from vit_demo.app.server.lean import holds_values, lean_sessions

    assert lean_sessions()
    with gr.Blocks(analytics_enabled=False) as demo:
        state = gr.State(None)
        runs = gr.State([])
    holder = sh.StateHolder()
    holder.set_blocks(demo)
    holder.capacity = 5
    holder["visitor"][state._id] = {"picture": 1}
    holder["menu only"][state._id] = None  # (a state read, nothing kept)
    holder["no runs"][runs._id] = []
    for i in range(50):
        holder[f"fresh{i}"]
    assert "visitor" in holder and len(holder.session_data) == 5
    assert holds_values(holder.session_data["visitor"]) and not holds_values(holder.session_data["fresh49"])
    for i in range(5):  # all of them hold values: the least recently used goes, as before
        holder[f"full{i}"][state._id] = i + 1
    assert "visitor" not in holder and "full0" in holder


def test_training_reads_a_float_tiff_reduced(tmp_path: Path) -> None:
    """The training child decoded a zip's 40-MP float TIFFs whole and made float64 copies (2.3 GB
    at its peak against 870 MB for an ordinary run); it now reads each picture reduced at load,
    as an upload is read: the arrays made for a 9-MP float TIFF stay under 100 MB (216 before)."""
    import tracemalloc

    from vit_demo.preprocess import DataConfig
    from vit_demo.train.data import index_folder, load_folder

    side = np.linspace(0, 9, 30, dtype=np.float32)
    small = np.sin(side)[None, :] * np.cos(side)[:, None]
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            big = Image.fromarray(small * (i + 1), "F").resize((3000, 3000), Image.Resampling.NEAREST)
            big.save(tmp_path / cls / f"{i}.tif", compression="tiff_adobe_deflate")
    tracemalloc.start()
    data = load_folder(index_folder(tmp_path), DataConfig(input_size=(32, 32)), 0.25, 0, 32, progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"4 float TIFFs of 9 MP read for training: numpy's and torch's peak {peak / MB:.0f} MiB")
    assert data.train_x.shape[1:] == (3, 32, 32) and len(data.train_x) + len(data.val_x) == 4
    assert peak < 100 * MB, peak / MB


def test_the_soft_file_limit_is_raised_to_the_hard_one() -> None:
    """A service often starts with a soft file limit of 1,024 under a much higher hard one: the
    app raises its soft limit to the hard one (as Go's runtime does) and says the limit in its
    start-up line; at 1,024 soft and hard it stays 1,024."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    code = ("from vit_demo.app.server.connections import ConnectionRules, describe, raise_file_limit; "
            "print(describe(ConnectionRules(per_address=100), *raise_file_limit()))")
    lines = {}
    for soft, top in ((512, hard), (1024, 1024)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).resolve().parents[1],
                             preexec_fn=lambda s=soft, t=top: resource.setrlimit(resource.RLIMIT_NOFILE, (s, t)))
        assert out.returncode == 0, out.stderr[-2000:]
        lines[soft] = out.stdout.strip()
    print(lines)
    if hard != resource.RLIM_INFINITY and hard > 512:
        assert f"file limit {hard:,} open files, raised from 512" in lines[512], lines[512]
    assert lines[1024].startswith("connections: file limit 1,024 open files: at most 614 connections"), lines[1024]
    assert "307 of them response streams; one address at most 100 connections and 32 streams" in lines[1024]


def test_an_unforeseen_error_is_plain_words() -> None:
    """An exception no check foresaw reaches the user as plain words with nothing of the server
    (its type, its text) and its traceback goes to the log; a check's own words pass as they are."""
    from vit_demo.app.common import SOMETHING_WRONG, check_look, readable_error
    from vit_demo.app.server.guard import InputError

    err = readable_error(KeyError("/srv/secret/path"), "a test")
    assert err.message == SOMETHING_WRONG and "secret" not in err.message and "KeyError" not in err.message
    assert readable_error(InputError("k must be a whole number from 1 to 10.")).message.startswith("k must be")
    for cmap, alpha, words in ((-1, 0.6, "Colormap"), ("inferno", "abc", "Overlay opacity"), ("x" * 30, 0.5, "Colormap"),
                               ("viridis", 1.5, "Overlay opacity"), ("gray", True, "Overlay opacity")):
        with pytest.raises(InputError, match=words):
            check_look(cmap, alpha)
    check_look("magma", 0)


def test_the_stream_open_longest_goes_first() -> None:
    """The response streams to close: a client's oldest past its own cap, then the oldest of all
    past the total (a page opens its heartbeat again when it needs it)."""
    from vit_demo.app.server.connections import Streams

    s = Streams()
    for i in range(6):
        s.add(f"a{i}", "A")
    for i in range(3):
        s.add(f"b{i}", "B")
    assert s.over("A", 4, None) == ["a0", "a1"]
    assert s.over("B", 4, 7) == ["a0", "a1"]
    assert s.over("A", 5, 6) == ["a0", "a1", "a2"]
    s.remove("a0")
    assert s.oldest() == "a1" and s.oldest("B") == "b0" and s.count("A") == 5


def test_server_paths_are_masked_both_ways(tmp_path: Path) -> None:
    """vit_demo.app.server.masking's middleware, driven as the server drives it: a streamed answer cut
    anywhere (through the folder's path too) reaches the client with ``files/`` in place of the folder,
    equal to the whole answer rewritten at once; a sized answer is rewritten with its new length; a
    request's body and a file address get the folder back; an upload's body, a file and a script's
    other bytes go as they are; Gradio's exact release becomes its major version, Range dropped."""
    import asyncio
    import json

    from vit_demo.app.server.masking import TOKEN, PathMask

    folder = tmp_path / "vit_demo_x1y2" / "gradio"
    real = f"{folder}/3fa9/chelsea.png"
    events = "".join(f'data: {json.dumps({"msg": "process_completed", "path": real, "i": i})}\n\n' for i in range(5))
    seen: dict[str, object] = {}

    async def app(scope, receive, send):  # what Gradio would answer, by route
        seen["path"] = scope["path"]
        seen["headers"] = scope.get("headers", [])
        seen["body"] = (await receive())["body"]
        kind, body = {"/queue/data": (b"text/event-stream", events.encode()),
                      "/config": (b"application/json", json.dumps({"version": "6.31.0", "file": real}).encode()),
                      "/assets/index.css": (b"text/css", b".gradio-container-6-31-0{color:red}"),
                      }.get(scope["path"], (b"image/png", real.encode()))
        sized = scope["path"] != "/queue/data"
        headers = [(b"content-type", kind)] + ([(b"content-length", str(len(body)).encode())] if sized else [])
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for k in range(0, len(body), cut):
            await send({"type": "http.response.body", "body": body[k : k + cut], "more_body": k + cut < len(body)})

    def call(path: str, body: bytes = b"", headers=()) -> tuple[dict, bytes]:
        out: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            out.append(message)

        scope = {"type": "http", "path": path, "headers": list(headers)}
        asyncio.run(PathMask(app, folder, release="6.31.0")(scope, receive, send))
        return out[0], b"".join(m.get("body", b"") for m in out[1:])

    for cut in (1, 7, 50, 10_000):  # a stream's chunks end anywhere
        _, got = call("/queue/data")
        assert got == events.replace(f"{folder}/", TOKEN).encode() and str(folder).encode() not in got, cut
    start, got = call("/config")
    assert json.loads(got) == {"version": "6", "file": "files/3fa9/chelsea.png"}
    assert dict(start["headers"])[b"content-length"] == str(len(got)).encode()
    call("/gradio_api/queue/join", json.dumps({"data": [{"path": "files/3fa9/chelsea.png"}]}).encode())
    assert json.loads(seen["body"]) == {"data": [{"path": real}]}  # the folder is back for the app
    call("/gradio_api/upload", b'"files/3fa9/chelsea.png"')
    assert seen["body"] == b'"files/3fa9/chelsea.png"'  # the user's file: as it is
    _, got = call("/gradio_api/file=files/3fa9/chelsea.png")
    assert seen["path"] == f"/gradio_api/file={real}" and got == real.encode()  # a file goes as it is
    _, got = call("/assets/index.css", headers=[(b"range", b"bytes=0-3")])
    assert got == b".gradio-container-6{color:red}" and seen["headers"] == []
