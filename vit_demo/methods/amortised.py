"""Amortised LRP: causal LRP's perturbation test predicted instead of run, then probed.

Causal LRP (:mod:`vit_demo.methods.perturb`) multiplies the gated LRP map by each patch's
measured effect on the class probability, from 256 masked forward passes. Here a small network
predicts that effect from maps the page computes anyway, the idea of amortised explainers
(Covert et al., "Learning to Estimate Shapley Values with Vision Transformers", ICLR 2023): it
was trained once, on photos it is never evaluated on, to reproduce the effect that causal LRP's
test measured there. Per patch, its inputs are seven single-pass maps (:data:`INPUTS`), each
scaled by its largest magnitude and as ranks in [0, 1], with their 3 x 3 neighbourhood means and
maxima (42 numbers, :func:`features`); it is a per-patch MLP (42 -> 32 -> 32 -> 1, GELU; five
of them trained from different seeds, averaged). Then

    seed(p) = u(max(gated, 0))(p) * u(predicted effect)(p),        u: min -> 0, max -> 1

and, as probed LRP does with the gated map (:func:`vit_demo.methods.probe.probe_seed`), the seed's
8 rank groups are each hidden once (8 masked forward passes, batched) and every patch is weighted
by its group's measured fall: map = u(seed) * (0.05 + u(group effect)).

Training (``python benchmarks/tune_amortised.py export``): 328 of the 1000 shared ImageNet photos
(sorted indices 1, 2, 4, 6, 7, 8, 9 mod 10), the shipped DeiT-Tiny, the true label; target: the
sum of the z-scored effects from causal LRP's 256 masks filled with the mean colour and 256
filled with a blur. The weights are :data:`WEIGHTS` (a few thousand numbers). The features are
scaled per photo, so the network runs on any grid and any model, but it learnt the effects of
DeiT-Tiny on ImageNet photos: on another model it is a prior that the probes then correct.

Cost: the gated map (shared with ``lrp-gated``: a CP-LRP pass and the attention-gradient pass), whose
attention-gradient pass also gives Chefer's map, GradCAM's, the raw attention, the rollout and the
class's probability, the network (negligible) and 8 masked forward passes, batched (plus one forward
pass when no class is given). Measured in docs/faithfulness.md, with its scores on held-out photos,
and in bfloat16 in docs/performance.md.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from ..model import VisionTransformer
from .attention import cls_attention
from .gradients import attention_gradients
from .passes import targets
from .perturb import unit_range
from .probe import probe_seed
from .registry import Target, get, register, sharing
from .rollout import rollout

INPUTS = ("lrp", "lrp-gated", "grad-rollout", "chefer", "gradcam", "rollout", "attention")
CHANNELS = 6 * len(INPUTS)  # each map scaled and as ranks, then their 3x3 means and maxima
WIDTH = 32
WEIGHTS = Path(__file__).with_name("amortised.safetensors")


def features(maps: dict[str, Tensor]) -> Tensor:
    """[B, CHANNELS, gh, gw]: the :data:`INPUTS` maps [B, gh, gw], each divided by its largest
    magnitude and as ranks in [0, 1] (ties in row-major order), then their 3x3 means and maxima."""
    chans = []
    for name in INPUTS:
        m = maps[name].float()
        flat = m.flatten(1)
        rank = flat.argsort(dim=1, stable=True).argsort(dim=1).float() / max(flat.shape[1] - 1, 1)
        chans += [m / flat.abs().amax(dim=1).clamp(min=1e-12)[:, None, None], rank.reshape(m.shape)]
    X = torch.stack(chans, dim=1)
    return torch.cat([X, F.avg_pool2d(X, 3, 1, 1, count_include_pad=False), F.max_pool2d(X, 3, 1, 1)], dim=1)


def effect_net() -> nn.Sequential:
    """One per-patch MLP as 1x1 convolutions: CHANNELS -> WIDTH -> WIDTH -> 1."""
    return nn.Sequential(nn.Conv2d(CHANNELS, WIDTH, 1), nn.GELU(), nn.Conv2d(WIDTH, WIDTH, 1), nn.GELU(),
                         nn.Conv2d(WIDTH, 1, 1))


class EffectPredictor(nn.Module):
    """The averaged networks, with the training inputs' per-channel mean and standard deviation."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.nets = nn.ModuleList(effect_net() for _ in range(count))
        self.register_buffer("mean", torch.zeros(1, CHANNELS, 1, 1))
        self.register_buffer("std", torch.ones(1, CHANNELS, 1, 1))

    def forward(self, features: Tensor) -> Tensor:
        """[B, CHANNELS, gh, gw] -> the predicted effect [B, gh, gw]."""
        z = (features - self.mean) / self.std
        return torch.stack([net(z)[:, 0] for net in self.nets]).mean(dim=0)


def load_predictor(path: str | Path = WEIGHTS) -> EffectPredictor:
    """The predictor in a safetensors file: every key and shape checked, a clear error otherwise."""
    state = load_file(str(path))
    count = len({k.split(".")[1] for k in state if k.startswith("nets.")})
    predictor = EffectPredictor(count)
    expected = {k: tuple(v.shape) for k, v in predictor.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if count == 0 or expected != got:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        wrong = sorted(f"{k}: {got[k]} (expected {expected[k]})" for k in set(got) & set(expected) if got[k] != expected[k])
        raise ValueError(f"{path} is not an effect predictor for {CHANNELS} inputs: missing {missing or 'none'}, "
                         f"unexpected {extra or 'none'}, wrong shapes {wrong or 'none'}")
    predictor.load_state_dict(state)
    return predictor.eval().requires_grad_(False)


@functools.cache
def predictor() -> EffectPredictor:
    """The shipped predictor (:data:`WEIGHTS`), loaded once."""
    return load_predictor()


def amortised_seed(maps: dict[str, Tensor]) -> Tensor:
    """u(max(gated, 0)) * u(predicted effect) [B, gh, gw] from the :data:`INPUTS` maps (the
    shipped :func:`predictor`)."""
    with torch.no_grad():
        effect = predictor()(features(maps))
    return unit_range(maps["lrp-gated"].float().clamp(min=0)) * unit_range(effect)


@register("lrp-amortised", title="Amortised LRP",
          cite="this project: gated CP-LRP x an effect predictor trained on causal LRP's tests, 8 forward passes more",
          bf16_ok=True)
def amortised_lrp(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Amortised LRP [B, gh, gw] (see the module docstring). Inside
    :func:`~vit_demo.methods.registry.reuse`, the input maps already computed are reused."""
    with sharing(model, x):  # the passes the input maps share run once
        if target is None:  # the classes as a tensor, as the gated map passes them on to CP-LRP
            with torch.no_grad():
                target = targets(None, model(x).logits)
        # the attention-gradient pass: the class's probability, the raw-attention and rollout maps (the
        # registered maps' values: its attention is the capture's), the gated map's gate, Chefer, GradCAM
        ag = attention_gradients(model, x, target)
        t = ag.target
        clean = ag.logits.softmax(dim=-1).gather(1, t[:, None])[:, 0]
        maps = {"attention": cls_attention(ag.attentions, ag.layout, layer=-1), "rollout": rollout(ag.attentions, ag.layout)}
        maps |= {name: get(name)(model, x, t).detach() for name in INPUTS if name not in maps}
    return probe_seed(model, x, t, clean, amortised_seed(maps))
