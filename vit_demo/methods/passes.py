"""The passes every method builds on: which class to explain, a gradient pass on a shared model,
and forward passes on masked inputs.

- :func:`targets`: ``target`` (None, an int or a [B] tensor) as one class per image;
- :func:`gradient_lock` / :func:`gradient_pass`: the one way a method takes gradients (the
  model instance is shared by the app's threads, and LRP's rules are hooks on the instance);
- :func:`masked_scores`: the class probability under masks over the patch grid, shared by RISE,
  causal LRP and the deletion / insertion curves.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..model import VisionTransformer
from ..progress import report


def targets(target: int | Tensor | None, logits: Tensor) -> Tensor:
    """None -> top-1 prediction; an int -> the same class for every image; a tensor -> [B]."""
    B = logits.shape[0]
    if target is None:
        return logits.argmax(dim=-1)
    t = torch.as_tensor(target, dtype=torch.long, device=logits.device).reshape(-1)
    if t.numel() == 1:
        t = t.expand(B)
    if t.shape != (B,):
        raise ValueError(f"target has {t.numel()} entries for a batch of {B}")
    if bool(((t < 0) | (t >= logits.shape[-1])).any()):
        raise ValueError(f"target {t.tolist()} outside 0..{logits.shape[-1] - 1}")
    return t


_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def gradient_lock(model: nn.Module) -> threading.RLock:
    """One re-entrant lock per model instance, held by every gradient pass on it (plain or LRP).

    The LRP rules are hooks on the instance: a plain gradient pass (grad-rollout, Chefer,
    GradCAM) running on another thread while they are on would pick up rule-shaped gradients.
    Forward values are the same either way, so plain forwards need no lock."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def gradient_pass(model: nn.Module, x: Tensor) -> Iterator[Tensor]:
    """A gradient pass on ``model``: yields a copy of ``x`` that requires grad, with gradients on
    (also under ``torch.no_grad`` or ``torch.inference_mode``) and the model's
    :func:`gradient_lock` held. ``torch.autograd.grad`` inside leaves the parameters' ``.grad`` alone."""
    with gradient_lock(model), torch.inference_mode(False), torch.enable_grad():
        yield x.detach().clone().requires_grad_(True)


@torch.inference_mode()
def masked_scores(model: VisionTransformer, x: Tensor, masks: Tensor, target: Tensor, chunk: int,
                  desc: str = "masked forward passes", fill: Tensor | None = None) -> Tensor:
    """Target probability of every image under every mask: x [B, 3, h, w], masks [M, gh, gw]
    (the same for every image) or [B, M, gh, gw] (one set per image), patch level, values in
    [0, 1] (1 = the patch shows the image, 0 = it is blended to 0, the mean colour, or to
    ``fill`` [B, 3, h, w] where given, e.g. a blurred copy), target [B] -> [B, M]. The B*M
    inputs are made and run ``chunk`` at a time; after every forward pass the share done goes to
    :func:`vit_demo.progress.report` (with ``desc``)."""
    p = model.cfg.patch_size
    B = x.shape[0]
    masks = masks.to(x.device).expand(B, *masks.shape[-3:])  # [B, M, gh, gw]
    M = masks.shape[1]
    out = torch.empty(B * M, device=x.device)
    for start in range(0, B * M, chunk):
        idx = torch.arange(start, min(start + chunk, B * M), device=x.device)
        b, m = idx // M, idx % M
        pixels = masks[b, m].to(x.dtype).repeat_interleave(p, dim=-2).repeat_interleave(p, dim=-1)  # [c, h, w]
        inputs = x[b] * pixels[:, None]
        if fill is not None:
            inputs = inputs + fill[b] * (1 - pixels[:, None])
        probs = model(inputs).logits.float().softmax(dim=-1)
        out[start : start + len(idx)] = probs.gather(1, target[b][:, None])[:, 0]
        report((start + len(idx)) / (B * M), desc, done=start + len(idx), total=B * M)
    return out.reshape(B, M)
