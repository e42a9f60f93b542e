"""What a model in training sees, every few epochs: attention going from spread out to on the object.

:class:`Recorder` is a :attr:`~vit_demo.train.loop.TrainOptions.on_epoch` hook. Before the first
epoch and every few epochs after it (and after the last), it runs the model, in eval mode, on one
fixed validation picture per class (up to :data:`MAX_PICTURES`, classes spread over the list) and
writes a frame (``epoch_0012.png``): for each picture the attention rollout (Abnar & Zuidema 2020)
and the mean of the last layer's heads, on ONE colour scale for every frame of the run (0 to
:data:`SCALE` times the uniform share of a patch: an untrained model's near-uniform maps look dim
and even, not like noise stretched to full contrast), its prediction, and each layer's mean
attention distance (the ViT paper's Fig. 7) beside the distance uniform attention would give.
:func:`filmstrip` puts the snapshots side by side: a row per picture, a column per snapshot.

The frames are plain PNGs of one size, so that :mod:`vit_demo.present.animate` can make a GIF and
an MP4 of them (``train --snapshots DIR``, the app's Train tab). Numpy, PIL and the project's
renderers only; the model runs once per snapshot on at most four pictures.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..methods.attention import cls_attention, mean_attention_distance
from ..methods.rollout import rollout
from ..viz import overlay_image, uniform_attention_distance, with_colorbar
from ..viz.style import text_font, text_width
from .augment import eval_batch

MAX_PICTURES = 4  # validation pictures a frame shows (one per class)
FRAMES = 10  # snapshots a run aims at after the untrained one, when no interval is given
SCALE = 4.0  # the maps' colour scale: 0 to SCALE times a patch's uniform share (1 / patches)
TILE = 112  # px: a picture or a map in a frame
FILM_TILE = 96  # px: ... in the filmstrip
INK, MUTED, RIGHT, WRONG, BAR = (34, 34, 34), (102, 102, 102), (26, 127, 55), (200, 40, 40), (31, 119, 180)
ROWS = ("picture", "rollout", "last layer:\nmean of heads")


@dataclass(frozen=True)
class Snapshot:
    """What the model saw at one epoch (``epoch`` 0: untrained) of ``epochs`` planned."""

    epoch: int
    epochs: int
    row: dict[str, Any]  # the epoch's history row (losses, accuracy); {"epoch": 0} before training
    rollout: np.ndarray  # [n, gh, gw], each map sums to 1
    last: np.ndarray  # [n, gh, gw] the last layer's attention, heads averaged
    distance: np.ndarray  # [L] mean attention distance in pixels, averaged over heads and pictures
    uniform: float  # the distance uniform attention gives on this grid (pixels)
    predicted: list[int]
    confidence: list[float]


def fixed_pictures(targets: Sequence[int], num_classes: int) -> list[int]:
    """Indices of the pictures shown: the first of each of up to :data:`MAX_PICTURES` classes, spread
    evenly over the class list (digits: 0, 3, 6, 9); classes without a picture are skipped."""
    ts, n = [int(t) for t in targets], MAX_PICTURES
    wanted = range(num_classes) if num_classes <= n else \
        sorted({round(i * (num_classes - 1) / (n - 1)) for i in range(n)})
    return [ts.index(c) for c in wanted if c in ts]


@torch.no_grad()
def take(model: Any, x: torch.Tensor, labels: Sequence[int], row: dict[str, Any], epochs: int) -> Snapshot:
    """One snapshot of ``model`` (in eval mode, its mode restored after) on the normalised inputs ``x``."""
    was = model.training
    model.eval()
    try:
        out = model(x.to(next(model.parameters()).device), capture=True)
    finally:
        model.train(was)
    att = [a.float().cpu() for a in out.attentions]
    layout = out.layout.cpu()
    patch = model.cfg.patch_size
    probs = out.logits.float().softmax(-1).cpu()
    return Snapshot(epoch=int(row["epoch"]), epochs=int(epochs), row=dict(row),
                    rollout=rollout(att, layout).numpy(), last=cls_attention(att, layout, layer=-1).numpy(),
                    distance=mean_attention_distance(att, layout, patch).mean(dim=(0, 2)).numpy(),
                    uniform=uniform_attention_distance(layout.grid, patch),
                    predicted=probs.argmax(-1).tolist(), confidence=probs.max(-1).values.tolist())


def scale_max(maps: np.ndarray) -> float:
    """The top of the colour scale: :data:`SCALE` times a patch's uniform share."""
    return SCALE / (maps.shape[-1] * maps.shape[-2])


def title(s: Snapshot) -> str:
    if s.epoch == 0:
        return "before training (random weights)"
    acc = s.row.get("val_accuracy")
    words = [f"epoch {s.epoch} of {s.epochs}"]
    if acc is not None and acc == acc:
        words.append(f"validation accuracy {acc:.1%}")
    if s.row.get("train_loss") is not None:
        words.append(f"train loss {s.row['train_loss']:.3f}")
    return "  ·  ".join(words)


def tile_picture(picture: np.ndarray, side: int) -> Image.Image:
    """A picture at ``side`` px, in square pixels (a tiny picture is shown as it is, not smoothed)."""
    img = Image.fromarray(picture).convert("RGB")
    small = max(img.size) * 4 <= side
    return img.resize((side, side), Image.Resampling.NEAREST if small else Image.Resampling.BICUBIC)


def render_frame(pictures: Sequence[np.ndarray], names: Sequence[str], s: Snapshot, classes: Sequence[str],
                 cmap: str = "inferno") -> Image.Image:
    """One frame: the pictures, their rollout and last-layer maps and predictions, and the layers'
    mean attention distance, with the colour bar. Every frame of a run has the same size."""
    n, gap, left, top, chart_w = len(pictures), 8, 128, 64, 250
    grid_w = n * TILE + (n - 1) * gap
    width, height = left + grid_w + 24 + chart_w + 16, top + 3 * (TILE + gap) + 30
    img = Image.new("RGB", (width + width % 2, height + height % 2), "white")
    draw = ImageDraw.Draw(img)
    bold, small = text_font(17, bold=True), text_font(13)
    draw.text((16, 14), title(s), font=bold, fill=INK)
    vmax = scale_max(s.rollout)
    for j, pic in enumerate(pictures):
        x = left + j * (TILE + gap)
        draw.text((x + TILE / 2, top - 10), fit(names[j], small, TILE), font=small, fill=MUTED, anchor="mm")
        tile = tile_picture(pic, TILE)
        img.paste(tile, (x, top))
        for r, maps in enumerate((s.rollout, s.last), start=1):
            img.paste(overlay_image(tile, maps[j], cmap, alpha=0.75, smooth=False, vmin=0.0, vmax=vmax),
                      (x, top + r * (TILE + gap)))
        said = classes[s.predicted[j]] if s.predicted[j] < len(classes) else str(s.predicted[j])
        ok = names[j] == said
        draw.text((x + TILE / 2, top + 3 * (TILE + gap) + 6), fit(f"{'✓' if ok else '✗'} {said} {s.confidence[j]:.0%}",
                  small, TILE), font=small, fill=RIGHT if ok else WRONG, anchor="mt")
    for r, label in enumerate(ROWS):
        draw.multiline_text((12, top + r * (TILE + gap) + TILE / 2), label, font=small, fill=INK, anchor="lm",
                            spacing=2)
    distance_chart(draw, (left + grid_w + 24, top, chart_w, 3 * TILE + 2 * gap), s, small)
    return with_colorbar(img, cmap, low="0", high=f"{SCALE:g}x uniform",
                         note="one scale for every frame: a patch's share of the attention, 0 to "
                              f"{SCALE:g} times 1/{s.rollout.shape[-1] * s.rollout.shape[-2]} (attention spread evenly)")


def fit(text: str, font: Any, width: int) -> str:
    while text_width(text, font) > width and len(text) > 4:
        text = text[:-2].rstrip() + "…"
    return text


def distance_chart(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], s: Snapshot, font: Any) -> None:
    """Each layer's mean attention distance as a bar (pixels), the uniform attention's as a dashed line."""
    x0, y0, w, h = box
    draw.text((x0, y0 - 10), "mean attention distance (px)", font=font, fill=INK, anchor="lm")
    top = max(s.uniform * 1.15, float(np.max(s.distance)) * 1.05, 1e-6)
    L = len(s.distance)
    label_w, row_h = 34, min(34, (h - 24) / max(1, L))
    span = w - label_w - 8
    for i, d in enumerate(s.distance):
        y = y0 + 8 + i * row_h
        draw.text((x0, y + row_h / 2), f"L{i + 1}", font=font, fill=MUTED, anchor="lm")
        draw.rectangle((x0 + label_w, y + 4, x0 + label_w + span * float(d) / top, y + row_h - 4), fill=BAR)
        draw.text((x0 + label_w + 4, y + row_h / 2), f"{float(d):.1f}", font=font, fill="white", anchor="lm")
    ux = x0 + label_w + span * s.uniform / top
    bottom = y0 + 8 + L * row_h
    for y in range(int(y0 + 4), int(bottom + 4), 8):
        draw.line((ux, y, ux, y + 4), fill=MUTED, width=2)
    draw.text((ux, bottom + 10), f"uniform: {s.uniform:.1f}", font=font, fill=MUTED, anchor="mm")
    draw.text((x0, bottom + 30), "lower: each patch looks nearby", font=font, fill=MUTED, anchor="lm")


def filmstrip(pictures: Sequence[np.ndarray], snaps: Sequence[Snapshot], which: str = "rollout", cmap: str = "inferno",
              tile: int = FILM_TILE) -> Image.Image:
    """The snapshots side by side: a row per picture (the picture first), a column per snapshot,
    ``which`` map ("rollout" or "last") on the frames' colour scale, the epoch above each column."""
    gap, head, left = 4, 26, tile + 10
    cols, rows = len(snaps), len(pictures)
    img = Image.new("RGB", (left + cols * (tile + gap) + 8, head + rows * (tile + gap) + 4), "white")
    draw = ImageDraw.Draw(img)
    font = text_font(12)
    for c, s in enumerate(snaps):
        draw.text((left + c * (tile + gap) + tile / 2, head / 2), "start" if s.epoch == 0 else f"ep {s.epoch}",
                  font=font, fill=MUTED, anchor="mm")
    for r, pic in enumerate(pictures):
        y = head + r * (tile + gap)
        base = tile_picture(pic, tile)
        img.paste(base, (0, y))
        for c, s in enumerate(snaps):
            maps = getattr(s, which)
            img.paste(overlay_image(base, maps[r], cmap, alpha=0.75, smooth=False, vmin=0.0, vmax=scale_max(maps)),
                      (left + c * (tile + gap), y))
    return img


def every_for(epochs: int, every: int | None) -> int:
    """Epochs between two snapshots: ``every``, or about :data:`FRAMES` over the run."""
    return max(1, every or math.ceil(epochs / FRAMES))


class Recorder:
    """The ``on_epoch`` hook that writes the frames into ``out`` (rank 0 only): before training,
    every ``every`` epochs (default: :func:`every_for`) and after the last epoch. ``on_frame(path,
    snapshot)`` is told of each frame as it is written."""

    def __init__(self, out: str | os.PathLike, every: int | None = None,
                 on_frame: Callable[[Path, Snapshot], None] | None = None, cmap: str = "inferno") -> None:
        self.out, self.every, self.on_frame, self.cmap = Path(out), every, on_frame, cmap
        self.frames: list[Path] = []
        self.snaps: list[Snapshot] = []
        self.pictures: list[np.ndarray] = []
        self.names: list[str] = []
        self.classes: list[str] = []
        self.x: torch.Tensor | None = None
        self.labels: list[int] = []

    def due(self, epoch: int, epochs: int) -> bool:
        return epoch == 0 or epoch >= epochs or epoch % every_for(epochs, self.every) == 0

    def __call__(self, s: Any, row: dict[str, Any], model: Any) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return
        epoch, epochs = int(row["epoch"]), int(s.recipe.epochs)
        if not self.due(epoch, epochs) or (self.snaps and self.snaps[-1].epoch == epoch):
            return
        if self.x is None:
            self.choose(s)
        snap = take(model, self.x, self.labels, row, epochs)
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"epoch_{epoch:04d}.png"
        render_frame(self.pictures, self.names, snap, self.classes, self.cmap).save(path)
        self.frames.append(path)
        self.snaps.append(snap)
        if self.on_frame is not None:
            self.on_frame(path, snap)

    def choose(self, s: Any) -> None:
        """The fixed pictures: validation ones (training ones when there are none), as the model sees them."""
        xs, ys = (s.data.val_x, s.data.val_y) if len(s.data.val_x) else (s.data.train_x, s.data.train_y)
        self.classes = list(s.data.classes)
        idx = fixed_pictures(ys.tolist(), len(self.classes))
        self.labels = [int(ys[i]) for i in idx]
        self.names = [self.classes[t] for t in self.labels]
        raw = xs[idx]
        self.pictures = [p.permute(1, 2, 0).numpy().copy() for p in raw]
        self.x = eval_batch(raw, s.dc)

    def strip(self, which: str = "rollout") -> Image.Image:
        """:func:`filmstrip` of the snapshots taken so far."""
        return filmstrip(self.pictures, self.snaps, which, self.cmap)

    def picture_files(self) -> list[Path]:
        """The fixed pictures as PNGs of at least 64 px (square pixels), to open in the app."""
        out, side = [], 64
        for name, pic in zip(self.names, self.pictures):
            path = self.out / f"picture_{len(out)}_{name}.png"
            tile_picture(pic, max(side, pic.shape[0])).save(path)
            out.append(path)
        return out
