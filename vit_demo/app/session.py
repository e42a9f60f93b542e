"""One user's session: the uploaded image and what that user is looking at.

A :class:`Session` lives in the user's ``gr.State`` (never global); :func:`open_image` turns an
upload into an :class:`Upload` or one readable :class:`~vit_demo.images.ImageError`. No Gradio here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ..analysis import Analysis
from ..images import ImageError, load_image

MIN_SIDE = 16  # px: smaller pictures hold less than one patch of information


@dataclass
class Upload:
    picture: Image.Image  # RGB, upright
    name: str
    size: tuple[int, int]  # original (width, height)
    notes: list[str] = field(default_factory=list)  # things the user should know (e.g. animated GIF)


def open_image(path: str | os.PathLike | None, min_side: int = MIN_SIDE) -> Upload:
    """A user's file -> an RGB picture, or :class:`ImageError` with a message for people."""
    if path is None or not str(path):
        raise ImageError("no image: upload a photo or click one of the examples")
    p = Path(path)
    name = p.name
    notes = []
    try:
        with Image.open(p) as probe:
            frames = getattr(probe, "n_frames", 1)
            fmt = probe.format or ""
    except Exception:  # load_image below says what is wrong, in words
        frames, fmt = 1, ""
    img = load_image(p)
    w, h = img.size
    if min(w, h) < min_side:
        raise ImageError(f"{name}: the image is only {w}x{h} px; it needs at least {min_side} px on each side "
                         f"(one {min_side}-px patch) to show anything")
    if frames > 1:
        notes.append(f"{name} is an animated {fmt or 'image'} with {frames} frames: using the first frame")
    return Upload(img, name, (w, h), notes)


# ----------------------------------------------------------------------------- one user's session


@dataclass
class Session:
    """What one browser tab (or API client) is looking at; kept in its gr.State, never global."""

    model_key: str | None = None
    upload: Upload | None = None
    analysis: Analysis | None = None
    query: int | None = None  # the query patch of the attention explorer (None: the [class] token)
    extra_models: list[str] = field(default_factory=list)  # checkpoints this session loaded itself
    open_tab: str = "patches"
    rendered: dict[str, str] = field(default_factory=dict)  # lazily drawn tab -> analysis it shows
    comparison: dict[str, Any] | None = None
    shown: tuple[str | None, str] | None = None  # (uploaded file, model) last handled
    last_pick: tuple[str, float] | None = None  # (model key, time) of the last menu pick

    @property
    def ready(self) -> bool:
        return self.analysis is not None and self.upload is not None

    @property
    def view_key(self) -> str:
        a = self.analysis
        return f"{a.model_name}|{a.key}" if a is not None else ""
