"""Layer-wise relevance propagation for the scratch ViT: CP-LRP and AttnLRP.

Ali et al., "XAI for Transformers: better explanations through conservative propagation"
(ICML 2022, CP-LRP) and Achtibat et al., "AttnLRP: attention-aware layer-wise relevance
propagation for transformers" (ICML 2024). Both are written in the gradient x input framework
of the authors' library (PyPI ``lxt``): the forward pass gets *detach points* that reshape the
gradient, one backward pass of the class logit follows, and the relevance of every input value
is ``x * grad``. The map sums it over the colour channels and over each patch.

The rules, switched on for one model instance by :func:`explanation_mode` (instance hooks, the
way zennit's composites work; no class is patched, so a plain backward pass on the same model
outside the ``with`` block, e.g. grad-rollout, keeps its ordinary gradients):

- LayerNorm: identity rule, the standard deviation held constant (its mean still flows);
- GELU / QuickGELU: identity rule, gradient ``act(x) / x`` (lxt's ``identity_rule_implicit``);
- attention, CP-LRP: the softmax probabilities held constant (q and k detached), relevance
  flows through the values only;
- attention, AttnLRP: the softmax keeps its gradient (its LRP rule is gradient x input) and the
  bilinear matmuls get the uniform rule: gradients of q and k divided by 4, of v by 2;
- Linear layers and the patch convolution: the generalised gamma rule exactly as zennit's
  ``Gamma`` (Montavon et al. 2019; Andeol et al. 2021), positive and negative outputs handled
  separately, with lxt's conversion to the gradient x input framework; a convolutional stem's
  convolutions get the conv gamma (its BatchNorm, an affine map in eval mode, and ReLU pass the
  gradient, which for ReLU is the identity rule).

The variants of timm's ViT family get the same rules where they have the same parts, and for the
rest (neither paper covers them) this module does what the papers' reasoning implies:

- RMSNorm: the root mean square held constant, as LayerNorm's standard deviation;
- SiLU and GELU-tanh: the identity rule, as GELU;
- a GLU MLP's product act(gate) * value: AttnLRP's uniform rule (both gradients / 2, as its
  paper does for LLaMA's SwiGLU); CP-LRP holds the gate constant, as it holds the attention
  probabilities, so relevance flows through the value (the "signal-take-all" rule of Arras et
  al. 2017 for gated LSTMs);
- an attention-pool head's attention: the same attention rule as the blocks';
- RoPE rotates q and k by fixed angles (linear, no bias: relevance passes as in gradient x
  input), a relative position bias is a constant added to the logits: nothing to propagate;
- EVA's and BEiT's q / v biases are added after the gamma-ruled qkv layer (they take no share);
- differential attention (softmax1 - lambda softmax2): the same rule on its q, k, v (CP-LRP holds
  both maps, and so their difference, constant; AttnLRP's uniform rule on the matmuls), its
  RMSNorm of the heads held constant as every RMSNorm;
- parallel blocks: a scaling block's attention gets the attention rule (its in_proj, the MLP's and
  the attention's projections are Linear layers), parallel branches are each a block's parts.

While the mode is on the model instance is in explanation mode for every caller: do not share
that instance with a concurrent plain forward (the app runs one analysis at a time per model).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model import VisionTransformer
from .gradients import attention_gradients, grad_rollout
from .passes import gradient_lock, gradient_pass, targets
from .registry import Target, register

AttentionRule = Literal["cp", "attnlrp"]
STABILIZER = 1e-6  # zennit's Gamma default: denominators moved away from 0 by this, keeping their sign
INPUT_EPS = 1e-10  # lxt: relevance / input


@dataclass(frozen=True)
class LrpRules:
    """Which rule the attention gets and the gamma of the linear layers and the patch conv."""

    attention: AttentionRule = "cp"
    gamma_linear: float = 0.05
    gamma_conv: float = 0.25


# Tuned on 10 photos outside the quick subset (sorted indices 5, 105, ..., 905); see docs/faithfulness.md.
CP_LRP = LrpRules("cp", gamma_linear=0.05, gamma_conv=0.25)
ATTN_LRP = LrpRules("attnlrp", gamma_linear=0.05, gamma_conv=0.25)


# ----------------------------------------------------------------------------- detach points


def _amp(t: Tensor) -> tuple[str, bool, torch.dtype]:
    """The autocast state for ``t``'s device: a rule's backward pass computes as its forward pass did
    (in bfloat16 for a model set to it, vit_demo.precision; autograd runs the backward outside autocast)."""
    kind = t.device.type
    return kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)


def _replay(amp: tuple[str, bool, torch.dtype]) -> torch.autocast:
    """:func:`_amp`'s state again, for a rule's backward pass (measured on 8 photos: the CP-LRP maps of
    a backward pass in bfloat16 rank the patches as those of one in float32 do, rank correlation with
    the float32 maps 0.9996 either way, at 0.40 against 0.83 of the float32 map's time)."""
    kind, on, dtype = amp
    return torch.autocast(kind, dtype=dtype, enabled=on)


def _stabilize(t: Tensor, eps: float) -> Tensor:
    """t moved away from 0 by eps with its sign (+ for 0 and -0), as zennit's ``stabilize``: the same
    numbers as ``where(t >= 0, t + eps, t - eps)`` without a boolean tensor (``where`` and comparisons
    took 10-60 times a multiplication on the CPU, torch 2.14; t + 0.0 turns -0 into +0)."""
    return t + torch.copysign(torch.tensor(eps, dtype=t.dtype, device=t.device), t + 0.0)


def scale_gradient(tensor: Tensor, factor: float) -> Tensor:
    """Same value, gradient divided by ``factor`` (lxt's uniform rule ``divide_gradient``)."""
    return tensor.detach() + (tensor - tensor.detach()) / factor


def identity_rule(x: Tensor, y: Tensor) -> Tensor:
    """y = f(x) element-wise: the value of y, the gradient y / x (LRP identity rule)."""
    return y.detach() + (x - x.detach()) * (y / (x + INPUT_EPS)).detach()


def layer_norm_constant_std(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """LayerNorm with its standard deviation detached (lxt's ``layer_norm_forward``)."""
    mean = x.mean(dim=-1, keepdim=True)
    std = ((x - mean) ** 2).mean(dim=-1, keepdim=True).add(norm.eps).sqrt()
    y = (x - mean) / std.detach()
    return y * norm.weight + norm.bias if norm.elementwise_affine else y


class _GammaLinear(torch.autograd.Function):
    """``F.linear(x, w, b)`` whose backward pass is zennit's generalised gamma rule in lxt's
    gradient x input form: R_out = grad * out, R_in by the rule, grad_in = R_in / x.

    With x+ = max(x, 0), x- = min(x, 0), w+ = w + g max(w, 0), w- = w + g min(w, 0):
    a positive output is shared by x+ through w+ (with bias b + g max(b, 0)) and x- through w-;
    a negative one by x+ through w- (with bias b + g min(b, 0)) and x- through w+.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, gamma: float, out: Tensor | None = None) -> Tensor:
        out = F.linear(x, weight, bias) if out is None else out.clone()  # ``out``: that value, computed already
        ctx.save_for_backward(x, weight, bias, out)
        ctx.gamma, ctx.amp = gamma, _amp(x)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        with _replay(ctx.amp):
            return _GammaLinear.rule(ctx, grad)

    @staticmethod
    def rule(ctx, grad: Tensor):
        x, w, b, z = ctx.saved_tensors
        g = ctx.gamma
        wp, wn = w + g * w.clamp(min=0), w + g * w.clamp(max=0)
        bp, bn = (None, None) if b is None else (b + g * b.clamp(min=0), b + g * b.clamp(max=0))
        xp, xn = x.clamp(min=0), x.clamp(max=0)
        # the relevance grad * z of the positive outputs, then of the negative ones (0 elsewhere), shared
        sp = grad * z.clamp(min=0) / _stabilize(F.linear(xp, wp, bp) + F.linear(xn, wn), STABILIZER)
        sn = grad * z.clamp(max=0) / _stabilize(F.linear(xp, wn, bn) + F.linear(xn, wp), STABILIZER)
        s = torch.cat([sp, sn], dim=-1)
        r_in = xp * (s @ torch.cat([wp, wn])) + xn * (s @ torch.cat([wn, wp]))
        return r_in / _stabilize(x, INPUT_EPS), None, None, None, None


def gamma_linear(linear: nn.Linear, x: Tensor, gamma: float, out: Tensor | None = None) -> Tensor:
    """``linear(x)`` with the gamma rule's backward pass; ``out``: ``linear(x)`` as the module computed it (a
    forward hook's), so that the product is not computed twice."""
    return _GammaLinear.apply(x, linear.weight, linear.bias, gamma, None if out is None else out.detach())


def gamma_patch_conv(conv: nn.Conv2d, x: Tensor, gamma: float) -> Tensor:
    """The patch convolution (stride = kernel, no padding) as a linear map of each patch, with
    the gamma rule's backward pass: [B, c, h, w] -> [B, C, gh, gw]."""
    (kh, kw), (sh, sw) = conv.kernel_size, conv.stride
    if (kh, kw) != (sh, sw) or conv.padding != (0, 0) or conv.groups != 1 or conv.dilation != (1, 1):
        raise ValueError("the gamma rule here covers patch convolutions (stride = kernel) only")
    B, c, h, w = x.shape
    gh, gw = h // kh, w // kw
    patches = x.reshape(B, c, gh, kh, gw, kw).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, c * kh * kw)
    out = _GammaLinear.apply(patches, conv.weight.reshape(conv.out_channels, -1), conv.bias, gamma)  # [B, gh*gw, C]
    return out.transpose(1, 2).reshape(B, conv.out_channels, gh, gw)


class _GammaConv(torch.autograd.Function):
    """``F.conv2d`` with the gamma rule of :class:`_GammaLinear`, for any stride and padding (a
    convolutional stem's 3x3 convolutions); the transposed convolution carries the shares back."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, gamma: float, stride, padding) -> Tensor:
        out = F.conv2d(x, weight, bias, stride, padding)
        ctx.save_for_backward(x, weight, bias, out)
        ctx.gamma, ctx.stride, ctx.padding, ctx.amp = gamma, stride, padding, _amp(x)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        with _replay(ctx.amp):
            return _GammaConv.rule(ctx, grad)

    @staticmethod
    def rule(ctx, grad: Tensor):
        x, w, b, z = ctx.saved_tensors
        g, st, pad = ctx.gamma, ctx.stride, ctx.padding
        wp, wn = w + g * w.clamp(min=0), w + g * w.clamp(max=0)
        bp, bn = (None, None) if b is None else (b + g * b.clamp(min=0), b + g * b.clamp(max=0))
        xp, xn = x.clamp(min=0), x.clamp(max=0)
        sp = grad * z.clamp(min=0) / _stabilize(F.conv2d(xp, wp, bp, st, pad) + F.conv2d(xn, wn, None, st, pad),
                                                STABILIZER)
        sn = grad * z.clamp(max=0) / _stabilize(F.conv2d(xp, wn, bn, st, pad) + F.conv2d(xn, wp, None, st, pad),
                                                STABILIZER)

        def back(s: Tensor, weight: Tensor) -> Tensor:  # s @ W for a convolution
            return torch.nn.grad.conv2d_input(x.shape, weight, s, st, pad)

        r_in = xp * (back(sp, wp) + back(sn, wn)) + xn * (back(sp, wn) + back(sn, wp))
        return r_in / _stabilize(x, INPUT_EPS), None, None, None, None, None


def gamma_conv(conv: nn.Conv2d, x: Tensor, gamma: float) -> Tensor:
    """``conv(x)`` with the gamma rule's backward pass: a patch convolution as a linear map of each
    patch (:func:`gamma_patch_conv`), any other one (a conv stem's) through :class:`_GammaConv`."""
    if conv.kernel_size == conv.stride and conv.padding == (0, 0) and conv.groups == 1 and conv.dilation == (1, 1):
        return gamma_patch_conv(conv, x, gamma)
    if conv.groups != 1 or conv.dilation != (1, 1) or isinstance(conv.padding, str):
        raise ValueError("the gamma rule here covers convolutions without groups, dilation or named padding")
    return _GammaConv.apply(x, conv.weight, conv.bias, gamma, conv.stride, conv.padding)


def rms_norm_constant(norm: nn.Module, x: Tensor) -> Tensor:
    """RMSNorm with its root mean square detached (the LayerNorm rule without the mean)."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt().detach() * norm.weight


def cp_gate(gate: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """CP-LRP on a GLU: the gate is a constant, relevance flows through the value."""
    return gate.detach(), value


def uniform_gate(gate: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """AttnLRP on a GLU: the uniform rule for a product of two inputs, each gradient / 2."""
    return scale_gradient(gate, 2), scale_gradient(value, 2)


def cp_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """CP-LRP: attention probabilities are constants; relevance flows through v only."""
    return q.detach(), k.detach(), v


def attnlrp_attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """AttnLRP: uniform rule on both matmuls (q k^T, then A v): q, k gradients / 4, v / 2."""
    return scale_gradient(q, 4), scale_gradient(k, 4), scale_gradient(v, 2)


# ----------------------------------------------------------------------------- the mode


@contextmanager
def explanation_mode(model: VisionTransformer, rules: LrpRules = CP_LRP) -> Iterator[VisionTransformer]:
    """Within the block, ``model``'s backward pass propagates LRP relevance by ``rules``.

    Forward hooks on this instance's LayerNorm, activation, Linear and Conv modules return
    the same values with rule-shaped gradients. The model's own modules say what they are by
    their ``relevance`` attribute: every attention (``"attention"``: the blocks', an attention
    pool's, a parallel block's) gets a rule for its q, k, v in ``relevance_rule``, every GLU
    MLP (``"gate"``) one for its gate; an RMSNorm is ``"rms_norm"``, QuickGELU ``"activation"``.
    Everything is removed on exit, also after an error.
    """
    if rules.attention not in ("cp", "attnlrp"):
        raise ValueError(f"unknown attention rule {rules.attention!r}: 'cp' or 'attnlrp'")
    attn_rule, gate_rule = (cp_attention, cp_gate) if rules.attention == "cp" else (attnlrp_attention, uniform_gate)
    handles = []
    attentions = [m for m in model.modules() if getattr(m, "relevance", None) == "attention"]
    gated = [m for m in model.modules() if getattr(m, "relevance", None) == "gate"]
    lock = gradient_lock(model)
    lock.acquire()  # no plain gradient pass on this instance while the rules are on
    try:
        for m in model.modules():
            kind = getattr(m, "relevance", None)
            if isinstance(m, nn.LayerNorm):
                handles.append(m.register_forward_hook(lambda mod, inp, out: layer_norm_constant_std(mod, inp[0])))
            elif kind == "rms_norm":
                handles.append(m.register_forward_hook(lambda mod, inp, out: rms_norm_constant(mod, inp[0])))
            elif isinstance(m, (nn.GELU, nn.SiLU)) or kind == "activation":
                handles.append(m.register_forward_hook(lambda mod, inp, out: identity_rule(inp[0], out)))
            elif isinstance(m, nn.Linear):
                g = rules.gamma_linear
                handles.append(m.register_forward_hook(lambda mod, inp, out, g=g: gamma_linear(mod, inp[0], g, out)))
            elif isinstance(m, nn.Conv2d):
                g = rules.gamma_conv
                handles.append(m.register_forward_hook(lambda mod, inp, out, g=g: gamma_conv(mod, inp[0], g)))
        for a in attentions:
            a.relevance_rule = attn_rule
        for m in gated:
            m.relevance_rule = gate_rule
        yield model
    finally:
        for h in handles:
            h.remove()
        for a in attentions + gated:
            a.relevance_rule = None
        lock.release()


def input_relevance(model: VisionTransformer, x: Tensor, target: int | Tensor | None, rules: LrpRules) -> Tensor:
    """Relevance of every input value for the target logit: x * grad in explanation mode,
    [B, 3, h, w]. ``target`` None explains the top-1 class of each image."""
    with gradient_pass(model, x) as x, explanation_mode(model, rules):
        logits = model(x).logits
        t = targets(target, logits)
        (grad,) = torch.autograd.grad(logits.gather(1, t[:, None]).sum(), x)
    return (x * grad).detach()


def patch_relevance(model: VisionTransformer, x: Tensor, target: int | Tensor | None, rules: LrpRules) -> Tensor:
    """The LRP map [B, gh, gw]: input relevance summed over channels and over each patch."""
    p = model.cfg.patch_size
    r = input_relevance(model, x, target, rules).sum(dim=1, keepdim=True)  # [B, 1, h, w]
    return F.avg_pool2d(r, p, p)[:, 0] * (p * p)


@register("lrp", title="CP-LRP", cite="Ali et al., ICML 2022", bf16_ok=True)
def cp_lrp_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """CP-LRP map (attention held constant, gamma rules as :data:`CP_LRP`)."""
    return patch_relevance(model, x, target, CP_LRP)


@register("attnlrp", title="AttnLRP", cite="Achtibat et al., ICML 2024", bf16_ok=True)
def attn_lrp_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """AttnLRP map (softmax and matmul rules, gamma rules as :data:`ATTN_LRP`)."""
    return patch_relevance(model, x, target, ATTN_LRP)


@register("lrp-gated", title="CP-LRP × grad-rollout", cite="this project: CP-LRP gated by gradient-weighted rollout",
          bf16_ok=True)
def gated_lrp_map(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """CP-LRP gated by gradient-weighted rollout: max(CP-LRP, 0) * grad-rollout, per patch.

    Two kinds of evidence for the same class: LRP says which patches' pixels carry the class
    logit, grad-rollout says which patches the class-relevant attention flows from. The
    product keeps a patch only when both point at it. Defined once (no weights to tune); chosen
    on 10 photos outside the quick subset (sorted indices 5, 105, ..., 905).
    """
    ag = attention_gradients(model, x, target)
    gate = grad_rollout(ag.attentions, ag.grads, ag.layout)
    return cp_lrp_map(model, x, ag.target).clamp(min=0) * gate
