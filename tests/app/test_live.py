"""The Live tab's parts without a browser: a frame's map against the analysis the other tabs show,
a frame checked as an upload is (and never naming a server file), the picture sent back, the door
of the frames' route (running streams only, within their rate; Gradio's media routes closed), the
one compute slot (a frame that waited too long is dropped), and the queue's check of a camera value."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo.analysis import analyze
from vit_demo.app.live import ATTENTION, CLASS_MAP, ROLLOUT, TAIL, LiveView, frame_bytes, look, open_frame, picture_url
from vit_demo.app.server.guard import REFUSED, FileGuard, JoinGuard
from vit_demo.app.server.streams import EXPOSED, LiveStreams, StreamDoor, is_frame
from vit_demo.images import ImageError
from vit_demo.methods import get as method
from vit_demo.methods.attention import cls_attention
from vit_demo.methods.rollout import rollout


def jpeg_url(img: Image.Image, quality: int = 90) -> str:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def huge_header_jpeg(side: int = 9000) -> bytes:
    """A 16-px JPEG whose header says ``side`` x ``side`` px: refused by its header, before any decoding."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 90, 90)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    i = data.index(b"\xff\xc0")  # SOF0: length (2), precision (1), height (2), width (2)
    data[i + 5:i + 9] = side.to_bytes(2, "big") + side.to_bytes(2, "big")
    return bytes(data)


def test_a_frame_map_is_the_analysis_map(deit_tiny, package_photos) -> None:
    """The Live tab draws, for a frame, the very maps the other tabs draw for the same picture
    (rollout, a layer's and a head's [class] attention), and its top class."""
    img = Image.open(package_photos["chelsea"]).convert("RGB").resize((256, 256))
    a = analyze(deit_tiny, img)
    seen = look(deit_tiny, img, ROLLOUT)
    assert seen.label in {"Egyptian cat", "tabby", "tiger cat"} and seen.label == deit_tiny.labels[a.top1]
    assert seen.prob == pytest.approx(float(a.probs[a.top1]), abs=1e-6)
    np.testing.assert_allclose(seen.heat, rollout(a.attentions, a.layout)[0].numpy(), rtol=1e-5, atol=1e-7)
    for layer, head in ((11, None), (3, 2)):
        got = look(deit_tiny, img, ATTENTION, layer, head).heat
        np.testing.assert_allclose(got, cls_attention(a.attentions, a.layout, layer, head)[0].numpy(), rtol=1e-5, atol=1e-7)
    assert seen.picture.size == (224, 224)


@pytest.mark.slow
def test_a_frame_class_map_is_the_relevance_tab_map(deit_tiny, package_photos) -> None:
    """The class-specific map a frame gets is amortised LRP of its top class, as the Relevance tab's."""
    img = Image.open(package_photos["coffee"]).convert("RGB").resize((256, 256))
    a = analyze(deit_tiny, img)
    lrp = look(deit_tiny, img, CLASS_MAP).heat
    ref = method(CLASS_MAP)(deit_tiny.model, a.x, torch.tensor([a.top1]))[0].numpy()
    np.testing.assert_allclose(lrp, ref, rtol=1e-4, atol=1e-6)


def test_a_model_without_classes_shows_its_attention() -> None:
    """A headless model (features only): the frame's rollout (also when the class map is asked for), no class."""
    from vit_demo.checkpoints.load import LoadedModel
    from vit_demo.model import VisionTransformer, ViTConfig
    from vit_demo.preprocess import DataConfig

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                        num_classes=0)).eval()
    lm = LoadedModel(model, DataConfig(input_size=(32, 32)), "headless", "random weights", None, random_weights=True)
    img = Image.new("RGB", (40, 40), (120, 60, 30))
    for kind in (ROLLOUT, CLASS_MAP):
        seen = look(lm, img, kind)
        assert seen.heat.shape == (4, 4) and seen.prob is None and seen.label == "(no classifier)"
    assert picture_url(seen, "inferno", 0.6, 5.0).startswith("data:image/jpeg;base64,")


def test_the_picture_sent_back(deit_tiny, package_photos) -> None:
    """A JPEG data URL: the map over what the model sees, enlarged to 448 px, a caption band under it."""
    img = Image.open(package_photos["coffee"]).convert("RGB").resize((256, 256))
    seen = look(deit_tiny, img)
    url = picture_url(seen, "inferno", 0.6, 12.3)
    assert url.startswith("data:image/jpeg;base64,")
    pic = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert pic.size == (448, 492)
    band = np.asarray(pic.convert("L"))[448:]
    assert band.mean() < 80 and band.max() > 200  # dark, with light text on it
    camera_only = np.asarray(Image.open(io.BytesIO(base64.b64decode(
        picture_url(seen, "inferno", 0.0, 1).split(",", 1)[1]))).convert("RGB"), dtype=float)[:448]
    picture = np.asarray(seen.picture.resize((448, 448), Image.Resampling.BILINEAR), dtype=float)
    assert np.abs(camera_only - picture).mean() < 4  # blend 0: the camera's picture, (JPEG aside)
    mixed = np.asarray(pic.convert("RGB"), dtype=float)[:448]
    assert np.abs(mixed - picture).mean() > 20  # blend 0.6: the map over it


def test_frames_are_checked_as_uploads_are() -> None:
    """Anything but a picture in a data URL is dropped with a reason; a frame never names a file; a
    frame over the upload's bytes or pixels is refused before it is decoded."""
    good = jpeg_url(Image.new("RGB", (256, 256), (10, 120, 200)))
    assert open_frame({"url": good}, 1 << 20, 40_000_000).size == (256, 256)
    for bad in (None, 3, "hello", {"path": "/etc/passwd"}, {"path": "/etc/passwd", "url": None},
                {"url": "data:text/plain;base64,aGVsbG8="}, {"url": "data:image/jpeg,notbase64"},
                {"url": "data:image/jpeg;base64,@@@@"},
                {"url": "data:image/jpeg;base64," + base64.b64encode(b"no picture").decode()}):
        with pytest.raises(ImageError):
            open_frame(bad, 1 << 20, 40_000_000)
    with pytest.raises(ImageError, match="limit"):
        frame_bytes({"url": good}, 1000)  # over the upload's bytes: refused before base64 is decoded
    bomb = "data:image/jpeg;base64," + base64.b64encode(huge_header_jpeg()).decode()
    with pytest.raises(ImageError, match="limit is 40 MP"):
        open_frame({"url": bomb}, 1 << 20, 40_000_000)
    big = jpeg_url(Image.new("RGB", (2000, 1500), (200, 30, 30)))
    assert open_frame({"url": big}, 1 << 20, 40_000_000).size[0] <= 1200  # decoded reduced (a browser that ignored the size)


def test_the_rate_on_the_picture_and_the_frame_frozen() -> None:
    view = LiveView()
    assert view.fps(0.0) == 0 and view.frame() is None
    urls = [f"data:image/jpeg;base64,{'A' * 100}{i:03d}" for i in range(21)]
    for i, url in enumerate(urls):
        view.sent(url, f"frame {i}".encode(), 10 + i * 0.1)
    assert view.fps(12.0) == pytest.approx(10.0)
    assert view.fps(30.0) == 0  # nothing lately
    assert view.frame(urls[18][-TAIL:]) == b"frame 18"  # the page says which picture it shows
    assert view.frame() == view.frame("no such") == b"frame 20"  # else: the newest


def call(door: StreamDoor, path: str, method: str = "POST") -> int:
    """The status ``door`` answers a request for ``path`` with (200: passed on to the app)."""
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        sent.append(msg)

    asyncio.run(door({"type": "http", "path": path, "method": method, "headers": []}, receive, send))
    return sent[0]["status"]


def test_the_frames_door() -> None:
    """Frames for a running stream only, within its rate (a burst of 3); Gradio's media routes closed."""
    live = LiveStreams(EXPOSED)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    door = StreamDoor(app, live)
    sid = "a" * 32
    assert call(door, f"/gradio_api/stream/{sid}") == 404  # no such stream (nothing parsed)
    live.running(sid)
    codes = [call(door, f"/gradio_api/stream/{sid}") for _ in range(10)]
    assert codes[:3] == [200] * 3 and set(codes[3:]) == {429}  # 8 frames a second, 3 at once
    time.sleep(0.3)  # 2 more frames' worth of time
    assert [call(door, f"/gradio_api/stream/{sid}") for _ in range(3)] == [200, 200, 429]
    assert live.age(sid) < 0.2
    for path, how in ((f"/gradio_api/stream/{sid}/x/playlist.m3u8", "GET"), (f"/gradio_api/stream/{sid}", "GET"),
                      ("/gradio_api/stream/../queue/join", "POST"), ("/gradio_api/stream/abc", "POST")):
        assert call(door, path, how) == 404, path
    assert call(door, f"/gradio_api/stream/{sid}/close") == 200
    assert call(door, f"/gradio_api/stream/{sid}") == 404  # closed: forgotten
    assert call(door, "/config", "GET") == 200  # every other route: not the door's


def test_a_frame_that_waited_too_long_is_dropped() -> None:
    """One frame computed at a time; a frame whose wait passes half a second is dropped, not queued."""
    live = LiveStreams(EXPOSED)
    held, release = threading.Event(), threading.Event()

    def hold():
        with live.compute(0.0) as turn:
            assert turn
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    t0 = time.monotonic()
    with live.compute(0.3) as turn:  # 0.2 s of its wait left
        assert not turn
    assert 0.15 < time.monotonic() - t0 < 1.0
    with live.compute(0.6) as turn:  # already late
        assert not turn
    release.set()
    t.join()
    with live.compute(0.0) as turn:
        assert turn


def test_the_queue_takes_a_frame_as_a_camera_value(tmp_path) -> None:
    """A camera's value at the door of the queue: a picture's data URL, never a file."""
    guard = JoinGuard(FileGuard([tmp_path]), file_ids=[1], frame_ids=[2], frame_chars=1000)
    url = "data:image/jpeg;base64," + "A" * 100
    assert guard.problem([1, 2], [None, {"url": url}]) is None
    assert guard.problem([1, 2], [None, None]) is None
    for bad in ({"path": "/etc/passwd", "url": url}, {"url": url, "meta": {"_type": "gradio.FileData"}},
                {"url": "data:image/jpeg;base64," + "A" * 2000}, {"url": "/etc/passwd"}, url, [url]):
        assert guard.problem([1, 2], [None, bad]) == REFUSED, bad
    assert is_frame(None, 10) and not is_frame({"url": "data:text/html,hi"}, 100)


def test_an_exposed_app_computes_frames_half_of_the_time_at_most() -> None:
    """Exposed, all streams together compute at most 12 frames a second and half of the time: after a
    slow frame (a class map) the next one starts only when that frame's share of the time is over."""
    live = LiveStreams(EXPOSED)
    t0 = time.monotonic()
    with live.compute(0.0) as turn:
        assert turn
        time.sleep(0.2)  # a frame of 0.2 s: the next may start 0.4 s after it started
    with live.compute(0.0) as turn:
        assert turn and time.monotonic() - t0 >= 0.39
        t1 = time.monotonic()
    with live.compute(0.0) as turn:  # a quick frame right after: 1/12 s later
        assert turn and time.monotonic() - t1 >= 1 / 12 - 0.01
        time.sleep(0.2)
    with live.compute(0.45) as turn:  # its turn 0.4 s after the frame before started; its wait is over first
        assert not turn
