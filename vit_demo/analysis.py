"""One record per (image, model): everything the app and the CLI show, computed once.

The slow part (a forward pass that captures attention; one backward pass per class for the
class-specific maps) happens here, once. Every slider, head, colormap or query-patch change is
then a cheap function of the cached record, which is what makes the app feel instant.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
from .methods.passes import gradient_lock
from .model import TokenLayout, ViTConfig
from .precision import forced_fp32, full_precision
from .preprocess import preprocess
from .progress import check, handed_over, reporting, time_left, under

MAX_LANES = 2  # lanes a record's class maps run in side by side, at most (two cores: the machine this is tuned on)
PARALLEL_BYTES = 512 * MB  # a model whose backward passes need more runs its maps in one lane (memory, not cores)
MAP_THREADS = 4  # the pool's threads: the lanes of two records at a time


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
    # the class-specific maps being computed, per class (:class:`MapJob`): a second caller (a tab opened
    # meanwhile) waits for them and reads them, instead of running the same backward passes beside the first
    jobs: dict[int, list[MapJob]] = field(default_factory=dict, repr=False, compare=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # guards jobs, class_maps

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
    share run once; in lanes side by side where the cores allow, :func:`map_lanes`) and cached on
    the record. ``names``: only these methods (those not cached yet are computed; the dict returned
    holds whatever is cached). The first lane runs on this thread (its progress reports and time
    limit are the caller's); maps already being computed for the class (:func:`start_class_maps`,
    e.g. right after an upload) are waited for, not computed again."""
    cls, jobs = _jobs_for(analysis, lm, cls, names, here=True)
    for job in jobs:
        if job.here:
            _run_lane(analysis, lm, job, 0)
        job.wait(job.names, whole=True)
    with analysis.lock:
        return analysis.class_maps.setdefault(cls, {})  # the record's own dict: on_demand_map adds to it


def start_class_maps(analysis: Analysis, lm: LoadedModel) -> MapJob | None:
    """Start computing the class-specific maps of the top-1 class in the background, at
    once (the app: as soon as the browser has an upload's first pictures, so that they are ready, or
    nearly, when a tab shows them); returns the job (None: they are cached already, or the model has no classifier).
    :func:`class_maps` and :func:`maps_so_far` read them."""
    if lm.model.cfg.num_classes == 0:
        return None
    _, jobs = _jobs_for(analysis, lm, None, None, here=False)
    return jobs[-1] if jobs else None


def maps_so_far(analysis: Analysis, cls: int | None = None, wait_for: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The maps of ``cls`` (default: top-1) made so far: cached, or made by a job still running. None
    is computed here; those of ``wait_for`` that a job is making are waited for first."""
    cls = analysis.top1 if cls is None else int(cls)
    with analysis.lock:
        jobs = list(analysis.jobs.get(cls, []))
    for job in jobs:
        job.wait([n for n in wait_for if n in job.names])
    with analysis.lock:
        out = dict(analysis.class_maps.get(cls, {}))
    for job in jobs:
        out.update(job.made())
    return out


class MapJob:
    """The class-specific maps of one class of one record being computed: the methods in
    :attr:`lanes` (each lane in order, the lanes side by side), each map in :meth:`made` as soon as
    it is made; the record's ``class_maps`` takes them all when the last lane ends. ``here``: the
    first lane is run by the caller (:func:`class_maps`), the others by the pool's threads."""

    def __init__(self, cls: int, lanes: list[list[str]], here: bool) -> None:
        self.cls, self.lanes, self.here = cls, lanes, here
        self.names = [n for lane in lanes for n in lane]
        self.maps: dict[str, np.ndarray] = {}
        self.error: BaseException | None = None
        self.left = len(lanes)  # lanes still running
        self.cond = threading.Condition()

    def put(self, name: str, m: np.ndarray) -> None:
        with self.cond:
            self.maps[name] = m
            self.cond.notify_all()

    def made(self) -> dict[str, np.ndarray]:
        with self.cond:
            return dict(self.maps)

    def end_lane(self, error: BaseException | None, last: Callable[[], Any]) -> None:
        """One lane has ended (``error``: it failed, and the job with it); the last one calls ``last()``
        (the record takes the maps) before the job counts as ended."""
        with self.cond:
            self.error = self.error or error
            is_last = self.left == 1
        if is_last:
            last()
        with self.cond:
            self.left -= 1
            self.cond.notify_all()

    def wait(self, names: Sequence[str], whole: bool = False) -> None:
        """Until ``names`` are made (``whole``: and the job has ended, the record holding them), or the
        job has failed (raised here), or the waiting thread's time limit is up
        (:func:`vit_demo.progress.check` raises). It sleeps until a map is made (or the time is up): a
        waiter that woke to poll took the interpreter's lock from the lanes each time."""
        with self.cond:
            while self.error is None and self.left and (whole or not all(n in self.maps for n in names)):
                limit = time_left()
                self.cond.wait(None if limit is None else max(0.0, limit[0]) + 0.01)
                check()
            if self.error is not None:
                raise self.error


def _jobs_for(analysis: Analysis, lm: LoadedModel, cls: int | None, names: Sequence[str] | None, here: bool
              ) -> tuple[int, list[MapJob]]:
    """(the class, the jobs that make ``names`` of it): those already running, and a new one for the
    rest, started (its lanes but the first in the pool when ``here``: the caller runs that one)."""
    if lm.model.cfg.num_classes == 0:
        raise ValueError(f"{lm.name} is headless: class-specific maps need a classifier")
    cls = analysis.top1 if cls is None else int(cls)
    wanted = methods.names(slow=False, class_specific=True) if names is None else list(names)
    with analysis.lock:
        running = analysis.jobs.setdefault(cls, [])
        busy = {n for job in running for n in job.names} | set(analysis.class_maps.get(cls, {}))
        jobs = [job for job in running if set(job.names) & set(wanted)]
        todo = [n for n in wanted if n not in busy]
        if todo:
            jobs.append(MapJob(cls, map_lanes(lm, todo), here))
            running.append(jobs[-1])
    if todo:
        setting = (handed_over(), forced_fp32())  # the caller's time limit and precision go with the work
        for i in range(1 if here else 0, len(jobs[-1].lanes)):
            _pool().submit(_run_lane, analysis, lm, jobs[-1], i, setting)
    return cls, jobs


def _run_lane(analysis: Analysis, lm: LoadedModel, job: MapJob, i: int, setting: tuple | None = None) -> None:
    """Lane ``i`` of ``job`` (on the model itself for the first lane, on :func:`replica` ``i`` for the
    others: each copy has its own gradient lock, so the lanes' passes run side by side); ``setting``:
    the time limit and precision of the thread that started it (None: this thread's own)."""
    error = None
    model = lm.model if i == 0 else replica(lm.model, i)
    limit, fp32 = setting if setting is not None else (handed_over(), False)
    try:
        with under(limit), full_precision() if fp32 else nullcontext(), _room(analysis, backward_working_set(lm)), \
                methods.reuse(model, analysis.x):
            for name in job.lanes[i]:
                if job.error is not None:
                    break
                job.put(name, methods.get(name)(model, analysis.x, job.cls)[0].detach().cpu().numpy())
    except BaseException as e:  # noqa: BLE001 - the waiters raise it
        error = e

    def last() -> None:
        with analysis.lock:
            analysis.jobs[job.cls].remove(job)
            if job.error is None:  # all at once: a failed job leaves no half-filled entry
                _store(analysis, job.cls, job.made())

    job.end_lane(error, last)


def _store(analysis: Analysis, cls: int, new: dict[str, np.ndarray]) -> None:
    """``new`` maps of class ``cls`` into the record's own dict (kept: whoever holds it sees them), in
    the registry's order whatever order the lanes made them in. The record's lock is held."""
    maps = analysis.class_maps.setdefault(cls, {})
    merged = {**maps, **new}
    rank = {n: i for i, n in enumerate(methods.names())}
    maps.clear()
    maps.update(sorted(merged.items(), key=lambda item: rank.get(item[0], len(rank))))


def map_lanes(lm: LoadedModel, names: Sequence[str]) -> list[list[str]]:
    """The order ``names`` are computed in, and the lanes that run side by side: the methods that run
    in the model's precision first (their passes are shared), the others after them, each group in
    the registry's order; with :func:`lane_count` lanes, each method registered ``solo`` (it shares
    no pass, and costs many) in a lane of its own beside the rest."""
    own = [n for n in names if methods.get(n).bf16_ok or lm.precision != "bf16"]
    ordered = own + [n for n in names if n not in own]
    lanes = lane_count(lm)
    solo = [n for n in ordered if methods.get(n).solo][: lanes - 1]
    rest = [n for n in ordered if n not in solo]
    return [lane for lane in [rest, *([n] for n in solo)] if lane]


def lane_count(lm: LoadedModel) -> int:
    """How many lanes a record's class maps may use: as many as the cores hold at the model's
    thread count (torch's), at most :data:`MAX_LANES`, and one more than the first only while the
    machine is not busier than its cores (the 1-minute load average under cores, which counts the app's
    own work and its browser's: on a busy machine
    two lanes' threads wait for each other's turn at the interpreter's lock, and took 1.3 times as
    long as one lane at load 15-22); one on a GPU, or for a model whose backward passes need more
    than :data:`PARALLEL_BYTES` (two at once would double the peak)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if lm.device.type != "cpu" or backward_working_set(lm) > PARALLEL_BYTES:
        return 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    spare = max(1, math.ceil(cores + 1 - load))  # the first lane runs whatever the load; a second while load < cores
    return max(1, min(MAX_LANES, cores // max(1, torch.get_num_threads()), spare))


_REPLICAS: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, torch.nn.Module]] = weakref.WeakKeyDictionary()
_REPLICAS_LOCK = threading.Lock()
_POOL_LOCK = threading.Lock()
_POOLS: list[ThreadPoolExecutor] = []


def replica(model: torch.nn.Module, i: int) -> torch.nn.Module:
    """Copy ``i`` of ``model`` that shares its parameters and buffers (no memory of its own to speak
    of): the same forward, with its own hooks and gradient lock. Made once, under the model's
    gradient lock (no LRP rules on it then), its hooks cleared (a pass's capture hook of the moment)."""
    with _REPLICAS_LOCK:
        copies = _REPLICAS.setdefault(model, {})
        if i not in copies:
            with gradient_lock(model):
                memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
                twin = copy.deepcopy(model, memo)
            for m in twin.modules():
                for hooks in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks):
                    hooks.clear()
            copies[i] = twin
        return copies[i]


def _pool() -> ThreadPoolExecutor:
    """The threads that compute class-specific maps in the background (made on first use)."""
    with _POOL_LOCK:
        if not _POOLS:
            _POOLS.append(ThreadPoolExecutor(MAP_THREADS, thread_name_prefix="class-maps"))
        return _POOLS[0]


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
