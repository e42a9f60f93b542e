"""Two more faithfulness scores for patch maps, each with two kinds of replacement: SRG and SaCo.

- **SRG**, symmetric relevance gain (Blücher, Vielhaben & Strodthoff, "Decoupling pixel flipping
  and occlusion strategy for consistent XAI benchmarks", TMLR 2024): the patches are removed
  least relevant first (LeRF) and, separately, most relevant first (MoRF); SRG is the area
  between the two curves of the target probability, mean(LeRF) - mean(MoRF). A faithful map
  keeps the probability up while its bottom goes and lets it fall while its top goes; random
  orders give 0.
- **SaCo**, the salience-guided faithfulness coefficient (Wu et al., "On the Faithfulness of
  Vision Transformer Explanations", CVPR 2024, Algorithm 1): the patches are ranked by the map
  and cut into K groups of equal size (K = 10), G_1 the most salient. Each group is removed on
  its own; its effect is p(x) - p(x without G_i), its salience s(G_i) the sum of the map over it.
  For every pair i < j the weight s(G_i) - s(G_j) counts for the map when G_i's effect is at
  least G_j's and against it otherwise; SaCo = sum of the signed weights / sum of their sizes,
  in [-1, 1] (1: the map's salience differences are never contradicted by the model).

A removed patch is replaced by the dataset's mean colour (0 in normalised space, as in the
deletion / insertion curves) or by the same patch of a blurred copy of the image (Gaussian,
``BLUR_SIGMA`` pixels), the two kinds the papers above discuss. The curves have the project's
points (one grid row of patches per step). Everything for a batch, every map and both scores,
goes through :func:`vit_demo.methods.passes.masked_scores` in one call.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import methods as registry
from ..methods.passes import masked_scores
from ..model import VisionTransformer
from .curves import forward_batch, num_steps, patch_order
from .faithfulness import target_batches

if TYPE_CHECKING:
    from ..checkpoints.load import LoadedModel

KINDS = ("mean", "blur")
MEASURES = ("deletion", "insertion", "srg", "saco")
SACO_GROUPS = 10
BLUR_SIGMA = 10.0  # pixels at the model's input size (224 for the DeiTs)


def gaussian_blur(x: Tensor, sigma: float) -> Tensor:
    """x [B, C, h, w] blurred by a separable Gaussian (kernel 2 ceil(3 sigma) + 1, edges replicated)."""
    r = math.ceil(3 * sigma)
    k = torch.exp(-((torch.arange(-r, r + 1, dtype=x.dtype, device=x.device) / sigma) ** 2) / 2)
    k = k / k.sum()
    C = x.shape[1]
    y = F.pad(x, (r, r, 0, 0), mode="replicate")
    y = F.conv2d(y, k.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)
    y = F.pad(y, (0, 0, r, r), mode="replicate")
    return F.conv2d(y, k.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)


def replacement(x: Tensor, kind: str) -> Tensor:
    """What a removed patch shows: "mean" (0 in normalised space) or "blur" (a blurred copy)."""
    if kind == "mean":
        return torch.zeros_like(x)
    if kind == "blur":
        return gaussian_blur(x, BLUR_SIGMA)
    raise ValueError(f"replacement must be one of {', '.join(KINDS)}, not {kind!r}")


def saco_groups(saliency: Tensor, groups: int = SACO_GROUPS) -> Tensor:
    """[B, gh, gw] maps -> [B, n] group of every patch, 0 = the most salient tenth (equal sizes
    up to one patch; ties keep the row-major order)."""
    n = saliency[0].numel()
    rank = patch_order(saliency).argsort(dim=1)  # position of each patch in the order
    return rank * groups // n


def saco(salience: Tensor, effect: Tensor) -> Tensor:
    """SaCo per image from the groups' salience sums [B, K] (G_1 first) and effects [B, K]."""
    i, j = torch.triu_indices(salience.shape[1], salience.shape[1], offset=1)
    w = salience[:, i] - salience[:, j]
    signed = torch.where(effect[:, i] >= effect[:, j], w, -w)
    total = signed.abs().sum(dim=1)
    return torch.where(total > 0, signed.sum(dim=1) / total.clamp(min=1e-30), torch.zeros_like(total))


def protocol_masks(maps: Sequence[Tensor], per_step: int, groups: int) -> Tensor:
    """The masks (True = shown) of every map: [B, 2 + K (3 (S - 1) + groups), gh, gw] in the
    order clean, blank, then per map its MoRF deletion, LeRF deletion and insertion points
    strictly inside the curves, and its SaCo groups removed one at a time."""
    B, gh, gw = maps[0].shape
    n = gh * gw
    S = num_steps(n, per_step)
    counts = torch.arange(1, S, device=maps[0].device) * per_step
    rows = [torch.ones(B, 1, n, dtype=torch.bool, device=maps[0].device), torch.zeros(B, 1, n, dtype=torch.bool,
                                                                                        device=maps[0].device)]
    for m in maps:
        rank = patch_order(m).argsort(dim=1)  # [B, n]
        first = rank[:, None, :] < counts[:, None]  # [B, S-1, n]: among the k most salient
        last = rank[:, None, :] >= n - counts[:, None]  # among the k least salient
        group = saco_groups(m, groups)
        rows += [~first, ~last, first, group[:, None, :] != torch.arange(groups, device=m.device)[:, None]]
    return torch.cat(rows, dim=1).reshape(B, -1, gh, gw)


def measures(model: VisionTransformer, x: Tensor, maps: Sequence[Tensor], target: Tensor, kind: str = "mean",
             per_step: int | None = None, groups: int = SACO_GROUPS) -> dict[str, Tensor]:
    """Deletion, insertion, SRG and SaCo of K maps ([B, gh, gw] each) for x [B, 3, h, w] and
    targets [B], with ``kind`` of replacement: ``{"deletion", "insertion", "srg", "saco"}`` ->
    [B, K] each (deletion and insertion: the mean of the MoRF deletion and the insertion curve,
    whose blank end is the fully replaced image)."""
    B, gh, gw = maps[0].shape
    per_step = per_step or gw
    S = num_steps(gh * gw, per_step)
    keep = protocol_masks([m.to(x.device) for m in maps], per_step, groups)
    probs = masked_scores(model, x, keep, target, forward_batch(x), "faithfulness", fill=replacement(x, kind)).double()
    clean, blank = probs[:, :1], probs[:, 1:2]
    per_map = probs[:, 2:].reshape(B, len(maps), 3 * (S - 1) + groups)
    out: dict[str, list[Tensor]] = {"deletion": [], "insertion": [], "srg": [], "saco": []}
    for k, m in enumerate(maps):
        morf, lerf, ins, removed = per_map[:, k].split([S - 1] * 3 + [groups], dim=1)
        morf, lerf = torch.cat([clean, morf, blank], 1).mean(1), torch.cat([clean, lerf, blank], 1).mean(1)
        out["deletion"].append(morf)
        out["insertion"].append(torch.cat([blank, ins, clean], 1).mean(1))
        out["srg"].append(lerf - morf)
        group = saco_groups(m, groups)
        salience = torch.zeros(B, groups, dtype=torch.float64, device=x.device)
        salience.scatter_add_(1, group.to(x.device), m.flatten(1).to(x.device, torch.float64))
        out["saco"].append(saco(salience, clean - removed))
    return {key: torch.stack(v, dim=1).float().cpu() for key, v in out.items()}


MapMaker = Callable[[VisionTransformer, Tensor, Tensor], Tensor]


def timed_maps(model: VisionTransformer, x: Tensor, makers: dict[str, MapMaker], target: Tensor
               ) -> tuple[list[Tensor], dict[str, float]]:
    """Each maker's maps for x and ``target``, each timed on its own (no passes shared), and the
    seconds of one plain forward pass of the batch under the key "forward"."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    seconds: dict[str, float] = {}
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        model(x)
        sync()
        seconds["forward"] = time.perf_counter() - t0
    maps = []
    for name, make in makers.items():
        t0 = time.perf_counter()
        maps.append(make(model, x, target).detach().float())
        sync()
        seconds[name] = time.perf_counter() - t0
    return maps, seconds


def summarise(values: Tensor) -> dict[str, float]:
    """Mean and standard error of per-image values."""
    n = values.numel()
    se = float(values.std() / math.sqrt(n)) if n > 1 else 0.0
    return {"mean": float(values.mean()), "se": se}


def evaluate_folder(lm: LoadedModel, paths: Sequence[str | os.PathLike], makers: dict[str, MapMaker],
                    target: str = "label", kinds: Sequence[str] = KINDS, batch_size: int = 4,
                    progress: bool = True, random_seed: int = 0, per_step: int | None = None,
                    share: bool = False) -> dict[str, Any]:
    """Deletion, insertion, SRG and SaCo of every maker's maps (and of random maps) over ``paths``,
    for each replacement kind; seconds per photo of every maker and of one forward pass, each
    measured on the same batches (``share``: the makers share their passes inside
    :func:`vit_demo.methods.reuse`, so a maker's seconds leave out what an earlier one computed).
    ``per_step``: patches per step of the curves (default one grid row). Returns ``{"images",
    "target", "kinds", "seconds_per_photo", "scores": {kind: {name: {measure: {"mean", "se"}}}},
    "per_image": {...the same, lists}, "errors"}``."""
    generator = torch.Generator().manual_seed(random_seed)
    names = [*makers, "random"]
    per_image: dict[str, dict[str, dict[str, list[float]]]] = {
        k: {n: {m: [] for m in MEASURES} for n in names} for k in kinds}
    seconds = dict.fromkeys(["forward", *makers], 0.0)
    count, errors = 0, []
    for x, cls in target_batches(lm, paths, target, batch_size, "SRG / SaCo", progress, errors):
        with registry.reuse(lm.model, x) if share else nullcontext():
            maps, spent = timed_maps(lm.model, x, makers, cls)
        maps.append(torch.rand(maps[0].shape, generator=generator))
        for key, s in spent.items():
            seconds[key] += s
        for kind in kinds:
            r = measures(lm.model, x, maps, cls, kind, per_step)
            for k, name in enumerate(names):
                for m in MEASURES:
                    per_image[kind][name][m] += r[m][:, k].tolist()
        count += len(x)
    if count == 0:
        raise ValueError("no readable images to evaluate: " + "; ".join(errors[:3]))
    scores = {k: {n: {m: summarise(torch.tensor(v, dtype=torch.float64)) for m, v in ms.items()}
                  for n, ms in per_kind.items()} for k, per_kind in per_image.items()}
    return {"images": count, "target": target, "kinds": list(kinds),
            "seconds_per_photo": {k: s / count for k, s in seconds.items()},
            "scores": scores, "per_image": per_image, "errors": errors}


def format_measures(result: dict[str, Any]) -> str:
    """A readable table of :func:`evaluate_folder`'s result, one block per replacement kind."""
    fwd = result["seconds_per_photo"]["forward"]
    lines = []
    for kind in result["kinds"]:
        lines += [f"{kind} replacement, {result['images']} images, probability of the {result['target']} class",
                  f"{'method':<22}{'deletion':>10}{'insertion':>10}{'SRG':>14}{'SaCo':>14}{'s/image':>9}{'x fwd':>7}"]
        for name, s in result["scores"][kind].items():
            sec = result["seconds_per_photo"].get(name)
            cost = f"{sec:>9.3f}{sec / fwd:>7.1f}" if sec is not None else ""
            lines.append(f"{name:<22}{s['deletion']['mean']:>10.3f}{s['insertion']['mean']:>10.3f}"
                         f"{s['srg']['mean']:>8.3f}±{s['srg']['se']:.3f}{s['saco']['mean']:>8.3f}±{s['saco']['se']:.3f}"
                         f"{cost}")
        lines.append("")
    lines.append(f"one forward pass: {fwd * 1000:.1f} ms per image (x fwd: a method's time over it, this run)")
    lines += [f"skipped: {e}" for e in result["errors"]]
    return "\n".join(lines)
