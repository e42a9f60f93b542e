"""One record per (image, model): everything the app and the CLI show, computed once.

The slow part (a forward pass that captures attention; one backward pass per class for the
class-specific maps) happens here, once. Every slider, head, colormap or query-patch change is
then a cheap function of the cached record, which is what makes the app feel instant.
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from . import methods
from .budget import DEFAULT_CACHE_MB, MB, ByteLRU, image_nbytes, tensor_nbytes
from .checkpoints.load import LoadedModel
from .labels import topk as topk_of
from .methods.attention import in_float32
from .model import TokenLayout, ViTConfig
from .preprocess import preprocess
from .progress import reporting


def image_key(img: Image.Image) -> str:
    """A content hash of the decoded pixels (same picture, same key, whatever the file name)."""
    h = hashlib.sha256(f"{img.mode}{img.size}".encode())
    h.update(img.tobytes())
    return h.hexdigest()[:24]


@dataclass
class Analysis:
    """The cached result of analysing one image with one model."""

    key: str
    model_name: str
    picture: Image.Image  # what the model sees: resized and center-cropped RGB
    x: torch.Tensor  # [1, 3, H, W] normalised input
    logits: torch.Tensor  # [classes]
    attentions: list[torch.Tensor]  # per layer [1, heads, N, N]
    layout: TokenLayout
    patch_size: int
    labels: tuple[str, ...]
    forward_s: float
    windows: tuple[int, ...] = ()  # per layer: its attention window in patches a side, 0 global; (): none windowed
    class_maps: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    # set by the AnalysisCache that keeps it: room(nbytes) makes room in the cache's budget for work on it
    room: Callable[[int], Any] | None = field(default=None, repr=False, compare=False)
    # held while class-specific maps are computed: a second caller (a tab opened meanwhile) waits for them
    # and reads them, instead of running the same backward passes beside the first
    busy: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.softmax(-1)

    @property
    def depth(self) -> int:
        return len(self.attentions)

    @property
    def num_heads(self) -> int:
        return self.attentions[0].shape[1]

    @property
    def window(self) -> int:
        """The windowed layers' attention window in patches a side (0: no layer windowed)."""
        return max(self.windows, default=0)

    @property
    def top1(self) -> int:
        return int(self.logits.argmax())

    def topk(self, k: int = 5) -> list[dict[str, Any]]:
        return topk_of(self.probs, k, self.labels)


@torch.inference_mode()
def analyze(lm: LoadedModel, img: Image.Image) -> Analysis:
    """Preprocess, then one forward pass that captures every layer's attention."""
    x, picture = preprocess(img, lm.input_config(img.size))
    x = x[None].to(lm.device)
    t0 = time.perf_counter()
    out = lm.model(x, capture=True)  # in the model's precision (lm.precision)
    dt = time.perf_counter() - t0
    out = in_float32(out)  # the attention kept in float32 whatever the model ran in
    logits = out.logits[0].float().cpu()
    if lm.model.cfg.num_classes == 0:  # headless: no classes, only features
        logits = torch.zeros(0)
    return Analysis(
        key=image_key(img),
        model_name=lm.name,
        picture=picture,
        x=x,
        logits=logits,
        attentions=[a.float().cpu() for a in out.attentions],
        layout=out.layout.cpu(),
        patch_size=lm.model.cfg.patch_size,
        labels=lm.labels,
        forward_s=dt,
        windows=layer_windows(lm.model.cfg),
    )


def layer_windows(cfg: ViTConfig) -> tuple[int, ...]:
    """Each layer's attention window in patches a side (0: the whole grid); () when no layer is
    windowed (SAM's encoder: windows in most blocks, a few global ones)."""
    if not cfg.window_size:
        return ()
    return tuple(0 if i in cfg.global_blocks else cfg.window_size for i in range(cfg.depth))


def class_maps(analysis: Analysis, lm: LoadedModel, cls: int | None = None, names: Sequence[str] | None = None
               ) -> dict[str, np.ndarray]:
    """Every single-pass class-specific method's map for class ``cls`` (default: top-1),
    [gh, gw] each, computed together (:func:`vit_demo.methods.reuse`: the gradient passes they
    share run once) and cached on the record. ``names``: only these methods (those not cached
    yet are computed; the dict returned holds whatever is cached)."""
    if lm.model.cfg.num_classes == 0:
        raise ValueError(f"{lm.name} is headless: class-specific maps need a classifier")
    cls = analysis.top1 if cls is None else int(cls)
    wanted = methods.names(slow=False, class_specific=True) if names is None else list(names)
    with analysis.busy:  # one computation per record at a time; whoever waited finds the maps cached
        maps = dict(analysis.class_maps.get(cls, {}))
        todo = [n for n in wanted if n not in maps]
        if todo:
            with _room(analysis, backward_working_set(lm)), methods.reuse(lm.model, analysis.x):
                for name in todo:
                    maps[name] = methods.get(name)(lm.model, analysis.x, cls)[0].detach().cpu().numpy()
            analysis.class_maps[cls] = maps  # all at once: a failed pass leaves no half-filled entry
        return analysis.class_maps.setdefault(cls, maps)  # the record's own dict: on_demand_map adds to it


def _room(a: Analysis, nbytes: int):
    """Room for ``nbytes`` of work on ``a`` in the budget of the cache that keeps it (if one does)."""
    return a.room(nbytes) if a.room is not None else nullcontext()


def attention_nbytes(lm: LoadedModel) -> int:
    """Bytes of one forward pass's attention maps for ``lm`` (every layer and head, float32)."""
    cfg = lm.model.cfg
    gh, gw = cfg.grid_size
    if cfg.naflex:  # any grid within the patch budget of its data config (see LoadedModel.input_config)
        gh, gw = (s // cfg.patch_size for s in lm.data_config.input_size)
    n = gh * gw + cfg.num_prefix_tokens
    return cfg.depth * cfg.num_heads * n * n * 4


def forward_working_set(lm: LoadedModel) -> int:
    """Bytes an :func:`analyze` of ``lm`` takes while it runs: the attention it captures, plus
    the scores and softmax of the layer being computed."""
    cfg = lm.model.cfg
    return attention_nbytes(lm) * (cfg.depth + 3) // cfg.depth


def backward_working_set(lm: LoadedModel) -> int:
    """Bytes the class-specific maps of ``lm`` take while they are computed: measured on a
    ViT-B/8 (785 tokens, benchmarks/bench_memory.py --class-maps), the attention maps of the
    gradient passes, their gradients and relevances come to about five times one forward pass's
    attention (1.8 GB)."""
    return 5 * attention_nbytes(lm)


def analysis_nbytes(analysis: Analysis) -> int:
    """Bytes one analysis holds: attention (it dominates: layers x heads x N x N floats), the
    input tensor, the logits, the class-specific maps so far and the model-input picture."""
    return image_nbytes(analysis.picture) + tensor_nbytes([analysis.x, analysis.logits, analysis.attentions, analysis.class_maps])


def on_demand_map(analysis: Analysis, lm: LoadedModel, name: str, cls: int | None = None,
                  progress: Callable[[float], Any] | None = None, settings: Any = None) -> np.ndarray:
    """A slow method's map (:func:`vit_demo.methods.slow`: RISE, causal LRP, ...) for class
    ``cls`` (default top-1), cached on the record next to :func:`class_maps`, whose maps it may
    reuse (causal LRP starts from the cached gated LRP map). ``progress(share done)`` follows
    its forward passes (default: whatever :func:`vit_demo.progress.reporting` the caller set up);
    ``settings``: passed on to the method (default: the registry's)."""
    if name not in methods.slow():
        raise ValueError(f"unknown on-demand method {name!r}; known: {', '.join(methods.slow())}")
    cls = analysis.top1 if cls is None else int(cls)
    maps = class_maps(analysis, lm, cls)
    if name not in maps:
        known = {(n, cls): torch.from_numpy(m)[None].to(analysis.x.device) for n, m in maps.items()}
        extra = {"settings": settings} if settings is not None else {}
        shown = reporting(lambda share, _text: progress(share)) if progress is not None else nullcontext()
        with _room(analysis, backward_working_set(lm)), methods.reuse(lm.model, analysis.x, known), shown:
            maps[name] = methods.get(name).fn(lm.model, analysis.x, cls, **extra)[0].detach().cpu().numpy()
    return maps[name]


class AnalysisCache:
    """A thread-safe LRU of analyses keyed by (model, image content), bounded by bytes.

    ``max_bytes`` is the budget for all analyses together (default 1 GiB: about 3 ViT-B/8
    analyses or 500 DeiT-Tiny ones). An analysis larger than the whole budget is still
    returned, but not kept; an evicted one is simply computed again when its photo comes back.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_MB * MB) -> None:
        """``max_bytes``: the budget of the analyses kept AND of the ones being computed."""
        self._lru: ByteLRU[tuple[str, str], Analysis] = ByteLRU(max_bytes, analysis_nbytes)
        self.hits = self.misses = 0

    @staticmethod
    def key(lm: LoadedModel, img: Image.Image) -> tuple[str, str]:
        return f"{lm.name}|{lm.source}", image_key(img)

    def get(self, lm: LoadedModel, img: Image.Image) -> Analysis:
        key = self.key(lm, img)
        a = self._lru.get(key)
        if a is not None:
            self._lru.reweigh(key)  # class-specific maps may have been added since it was stored
            self.hits += 1
            return a
        with self._lru.reserve(forward_working_set(lm)):  # the analysis in flight counts in the budget
            a = analyze(lm, img)  # outside any lock: concurrent users analyse in parallel
        self.misses += 1
        ref = weakref.ref(a)
        a.room = lambda nbytes: self.room(nbytes, keep=ref())  # its class maps' work counts in the budget too
        self._lru.put(key, a)
        return a

    def room(self, nbytes: int, keep: Analysis | None = None):
        """A block that needs ``nbytes`` of working memory (a backward pass, a slow method):
        the least recently used analyses leave to make room for it, never ``keep`` (the one
        it works on)."""
        protect = [k for k in self._lru.keys() if keep is not None and self._lru.get_quiet(k) is keep]
        return self._lru.reserve(nbytes, protect)

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes the kept analyses hold now (at most ``max_bytes``)."""
        return self._lru.nbytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def __len__(self) -> int:
        return len(self._lru)
