"""Attention in motion: one image's maps through the layers, as a GIF or an MP4.

Frame *l* shows layer *l* (counted from 1 in the titles: "Layer 3 of 12"). Three clips can
play side by side in one frame or as separate files:

- ``attention``: the raw [class] attention of layer *l* (mean over heads, or one head);
- ``rollout``: attention rollout (Abnar & Zuidema 2020) accumulated up to layer *l*, i.e.
  :func:`vit_demo.methods.rollout.rollout` of the layers 0..l;
- ``relevance``: Chefer et al. (ICCV 2021) relevance accumulated block by block, i.e.
  :func:`vit_demo.methods.gradients.chefer_relevance` of the blocks 0..l.

So the last frame of each clip is exactly the map the app and ``explain`` show. Each clip has
ONE colour scale for all its frames (its min..max over every layer), so that the eye sees the
map change, not the scale. Between layers, ``tween`` frames blend one map into the next; the
first and last frames are held longer.

The science (maps per layer) is :func:`layer_clips`; the pictures are :func:`render` (numpy +
PIL, fast); :func:`write_gif` / :func:`write_mp4` write the files through ``imageio`` (MP4 with
the ffmpeg binary that the ``imageio-ffmpeg`` wheel ships, H.264 in yuv420p for any player).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from .. import viz
from ..methods.attention import captured, cls_attention
from ..methods.gradients import attention_gradients, chefer_relevance
from ..methods.rollout import rollout
from ..model import TokenLayout
from ..preprocess import preprocess
from ..progress import report
from ..viz.arrays import blend

CLIPS = ("attention", "rollout", "relevance")
FORMATS = ("gif", "mp4")
DEFAULT_WIDTH = {"gif": 960, "mp4": 1280}  # 16:9 frames; MP4 at least 1280 px wide for slides
MP4_FPS = 25
BACKGROUND = (255, 255, 255)
INK = (34, 34, 34)
MUTED = (102, 102, 102)
ACCENT = (31, 119, 180)


@dataclass
class Clip:
    """One method's maps through the layers: ``maps[l]`` is the map after layer ``l``."""

    name: str  # "attention", "rollout" or "relevance"
    title: str  # panel title
    maps: np.ndarray  # [L, gh, gw]

    @property
    def vmin(self) -> float:
        return float(self.maps.min())

    @property
    def vmax(self) -> float:
        return float(self.maps.max())


@dataclass
class Animation:
    """Rendered frames and how long each one shows (seconds)."""

    frames: list[Image.Image]
    durations: list[float]
    layers: int
    clips: list[str] = field(default_factory=list)

    def mp4_repeats(self, fps: int = MP4_FPS) -> list[int]:
        """How many video frames each frame becomes at ``fps`` (at least one)."""
        return [max(1, round(d * fps)) for d in self.durations]

    def mp4_frame_count(self, fps: int = MP4_FPS) -> int:
        return sum(self.mp4_repeats(fps))


# ----------------------------------------------------------------------------- maps per layer


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def attention_layers(attentions: Sequence[torch.Tensor], layout: TokenLayout, head: int | None = None) -> np.ndarray:
    """[L, gh, gw]: the [class] attention of every layer (first image of the batch)."""
    return np.stack([_np(cls_attention(attentions, layout, i, head)[0]) for i in range(len(attentions))])


def rollout_layers(attentions: Sequence[torch.Tensor], layout: TokenLayout) -> np.ndarray:
    """[L, gh, gw]: rollout of the layers 0..l, for every l (the last one is ``rollout``)."""
    return np.stack([_np(rollout(attentions[: i + 1], layout)[0]) for i in range(len(attentions))])


def relevance_layers(
    attentions: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], layout: TokenLayout
) -> np.ndarray:
    """[L, gh, gw]: Chefer relevance after blocks 0..l, for every l (the last one is the map)."""
    L = len(attentions)
    return np.stack([_np(chefer_relevance(attentions[: i + 1], grads[: i + 1], layout)[0]) for i in range(L)])


def layer_clips(
    model, x: torch.Tensor, clips: Sequence[str] = CLIPS, head: int | None = None, target: int | None = None,
    labels: Sequence[str] | None = None,
) -> tuple[list[Clip], dict]:
    """The maps of ``clips`` through the layers for one input ``x`` [1, 3, h, w].

    One forward and (for ``relevance``) one backward pass. Returns the clips and a record of
    the prediction: ``{"target", "label", "prob"}`` (the class the relevance explains: ``target``,
    default the top-1 prediction); empty for a headless model.
    """
    unknown = [c for c in clips if c not in CLIPS]
    if unknown or not clips:
        raise ValueError(f"unknown clip(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(CLIPS)}")
    headless = model.cfg.num_classes == 0
    if "relevance" in clips and headless:
        raise ValueError("the relevance clip needs class scores; this model is headless (no classifier)")
    if head is not None and not 0 <= head < model.cfg.num_heads:
        raise ValueError(f"head {head} is outside 0..{model.cfg.num_heads - 1}")
    if headless:
        out = captured(model, x)
        attentions, grads, layout, info = out.attentions, None, out.layout, {}
    else:
        ag = attention_gradients(model, x, target)
        attentions, grads, layout = ag.attentions, ag.grads, ag.layout
        t = int(ag.target[0])
        info = {"target": t, "prob": float(ag.logits.float().softmax(-1)[0, t])}
        info["label"] = labels[t] if labels is not None else f"class {t}"
    out_clips = []
    for name in clips:
        if name == "attention":
            who = "mean of heads" if head is None else f"head {head + 1}"
            out_clips.append(Clip(name, f"Attention ({who})", attention_layers(attentions, layout, head)))
        elif name == "rollout":
            out_clips.append(Clip(name, "Rollout so far", rollout_layers(attentions, layout)))
        else:
            title = f"Relevance for '{info['label']}'"
            out_clips.append(Clip(name, title, relevance_layers(attentions, grads, layout)))
    return out_clips, info


# ----------------------------------------------------------------------------- frames


@dataclass(frozen=True)
class _Layout:
    """Pixel geometry of one frame (everything scales with the width)."""

    width: int
    height: int
    panel: int
    gap: int
    top: int  # y of the panel titles
    strip: int  # y of the layer strip
    s: float  # scale factor vs a 1280-px frame

    @classmethod
    def make(cls, width: int, panels: int) -> _Layout:
        width = int(width) // 2 * 2
        height = round(width * 9 / 16) // 2 * 2  # even sizes: H.264 in yuv420p needs them
        s = width / 1280
        gap = round(28 * s)
        top = round(122 * s)
        avail_h = height - top - round(176 * s)  # panel title above; colour bar and layer strip below
        panel = int(min((width - (panels + 1) * gap) / panels, avail_h))
        strip = top + panel + round(128 * s)  # below the colour bars' labels
        spare = max(0, height - round(44 * s) - strip)  # when the panels are width-bound: centre vertically
        return cls(width, height, panel, gap, top + spare // 2, strip + spare // 2, s)

    def x0(self, i: int, n: int) -> int:
        total = n * self.panel + (n - 1) * self.gap
        return (self.width - total) // 2 + i * (self.panel + self.gap)


def _colour_bar(draw: ImageDraw.ImageDraw, img: Image.Image, x: int, y: int, w: int, clip: Clip, cmap: str, g: _Layout) -> None:
    h = max(6, round(12 * g.s))
    bar = viz.colorize(np.tile(np.linspace(0, 1, w, dtype=np.float32), (h, 1)), cmap)
    img.paste(Image.fromarray(bar), (x, y))
    font = viz.text_font(max(10, round(17 * g.s)))
    ty = y + h + round(4 * g.s)
    # words, not numbers: "8.5e-05 ... 0.0709" told a class nothing (the values are in the JSON)
    draw.text((x, ty), "low", font=font, fill=MUTED, anchor="la")
    draw.text((x + w, ty), "high", font=font, fill=MUTED, anchor="ra")
    draw.text((x + w // 2, ty), "one scale for all layers", font=font, fill=MUTED, anchor="ma")


def _layer_strip(draw: ImageDraw.ImageDraw, g: _Layout, layers: int, pos: float) -> None:
    """A row of boxes, one per layer, filled up to the current one."""
    box = round(min(30 * g.s, (g.width * 0.6) / layers))
    step = box + max(2, round(6 * g.s))
    x = (g.width - (layers * step - (step - box))) // 2
    y = g.strip
    font = viz.text_font(max(9, round(15 * g.s)), bold=True)
    for i in range(layers):
        on = i <= pos + 1e-6
        fill = ACCENT if on else (225, 230, 236)
        draw.rectangle((x + i * step, y, x + i * step + box, y + box), fill=fill)
        draw.text((x + i * step + box / 2, y + box / 2), str(i + 1), font=font, fill=(255, 255, 255) if on else MUTED,
                  anchor="mm")


class _Painter:
    """Draws the frames of one animation: the static parts (titles, colour bars, the input
    panel) once, then per frame only the heat panels, the layer title and the layer strip."""

    def __init__(self, picture: Image.Image, clips: Sequence[Clip], caption: str, cmap: str, alpha: float,
                 width: int) -> None:
        self.clips, self.cmap, self.alpha = list(clips), viz.check_cmap(cmap), float(np.clip(alpha, 0, 1))
        self.layers = clips[0].maps.shape[0]
        show_input = len(clips) == 1  # a single clip: the plain picture in a panel before it
        n = len(clips) + int(show_input)
        g = self.g = _Layout.make(width, n)
        pic = picture.convert("RGB").resize((g.panel, g.panel), Image.Resampling.BICUBIC)
        self.pic = np.asarray(pic)
        # every layer's map, upsampled and put on its clip's fixed scale once
        self.up = [viz.upsample(viz.normalize(c.maps, c.vmin, c.vmax), (g.panel, g.panel)) for c in clips]
        self.base = Image.new("RGB", (g.width, g.height), BACKGROUND)
        draw = ImageDraw.Draw(self.base)
        if caption:
            draw.text((g.width // 2, round(72 * g.s)), caption, font=viz.text_font(round(20 * g.s)), fill=MUTED, anchor="ma")
        title_font = viz.text_font(round(22 * g.s), bold=True)
        self.y = g.top + round(36 * g.s)
        titles = (["Model input"] if show_input else []) + [c.title for c in clips]
        self.xs = [g.x0(i, n) for i in range(n)]
        for x, title in zip(self.xs, titles):
            draw.text((x + g.panel // 2, g.top), _fit(title, title_font, g.panel), font=title_font, fill=INK, anchor="ma")
        if show_input:
            self.base.paste(pic, (self.xs[0], self.y))
            self.xs = self.xs[1:]
        for x, c in zip(self.xs, clips):
            _colour_bar(draw, self.base, x, self.y + g.panel + round(10 * g.s), g.panel, c, cmap, g)

    def frame(self, pos: float) -> Image.Image:
        """The frame at layer position ``pos`` (0-based; a fraction blends two layers)."""
        g, lo = self.g, int(np.floor(pos))
        hi, f = min(lo + 1, self.layers - 1), pos - lo
        img = self.base.copy()
        for x, up in zip(self.xs, self.up):
            colours = viz.colorize((1 - f) * up[lo] + f * up[hi], self.cmap)
            img.paste(Image.fromarray(blend(self.pic, colours, self.alpha)), (x, self.y))
        draw = ImageDraw.Draw(img)
        draw.text((g.width // 2, round(16 * g.s)), f"Layer {lo + 1} of {self.layers}",
                  font=viz.text_font(round(42 * g.s), True), fill=INK, anchor="ma")
        _layer_strip(draw, g, self.layers, pos)
        return img


def _fit(text: str, font, width: int) -> str:
    """``text``, shortened with an ellipsis until it fits ``width`` pixels."""
    if viz.text_width(text, font) <= width:
        return text
    while len(text) > 4 and viz.text_width(text + "…", font) > width:
        text = text[:-1]
    return text.rstrip() + "…"


def render(
    picture: Image.Image, clips: Sequence[Clip], caption: str = "", cmap: str = "inferno", alpha: float = 0.6,
    width: int = 1280, tween: int = 3, step_s: float = 0.7, tween_s: float = 0.08, hold_s: float = 2.0,
) -> Animation:
    """Every frame: one per layer, ``tween`` blended frames between layers; each layer shows
    ``step_s`` seconds, the first and the last ``hold_s``. Frames: L + (L - 1) * tween. A single
    clip is shown after the plain picture."""
    if not clips:
        raise ValueError("render needs at least one clip")
    layers = clips[0].maps.shape[0]
    if any(c.maps.shape[0] != layers for c in clips):
        raise ValueError("every clip must have the same number of layers")
    painter = _Painter(picture, clips, caption, cmap, alpha, width)
    positions, durations = schedule(layers, tween, step_s, tween_s, hold_s)
    frames = []
    for i, p in enumerate(positions):
        frames.append(painter.frame(p))
        report((i + 1) / len(positions), "frame", done=i + 1, total=len(positions))
    return Animation(frames, durations, layers, [c.name for c in clips])


def schedule(layers: int, tween: int = 3, step_s: float = 0.7, tween_s: float = 0.08, hold_s: float = 2.0
             ) -> tuple[list[float], list[float]]:
    """Every frame's layer position (0-based, fractions blend) and how long it shows (seconds)."""
    positions, durations = [], []
    for layer in range(layers):
        positions.append(float(layer))
        durations.append(hold_s if layer in (0, layers - 1) else step_s)
        if layer < layers - 1:
            positions += [layer + k / (tween + 1) for k in range(1, tween + 1)]
            durations += [tween_s] * tween
    return positions, durations


# ----------------------------------------------------------------------------- files


def write_gif(anim: Animation, path: str | Path) -> Path:
    """A looping GIF with the per-frame durations.

    One 256-colour palette for every frame (fitted to a sample of them), so
    colours do not flicker between frames and the file stays small; written by Pillow, the
    library ``imageio`` itself uses for GIF.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    palette = _palette(anim.frames)
    frames = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in anim.frames]
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], loop=0, optimize=False,
                   duration=[round(d * 1000) for d in anim.durations], disposal=1)
    return path


def _palette(frames: Sequence[Image.Image]) -> Image.Image:
    """A 256-colour palette fitted to every second frame and the last (at half size, side by side).

    Octree, not median cut: median cut spent its colours on the photo and left the heat map's
    gradient in visible bands (posterised); the octree palette keeps the gradient smooth, and the
    file comes out smaller (measured on the cat: 39.3 vs 37.1 dB, 2.7 vs 4.0 MB).
    Not dithered: dithering speckles fine detail (whiskers, text) and doubles the file size.
    """
    pick = list(frames[::2]) + [frames[-1]]
    w, h = (max(1, v // 2) for v in pick[0].size)
    sheet = Image.new("RGB", (w * len(pick), h))
    for i, f in enumerate(pick):
        sheet.paste(f.resize((w, h), Image.Resampling.NEAREST), (i * w, 0))
    return sheet.quantize(colors=256, method=Image.Quantize.FASTOCTREE)


def write_mp4(anim: Animation, path: str | Path, fps: int = MP4_FPS) -> Path:
    """An H.264 MP4 (yuv420p) at ``fps``; each frame repeated to last its duration."""
    import imageio.v2 as iio2

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = iio2.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", quality=8,
                        pixelformat="yuv420p", macro_block_size=2, ffmpeg_log_level="error")
    try:
        for frame, n in zip(anim.frames, anim.mp4_repeats(fps)):
            a = np.asarray(frame)
            for _ in range(n):
                w.append_data(a)
    finally:
        w.close()
    return path


SLIDE_S, HOLD_S = 0.8, 2.0  # seconds a still frame shows; the first and the last: longer


def slideshow(frames: Sequence[Image.Image]) -> Animation:
    """Still frames one after another (a training run's snapshots): each for :data:`SLIDE_S`, the
    first and the last for :data:`HOLD_S`."""
    durations = [HOLD_S if i in (0, len(frames) - 1) else SLIDE_S for i in range(len(frames))]
    return Animation(list(frames), durations, layers=len(frames))


def write_slideshow(paths: Sequence[str | Path], stem: str | Path) -> tuple[Path, Path]:
    """The frames at ``paths`` (PNGs of one size) as ``stem.gif`` and ``stem.mp4``."""
    frames = []
    for p in paths:
        with Image.open(p) as im:
            frames.append(im.convert("RGB"))
    anim = slideshow(frames)
    stem = Path(stem)
    return write_gif(anim, stem.with_suffix(".gif")), write_mp4(anim, stem.with_suffix(".mp4"))


def write(anim: Animation, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``anim`` as GIF or MP4 (``fmt``, default from the suffix)."""
    fmt = (fmt or Path(path).suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ValueError(f"{Path(path).name}: animations are .gif or .mp4, not {fmt!r}")
    return write_gif(anim, path) if fmt == "gif" else write_mp4(anim, path)


def animate_image(
    lm, image: Image.Image, path: str | Path, fmt: str = "gif", separate: bool = False, head: int | None = None,
    target: int | None = None, cmap: str = "inferno", alpha: float = 0.6, width: int | None = None,
) -> dict:
    """Analyse ``image`` with ``lm`` (a LoadedModel) and write its animation(s) of the three
    :data:`CLIPS`, captioned with the model's name and its prediction.

    ``separate``: one file per clip, named ``STEM_CLIP.EXT``; else one file at ``path``.
    Returns a record: the files written, their frame counts, each clip's colour scale and
    the class the relevance explains.
    """
    if fmt not in FORMATS:
        raise ValueError(f"animations are {' or '.join(FORMATS)}, not {fmt!r}")
    x, picture = preprocess(image, lm.data_config)
    made, info = layer_clips(lm.model, x[None].to(lm.device), CLIPS, head, target, lm.labels)
    caption = lm.name + (f"  ·  predicted: {info['label']} ({info['prob'] * 100:.1f}%)" if info else "")
    width = width or DEFAULT_WIDTH[fmt]
    path = Path(path)
    record: dict = {"format": fmt, "layers": made[0].maps.shape[0], "files": [], "frames": [], **info}
    record["scales"] = {c.name: [c.vmin, c.vmax] for c in made}
    for group in [[c] for c in made] if separate else [made]:
        out = path.with_name(f"{path.stem}_{group[0].name}{path.suffix}") if separate else path
        anim = render(picture, group, caption, cmap, alpha, width)
        record["files"].append(str(write(anim, out, fmt)))
        record["frames"].append(len(anim.frames) if fmt == "gif" else anim.mp4_frame_count())
        record["size"] = list(anim.frames[0].size)
    return record
