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


def rank_groups(seed: Tensor, groups: int) -> Tensor:
    """[B, gh, gw] map -> [B, n] group of every patch by the map's rank (0: the top; equal
    sizes up to one patch; ties keep the row-major order)."""
    n = seed[0].numel()
    rank = seed.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1)
    return rank * groups // n


def group_effects(model: VisionTransformer, x: Tensor, group: Tensor, t: Tensor, clean: Tensor,
                  s: ProbeSettings) -> Tensor:
    """Each group's effect on the class probability [B, groups]: the fall from ``clean`` [B]
    when it is hidden (and, with ``show``, plus the rise when it alone is shown on the blank input)."""
    B, n = group.shape
    gh, gw = x.shape[-2] // model.cfg.patch_size, x.shape[-1] // model.cfg.patch_size
    alone = group[:, None, :] == torch.arange(s.groups, device=group.device)[:, None]  # [B, groups, n]
    rows = [~alone]
    if s.show:
        rows += [torch.zeros(B, 1, n, dtype=torch.bool, device=group.device), alone]
    scores = masked_scores(model, x, torch.cat(rows, dim=1).reshape(B, -1, gh, gw), t, s.chunk, "probes").double()
    effect = clean.double()[:, None] - scores[:, : s.groups]
    if s.show:
        effect = effect + scores[:, s.groups + 1 :] - scores[:, s.groups, None]
    return effect


def probed_map(model: VisionTransformer, x: Tensor, target: Target = None, settings: ProbeSettings | None = None
               ) -> Tensor:
    """The probed map [B, gh, gw] with ``settings`` (see the module docstring)."""
    s = settings or ProbeSettings()
    with torch.no_grad():  # not inference mode: the targets index the seed's backward pass
        logits = model(x).logits.float()
        t = targets(target, logits)
        clean = logits.softmax(dim=-1).gather(1, t[:, None])[:, 0]
    seed = gated_lrp_map(model, x, t).detach()
    group = rank_groups(seed, s.groups)
    effect = unit_range(group_effects(model, x, group, t, clean, s)[:, :, None]).squeeze(-1)  # [B, groups], [0, 1]
    factor = s.floor + effect.float().gather(1, group).reshape(seed.shape)
    return unit_range(seed.clamp(min=0)) * factor


@register("lrp-probed", title="Probed LRP",
          cite="this project: gated CP-LRP x occlusion of its 8 rank groups, 8 forward passes more")
def probed_lrp(model: VisionTransformer, x: Tensor, target: Target = None) -> Tensor:
    """Probed LRP [B, gh, gw]: the gated LRP map weighted by the measured effect of its rank
    groups (:func:`probed_map`, default :class:`ProbeSettings`). Inside
    :func:`~vit_demo.methods.registry.reuse`, a gated map already computed is reused."""
    return probed_map(model, x, target)
