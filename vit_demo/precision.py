"""Which precision a device computes fast in: bf16 autocast where the hardware has bf16 arithmetic,
fp32 elsewhere. One detection for training (``train --precision auto``) and inference alike.

- CPU: bf16 dot products in hardware (AVX512-BF16, or AMX tiles). Without them PyTorch emulates
  bf16 and autocast is slower than fp32.
- CUDA: compute capability 8.0 or more (Ampere on), not the emulation older cards offer.
- Anything else (MPS): fp32.

Measured on the 2-core AMD EPYC (AVX512-BF16) this project develops on, one thread, the default
from-scratch model's training step at 32 px: the matrix products 3.2x faster under bf16 autocast
(docs/training.md has the whole profile).
"""

from __future__ import annotations

import contextlib

import torch


def bf16_is_fast(device: torch.device | str) -> bool:
    """True where ``device`` multiplies bf16 in hardware (see the module's docstring)."""
    device = torch.device(device)
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return False


def autocast(device: torch.device | str, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``enabled`` (matrix products and convolutions in bf16, the
    rest in fp32), else nothing."""
    device = torch.device(device)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
