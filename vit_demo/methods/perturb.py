"""A causal explanation from forward passes only: RISE (Petsiuk et al., BMVC 2018) on the patch grid.

Random smooth masks over the patch grid hide part of the image (a hidden patch is blended
toward 0 in normalised space, the dataset's mean colour, as in the deletion / insertion test);
each masked input is scored by the softmax probability of the class explained. A patch's
saliency is the mean score of the masks that show it minus the mean score of the masks that
hide it, both weighted by how much each mask shows (hides) it:

    S(p) = sum_m s_m M_m(p) / sum_m M_m(p)  -  sum_m s_m (1 - M_m(p)) / sum_m (1 - M_m(p))

(RISE's estimator, sum_m s_m M_m(p) / (N keep), with the complementary term subtracted: the
same expectation up to a constant for a uniform mask density, with less variance.)

Masks, as in RISE: a coarse random binary grid (cells of ``cell`` x ``cell`` patches, each kept
with probability ``keep``) upsampled bilinearly and shifted by a random offset of up to a cell.
They come from a seeded generator, so a map is reproducible, and every image of a batch gets the
same masks, so a batch gives the same maps as single images. Cost: ``masks`` forward passes per
image, run ``chunk`` inputs at a time.

Causal LRP (:func:`causal_lrp`, the registry's ``lrp-causal``) uses the same masked forward passes
the other way round: a single-pass map (the gated LRP map) proposes the patches, and masks that
reveal or hide that map's top measure how much the class probability depends on each of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import VisionTransformer
from .lrp import gated_lrp_map
from .passes import masked_scores, targets
from .registry import Target, register


@dataclass(frozen=True)
class RiseSettings:
    masks: int = 256  # forward passes per image
    cell: int = 2  # coarse cell size in patches
    keep: float = 0.5  # probability that a coarse cell shows the image
    seed: int = 0
    chunk: int = 32  # masked inputs per forward pass


def rise_masks(grid: tuple[int, int], settings: RiseSettings) -> Tensor:
    """[masks, gh, gw] soft masks in [0, 1] (1 = the patch shows the image), seeded."""
    gh, gw = grid
    g = torch.Generator().manual_seed(settings.seed)
    ch, cw = math.ceil(gh / settings.cell) + 1, math.ceil(gw / settings.cell) + 1
    coarse = (torch.rand(settings.masks, 1, ch, cw, generator=g) < settings.keep).float()
    up = F.interpolate(coarse, size=(ch * settings.cell, cw * settings.cell), mode="bilinear", align_corners=False)[:, 0]
    dy = torch.randint(0, settings.cell, (settings.masks,), generator=g)
    dx = torch.randint(0, settings.cell, (settings.masks,), generator=g)
    return torch.stack([up[i, y : y + gh, x : x + gw] for i, (y, x) in enumerate(zip(dy.tolist(), dx.tolist()))])


def rise_from_scores(scores: Tensor, masks: Tensor) -> Tensor:
    """The contrast estimator: scores [B, M], masks [M, gh, gw] -> saliency [B, gh, gw]."""
    m = masks.to(scores.device, scores.dtype).flatten(1)  # [M, n]
    shown = scores @ m / m.sum(dim=0).clamp(min=1e-6)
    hidden = scores @ (1 - m) / (1 - m).sum(dim=0).clamp(min=1e-6)
    return (shown - hidden).reshape(-1, *masks.shape[1:])


@register("rise", title="RISE", cite="Petsiuk et al., BMVC 2018; 256 masks", slow=True)
def rise(model: VisionTransformer, x: Tensor, target: Target = None, settings: RiseSettings | None = None) -> Tensor:
    """RISE saliency [B, gh, gw] for the target class (None: the top-1 class of each image);
    the forward passes report their progress (:func:`vit_demo.progress.report`)."""
    s = settings or RiseSettings()
    p = model.cfg.patch_size
    grid = (x.shape[-2] // p, x.shape[-1] // p)
    with torch.inference_mode():
        t = targets(target, model(x).logits)
    masks = rise_masks(grid, s)
    return rise_from_scores(masked_scores(model, x, masks, t, s.chunk, "masks"), masks)


# ---------------------------------------------------------------------------------------------
# Causal LRP: the gated LRP map, weighted by the effect of its patches measured by perturbation


@dataclass(frozen=True)
class CausalSettings:
    masks: int = 256  # forward passes per image: half reveal the seed's top, half hide it
    jitter: float = 0.2  # noise on the seed's ranks (in units of all patches), so masks differ
    levels: int = 8  # strata per half: scores are compared only between masks of one stratum
    seed: int = 0
    chunk: int = 32  # masked inputs per forward pass


def seeded_masks(seed_map: Tensor, settings: CausalSettings) -> tuple[Tensor, Tensor]:
    """Masks that follow a seed map, [B, M, gh, gw] bool (True = shown), and each mask's stratum [M].

    The patches are ranked by the seed (r = 0 the most salient, up to 1), each rank jittered by
    ``jitter`` x N(0, 1) noise. Mask j of the first half shows the patches with a jittered rank
    below its level l_j, the top l_j of the image as an insertion curve would; mask j of the second
    half hides them, as a deletion curve would. The levels are spread evenly over (0, 1). The same
    noise (from ``seed``) for every image, so a batch gives the same maps as single images."""
    B, gh, gw = seed_map.shape
    n, half = gh * gw, settings.masks // 2
    rank = seed_map.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1).float() / n  # [B, n]
    g = torch.Generator().manual_seed(settings.seed)
    noise = torch.randn(2, half, n, generator=g).to(seed_map.device) * settings.jitter
    level = ((torch.arange(half) + 0.5) / half).to(seed_map.device)  # [half]
    top = rank[:, None, None, :] + noise[None] < level[None, None, :, None]  # [B, 2, half, n]
    shown = torch.cat([top[:, 0], ~top[:, 1]], dim=1)  # reveal the top / hide the top
    stratum = (level * settings.levels).long().clamp(max=settings.levels - 1)
    return shown.reshape(B, 2 * half, gh, gw), torch.cat([stratum, stratum + settings.levels])


def patch_effects(scores: Tensor, shown: Tensor, stratum: Tensor) -> Tensor:
    """Each patch's effect on the score: scores [B, M], shown [B, M, gh, gw], stratum [M] -> [B, gh, gw].

    Within each stratum the score and each patch's presence are centred; the effect is the
    least-squares slope of score on presence over all masks, sum(s~ m~) / sum(m~^2). Centring per
    stratum removes what the level alone explains (more of the image shown, higher score), which
    would otherwise credit every patch that is only shown at high levels."""
    B, M, gh, gw = shown.shape
    m = shown.reshape(B, M, -1).double()  # float64: the score differences can be tiny next to the scores
    s = scores.double().clone()
    for k in stratum.unique().tolist():
        sel = stratum == k
        s[:, sel] -= s[:, sel].mean(dim=1, keepdim=True)
        m[:, sel] -= m[:, sel].mean(dim=1, keepdim=True)
    slope = torch.einsum("bm,bmn->bn", s, m) / (m * m).sum(dim=1).clamp(min=1e-6)
    return slope.reshape(B, gh, gw).float()


def unit_range(maps: Tensor) -> Tensor:
    """Each map [B, gh, gw] scaled to [0, 1] (min to 0, max to 1; a flat map gives 0)."""
    f = maps.flatten(1)
    f = f - f.amin(dim=1, keepdim=True)
    return (f / f.amax(dim=1, keepdim=True).clamp(min=1e-12)).reshape(maps.shape)


@register("lrp-causal", title="Causal LRP", cite="this project: gated CP-LRP x perturbation effect, 256 masks",
          slow=True)
def causal_lrp(model: VisionTransformer, x: Tensor, target: Target = None, settings: CausalSettings | None = None
               ) -> Tensor:
    """Causal LRP [B, gh, gw]: the gated LRP map (``lrp-gated``, one forward and two backward
    passes) times each patch's effect on the class probability, measured with ``masks`` forward
    passes on masks that follow the gated map (:func:`seeded_masks`, :func:`patch_effects`).

    The single-pass map proposes which patches matter; the perturbation tests them in the
    contexts the deletion and insertion curves visit (the map's top shown alone, or hidden from
    the whole image) and demotes patches the probability does not depend on. Both factors are
    scaled to [0, 1] and multiplied. Settings chosen on 50 ImageNet sample photos outside the
    quick subset (sorted indices 5, 25, ..., 985), never on the evaluation photos. Inside
    :func:`~vit_demo.methods.registry.reuse`, a gated map already computed for these targets is reused."""
    s = settings or CausalSettings()
    with torch.no_grad():  # not inference mode: the targets index the seed's backward pass
        t = targets(target, model(x).logits)
    seed = gated_lrp_map(model, x, t).detach()
    shown, stratum = seeded_masks(seed, s)
    effect = patch_effects(masked_scores(model, x, shown, t, s.chunk, "masks"), shown, stratum.to(x.device))
    return unit_range(seed.clamp(min=0)) * unit_range(effect)

