"""The Live tab's frames, without Gradio: a camera frame in (a JPEG data URL, checked as an upload
is checked), the chosen map of it computed at once, and the picture sent back (the map over what
the model sees, the top-1 class, its probability and the frames a second shown, as a JPEG data URL).

A frame is seen once: nothing goes into the analyses' cache, nothing is written to disk, and the
picture goes back inside the event's message (no file, no second request). The per-frame path is
one forward pass that captures the attention (in the model's precision: bf16 where the CPU
multiplies it), the map read off it (rollout, or one layer's [class] attention), a 224-px overlay
enlarged for the screen, one caption band and a JPEG (quality :data:`JPEG_QUALITY`): measured in
docs/performance.md. The class-specific map (amortised LRP: its own gradient and probe passes)
runs at the rate it allows.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

import numpy as np
import torch
from PIL import Image

from .. import methods, viz
from ..checkpoints.load import LoadedModel
from ..images import ImageError, load_image, mib
from ..methods.attention import cls_attention
from ..methods.rollout import rollout
from ..preprocess import preprocess

ROLLOUT, ATTENTION, CLASS_MAP = "rollout", "attention", "lrp-amortised"
MAPS = {ROLLOUT: "Rollout", ATTENTION: "Raw attention (layer, head)", CLASS_MAP: "Amortised LRP (top class, slower)"}
FRAME_SIDE = 256  # px: the square frames asked of the camera (a 224-px model resizes to 256, then crops 224)
FRAME_PIXELS = 1024 * 1024  # a larger frame (a browser that ignores the size asked) is decoded reduced to this
VIEW_SIDE = 448  # px: the picture sent back (the model's 224 px, doubled for a projector)
BAND = 44  # px: the caption band under the picture
JPEG_QUALITY = 85
FPS_WINDOW_S = 2.0  # the frames a second shown: those sent in the last this many seconds
RECENT = 4  # frames a stream keeps (their camera JPEGs, about 20 KB each): Freeze takes the one shown
TAIL = 64  # characters that tell one picture's data URL from another's (its end)
DATA_URL = "data:image/"


@dataclass
class Look:
    """One frame's answer: what the model sees, the map over it, the top-1 class and its probability."""

    picture: Image.Image
    heat: np.ndarray  # [gh, gw]
    label: str
    prob: float | None  # None: a model without classes


@dataclass
class LiveView:
    """One stream's state (a session's gr.State): when the last pictures were sent (the rate on the
    picture) and the camera's own bytes of the last few frames, by the end of the picture sent for
    each (Freeze hands the upload the frame whose picture the page shows: not always the newest)."""

    shown: deque = field(default_factory=lambda: deque(maxlen=64))
    frames: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # (the picture's tail, the frame's JPEG)
    at: float = 0.0  # when the last frame was computed (time.monotonic)
    dropped: int = 0  # frames dropped: late, too fast, or not pictures
    note: str = ""

    def fps(self, now: float) -> float:
        """Frames sent in the last :data:`FPS_WINDOW_S` seconds, per second (0 before two)."""
        recent = [t for t in self.shown if now - t <= FPS_WINDOW_S]
        if len(recent) < 2:
            return 0.0
        return (len(recent) - 1) / max(recent[-1] - recent[0], 1e-3)

    def sent(self, url: str, frame: bytes, now: float) -> None:
        self.shown.append(now)
        self.frames.append((url[-TAIL:], frame))
        self.at = now

    def frame(self, tail: Any = None) -> bytes | None:
        """The camera's bytes of the frame whose picture ends with ``tail`` (the newest when none does)."""
        for t, raw in reversed(self.frames):
            if t == tail:
                return raw
        return self.frames[-1][1] if self.frames else None


def frame_bytes(value: Any, max_bytes: int) -> bytes:
    """The picture's bytes in a streamed frame: Gradio sends ``{"url": "data:image/jpeg;base64,..."}``
    (a data URL, never a path: nothing on the server is named). Too long a URL is refused before
    it is decoded; anything else is :class:`~vit_demo.images.ImageError`."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url.startswith(DATA_URL) or "," not in url[:64]:
        raise ImageError("this frame is not a picture (the camera sends JPEG frames)")
    head, body = url.split(",", 1)
    if not head.endswith(";base64"):
        raise ImageError("this frame is not a picture (the camera sends JPEG frames)")
    if len(body) * 3 // 4 > max_bytes:
        raise ImageError(f"this frame is over {mib(max_bytes)}, the limit of an upload")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("this frame is not a picture (its data is not base64)") from None


def open_frame(value: Any, max_bytes: int, max_pixels: int) -> Image.Image:
    """A streamed frame as an RGB picture, with an upload's checks (bytes, a readable header, pixels),
    a larger frame reduced as it is decoded (:data:`FRAME_PIXELS`). Raises ImageError."""
    return frame_picture(frame_bytes(value, max_bytes), max_bytes, max_pixels)


def frame_picture(raw: bytes, max_bytes: int, max_pixels: int) -> Image.Image:
    """:func:`open_frame` for the frame's bytes."""
    try:
        img = load_image(raw, max_pixels=max_pixels, max_bytes=max_bytes, reduce_to=FRAME_PIXELS)
    except ImageError as e:  # load_image names the picture "upload": say "this frame" instead
        raise ImageError(str(e).replace("upload: ", "this frame: ", 1)) from None
    if min(img.size) < 16:
        raise ImageError(f"this frame is only {img.width}x{img.height} px")
    return img


def look(lm: LoadedModel, img: Image.Image, kind: str = ROLLOUT, layer: int = -1, head: int | None = None) -> Look:
    """``kind``'s map of ``img`` by ``lm`` (one forward pass that captures the attention; the
    class map adds its own passes), the top-1 class and its probability (a model without
    classes: no class, and no class map)."""
    x, picture = preprocess(img, lm.input_config(img.size))
    x = x[None].to(lm.device)
    classes = lm.model.cfg.num_classes
    kind = ROLLOUT if kind == CLASS_MAP and not classes else kind
    with torch.inference_mode():
        out = lm.model(x, capture=kind != CLASS_MAP)
    label, prob, top = "(no classifier)", None, None
    if classes:
        probs = out.logits[0].float().softmax(-1)
        top = int(probs.argmax())
        label, prob = (lm.labels[top] if top < len(lm.labels) else f"class {top}"), float(probs[top])
    if kind == CLASS_MAP:
        heat = methods.get(CLASS_MAP)(lm.model, x, torch.tensor([top], device=x.device))[0]
    else:  # (attention captured in bf16 is read as it is: rollout fuses the heads into float32 itself)
        heat = (cls_attention(out.attentions, out.layout, layer, head) if kind == ATTENTION
                else rollout(out.attentions, out.layout))[0]
    return Look(picture, heat.detach().float().cpu().numpy(), label, prob)


def caption(seen: Look, fps: float) -> tuple[str, str, str]:
    """The band's texts: the top-1 class, its probability, the frames a second shown."""
    return seen.label, "" if seen.prob is None else f"{seen.prob:.0%}", f"{fps:.1f} fps"


def picture_url(seen: Look, cmap: str, alpha: float, fps: float) -> str:
    """The picture sent back, as a JPEG data URL."""
    img = viz.live_picture(seen.picture, seen.heat, cmap, alpha, caption(seen, fps), VIEW_SIDE, BAND)
    buf = BytesIO()
    img.save(buf, "JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def frame_file(view: LiveView, folder: Any, tail: Any = None) -> str | None:
    """The frame whose picture ends with ``tail`` (the newest when none does), as the camera sent it
    (a JPEG), saved in ``folder``: what Freeze hands the upload. None before the first frame."""
    raw = view.frame(tail)
    if raw is None:
        return None
    path = folder / f"live-{time.strftime('%H%M%S')}-{secrets.token_hex(3)}.jpg"
    path.write_bytes(raw)
    return str(path)
