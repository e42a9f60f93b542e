"""What the app shows, as plain Python: no Gradio here.

:mod:`vit_demo.ui` only lays out components and wires events to the functions below. Each
view is a cheap function of a cached :class:`~vit_demo.analysis.Analysis` and the view
settings (layer, head, query patch, colormap...), so a slider move never re-runs the model.

- :class:`ModelRegistry`: the models a user can pick (checkpoints found on disk, a
  random-weights model, hub names tried only when picked), loaded lazily and kept in a small
  LRU with their timm twins.
- :func:`open_image`: a user's upload -> RGB picture, or one readable :class:`ImageError`.
- ``*_view`` functions: (analysis, settings) -> PIL pictures and captions for the app.
- ``*_export`` functions: the same views as slide-ready PNG files (matplotlib, 2400 px wide).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from . import explain, viz
from .analysis import Analysis, AnalysisCache, analyze, class_maps
from .images import ImageError, load_image
from .weights import LoadedModel, discover_checkpoints, load_model, weights_dir

# ----------------------------------------------------------------------------- constants

RANDOM_MODEL = "deit_tiny_patch16_224"
HUB_MODELS = (  # offered when the user wants pretrained weights from the hub (tried only when picked)
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_base_distilled_patch16_224",
    "deit3_small_patch16_224",
    "vit_base_patch16_224",
    "vit_small_patch16_224.dino",
)
MIN_SIDE = 16  # px: smaller pictures hold less than one patch of information
EXPORT_WIDTH = 2400  # px: slide resolution of every downloadable figure
VIEW_SIZE = 448  # px: longer side of the single-map pictures shown in the app
CLASS_TOKEN = "[class] token"
PATCH_QUERY = "a patch (click the picture)"
HEAD_ALL, HEAD_MEAN, HEAD_LAYERS = "all", "mean", "layers"
COLORMAPS = ("inferno", "magma", "viridis", "plasma", "turbo", "jet", "gray")
FUSIONS = ("mean", "max", "min")


# ----------------------------------------------------------------------------- drawing helpers


def _token_color(name: str) -> str:
    kind = "reg" if name.startswith("[reg") else "dist" if name == "[dist]" else "class"
    return viz.TOKEN_COLORS.get(kind, "#7b3fa0")


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the model menu. ``key`` is what the menu and the API pass around."""

    key: str  # "file:/abs/path", "random:NAME" or "hub:NAME"
    label: str
    kind: str  # "file", "random", "hub"
    name: str | None  # timm architecture name (None: read it from the file)
    path: Path | None = None


class ModelError(ValueError):
    """A model that cannot be loaded, in one readable line."""


def _file_label(path: Path, name: str | None) -> str:
    arch = name or path.name.split(".")[0]
    return f"{arch}  ·  {path.name}"


class ModelRegistry:
    """The models on offer, loaded on first use and kept (at most ``max_loaded``) in memory.

    ``weights``: checkpoint files given on the command line (``--weights``); ``model_name``:
    the architecture for them (``--model``) and the model to select first. ``allow_paths``:
    whether a user may load any checkpoint path from the UI (off when the app is exposed).
    """

    def __init__(
        self,
        weights: Sequence[str | os.PathLike] = (),
        model_name: str | None = None,
        hub_names: Sequence[str] = HUB_MODELS,
        device: str = "cpu",
        max_loaded: int = 3,
        allow_paths: bool = True,
    ) -> None:
        self.device = device
        self.max_loaded = max_loaded
        self.allow_paths = allow_paths
        self.model_name = model_name
        self._specs: dict[str, ModelSpec] = {}
        self._private: set[str] = set()  # keys one session added (an upload, a typed path): not on everyone's menu
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._twins: OrderedDict[str, Any] = OrderedDict()
        self._pos: dict[str, Image.Image] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        given = [Path(w) for w in weights]
        for p in given:
            self._add(self._file_spec(p, model_name))
        for p in discover_checkpoints():
            spec = self._file_spec(p, None)
            if spec.key not in self._specs:
                self._add(spec)
        self.has_checkpoint = bool(self._specs)
        self._add(ModelSpec(f"random:{RANDOM_MODEL}", f"{RANDOM_MODEL}  ·  RANDOM weights (no checkpoint needed)",
                            "random", RANDOM_MODEL))
        names = list(hub_names)
        if model_name and model_name not in names and not given:
            names.insert(0, model_name)
        for n in names:
            self._add(ModelSpec(f"hub:{n}", f"{n}  ·  download from the hub (needs internet)", "hub", n))
        self.analyses = AnalysisCache()

    # -- the menu

    @staticmethod
    def _file_spec(path: Path, name: str | None) -> ModelSpec:
        p = path.expanduser().resolve()
        return ModelSpec(f"file:{p}", _file_label(p, name), "file", name, p)

    def _add(self, spec: ModelSpec) -> ModelSpec:
        self._specs.setdefault(spec.key, spec)
        return self._specs[spec.key]

    def specs(self, extra: Sequence[str] = ()) -> list[ModelSpec]:
        """The public menu, plus the session's own checkpoints (``extra`` keys) after the files."""
        base = [s for s in self._specs.values() if not s.key.startswith("file:") or s.key not in self._private]
        mine = [self._specs[k] for k in extra if k in self._specs and k in self._private]
        files = [s for s in base if s.kind == "file"]
        rest = [s for s in base if s.kind != "file"]
        return files + mine + rest

    def choices(self, extra: Sequence[str] = ()) -> list[tuple[str, str]]:
        return [(s.label, s.key) for s in self.specs(extra)]

    def default_key(self) -> str:
        """The first checkpoint (``--weights`` first), else the model named by ``--model`` when it
        has a local file, else the random-weights model. Never the hub: start-up stays offline."""
        files = [s for s in self._specs.values() if s.kind == "file" and s.key not in self._private]
        if self.model_name:
            named = [s for s in files
                     if s.name == self.model_name or (s.path and s.path.name.startswith(self.model_name))]
            if named:
                return named[0].key
        return files[0].key if files else f"random:{RANDOM_MODEL}"

    def spec(self, key: str) -> ModelSpec:
        if key in self._specs:
            return self._specs[key]
        raise ModelError(f"unknown model {key!r}: pick one from the menu")

    def add_checkpoint(self, path: str | os.PathLike, name: str | None = None, uploaded: bool = False) -> ModelSpec:
        """A checkpoint the user pointed at from the UI (a typed path or an upload). It is
        loaded right away, only through :mod:`vit_demo.port` (safetensors, or ``torch.load``
        with ``weights_only=True``), so a file that is not a checkpoint fails here."""
        if not uploaded and not self.allow_paths:
            raise ModelError("loading a server-side path is disabled while the app is exposed; upload the file instead")
        p = Path(str(path).strip().strip('"').strip("'")).expanduser()
        if not str(path).strip():
            raise ModelError("give the path of a checkpoint file (.safetensors, .pth, .bin or .npz)")
        if not p.is_file():
            raise ModelError(f"{p}: no such file")
        spec = self._file_spec(p, (name or "").strip() or None)
        if spec.key in self._specs and spec.key not in self._private:  # already on everyone's menu
            self.get(spec.key)
            return self._specs[spec.key]
        if uploaded:
            label = f"{spec.name or 'uploaded'}  ·  {p.name} (uploaded)"
            spec = ModelSpec(spec.key, label, "file", spec.name, spec.path)
        with self._lock:
            self._specs[spec.key] = spec
            self._private.add(spec.key)
            self._loaded.pop(spec.key, None)  # the same path with another architecture name: reload
        try:
            self.get(spec.key)  # fail now, with the loader's message, rather than on the next image
        except ModelError:
            with self._lock:
                self._specs.pop(spec.key, None)
                self._private.discard(spec.key)
            raise
        return spec

    # -- loading

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, key: str) -> LoadedModel:
        """The loaded model for ``key`` (loading it once; other sessions wait for that load)."""
        spec = self.spec(key)
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
        with self._key_lock(key):
            with self._lock:
                if key in self._loaded:
                    return self._loaded[key]
            lm = self._load(spec)
            with self._lock:
                self._loaded[key] = lm
                while len(self._loaded) > self.max_loaded:
                    old, _ = self._loaded.popitem(last=False)
                    self._twins.pop(old, None)
            return lm

    def _load(self, spec: ModelSpec) -> LoadedModel:
        from .port import CheckpointError, HubUnavailableError, UnsupportedModelError

        try:
            if spec.kind == "file":
                lm = load_model(spec.name, spec.path, device=self.device)
            elif spec.kind == "random":
                lm = load_model(spec.name, random_init=True, device=self.device)
            else:
                lm = load_model(spec.name, device=self.device)
        except (CheckpointError, HubUnavailableError, UnsupportedModelError, ValueError, OSError) as e:
            raise ModelError(str(e)) from e
        if spec.kind == "file" and spec.name is None and lm.timm_name is None:
            lm.name = spec.path.name if spec.path else lm.name
        return lm

    def is_private(self, key: str) -> bool:
        """A checkpoint one session added (shown on that session's menu only)."""
        return key in self._private

    def is_loaded(self, key: str) -> bool:
        return key in self._loaded

    def timm_twin(self, key: str) -> Any:
        """timm's own model with the same weights, built once per model."""
        from .verify import timm_twin

        lm = self.get(key)
        with self._key_lock("twin:" + key):
            if key not in self._twins:
                spec = self.spec(key)
                try:
                    self._twins[key] = timm_twin(lm, spec.path if spec.kind == "file" else None)
                except Exception as e:  # an architecture timm cannot build with these weights
                    why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                    raise ModelError(f"cannot build timm's {lm.timm_name or lm.name}: {why}") from e
                while len(self._twins) > 2:
                    self._twins.popitem(last=False)
            return self._twins[key]

    def analyze(self, key: str, img: Image.Image) -> Analysis:
        return self.analyses.get(self.get(key), img)

    def pos_embed_picture(self, key: str, width: int = 1100) -> Image.Image:
        """The model's position-embedding similarity figure (depends on the model only)."""
        if key not in self._pos:
            lm = self.get(key)
            fig = viz.pos_embed_figure(explain.pos_embed_similarity(lm.model).cpu(),
                                       title=f"Position-embedding similarity · {lm.name}")
            self._pos[key] = viz.figure_to_image(fig, width)
        return self._pos[key]

    def warm_up(self, key: str | None = None) -> None:
        """Load the default model and run it once (first calls are slow), for a snappy first image."""
        key = key or self.default_key()
        lm = self.get(key)
        img = Image.new("RGB", tuple(reversed(lm.data_config.input_size)), (128, 128, 128))
        a = analyze(lm, img)  # not kept: a grey square is nobody's photo (and 0.35 GB for a ViT-B/8)
        if lm.model.cfg.num_classes:
            class_maps(a, lm)
        attention_view(a, a.depth - 1, HEAD_ALL, None)


def model_summary(lm: LoadedModel) -> str:
    """One line a presenter can read out."""
    cfg = lm.model.cfg
    gh, gw = cfg.grid_size
    prefix = ", ".join(lm.model.layout((gh, gw)).names()) or "no prefix tokens"
    head = f"{cfg.num_classes} classes" if cfg.num_classes else "no classifier (features only)"
    warn = "  **Random weights**: the machinery is real, the predictions are noise." if lm.random_weights else ""
    source = f"`{Path(lm.source[5:]).name}`" if lm.source.startswith("file ") else lm.source
    return (f"**{lm.name}**: {cfg.depth} layers × {cfg.num_heads} heads, width {cfg.embed_dim}, "
            f"{lm.model.num_params / 1e6:.1f} M parameters, {cfg.patch_size}-px patches, tokens: {prefix}; "
            f"{head}. Weights: {source}.{warn}")


def no_checkpoint_message() -> str:
    return (f"**No checkpoint found** (looked in `{weights_dir()}` and `$VIT_DEMO_WEIGHTS`), so predictions "
            "need one: see `weights/README.md` (port one with `python -m vit_demo port --model "
            "deit_tiny_patch16_224` when online, or start with `python app.py --weights FILE`), or load a "
            "file under *Use your own checkpoint*. Meanwhile the model below has **random weights**: "
            "every step is real, the predictions are noise.")


# ----------------------------------------------------------------------------- images


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


# ----------------------------------------------------------------------------- predictions

@lru_cache(maxsize=8)
def _duplicates(labels: tuple[str, ...]) -> frozenset[str]:
    """Names that more than one class shares (ImageNet has two "crane"s and two "maillot"s)."""
    seen: set[str] = set()
    dup = {n for n in labels if n in seen or seen.add(n)}
    return frozenset(dup)


def _display_label(a: Analysis, index: int) -> str:
    name = a.labels[index]
    return f"{name} (class {index})" if name in _duplicates(a.labels) else name


def predictions(a: Analysis, k: int = 5) -> dict[str, float]:
    """``{label: probability}`` for gr.Label, most likely first (duplicate names get their index)."""
    if not a.logits.numel():
        return {}
    return {_display_label(a, t["index"]): t["prob"] for t in a.topk(int(k))}


def predictions_json(a: Analysis, k: int = 5) -> list[dict[str, Any]]:
    """The same top-k as the CLI's ``predict --json``: ``[{"index", "label", "prob"}]``."""
    return a.topk(int(k)) if a.logits.numel() else []


def class_choices(a: Analysis, k: int = 5) -> list[tuple[str, int]]:
    """(menu text, class index) for the top-k classes, for the class-specific maps."""
    top = a.topk(max(5, int(k)))
    return [(f"{i + 1}. {t['label']} ({t['prob'] * 100:.1f}%)", t["index"]) for i, t in enumerate(top)]


# ----------------------------------------------------------------------------- input and patches


def input_caption(a: Analysis, up: Upload, lm: LoadedModel) -> str:
    dc = lm.data_config
    h, w = dc.input_size
    return (f"**What the model sees**: {w}×{h} px, cut from your {up.size[0]}×{up.size[1]} px image. "
            f"Steps: {dc.describe()}.")


def input_picture(a: Analysis, size: int = VIEW_SIZE) -> Image.Image:
    """The model-input picture, enlarged without smoothing so the pixels stay honest."""
    pic = a.picture
    s = max(1, size // max(pic.size))
    return pic.resize((pic.width * s, pic.height * s), Image.Resampling.NEAREST) if s > 1 else pic


def patch_caption(a: Analysis, lm: LoadedModel) -> str:
    gh, gw = a.layout.grid
    n = gh * gw
    names = a.layout.names()
    prefix = " ".join(f"`{t}`" for t in names)
    seq = f"{prefix} + {n} patches = **{len(names) + n} tokens**" if names else f"{n} patches = **{n} tokens**"
    return (f"**{a.patch_size}×{a.patch_size}-px patches → a {gh}×{gw} grid = {n} patches**, numbered in the "
            f"order the transformer reads them (left to right, top to bottom). Each patch becomes one "
            f"{lm.model.cfg.embed_dim}-number vector; the sequence is {seq}. Click a patch to make it the query "
            f"in the attention explorer.")


def patch_picture(a: Analysis, highlight: int | None = None, numbers: bool = True) -> Image.Image:
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=numbers, highlight=highlight)


def patch_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`patch_picture` without drawing it."""
    scale = max(1, math.ceil(32 / a.patch_size))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def query_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`query_picture` without drawing it."""
    scale = max(1, round(VIEW_SIZE / max(a.picture.size)))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def click_to_patch(a: Analysis, x: float, y: float, size: tuple[int, int]) -> int:
    """The patch under a click at pixel (x, y) of a picture of ``size`` showing the model input."""
    return viz.patch_index_at(x, y, size, a.layout.grid)


def sequence_picture(
    a: Analysis, highlight: int | None = None, width: int = 1120, embed_dim: int | None = None
) -> Image.Image:
    """The flattened sequence the transformer reads (fast: PIL): the prefix tokens, then the
    patches left to right, top to bottom (the first ones, an ellipsis, the last ones, and the
    ``highlight`` patch wherever it sits), each with its patch number above and its position in
    the sequence below."""
    P, n, p = a.layout.num_prefix, a.layout.num_patches, a.patch_size
    names = a.layout.names()
    pic = np.asarray(a.picture)
    gw = a.layout.grid[1]
    box, gap = 56, 10
    slots_fit = max(6, (width - 110) // (box + gap))
    tail = 3
    first = max(2, slots_fit - P - tail - 1 - (2 if highlight is not None else 0))
    shown: list[int | None] = list(range(min(first, n)))
    if highlight is not None and first <= highlight < n - tail:
        if highlight > first:
            shown.append(None)
        shown.append(highlight)
    if n > len([s for s in shown if s is not None]):
        if shown[-1] is not None and shown[-1] + 1 < n - tail:
            shown.append(None)
        shown += [i for i in range(max(n - tail, (shown[-1] or 0) + 1), n)]
    slots: list[tuple[str, Any]] = [("prefix", t) for t in names]
    slots += [("patch", i) if i is not None else ("dots", None) for i in shown]

    title_font, small, tiny = viz.text_font(17, bold=True), viz.text_font(13), viz.text_font(12, bold=True)
    height = 250
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    total = len(slots) * (box + gap) - gap
    x0 = max(80, (width - total) // 2)
    y_box = 86
    head = f"{' + '.join(names)} + {n} patches = {P + n} tokens" if names else f"{n} patches = {n} tokens"
    draw.text((width / 2, 20), f"The sequence the transformer reads: {head}", font=title_font, fill=(34, 34, 34),
              anchor="mm")
    draw.text((x0 - 8, y_box - 14), "patch", font=small, fill=(102, 102, 102), anchor="rm")
    draw.text((x0 - 8, y_box + box + 16), "position", font=small, fill=(102, 102, 102), anchor="rm")
    for k, (kind, val) in enumerate(slots):
        x = x0 + k * (box + gap)
        if kind == "prefix":
            colour = _token_color(val)
            draw.rounded_rectangle((x, y_box, x + box, y_box + box), radius=8, fill=colour)
            draw.text((x + box / 2, y_box + box / 2), val, font=tiny, fill="white", anchor="mm")
            pos = k
        elif kind == "patch":
            r, c = divmod(val, gw)
            cut = pic[r * p:(r + 1) * p, c * p:(c + 1) * p]
            thumb = Image.fromarray(cut).resize((box, box), Image.Resampling.NEAREST)
            img.paste(thumb, (x, y_box))
            hl = val == highlight
            draw.rectangle((x - 1, y_box - 1, x + box, y_box + box), outline=(0, 229, 255) if hl else (136, 136, 136),
                           width=3 if hl else 1)
            draw.text((x + box / 2, y_box - 14), str(val), font=small, fill=(34, 34, 34), anchor="mm")
            pos = P + val
        else:
            draw.text((x + box / 2, y_box + box / 2), "…", font=title_font, fill=(102, 102, 102), anchor="mm")
            continue
        draw.rounded_rectangle((x + 8, y_box + box + 6, x + box - 8, y_box + box + 26), radius=6, fill=(155, 143, 184))
        draw.text((x + box / 2, y_box + box + 16), str(pos), font=tiny, fill="white", anchor="mm")
    dim = f"a {embed_dim}-number vector" if embed_dim else "one vector"
    lines = [
        f"Each {p}×{p}×3-pixel patch is flattened and projected to {dim}; "
        + (f"{' and '.join(names)} {'are learned vectors' if len(names) > 1 else 'is a learned vector'} "
           "of the same size." if names else "there are no extra tokens."),
        "A learned position embedding is added to every token: the model is told where each patch came from.",
    ]
    for i, line in enumerate(lines):
        draw.text((width / 2, 192 + i * 22), line, font=small, fill=(102, 102, 102), anchor="mm")
    return img


# ----------------------------------------------------------------------------- attention explorer


def head_choices(num_heads: int) -> list[tuple[str, str]]:
    return ([("all heads (grid)", HEAD_ALL), ("mean of the heads", HEAD_MEAN)]
            + [(f"head {h}", str(h)) for h in range(num_heads)]
            + [("every layer × every head", HEAD_LAYERS)])


def _head(head: str | int | None) -> str | int:
    if head in (None, "", HEAD_MEAN):
        return HEAD_MEAN
    if head in (HEAD_ALL, HEAD_LAYERS):
        return head
    try:
        return int(head)
    except (TypeError, ValueError):
        return HEAD_ALL


def _query_label(a: Analysis, query: int | None) -> str:
    if query is None:
        if a.layout.cls_index is None:
            return "every patch (mean; this model has no [class] token)"
        return "the [class] token"
    r, c = divmod(query, a.layout.grid[1])
    return f"patch {query} (row {r}, column {c})"


def prefix_share(a: Analysis, layer: int, head: str | int, query: int | None) -> float | None:
    """The fraction of the query's attention that goes to the prefix tokens (not on the map)."""
    P = a.layout.num_prefix
    if not P:
        return None
    att = a.attentions[layer][0]  # [H, N, N]
    rows = att[:, P + query] if query is not None else (
        att[:, a.layout.cls_index] if a.layout.cls_index is not None else att[:, P:].mean(1))
    share = rows[:, :P].sum(-1)  # [H]
    return float(share.mean() if not isinstance(head, int) else share[head])


def attention_maps(a: Analysis, layer: int, head: str | int, query: int | None) -> torch.Tensor:
    """[gh, gw], [H, gh, gw] or [L, H, gh, gw] maps for the explorer's settings."""
    head = _head(head)
    if head == HEAD_LAYERS:
        return explain.head_maps(a.attentions, a.layout, None, query)[0]
    if head == HEAD_ALL:
        return explain.head_maps(a.attentions, a.layout, layer, query)[0]
    h = None if head == HEAD_MEAN else head
    if query is None:
        return explain.cls_attention(a.attentions, a.layout, layer, h)[0]
    return explain.query_attention(a.attentions, a.layout, layer, query, h)[0]


def attention_view(
    a: Analysis,
    layer: int,
    head: str | int | None = HEAD_ALL,
    query: int | None = None,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
) -> tuple[Image.Image, str]:
    """The explorer's picture and a caption that says what it shows."""
    layer = int(np.clip(int(layer), 0, a.depth - 1))
    head = _head(head)
    if isinstance(head, int) and not 0 <= head < a.num_heads:
        head = HEAD_ALL
    if query is not None and not 0 <= query < a.layout.num_patches:
        query = None
    maps = attention_maps(a, layer, head, query)
    who = _query_label(a, query)
    if head == HEAD_LAYERS:
        H = a.num_heads
        tile = 96 if H > 6 else 128
        pic = viz.heads_image(a.picture, maps, cmap, alpha, smooth, tile=tile, mark=query)
        what = f"Where {who} looks in **every layer (rows) and head (columns)**"
    elif head == HEAD_ALL:
        H = a.num_heads
        cols = H if H <= 6 else math.ceil(H / math.ceil(H / 6))
        tile = int(min(300, max(120, 880 // cols)))
        pic = viz.heads_image(a.picture, maps, cmap, alpha, smooth, tile=tile, layer=layer, mark=query)
        what = f"Where {who} looks at **layer {layer}**, each of the {H} heads"
    else:
        pic = viz.overlay_image(a.picture, maps, cmap, alpha, smooth, size=VIEW_SIZE, mark=query)
        which = "the mean of the heads" if head == HEAD_MEAN else f"head {head}"
        what = f"Where {who} looks at **layer {layer}**, {which}"
    share = prefix_share(a, layer, head if head != HEAD_LAYERS else HEAD_MEAN, query) if head != HEAD_LAYERS else None
    extra = ""
    if share is not None:
        names = "/".join(a.layout.names())
        extra = f" {share * 100:.0f}% of its attention goes to {names}, which has no place on the picture."
    caption = (f"{what} (layers and heads count from 0; the model has {a.depth} layers × {a.num_heads} heads). "
               f"Bright = more attention; each map is scaled to its own min–max.{extra}")
    return pic, caption


def query_picture(a: Analysis, query: int | None) -> Image.Image:
    """The model input with its patch grid and the query patch outlined: the click target."""
    scale = max(1, round(VIEW_SIZE / max(a.picture.size)))
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=False, highlight=query, scale=scale)


# ----------------------------------------------------------------------------- rollout and relevance


def method_maps(
    a: Analysis,
    lm: LoadedModel | None,
    fusion: str = "mean",
    discard: float = 0.0,
    start_layer: int = 0,
    cls: int | None = None,
) -> dict[str, np.ndarray]:
    """Every method's map for the side-by-side view. The class-specific maps (one backward
    pass per class, cached on the analysis) only when ``lm`` is given and the class is known."""
    start_layer = int(np.clip(int(start_layer), 0, a.depth - 1))
    out = {
        "Raw attention\nlast layer, mean of heads":
        explain.cls_attention(a.attentions, a.layout, a.depth - 1)[0].numpy(),
        f"Attention rollout\n{fusion} fusion" + (f", discard {float(discard):.0%}" if float(discard) > 0 else "")
        + (f", from layer {start_layer}" if start_layer else ""):
        explain.rollout(a.attentions, a.layout, fusion, float(discard), start_layer)[0].numpy(),
    }
    if lm is not None and a.logits.numel():
        cls = a.top1 if cls is None else int(cls)
        cm = class_maps(a, lm, cls)
        label = a.labels[cls]
        out[f"Gradient rollout\nfor “{label}”"] = cm["grad-rollout"]
        out[f"Chefer relevance\nfor “{label}”"] = cm["chefer"]
    return out


def pending_titles(a: Analysis, cls: int | None) -> list[str]:
    """Titles of the class-specific maps not computed yet (placeholders in the first render)."""
    if not a.logits.numel() or has_class_maps(a, cls):
        return []
    label = a.labels[a.top1 if cls is None else int(cls)]
    return [f"Gradient rollout\nfor “{label}”", f"Chefer relevance\nfor “{label}”"]


def has_class_maps(a: Analysis, cls: int | None) -> bool:
    return a.logits.numel() > 0 and (a.top1 if cls is None else int(cls)) in a.class_maps


def tiles_image(
    picture: Image.Image,
    maps: dict[str, np.ndarray],
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
    tile: int = 260,
    pending: Sequence[str] = (),
) -> Image.Image:
    """Labelled overlays side by side (fast: PIL). A title's first line is bold, a second line
    (after "\\n") smaller. ``pending``: titles of maps still being computed, drawn as grey
    placeholders so the layout does not jump when they arrive."""
    titles = list(maps) + list(pending)
    bold, small = viz.text_font(16, bold=True), viz.text_font(14)
    gap, label_h = 12, 46
    n = len(titles)
    canvas = Image.new("RGB", (n * tile + (n - 1) * gap, tile + label_h), "white")
    draw = ImageDraw.Draw(canvas)

    def fit(text: str, font) -> str:
        while viz.text_width(text, font) > tile and len(text) > 4:
            text = text[:-2].rstrip() + "…"
        return text

    for i, title in enumerate(titles):
        x = i * (tile + gap)
        if title in maps:
            canvas.paste(viz.overlay_image(picture, maps[title], cmap, alpha, smooth, size=(tile, tile)), (x, label_h))
        else:
            draw.rectangle((x, label_h, x + tile - 1, label_h + tile - 1), fill=(236, 236, 236))
            draw.text((x + tile / 2, label_h + tile / 2), "computing…", font=bold, fill=(120, 120, 120), anchor="mm")
        first, _, second = title.partition("\n")
        draw.text((x + tile / 2, 12), fit(first, bold), font=bold, fill=(34, 34, 34), anchor="mm")
        if second:
            draw.text((x + tile / 2, 33), fit(second, small), font=small, fill=(102, 102, 102), anchor="mm")
    return canvas


def methods_caption(a: Analysis, fusion: str, discard: float, start_layer: int, cls: int | None) -> str:
    parts = [
        "**Raw attention**: the [class] token's attention at the last layer, heads averaged.",
        f"**Attention rollout** (Abnar & Zuidema 2020): attention multiplied through the layers {int(start_layer)}–"
        f"{a.depth - 1} with the skip connections, heads fused by *{fusion}*"
        + (f", lowest {float(discard) * 100:.0f}% of each layer's attention discarded." if float(discard) > 0 else "."),
    ]
    if a.logits.numel():
        label = a.labels[a.top1 if cls is None else int(cls)]
        parts.append(f"**Gradient rollout** and **Chefer relevance** (Chefer, Gur & Wolf 2021) explain the class "
                     f"*{label}*: heads weighted by how much that class's score depends on them (one backward pass).")
    else:
        parts.append("This model has no classifier, so there are no class-specific maps.")
    return " ".join(parts)


# ----------------------------------------------------------------------------- diagnostics


def distance_picture(a: Analysis, width: int = 1100) -> Image.Image:
    return viz.figure_to_image(_distance_figure(a), width)


def _distance_figure(a: Analysis):
    d = explain.mean_attention_distance(a.attentions, a.layout, a.patch_size)[0]
    ref = viz.uniform_attention_distance(a.layout.grid, a.patch_size)
    return viz.distance_figure(d, title=f"Mean attention distance · {a.model_name}", reference=ref)


DIAGNOSTICS_CAPTION = (
    "**Mean attention distance** (ViT paper, Dosovitskiy et al. 2021, Fig. 7 right): for each head, how far in pixels "
    "a patch looks on average, weighted by its attention; like a CNN's receptive field. Early layers mix local and "
    "global heads, late layers look far. **Position-embedding similarity** (Fig. 7 centre): each small map shows how "
    "similar one patch's learned position embedding is to all the others; the model learned the 2-D grid from 1-D "
    "positions."
)


# ----------------------------------------------------------------------------- timm comparison


def compare_with_timm(a: Analysis, lm: LoadedModel, tm: Any, k: int = 5) -> dict[str, Any]:
    """Both models on this image (the cached input tensor), with a verdict sentence."""
    from .verify import compare_one, verdict

    c = compare_one(lm.model, tm, a.x, k=int(k), repeats=3)
    c["verdict"] = verdict(c)
    c["identical"] = c["verdict"].startswith("Identical")
    return c


def compare_labels(a: Analysis, c: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    ours = {_display_label(a, i): p for i, p in zip(c["scratch_topk"], c["scratch_probs"])}
    ref = {_display_label(a, i): p for i, p in zip(c["timm_topk"], c["timm_probs"])}
    return ours, ref


def compare_markdown(c: dict[str, Any]) -> str:
    diffs = c["layer_attn_max_diff"]
    rows = " | ".join(f"L{i}" for i in range(len(diffs)))
    vals = " | ".join(f"{d:.1e}" for d in diffs)
    sep = " | ".join("---" for _ in diffs)
    k = len(c["scratch_topk"])
    return "\n".join([
        "| Measure | Scratch vs timm |", "|---|---|",
        f"| max \\|logit difference\\| | {c['max_abs_logit_diff']:.2e} |",
        f"| max \\|probability difference\\| | {c['max_abs_prob_diff']:.2e} |",
        f"| same top-1 | {'yes' if c['top1_agree'] else '**no**'} |",
        f"| same top-{k}, same order | {'yes' if c['topk_agree'] else '**no**'} |",
        f"| time per image (best of 3) | scratch **{c['scratch_ms']:.1f} ms**, timm **{c['timm_ms']:.1f} ms** |",
        "",
        "**Max \\|attention difference\\| per layer** (every head, every token pair):",
        "",
        f"| {rows} |", f"| {sep} |", f"| {vals} |",
    ])


def verdict_markdown(c: dict[str, Any]) -> str:
    mark = "✅" if c["identical"] else "❌"
    return f"### {mark} {c['verdict']}"


# ----------------------------------------------------------------------------- exports (slide PNGs)

_EXPORT_DIR: Path | None = None


def export_dir() -> Path:
    """A private temp folder for exported PNGs; files older than an hour are removed."""
    global _EXPORT_DIR
    if _EXPORT_DIR is None:
        _EXPORT_DIR = Path(tempfile.mkdtemp(prefix="vit_demo_exports_"))
    now = time.time()
    for f in _EXPORT_DIR.glob("*.png"):
        try:
            if now - f.stat().st_mtime > 3600:
                f.unlink()
        except OSError:
            pass
    return _EXPORT_DIR


_VIEW_DIR: Path | None = None
_view_count = 0
_view_lock = threading.Lock()


def save_view(img: Image.Image, fmt: str = "jpeg") -> str:
    """Write a picture for the browser, fast: JPEG (quality 92, ~2 ms) for photos and heat maps,
    PNG at the lowest compression (~15 ms) for pictures with text and thin lines. PIL's default
    PNG compression costs 80-250 ms per picture, more than drawing it. Files older than ten
    minutes are removed (the app's server keeps its own copy)."""
    global _VIEW_DIR, _view_count
    with _view_lock:
        if _VIEW_DIR is None:
            _VIEW_DIR = Path(tempfile.mkdtemp(prefix="vit_demo_views_"))
        _view_count += 1
        n = _view_count
        if n % 200 == 0:
            now = time.time()
            for f in _VIEW_DIR.iterdir():
                try:
                    if now - f.stat().st_mtime > 600:
                        f.unlink()
                except OSError:
                    pass
    path = _VIEW_DIR / f"view_{os.getpid()}_{n:08d}.{'jpg' if fmt == 'jpeg' else 'png'}"
    if fmt == "jpeg":
        img.convert("RGB").save(path, "JPEG", quality=92)
    else:
        img.save(path, "PNG", compress_level=1)
    return str(path)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "image"


def _save(fig, name: str, width: int = EXPORT_WIDTH) -> Path:
    out = export_dir() / f"{slug(name)}.png"
    tmp = Path(tempfile.mkstemp(dir=out.parent, suffix=".png")[1])
    viz.save_figure(fig, tmp, width)
    tmp.replace(out)
    return out


def export_input(a: Analysis, up: Upload, lm: LoadedModel) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.4), layout="constrained", facecolor="white")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.imshow(np.asarray(up.picture))
    ax1.set_title(f"Your image · {up.size[0]}×{up.size[1]} px", fontsize=viz.PANEL_TITLE_SIZE + 1)
    h, w = lm.data_config.input_size
    ax2.imshow(np.asarray(a.picture), interpolation="nearest")
    ax2.set_title(f"What the model sees · {w}×{h} px", fontsize=viz.PANEL_TITLE_SIZE + 1)
    for ax in (ax1, ax2):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.supxlabel(_wrap(lm.data_config.describe(), 110), fontsize=viz.TICK_SIZE, color=viz.MUTED_COLOR)
    return _save(fig, f"{Path(up.name).stem}-input")


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def export_patches(a: Analysis, up: Upload, highlight: int | None) -> Path:
    fig = viz.patch_grid_figure(a.picture, a.patch_size, a.layout.names(), highlight=highlight)
    return _save(fig, f"{Path(up.name).stem}-patches")


def export_predictions(a: Analysis, up: Upload, k: int) -> Path:
    fig = viz.topk_figure(a.topk(int(k)), title=f"Top-{int(k)} predictions · {a.model_name}")
    return _save(fig, f"{Path(up.name).stem}-top{int(k)}")


def export_attention(a: Analysis, up: Upload, layer: int, head: str | int | None, query: int | None,
                     cmap: str, alpha: float, smooth: bool) -> Path:
    head = _head(head)
    layer = int(layer)
    maps = attention_maps(a, layer, head, query)
    who = "[class]" if query is None else f"patch {query}"
    if head == HEAD_LAYERS:
        fig = viz.heads_figure(a.picture, maps, cmap, alpha, smooth, title=f"Attention of {who}, every layer and head",
                               mark=query)
        name = f"{Path(up.name).stem}-attention-all-layers-{slug(who)}"
    elif head == HEAD_ALL:
        fig = viz.heads_figure(a.picture, maps, cmap, alpha, smooth, title=f"Attention of {who} · layer {layer}",
                               layer=layer, mark=query)
        name = f"{Path(up.name).stem}-attention-L{layer}-heads-{slug(who)}"
    else:
        which = "mean of heads" if head == HEAD_MEAN else f"head {head}"
        fig = viz.heatmap_figure(a.picture, maps, cmap, alpha, smooth, show_input=True, mark=query,
                                 title=f"Attention of {who} · layer {layer}, {which}")
        name = f"{Path(up.name).stem}-attention-L{layer}-{slug(which)}-{slug(who)}"
    return _save(fig, name)


def export_methods(a: Analysis, lm: LoadedModel, up: Upload, fusion: str, discard: float, start_layer: int,
                   cls: int | None, cmap: str, alpha: float, smooth: bool) -> Path:
    maps = method_maps(a, lm, fusion, discard, start_layer, cls)
    label = a.labels[a.top1 if cls is None else int(cls)] if a.logits.numel() else ""
    title = f"Where the model looks · {label}" if label else "Where the model looks"
    fig = viz.compare_figure(a.picture, maps, cmap, alpha, smooth, title=title)
    return _save(fig, f"{Path(up.name).stem}-methods-{slug(label)}")


def export_distance(a: Analysis, up: Upload) -> Path:
    return _save(_distance_figure(a), f"{Path(up.name).stem}-attention-distance")


def export_pos_embed(lm: LoadedModel) -> Path:
    sim = explain.pos_embed_similarity(lm.model).cpu()
    fig = viz.pos_embed_figure(sim, title=f"Position-embedding similarity · {lm.name}")
    return _save(fig, f"{lm.name}-position-embeddings")


def export_compare(a: Analysis, up: Upload, c: dict[str, Any]) -> Path:
    from matplotlib.figure import Figure

    diffs = np.maximum(np.asarray(c["layer_attn_max_diff"], dtype=float), 1e-12)
    fig = Figure(figsize=(10, 4.8), layout="constrained", facecolor="white")
    ax = fig.add_subplot()
    ax.bar(np.arange(len(diffs)), diffs, color=viz.ACCENT)
    ax.axhline(1e-4, color="#c0392b", linestyle="--", linewidth=1.2, label="tolerance 1e-4")
    ax.set_yscale("log")
    ax.set_ylim(1e-12, max(1e-3, diffs.max() * 10))
    ax.set_xticks(np.arange(len(diffs)), [f"L{i}" for i in range(len(diffs))])
    ax.set_xlabel("Layer", fontsize=viz.LABEL_SIZE)
    ax.set_ylabel("max |attention difference|", fontsize=viz.LABEL_SIZE)
    ax.legend(frameon=False)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.suptitle(f"Scratch ViT vs timm · {a.model_name}", fontsize=viz.TITLE_SIZE, fontweight="bold")
    ax.set_title(_wrap(c["verdict"], 100), fontsize=viz.TICK_SIZE + 1, color=viz.MUTED_COLOR)
    return _save(fig, f"{Path(up.name).stem}-scratch-vs-timm")
