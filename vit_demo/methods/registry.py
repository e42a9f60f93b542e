"""The explanation methods' registry: every method is one record, and everything reads it.

A method is a function ``fn(model, x [B, 3, H, W], target=None) -> [B, gh, gw]`` (``target``:
None for each image's top-1 class, an int for one class, or a [B] tensor) registered with
:func:`register`::

    @register("gradcam", title="GradCAM", cite="Selvaraju et al., ICCV 2017")
    def gradcam_map(model, x, target=None): ...

The command line (``explain --method``, ``faithfulness/sanity/pointing --methods``), the app's
relevance row (slow methods as on-request buttons), the analysis cache, the deck's scores,
side-by-side and the benchmarks all list :func:`names` and call :func:`get`; titles and
citations come from the record. Order: the class-agnostic methods, then the class-specific
single-pass ones, then the slow ones (hundreds of forward passes), each group in the order
the modules of :mod:`vit_demo.methods` register them (alphabetical by module).

:func:`reuse` lets several methods on one input share their work: inside it, a registered
method or a :func:`shared` pass called again with the same model, input and target returns
its first result (the gated LRP map reuses the CP-LRP map and the gradient rollout computed
just before it; causal LRP reuses the gated map).
"""

from __future__ import annotations

import difflib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..model import VisionTransformer
from ..precision import full_precision, runs_bf16, widened

Target = int | Tensor | None
MapFn = Callable[[VisionTransformer, Tensor, Target], Tensor]


@dataclass(frozen=True)
class Method:
    """One registered method: its function and how to present it."""

    name: str  # what the CLI, the JSON and the app call it
    fn: MapFn
    title: str  # short, for figure and tile titles ("CP-LRP")
    cite: str  # the paper ("Ali et al., ICML 2022"), or "this project"
    slow: bool = False  # hundreds of forward passes: run only when asked for by name (or "all")
    class_specific: bool = True  # explains one class (False: the map is the same for every class)
    bf16_ok: bool = False  # measured as faithful in bfloat16: it runs in the model's precision (else in float32)
    solo: bool = False  # shares no pass with the others and costs many: may run beside them (vit_demo.analysis.map_lanes)

    def __call__(self, model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
        return self.fn(model, x, target)

    @property
    def label(self) -> str:
        """Title and citation, for a figure: "CP-LRP (Ali et al., ICML 2022)"."""
        return f"{self.title} ({self.cite})"


_METHODS: dict[str, Method] = {}


def register(name: str, *, title: str, cite: str, slow: bool = False, class_specific: bool = True,
             bf16_ok: bool = False, solo: bool = False) -> Callable[[MapFn], MapFn]:
    """Decorator: add ``fn`` to the registry under ``name`` (a name may be registered once).
    The function is returned wrapped so that :func:`reuse` can share its result, and so that it
    runs in the model's precision only when ``bf16_ok`` (its maps measured as faithful in bfloat16,
    docs/performance.md); otherwise a model set to bfloat16 runs in float32 for it. Maps come out
    in float32 either way."""

    def add(fn: MapFn) -> MapFn:
        if name in _METHODS:
            raise ValueError(f"method {name!r} is registered twice ({_METHODS[name].fn.__module__} and {fn.__module__})")
        wrapped = shared(name)(in_precision(fn, bf16_ok))
        _METHODS[name] = Method(name, wrapped, title, cite, slow, class_specific, bf16_ok, solo)
        return wrapped

    return add


_measuring = threading.local()


@contextmanager
def every_method_in_bf16() -> Iterator[None]:
    """Within the block, on this thread, every method runs in the model's precision, ``bf16_ok`` or
    not: to measure what bfloat16 does to a method's maps (benchmarks/bench_precision.py)."""
    before = getattr(_measuring, "on", False)
    _measuring.on = True
    try:
        yield
    finally:
        _measuring.on = before


def in_precision(fn: Callable[..., Tensor], bf16_ok: bool) -> Callable[..., Tensor]:
    """``fn`` whose model runs in float32 unless ``bf16_ok`` (vit_demo.precision.full_precision),
    and whose map is float32 (or float64) whatever the model ran in."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Tensor:
        with full_precision() if not (bf16_ok or getattr(_measuring, "on", False)) else nullcontext():
            out = fn(*args, **kwargs)
        return widened(out) if isinstance(out, Tensor) else out

    return call


def names(*, slow: bool | None = None, class_specific: bool | None = None) -> list[str]:
    """Registered names in the registry's order (see the module docstring); ``slow`` /
    ``class_specific``: only those with that flag (None: either)."""
    ms = sorted(_METHODS.values(), key=lambda m: (m.slow, m.class_specific))  # stable: registration order within
    return [m.name for m in ms if (slow is None or m.slow == slow)
            and (class_specific is None or m.class_specific == class_specific)]


def single_pass() -> list[str]:
    """Every method but the slow ones: what runs by default."""
    return names(slow=False)


def slow() -> list[str]:
    """The methods that take hundreds of forward passes: run only on request."""
    return names(slow=True)


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-").replace(" ", "-")


def find(name: str, among: Sequence[str] | None = None) -> str:
    """The registered name ``name`` means, spelled as people do: any case, spaces or underscores for the
    hyphens ("Chefer", "LRP_gated" -> "chefer", "lrp-gated"). ValueError otherwise, in one line: the
    closest names ("did you mean 'chefer'?", :func:`did_you_mean`) and the known ones. ``among``: the
    names allowed here (default every registered one)."""
    known = list(names() if among is None else among)
    if name in known:
        return name
    by_key = {n.lower(): n for n in known}
    if _key(name) in by_key:
        return by_key[_key(name)]
    raise ValueError(f"unknown method {str(name)[:40]!r}{did_you_mean(name, known)}; known: {', '.join(known)}")


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """" (did you mean 'chefer'?)" for the names of ``known`` closest to ``name``; "" when none is close."""
    by_key = {n.lower(): n for n in known}
    close = difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(by_key[c]) for c in close)}?)" if close else ""


def get(name: str) -> Method:
    """The record for ``name`` (as :func:`find` reads it); ValueError naming the known methods otherwise."""
    return _METHODS[name] if name in _METHODS else _METHODS[find(name)]


# ----------------------------------------------------------------------------- sharing work between methods


@dataclass
class _Scope:
    model: VisionTransformer
    x: Tensor
    memo: dict[tuple[str, Any], Any]


_local = threading.local()


def target_key(target: Target, batch: int) -> tuple[int, ...] | None:
    """A hashable form of ``target`` for a batch of ``batch`` images (None: the top-1 classes)."""
    if target is None:
        return None
    t = torch.as_tensor(target).reshape(-1).tolist()
    return tuple(int(v) for v in (t * batch if len(t) == 1 else t))


def memo_key(name: str, model: VisionTransformer, target: Target, batch: int) -> tuple[str, tuple[int, ...] | None, bool]:
    """What a result is shared under: the pass's name, the target, and whether the model runs in bfloat16
    here and now (a method kept in float32 on a bf16 model does not reuse a pass made in bfloat16)."""
    return name, target_key(target, batch), runs_bf16(model)


@contextmanager
def reuse(model: VisionTransformer, x: Tensor, known: Mapping[tuple[str, Target], Any] | None = None) -> Iterator[None]:
    """Within the block, a registered method or :func:`shared` pass called on exactly ``model``
    and ``x`` (the same objects) runs once per target; later calls return its first result.
    ``known``: results computed earlier, ``{(name, target): result}``. One scope per thread;
    scopes nest (the inner one wins)."""
    memo = {memo_key(name, model, t, x.shape[0]): v for (name, t), v in (known or {}).items()}
    outer = getattr(_local, "scope", None)
    _local.scope = _Scope(model, x, memo)
    try:
        yield
    finally:
        _local.scope = outer


@contextmanager
def sharing(model: VisionTransformer, x: Tensor) -> Iterator[None]:
    """:func:`reuse` for ``model`` and ``x``, unless a scope for exactly them is open already: then
    that one (a method that calls others shares what its caller computed, and the caller what it computes)."""
    scope: _Scope | None = getattr(_local, "scope", None)
    if scope is not None and scope.model is model and scope.x is x:
        yield
        return
    with reuse(model, x):
        yield


def computed(name: str, model: VisionTransformer, x: Tensor, target: Target = None) -> Any | None:
    """What :func:`shared` pass ``name`` returned for exactly ``model``, ``x`` and ``target`` in the open
    :func:`reuse` scope, if it ran there; None otherwise (nothing is computed)."""
    scope: _Scope | None = getattr(_local, "scope", None)
    if scope is None or scope.model is not model or scope.x is not x:
        return None
    return scope.memo.get(memo_key(name, model, target, x.shape[0]))


def shared(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for ``fn(model, x, target=None, ...)``: inside :func:`reuse` for this model
    and input, the result is computed once per target (calls with more arguments, e.g.
    ``settings``, and calls outside the scope run as usual)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(model: VisionTransformer, x: Tensor, target: Target = None, *args: Any, **kwargs: Any) -> Any:
            scope: _Scope | None = getattr(_local, "scope", None)
            if args or kwargs or scope is None or scope.model is not model or scope.x is not x:
                return fn(model, x, target, *args, **kwargs)
            key = memo_key(name, model, target, x.shape[0])
            if key not in scope.memo:
                scope.memo[key] = fn(model, x, target)
            return scope.memo[key]

        return call

    return wrap
