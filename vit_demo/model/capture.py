"""The capture path's speed: every layer's attention probabilities at the cost of little more than a
plain forward pass. Registered over vit.py's ``attend`` and ``capture_slots`` as the model's attention
kernel (those give the same numbers, slower, and run only where vit.py is copied alone):

- without autograd the probabilities of all L layers go into one [L, B, H, N, N] tensor, each block
  writing into its slot (``capture_slots``): the allocator keeps one block that size for the next
  forward, where twelve separate ones went back to the OS and were faulted in again, page by page,
  every time;
- the scores q k^T are written straight into that slot and the softmax runs there in place, on
  numbers still in cache (``scores_into``, ``probabilities``);
- one :func:`attend` for every attention of every family: the fused kernel when nothing is
  captured, the explicit softmax (into the slot when there is one) when something is, or when it
  is faster (bfloat16 on a CPU, :func:`explicit_is_faster`); there the scores pass the attention's
  ``hook_scores`` before the softmax (a hook that keeps them copies them: the softmax runs in place);
- the plain ViT's block (:class:`LeanBlock`, registered over vit.py's ``Block``): without autograd
  and with no hook on its parts, it calls their ``forward`` directly instead of through
  ``nn.Module.__call__`` and skips its unhooked hook points, the same operations in the same order
  (bit for bit vit.py's numbers), about 15 Python calls a block fewer.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .vit import Block, HookPoint, Mlp, Positions, SelfAttention, register


def scores_into(capture: bool | torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * q k^T [B, H, N, N], the same numbers whichever way it is computed. When ``capture``
    is a tensor of that shape and dtype (a slot of the block that a forward pass without autograd
    keeps, see :func:`capture_slots`), the product is written straight into it, so that the softmax
    can run in place on numbers still in cache; a power-of-2 scale (head size 64: 1/8) is applied
    by the matrix product itself, exactly as a multiply after it would (other scales: multiplied
    after, as always)."""
    if not (isinstance(capture, torch.Tensor) and capture.dtype == q.dtype and capture.is_contiguous()
            and capture.shape == (*q.shape[:-1], k.shape[-2])):
        return torch.matmul(q, k.transpose(-2, -1)).mul_(scale)
    B, H, N, D = q.shape  # a slot: [B, H, N, N]
    exact = math.frexp(scale)[0] == 0.5  # a power of 2
    out = capture.view(B * H, N, -1)
    torch.baddbmm(out, q.reshape(B * H, N, D), k.transpose(-2, -1).reshape(B * H, D, -1), beta=0,
                  alpha=scale if exact else 1.0, out=out)
    return capture if exact else capture.mul_(scale)


def probabilities(q: torch.Tensor, k: torch.Tensor, scale: float, capture: bool | torch.Tensor = True,
                  bias: torch.Tensor | None = None, hook_scores: HookPoint | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + bias) [B, H, N, M], in place in ``capture`` when it is a slot that fits;
    the scores pass ``hook_scores`` (the attention's) before the softmax."""
    attn = scores_into(capture, q, k, scale)
    attn = attn if bias is None else attn.add_(bias)
    attn = attn if hook_scores is None else hook_scores(attn)
    return torch.softmax(attn, -1, out=attn) if attn is capture else attn.softmax(dim=-1)


def explicit_is_faster(q: torch.Tensor) -> bool:
    """Whether the explicit softmax attention beats the fused kernel for ``q``: in bfloat16 on a CPU
    (torch 2.14, AVX512-BF16: DeiT-Tiny's attention of one layer 0.44 against 1.04 ms, batch 8 3.7
    against 7.4 ms; the fused kernel gains nothing over float32 there)."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"


@register("kernel", "attend")
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, capture: bool | torch.Tensor = False,
           bias: torch.Tensor | None = None, rule: Callable | None = None, hook_scores: HookPoint | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T * scale + bias) v: q [B, H, N, D], k and v [B, H, M, D] -> [B, H, N, D], and the
    probabilities [B, H, N, M] when ``capture`` (True, or a slot to write them into) is not False.
    ``rule``: LRP's rule for q, k, v (methods/lrp.py), None outside its explanation mode; ``hook_scores``:
    the attention's point the scores pass before the softmax, where it is explicit."""
    if rule is not None:  # the same values, gradients shaped by the rule
        q, k, v = rule(q, k, v)
    if capture is False and not explicit_is_faster(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), None
    attn = probabilities(q, k, scale, True if capture is False else capture, bias, hook_scores)
    return attn @ v, None if capture is False else attn


def scores_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype q k^T comes out in: autocast's (bfloat16) where it is on for ``x``'s device, else ``x``'s.
    Under bfloat16 the slots hold bfloat16 probabilities (half the bytes; the softmax sums in float32
    inside, and the maps built on them sum in float32: vit_demo/methods/rollout.py)."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


@register("kernel", "slots")
def capture_slots(x: torch.Tensor, capture: bool, depth: int, heads: int) -> Sequence[bool | torch.Tensor]:
    """What each block gets for ``capture``: without autograd, its slot [B, H, N, N] of one
    [L, B, H, N, N] tensor for every layer's probabilities (in :func:`scores_dtype`); otherwise the flag itself."""
    if not capture or torch.is_grad_enabled():
        return [capture] * depth
    B, N = x.shape[0], x.shape[1]
    keep = torch.empty(depth, B, heads, N, N, dtype=scores_dtype(x), device=x.device)
    return [keep[i] for i in range(depth)]


def hooked(*modules: nn.Module) -> bool:
    """Whether calling ``modules`` would run a hook: one of their own, or a global one (``nn.modules.module``'s)."""
    g = nn.modules.module
    if (g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
            or g._global_backward_pre_hooks):
        return True
    for m in modules:  # a loop, not any(generator): this runs on every block of every forward
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return True
    return False


_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple] = weakref.WeakKeyDictionary()  # -> (key, product)
_PRODUCT = getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def under_bf16(x: torch.Tensor) -> bool:
    """Whether ``x`` is a CPU tensor in bfloat16 autocast's reach (a model set to bf16, vit_demo.precision)."""
    return x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _state(t: torch.Tensor | None) -> tuple[int, int]:
    """What changes when ``t``'s values may have: its storage and its in-place version."""
    return (0, 0) if t is None else (t.data_ptr(), -1 if t.is_inference() else t._version)


def packed(linear: nn.Linear, rows: int = 1) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``linear``'s product in bfloat16 with its weight packed once for oneDNN (laid out for inputs of
    about ``rows`` rows) and its bias in bfloat16: made again only when a parameter changed (training,
    a state dict loaded into it); None where oneDNN cannot (no oneDNN, no bfloat16 in it: then
    autocast's way, from then on)."""
    key = (_state(linear.weight), _state(linear.bias))
    entry = _PACKED.get(linear)
    if entry is not None and (entry[0] == key or entry[0] is None):
        return entry[1]
    try:
        with torch.inference_mode(False), torch.no_grad():
            w = torch.ops.mkldnn._reorder_linear_weight(linear.weight.to(torch.bfloat16), rows)
            made = functools.partial(_product, w, None if linear.bias is None else linear.bias.to(torch.bfloat16))
    except (RuntimeError, AttributeError):
        _PACKED[linear] = (None, None)
        return None
    _PACKED[linear] = (key, made)
    return made


def products(x: torch.Tensor, *linears: nn.Linear) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Each Linear layer's product for inputs like ``x``: under bfloat16 autocast on a CPU, with its
    packed weight (bit for bit autocast's ``F.linear``, which casts every weight at every call: on
    DeiT-Tiny 1.6 ms of a 15-ms forward on one thread, and its unpacked products 1.5 ms more); else its ``forward``."""
    if _PRODUCT is None or not under_bf16(x):
        return [m.forward for m in linears]
    rows = x.numel() // x.shape[-1]
    made = [packed(m, rows) for m in linears]
    return [m.forward for m in linears] if None in made else made


def _product(w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return _PRODUCT(x.to(torch.bfloat16), w, b, "none", [], "")


@register("block", "")
class LeanBlock(Block):
    """vit.py's pre-norm block, the same parameters and numbers. Without autograd, with vit.py's own
    attention and MLP and no hook on any of its parts, ``forward`` calls the parts' ``forward``
    directly, multiplies by packed weights under bfloat16 (:func:`products`) and hands the attention
    kernel no ``hook_scores``; otherwise (and under ``torch.compile``, which traces vit.py's block) it
    is vit.py's ``Block.forward``."""

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, positions: Positions | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn, mlp = self.attn, self.mlp
        if (positions is not None or torch.is_grad_enabled() or type(attn) is not SelfAttention or type(mlp) is not Mlp
                or attn.relevance_rule is not None or torch.compiler.is_compiling()):  # compiled: torch's fusions
            return super().forward(x, capture, positions)
        parts = (self.norm1, self.ls1, self.norm2, mlp.act, self.ls2)
        if hooked(attn, attn.qkv, attn.proj, attn.hook_q, attn.hook_k, attn.hook_v, attn.hook_scores, mlp, mlp.fc1,
                  mlp.hook_hidden, mlp.fc2, *parts):
            return super().forward(x, capture, positions)
        norm1, ls1, norm2, act, ls2 = (m.forward for m in parts)
        qkv, proj, fc1, fc2 = products(x, attn.qkv, attn.proj, mlp.fc1, mlp.fc2)
        B, N, _ = x.shape  # the attention: SelfAttention.project and .forward
        q, k, v = qkv(norm1(x)).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        o, probs = attn.attend(q, k, v, attn.scale, capture, None, None, None)  # no bias, rule or hook
        x = x + ls1(proj(o.transpose(1, 2).reshape(B, N, -1)))
        return x + ls2(fc2(act(fc1(norm2(x))))), probs  # the MLP: Mlp.forward
