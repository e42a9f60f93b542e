"""The pointing game on the shapes set: does an explanation map point at the shape?

Each shape comes with its bounding box (``boxes.json``, see vit_demo.data.annotations). Maps live on the
model's patch grid, so the box is carried into patch coordinates first:

1. the eval transform's resize and center-crop map picture pixels to model-input pixels
   (for shapes at the model's own size this is the identity);
2. dividing by the patch size gives the box on the grid, in continuous patch units;
3. every patch gets its **coverage**: the share of its area inside the box, in [0, 1].

Then, per picture and method (maps from the registered methods, :mod:`vit_demo.methods`, all of them by default):

- **pointing hit**: the map's maximum falls on a patch whose centre lies inside the box
  (when the box is so small that no patch centre lies in it: the patch holding the box's centre);
- **mass in box**: sum(map * coverage) / sum(map), with negative values clipped to 0 (a map with
  no positive mass counts as uniform).

Baselines, next to them: a random map (uniform noise, so a uniformly random patch), the box-area
share (the mass a uniform map puts in the box) and the share of patches that count as hits (a
random pointer's expected accuracy).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.annotations import read_boxes
from ..images import ImageError, load_image
from ..preprocess import preprocess
from ..progress import batches
from .faithfulness import method_maps, spread
from .geometry import box_to_input, hit_patches, patch_coverage


def score_maps(maps: Tensor, coverage: Tensor, hits: Tensor) -> tuple[Tensor, Tensor]:
    """Per picture: (pointing hit 0/1, mass share in the box). All [B, gh, gw] inputs."""
    B = maps.shape[0]
    flat = maps.reshape(B, -1).double()
    hit = hits.reshape(B, -1).gather(1, flat.argmax(dim=1, keepdim=True)).squeeze(1).double()
    mass = flat.clamp(min=0)
    total = mass.sum(dim=1, keepdim=True)
    mass = torch.where(total > 0, mass / total.clamp(min=1e-300), torch.full_like(mass, 1 / mass.shape[1]))
    share = (mass * coverage.reshape(B, -1).double()).sum(dim=1)
    return hit, share


def evaluate(lm, root: str | Path, methods: Sequence[str], target: str = "label", limit: int | None = None,
             batch_size: int = 32, progress: bool = True) -> dict[str, Any]:
    """Pointing accuracy and mass in box for every method, a random map (seeded with 0) and the baselines."""
    root = Path(root)
    boxes = read_boxes(root)
    names = sorted(boxes)
    if limit:
        names = spread(names, limit)
    classes = {c: i for i, c in enumerate(lm.labels)}
    model, dc, p = lm.model, lm.data_config, lm.model.cfg.patch_size
    g = torch.Generator().manual_seed(0)
    sums: dict[str, Tensor] = {m: torch.zeros(2, dtype=torch.float64) for m in [*methods, "random"]}
    base = torch.zeros(2, dtype=torch.float64)
    count, errors, grid = 0, [], None
    for chunk in batches(names, batch_size, "pointing", progress):
        xs, covs, hitss, ys = [], [], [], []
        for rel in chunk:
            try:
                img = load_image(root / rel)
            except ImageError as e:
                errors.append(str(e))
                continue
            xs.append(preprocess(img, dc)[0])
            box = box_to_input(boxes[rel], img.size, dc)
            grid = (dc.input_size[0] // p, dc.input_size[1] // p)
            covs.append(patch_coverage(box, grid, p))
            hitss.append(hit_patches(box, grid, p))
            ys.append(classes.get(rel.split("/")[0], -1))
        if not xs:
            continue
        x = torch.stack(xs).to(lm.device)
        cov, hits = torch.stack(covs), torch.stack(hitss)
        if target == "label":
            if min(ys) < 0:
                raise ValueError(f"the model's classes ({', '.join(lm.labels[:6])}...) do not include the folder's "
                                 f"class names; use --target predicted")
            cls: Tensor | None = torch.tensor(ys, device=lm.device)
        else:
            cls = None
        for m, maps in zip(methods, method_maps(model, x, cls, methods)):
            sums[m] += torch.stack(score_maps(maps.detach().cpu(), cov, hits)).sum(dim=1)
        rnd = torch.rand(cov.shape, generator=g, dtype=torch.float64)
        sums["random"] += torch.stack(score_maps(rnd, cov, hits)).sum(dim=1)
        base += torch.stack([hits.double().mean(dim=(1, 2)), cov.mean(dim=(1, 2))]).sum(dim=1)
        count += len(xs)
    if count == 0:
        raise ValueError("no readable pictures to evaluate: " + "; ".join(errors[:3]))
    res = {k: {"pointing_accuracy": round(float(v[0]) / count, 4), "mass_in_box": round(float(v[1]) / count, 4)}
           for k, v in sums.items()}
    return {"images": count, "grid": list(grid), "target": target, "methods": {m: res[m] for m in methods},
            "random": res["random"],
            "baseline": {"hit_patch_share": round(float(base[0]) / count, 4), "box_area_share": round(float(base[1]) / count, 4)},
            "errors": errors}


def format_results(result: dict[str, Any]) -> str:
    lines = [f"pointing game on {result['images']} pictures ({result['grid'][0]}x{result['grid'][1]} patch grid; maps for "
             f"{'the true class' if result['target'] == 'label' else 'the predicted class'})",
             f"{'method':<16}{'pointing accuracy':>20}{'mass in box':>14}"]
    for name, m in [*result["methods"].items(), ("random map", result["random"])]:
        lines.append(f"{name:<16}{m['pointing_accuracy']:>20.3f}{m['mass_in_box']:>14.3f}")
    b = result["baseline"]
    lines.append(f"{'box baseline':<16}{b['hit_patch_share']:>20.3f}{b['box_area_share']:>14.3f}"
                 f"   (share of hit patches / of the grid inside the box)")
    lines += [f"skipped: {e}" for e in result["errors"]]
    return "\n".join(lines)
