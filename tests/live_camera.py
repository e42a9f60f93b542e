"""A fake webcam for the Live tab's browser tests and ``benchmarks/bench_live.py``.

Chromium plays a file as its camera (``--use-fake-device-for-media-stream
--use-file-for-fake-video-capture=clip.y4m``). :func:`write_clip` writes one with numpy: raw
YUV4MPEG2 4:2:0 frames that pan across a photo, each with its number drawn in (a row of
:data:`BITS` cells near the top of what the model sees, each cell a bright and a dark half in one
order or the other: a reading that survives the map blended over it). :data:`WATCH_JS`, run in the
page, notes every change of the Live tab's picture, the number read off it and the number the
camera shows at that moment: the end-to-end latency is their difference over the clip's frame rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

BITS = 10  # frame numbers 0..1023
FAKE_CAMERA = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
CAMERA_SIDE = 256  # px: the square frames the Live tab asks of the camera (vit_demo.app.live.FRAME_SIDE)
MODEL_CROP = 224 / 256  # the share of a frame the model sees (a 224-px model: resize to 256, crop 224)


def camera_args(clip: Path) -> list[str]:
    """Chromium's flags for a camera that plays ``clip``."""
    return [*FAKE_CAMERA, f"--use-file-for-fake-video-capture={clip}"]


def _yuv420(rgb: np.ndarray) -> list[np.ndarray]:
    """RGB [h, w, 3] uint8 -> the Y, U and V planes of 4:2:0 (BT.601, studio range)."""
    r, g, b = (rgb[..., i].astype(np.float32) for i in range(3))
    y = 0.257 * r + 0.504 * g + 0.098 * b + 16
    u = -0.148 * r - 0.291 * g + 0.439 * b + 128
    v = 0.439 * r - 0.368 * g - 0.071 * b + 128
    h, w = y.shape
    u = u.reshape(h // 2, 2, w // 2, 2).mean((1, 3))
    v = v.reshape(h // 2, 2, w // 2, 2).mean((1, 3))
    return [np.clip(c + 0.5, 0, 255).astype(np.uint8) for c in (y, u, v)]


def code_box(width: int, height: int) -> tuple[float, float, float, float]:
    """(x0, y0, cell, band) of the number's row in a ``width`` x ``height`` frame: inside the part
    the model sees (the centred square, of which the middle :data:`MODEL_CROP`), near its top."""
    side = height * MODEL_CROP
    x0 = (width - side) / 2 + side * 0.04
    y0 = (height - side) / 2 + side * 0.04
    return x0, y0, side * 0.92 / BITS, side * 0.09


def draw_number(frame: np.ndarray, n: int) -> None:
    """Draw ``n`` into ``frame`` (in place): per bit, a cell whose left half is white and right
    half black for a 1, the other way for a 0, on a grey strip."""
    h, w = frame.shape[:2]
    x0, y0, cell, band = code_box(w, h)
    frame[int(y0):int(y0 + band), int(x0):int(x0 + cell * BITS)] = 128
    for i in range(BITS):
        bit = (n >> (BITS - 1 - i)) & 1
        left, mid, right = int(x0 + i * cell), int(x0 + (i + 0.5) * cell), int(x0 + (i + 1) * cell)
        frame[int(y0):int(y0 + band), left:mid] = 255 if bit else 0
        frame[int(y0):int(y0 + band), mid:right] = 0 if bit else 255


def write_clip(path: Path, photo: Path, size: tuple[int, int] = (384, 288), fps: int = 30, seconds: float = 10,
               numbered: bool = True) -> Path:
    """A y4m clip of ``seconds`` at ``fps`` that pans across ``photo`` (and back), each frame's
    number drawn in when ``numbered``."""
    w, h = size
    img = Image.open(photo).convert("RGB")
    scale = max(h * 1.15 / img.height, w * 1.8 / img.width)
    a = np.asarray(img.resize((int(img.width * scale) + 1, int(img.height * scale) + 1), Image.Resampling.BILINEAR))
    n = int(fps * seconds)
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for i in range(n):
            t = 1 - abs(1 - 2 * i / n)  # 0 -> 1 -> 0: across and back, so the loop has no jump
            x, y = int((a.shape[1] - w) * t), int((a.shape[0] - h) * (0.3 + 0.4 * t))
            frame = a[y:y + h, x:x + w].copy()
            if numbered:
                draw_number(frame, i)
            f.write(b"FRAME\n")
            for plane in _yuv420(frame):
                f.write(plane.tobytes())
    return path


def clip_frames(fps: int = 30, seconds: float = 10) -> int:
    return int(fps * seconds)


# The page side: every change of the Live picture's src, with the number read off it and off the camera's video.
# The picture is the model's input (the middle MODEL_CROP of the camera's square frame), enlarged, over a caption band.
WATCH_JS = """(cfg) => {
  const bits = cfg.bits, cv = document.createElement('canvas'), cx = cv.getContext('2d', {willReadFrequently: true});
  // the number in a picture: only its strip is drawn and read (box: [x0, y0, cell, band], shares of the square of
  // `side` px at the top middle of a picture `width` px wide); each bit: its left half brighter than its right half
  const read = (src, width, side, box) => {
    const x = (width - side) / 2 + box[0] * side, y = box[1] * side, w = box[2] * side * bits, h = box[3] * side;
    const W = 8 * bits, H = 8;
    cv.width = W; cv.height = H; cx.drawImage(src, x, y + h * 0.2, w, h * 0.6, 0, 0, W, H);
    const px = cx.getImageData(0, 0, W, H).data;
    const lum = (x0) => { let s = 0; for (let yy = 2; yy < 6; yy++) for (let xx = x0; xx < x0 + 2; xx++) {
      const i = 4 * (yy * W + xx); s += px[i] + px[i + 1] + px[i + 2]; } return s; };
    let v = 0;
    for (let b = 0; b < bits; b++) v = v * 2 + (lum(8 * b + 1) > lum(8 * b + 5) ? 1 : 0);
    return v; };
  window.liveChanges = []; let last = null;
  const seen = () => {
    const im = document.querySelector(cfg.view + ' img'), video = document.querySelector(cfg.video + ' video');
    const src = im && im.getAttribute('src');
    if (!src || src === last) return;
    last = src;
    const note = [performance.now(), src.length + ':' + src.slice(-48), -1, -1];
    window.liveChanges.push(note);
    try {
      if (video && video.videoWidth) {
        note[3] = read(video, video.videoWidth, Math.min(video.videoWidth, video.videoHeight), cfg.inCamera);
      }
    } catch (e) {}
    im.decode().then(() => { note[2] = read(im, im.naturalWidth, im.naturalWidth, cfg.inView); }).catch(() => {});
  };
  window.liveObserver = new MutationObserver(seen);
  window.liveObserver.observe(document.querySelector(cfg.view),
                              {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});
  seen();
}"""


def watch_config(clip_size: tuple[int, int], view: str = "#live-view", video: str = "#live-camera") -> dict:
    """The boxes :data:`WATCH_JS` reads, as shares of the square each picture shows: the camera's
    square frame (the clip's centred square), and the Live picture (the middle of that square)."""
    w, h = clip_size
    x0, y0, cell, band = code_box(w, h)
    sq = (x0 - (w - h) / 2) / h, (y0) / h, cell / h, band / h  # in the camera's square frame
    margin = (1 - MODEL_CROP) / 2
    in_view = ((sq[0] - margin) / MODEL_CROP, (sq[1] - margin) / MODEL_CROP, sq[2] / MODEL_CROP, sq[3] / MODEL_CROP)
    return {"bits": BITS, "view": view, "video": video, "inCamera": list(sq), "inView": list(in_view)}


def start_live(pg, timeout_ms: int = 60_000) -> None:
    """Open the Live tab, let the page at the camera ("Click to Access Webcam" when shown) and press
    the first button whose text begins with Start or Record."""
    pg.get_by_role("tab", name="Live").click()
    cam = pg.locator("#live-camera")
    cam.wait_for(timeout=timeout_ms)
    access = cam.get_by_text("Click to Access Webcam")
    if access.count():
        access.first.click()
    button = cam.locator("button").filter(has_text=__import__("re").compile(r"^\s*(Start|Record)"))
    button.first.wait_for(timeout=timeout_ms)
    button.first.click()


def measure(pg, seconds: float, clip_size: tuple[int, int], fps: int, frames: int, settle_s: float = 3.0) -> dict:
    """Changes of the Live picture over ``seconds`` (after the first picture and ``settle_s``):
    how many a second, how many distinct pictures, and the latency read off the numbers."""
    pg.wait_for_function("() => { const i = document.querySelector('#live-view img'); return i && i.src; }",
                         timeout=120_000)
    time.sleep(settle_s)
    pg.evaluate(WATCH_JS, watch_config(clip_size))
    time.sleep(seconds)
    pg.evaluate("() => { window.liveObserver.disconnect(); }")
    changes = pg.evaluate("window.liveChanges")
    return summary(changes, seconds, fps, frames)


def summary(changes: Iterable[list], seconds: float, fps: int, frames: int) -> dict:
    """Rate, distinct pictures and latency (median, 90th percentile, seconds) from WATCH_JS's notes."""
    changes = list(changes)
    lat = [((cam - shown) % frames) / fps for _, _, shown, cam in changes
           if 0 <= shown < frames and 0 <= cam < frames and (cam - shown) % frames < frames // 2]
    return {"changes": len(changes), "seconds": seconds, "per_second": len(changes) / seconds,
            "distinct": len({c[1] for c in changes}), "latency_read": len(lat),
            "latency_median_s": float(np.median(lat)) if lat else None,
            "latency_p90_s": float(np.percentile(lat, 90)) if lat else None}


def dumps(d: dict) -> str:
    return json.dumps(d, indent=1, default=float)
