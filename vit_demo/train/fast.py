"""How a training step runs fast: its precision (``--precision``), the attention kernel under bf16,
and the memory layout of the convolutional stem. Measured in docs/training.md ("Two minutes").

- ``auto`` trains from scratch in bf16 autocast where the device multiplies bf16 in hardware
  (:func:`~vit_demo.precision.bf16_is_fast`), else in fp32; fine-tuning stays in fp32 unless asked
  (not measured). ``fp32`` and ``bf16`` force one (``--amp`` is ``bf16``).
- Under bf16 on a CPU, attention runs as explicit matrix products (PyTorch's "math" kernel): the
  fused CPU kernel's bf16 backward pass took 6x the time of its fp32 one.
- On a CPU the model and its inputs are channels-last: the stem's max-pool took 19 ms a call in
  the default layout, 0.8 ms channels-last.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..precision import PRECISIONS, autocast, bf16_is_fast  # PRECISIONS: --precision, the default first


def use_bf16(precision: str, device: torch.device, scratch: bool = True) -> bool:
    """Whether a run asked for ``precision`` trains in bf16 autocast on ``device``."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        return scratch and bf16_is_fast(device)
    return precision == "bf16"


def step_context(device: torch.device, bf16: bool) -> contextlib.ExitStack:
    """The context a training forward pass runs in: bf16 autocast when ``bf16``, and on a CPU then
    the math attention kernel (see the module's docstring)."""
    stack = contextlib.ExitStack()
    stack.enter_context(autocast(device, bf16))
    if bf16 and device.type == "cpu":
        stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
    return stack


def channels_last(device: torch.device) -> bool:
    """Channels-last memory for the model's convolutions and its inputs (on a CPU)."""
    return device.type == "cpu"


def fast_layout(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` in the layout its steps run fastest in on ``device`` (in place; returns it)."""
    return model.to(memory_format=torch.channels_last) if channels_last(device) else model


def plain_layout(model: nn.Module) -> nn.Module:
    """``model`` back in the default layout (contiguous weights, as a checkpoint stores them)."""
    return model.to(memory_format=torch.contiguous_format)


def fast_input(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch [B, C, H, W] in the layout of :func:`fast_layout`."""
    return x.contiguous(memory_format=torch.channels_last) if channels_last(device) and x.ndim == 4 else x
