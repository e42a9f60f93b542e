"""Reduced precision where the hardware has it (issues 43 and 44): bfloat16 on a CPU with AVX512-BF16
or AMX and on a GPU that computes it (CUDA's bf16 without emulation: Ampere on), float32 elsewhere
(without them PyTorch emulates bf16 and autocast is slower than fp32). One detection for training
(``train --precision auto``, vit_demo.train.fast) and inference (``--precision auto`` on predict,
explain, survey, atlas and the app).

- :func:`bf16_is_fast`: whether a device computes bfloat16 natively (detected once per device);
  ``VIT_DEMO_NO_BF16=1`` says no everywhere (the tests, a machine that should behave as one without it);
- :func:`resolve` / :func:`describe`: a ``--precision`` setting (:data:`PRECISIONS`) as "fp32" or
  "bf16" for a device, and the reason in words for a command's header line and the app's summary;
- :func:`autocast`: torch's autocast to bfloat16 on a device (matrix products in bfloat16, sums and
  norms of float32 inputs in float32);
- :func:`set_precision`: a model instance whose forward runs in bfloat16 wherever it is called, but
  for its parts in :data:`FP32_PARTS` (the pixels' projection and the head: measured, the logits
  move six times less and top-1 agrees on 99.8 % instead of 99.3 % of the 1000 sample photos);
- :func:`full_precision`: a block in which such a model runs in float32 on this thread (the
  parity check against timm, an explanation method that bfloat16 degrades).

Nothing here knows the model's classes: the parts are named by attribute.
"""

from __future__ import annotations

import functools
import os
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

PRECISIONS = ("auto", "fp32", "bf16")
ENV_NO_BF16 = "VIT_DEMO_NO_BF16"  # set (not "0"): no device counts as computing bfloat16 natively
FP32_PARTS = ("embed", "forward_head")  # methods of the model kept in float32 under bfloat16
_ATTR = "vit_demo_precision"  # where set_precision records the model's precision on the instance
# What bfloat16 does, true of every model (the app's model summary) ...
BF16_HOW = ("matrix products in bfloat16, for speed, with the pixels' projection and the head in float32; the "
            "explanation methods measured as faithful in bf16 run in it, the others in fp32, and the Compare tab checks "
            "in fp32")
# ... and what it was measured to gain and cost (docs/performance.md), each figure said only of the model it was
# measured on: the speed-up by architecture (any weights of it run as fast), the fidelity of the shipped DeiT-Tiny
BF16_SPEED = {"deit_tiny_patch16_224": 1.7, "vit_base_patch16_224": 3.3}  # times as fast as fp32, this project's CPU
BF16_FIDELITY = ("on the 1000 sample photos its top-1 equals fp32's on 99.8 % of them (the 2 others are near-ties) and "
                 "the maps run in bf16 rank the patches as in fp32 (median rank correlation 0.996 or more)")


def detection_off() -> bool:
    """Whether $VIT_DEMO_NO_BF16 forces the detection off (any value but empty or 0)."""
    return os.environ.get(ENV_NO_BF16, "").strip() not in ("", "0")


def as_device(device: torch.device | str) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


@functools.cache
def _cpu_native() -> tuple[bool, str]:
    """The CPU's answer, read once: (native bfloat16, which feature says so)."""
    for feature, test in (("AMX", torch.cpu._is_amx_tile_supported),
                          ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported)):
        if test():
            return True, f"this CPU has {feature}"
    return False, "this CPU has neither AVX512-BF16 nor AMX"


def _native(kind: str, index: int | None) -> tuple[bool, str]:
    """(native bfloat16 on this device, which feature says so); CUDA asked each time (cheap)."""
    if kind == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        return ok, "this GPU computes bfloat16" if ok else "this GPU does not compute bfloat16 natively"
    if kind == "cpu":
        return _cpu_native()
    return False, f"bfloat16 is not used on {kind}"


def bf16_is_fast(device: torch.device | str) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CPU with AVX512-BF16 or AMX (read once), a GPU
    with bf16 (False everywhere when $VIT_DEMO_NO_BF16 is set; training's ``auto`` asks this too)."""
    d = as_device(device)
    return not detection_off() and _native(d.type, d.index)[0]


def autocast(device: torch.device | str, enabled: bool = True) -> torch.autocast:
    """torch's autocast to bfloat16 on ``device``: matrix products and convolutions in bf16, the rest
    in fp32 (when not ``enabled``: autocast off inside the block; a training step and a model set to
    bf16 both run under it)."""
    return torch.autocast(as_device(device).type, dtype=torch.bfloat16, enabled=enabled)


def check(setting: str) -> str:
    if setting not in PRECISIONS:
        raise ValueError(f"precision {setting!r}: one of {', '.join(PRECISIONS)}")
    return setting


def resolve(setting: str, device: torch.device | str) -> str:
    """"fp32" or "bf16" for ``setting`` (:data:`PRECISIONS`) on ``device``: auto is bf16 where the device
    computes it natively, fp32 elsewhere; fp32 and bf16 are taken as asked (bf16 on a device without
    native support runs, emulated and slow; on Apple MPS it is refused)."""
    d = as_device(device)
    if check(setting) == "auto":
        return "bf16" if bf16_is_fast(d) else "fp32"
    if setting == "bf16" and d.type not in ("cpu", "cuda"):
        raise ValueError(f"--precision bf16 runs on a CPU or a CUDA GPU, not on {d.type}")
    return setting


def describe(setting: str, device: torch.device | str) -> str:
    """The choice and its reason in words: "bf16 (auto: this CPU has AVX512-BF16)"."""
    d = as_device(device)
    chosen = resolve(setting, d)
    if setting != "auto":
        slow = chosen == "bf16" and not _native(d.type, d.index)[0]  # the hardware's answer, whatever the override
        return f"{chosen} (asked for{'; not native here, emulated and slow' if slow else ''})"
    if detection_off():
        return f"fp32 (auto: bf16 detection switched off by {ENV_NO_BF16})"
    return f"{chosen} (auto: {_native(d.type, d.index)[1]})"


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is in a lower precision (bfloat16, float16); float32 and float64 as they are."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


# ----------------------------------------------------------------------------- a model in bfloat16

_local = threading.local()


@contextmanager
def full_precision() -> Iterator[None]:
    """Within the block, on this thread, models set to bf16 (:func:`set_precision`) run in float32."""
    before = getattr(_local, "fp32", False)
    _local.fp32 = True
    try:
        yield
    finally:
        _local.fp32 = before


def forced_fp32() -> bool:
    """Whether this thread is inside :func:`full_precision`."""
    return getattr(_local, "fp32", False)


def model_precision(model: nn.Module) -> str:
    """"bf16" or "fp32": what :func:`set_precision` set on ``model`` (fp32 when nothing was)."""
    return getattr(model, _ATTR, "fp32")


def runs_bf16(model: nn.Module) -> bool:
    """Whether a forward of ``model`` called here and now runs in bfloat16."""
    return model_precision(model) == "bf16" and not forced_fp32()


def _device_type(module: nn.Module) -> str:
    p = next(module.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _autocast_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The class's forward under bfloat16 autocast, unless :func:`full_precision` is on."""
    with autocast(_device_type(self), enabled=not forced_fp32()):
        return type(self).forward(self, *args, **kwargs)


def _in_fp32(name: str) -> Any:
    """The model's method ``name`` in float32 when called under autocast (floating inputs cast up)."""

    def run(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        method = getattr(type(self), name)
        kind = _device_type(self)
        if not torch.is_autocast_enabled(kind):
            return method(self, *args, **kwargs)
        up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        with torch.autocast(kind, enabled=False):
            return method(self, *up, **kwargs)

    return run


def set_precision(model: nn.Module, precision: str) -> nn.Module:
    """Make ``model`` (the instance) run in ``precision``: "bf16" wraps its forward in bfloat16
    autocast, with the parts of :data:`FP32_PARTS` it has in float32; "fp32" restores the class's
    methods (bit for bit the model as built). A copy of the model (``copy.deepcopy``) keeps the setting."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"a model runs in fp32 or bf16, not {precision!r}")
    for name in ("forward", *FP32_PARTS):
        model.__dict__.pop(name, None)
    if precision == "bf16":
        model.forward = types.MethodType(_autocast_forward, model)
        for name in FP32_PARTS:
            if callable(getattr(type(model), name, None)):
                setattr(model, name, types.MethodType(_in_fp32(name), model))
    setattr(model, _ATTR, precision)
    return model
