"""Probed LRP: the gated LRP map with its rank groups tested by a few occlusions.

Causal LRP (:mod:`vit_demo.methods.perturb`) measures every patch's effect with 256 masked
forward passes. A handful of passes can test the gated map it starts from coarsely: which parts
of its ranking the class probability depends on, and which it does not. The patches
are ranked by the gated map (``lrp-gated``) and cut into ``groups`` groups of equal size; each
group is hidden on its own (blended to 0 in normalised space, the mean colour, as in the
deletion test) and its effect is the fall of the class probability, p(x) - p(x without the
group). The map is the gated map times its group's effect, both scaled to [0, 1] (a group with
the smallest effect keeps a small floor, ``floor``, so the gated order still ranks its patches):

    map(p) = u(max(gated, 0))(p) * (floor + u(effect)(group of p)),   u: min -> 0, max -> 1

Cost: the gated map (one forward and two backward passes, about 16 forward passes' worth), the
plain forward pass that picks the class, and ``groups`` masked forward passes, batched. The
masks follow each image's own ranking, so a batch gives the same maps as single images.

Path-probed LRP (an experiment, not registered: ``ProbeSettings(path=True)``, :data:`PATH`,
:func:`path_effects`; ``lrp-path`` in ``benchmarks/tune_probe.py``) tests the same groups along the curves the
faithfulness scores integrate instead of alone: the top k groups shown on the blank input and
hidden from the photo (k = 1 .. groups - 1, and the blank input: 2 groups - 1 masked passes); a
group's effect is its rise when it joins the groups above it plus its fall when it leaves after
them. A middle group hidden alone from the whole photo rarely changes the probability; along the
curves it does, and that is where causal LRP's 256 masks gain over the gated map. On the held-out
photos it raised SRG with the mean colour (0.387 against the gated map's 0.377) but not with blur
(0.355 against 0.352), for 15 masked passes (about 0.53 s a photo on 2 idle cores, over the 0.5 s
the app's maps have): not worth a place in every upload's row, so not registered.

Measured on held-out ImageNet photos (docs/faithfulness.md): SaCo above the gated map's on both
replacement kinds, SRG, deletion and insertion level with it; settings fixed before any held-out
photo was scored, not tuned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import VisionTransformer
from .lrp import gated_lrp_map
from .passes import masked_scores, targets
from .perturb import unit_range
from .registry import Target, register


@dataclass(frozen=True)
class ProbeSettings:
    groups: int = 8  # rank groups of the gated map, each hidden once: one forward pass each
    show: bool = False  # also show each group alone on the blank input (groups more passes)
    floor: float = 0.05  # the weakest group's factor, so the gated map still orders its patches
    chunk: int = 16  # masked inputs per forward pass
    path: bool = False  # effects along the curves' orders instead of each group hidden alone (lrp-path)
    bf16: bool = False  # masked passes in bfloat16 where the device computes it natively


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively (CUDA; a CPU with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def rank_groups(seed: Tensor, groups: int) -> Tensor:
    """[B, gh, gw] map -> [B, n] group of every patch by the map's rank (0: the top; equal
    sizes up to one patch; ties keep the row-major order)."""
    n = seed[0].numel()
    rank = seed.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1)
    return rank * groups // n


def group_effects(model: VisionTransformer, x: Tensor, group: Tensor, targets: Tensor, clean: Tensor,
                  settings: ProbeSettings) -> Tensor:
    """Each group's effect on the class probability [B, groups]: the fall from ``clean`` [B]
    when it is hidden (and, with ``show``, plus the rise when it alone is shown on the blank input)."""
    B, n = group.shape
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    alone = group[:, None, :] == torch.arange(settings.groups, device=group.device)[:, None]  # [B, groups, n]
    rows = [~alone]
    if settings.show:
        rows += [torch.zeros(B, 1, n, dtype=torch.bool, device=group.device), alone]
    scores = masked_scores(model, x, torch.cat(rows, dim=1).reshape(B, -1, gh, gw), targets, settings.chunk, "probes").double()
    effect = clean.double()[:, None] - scores[:, : settings.groups]
    if settings.show:
        effect = effect + scores[:, settings.groups + 1 :] - scores[:, settings.groups, None]
    return effect


def path_effects(model: VisionTransformer, x: Tensor, group: Tensor, targets: Tensor, clean: Tensor,
                 settings: ProbeSettings) -> Tensor:
    """Each group's effect along the curves [B, groups]: its rise in class probability when it is
    shown after the groups above it on the blank input (the insertion order, and the least-relevant-
    first deletion seen from its end) plus its fall when it is hidden after the groups above it (the
    most-relevant-first deletion order). 2 groups - 1 masked passes: the blank input, the top k
    groups shown (k = 1 .. groups - 1) and hidden (k = 1 .. groups - 1); ``clean`` [B] is the whole image's."""
    B, n = group.shape
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    upto = group[:, None, :] < torch.arange(settings.groups, device=group.device)[:, None]  # [B, groups, n]: above k
    masks = torch.cat([upto, ~upto[:, 1:]], dim=1).reshape(B, -1, gh, gw)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=settings.bf16 and native_bf16(x.device)):
        # one image at a time: the same shapes in a batch as alone, so bfloat16 rounds alike and a
        # batch gives the same maps as single images
        scores = torch.cat([masked_scores(model, x[b : b + 1], masks[b : b + 1], targets[b : b + 1], settings.chunk, "probes")
                            for b in range(B)]).double()
    whole = clean.double()[:, None]
    shown = torch.cat([scores[:, : settings.groups], whole], dim=1)  # top k shown, k = 0 .. groups
    hidden = torch.cat([whole, scores[:, settings.groups :], scores[:, :1]], dim=1)  # top k hidden, k = 0 .. groups
    return (shown[:, 1:] - shown[:, :-1]) + (hidden[:, :-1] - hidden[:, 1:])


def probed_map(model: VisionTransformer, x: Tensor, target: Target = None, settings: ProbeSettings | None = None
               ) -> Tensor:
    """The probed map [B, gh, gw] with ``settings`` (see the module docstring)."""
    with torch.no_grad():  # not inference mode: the targets index the seed's backward pass
        logits = model(x).logits.float()
        t = targets(target, logits)
        clean = logits.softmax(dim=-1).gather(1, t[:, None])[:, 0]
    return probe_seed(model, x, t, clean, gated_lrp_map(model, x, t).detach(), settings)


def probe_seed(model: VisionTransformer, x: Tensor, targets: Tensor, clean: Tensor, seed: Tensor,
               settings: ProbeSettings | None = None) -> Tensor:
    """Any map ``seed`` [B, gh, gw] for the classes ``targets`` [B] (``clean`` [B]: their probabilities on
    the whole image) weighted by the measured effect of its rank groups:
    u(max(seed, 0)) * (floor + u(effect of the patch's group))."""
    s = settings or ProbeSettings()
    group = rank_groups(seed, s.groups)
    effects = path_effects if s.path else group_effects
    effect = unit_range(effects(model, x, group, targets, clean, s)[:, :, None]).squeeze(-1)  # [B, groups], [0, 1]
    factor = s.floor + effect.float().gather(1, group).reshape(seed.shape)
    return unit_range(seed.clamp(min=0)) * factor


@register("lrp-probed", title="Probed LRP",
          cite="this project: gated CP-LRP x occlusion of its 8 rank groups, 8 forward passes more")
def probed_lrp(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Probed LRP [B, gh, gw]: the gated LRP map weighted by the measured effect of its rank
    groups (:func:`probed_map`, default :class:`ProbeSettings`). It runs in float32 on a bf16 model
    (not ``bf16_ok``: its rank correlation with its fp32 map was 0.89 at the 5th percentile of 32 photos,
    docs/performance.md). Inside
    :func:`~vit_demo.methods.registry.reuse`, a gated map already computed is reused."""
    return probed_map(model, x, target)


PATH = ProbeSettings(path=True, bf16=True)  # lrp-path, the experiment (see the module docstring)
