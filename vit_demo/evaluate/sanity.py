"""Does a map explain the model, or only the image? The model-randomisation sanity check.

Adebayo et al., "Sanity checks for saliency maps" (NeurIPS 2018), cascading randomisation:
re-initialise the model's parameters from the top down, one stage at a time (the head with the
final norm, then the last block, ..., the first block, then the patch embedding with the
position embedding and prefix tokens), keeping every stage already randomised. After each stage,
every method's map is compared with its map on the trained model by Spearman's rank correlation
(ties get their average rank), per image, for the same class index. A method that explains the
model loses its map as the weights go (correlation near 0); one whose map survives describes the
image (edges, contrast), whatever the model has learned.

Re-initialisation follows timm's ViT init: Linear and Conv weights truncated normal (std 0.02),
biases 0 (EVA's and BEiT's q / v biases too), norm weights 1 and biases 0, position embedding,
prefix tokens, relative-position tables and an attention pool's query normal (std 0.02);
LayerScale and learned RoPE frequencies are left alone. One seeded generator: a run is reproducible.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .. import methods as registry
from ..model import RMSNorm, VisionTransformer
from .faithfulness import check_request, target_batches

if TYPE_CHECKING:
    from ..checkpoints.load import LoadedModel


def stages(model: VisionTransformer) -> list[tuple[str, list[nn.Module | nn.Parameter]]]:
    """The cascade, top down: (name, what it re-initialises) per stage."""
    head = [m for m in (model.head, model.head_dist, model.fc_norm, model.attn_pool, model.norm) if m is not None]
    out: list[tuple[str, list[nn.Module | nn.Parameter]]] = [("head", head)]
    out += [(f"block {i}", [model.blocks[i]]) for i in reversed(range(len(model.blocks)))]
    embed = [model.patch_embed, model.norm_pre]
    embed += [t for t in (model.pos_embed, model.rope, model.rel_pos_bias, model.shared_rel_pos, model.cls_token,
                          model.dist_token, model.reg_token) if t is not None]
    return out + [("embedding", embed)]


def _drawn_on_cpu(t: Tensor, draw: Callable[[Tensor], object]) -> None:
    """Fill ``t`` with values that ``draw`` writes into a CPU tensor: the CPU ``generator`` works
    for a model on any device, and gives the same randomised model on every device."""
    values = torch.empty(t.shape, dtype=t.dtype)
    draw(values)
    t.copy_(values)


@torch.no_grad()
def reinit_(parts: Sequence[nn.Module | nn.Parameter], generator: torch.Generator) -> None:
    """Re-initialise ``parts`` in place, timm's ViT init (see the module docstring); ``generator``
    is a CPU generator, whatever the model's device."""
    for part in parts:
        if isinstance(part, nn.Parameter):
            _drawn_on_cpu(part, lambda v: v.normal_(0.0, 0.02, generator=generator))
            continue
        for m in part.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                _drawn_on_cpu(m.weight, lambda v: nn.init.trunc_normal_(v, std=0.02, a=-0.04, b=0.04, generator=generator))
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
            for name, p in m.named_parameters(recurse=False):  # the variants' own parameters
                if name in ("q_bias", "v_bias"):
                    p.zero_()
                elif name in ("relative_position_bias_table", "latent"):
                    _drawn_on_cpu(p, lambda v: v.normal_(0.0, 0.02, generator=generator))


def average_ranks(values: Tensor) -> Tensor:
    """Ranks of a 1-D tensor from 0, ties sharing their average rank."""
    _, inverse, counts = torch.unique(values, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0)
    return ((ends - counts + ends - 1).double() / 2)[inverse]


def spearman(first: Tensor, second: Tensor) -> Tensor:
    """Spearman's rank correlation of each pair of maps: [B, ...] x [B, ...] -> [B] (0 when a
    map is constant)."""
    out = []
    for x, y in zip(first.flatten(1).double().cpu(), second.flatten(1).double().cpu()):
        rx, ry = average_ranks(x), average_ranks(y)
        rx, ry = rx - rx.mean(), ry - ry.mean()
        denom = (rx.norm() * ry.norm()).item()
        out.append((rx @ ry).item() / denom if denom > 0 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def cascade(
    model: VisionTransformer, x: Tensor, target: Tensor, methods: Sequence[str], seed: int = 0
) -> dict[str, dict[str, Tensor]]:
    """{method: {"rank": [S, B], "abs_rank": [S, B]}}: per stage S and image B, the rank
    correlation of the map (and of its absolute value) with the trained model's map.
    ``model`` itself is not changed (the cascade runs on a copy)."""
    reference = {m: registry.get(m)(model, x, target) for m in methods}
    work = copy.deepcopy(model)
    parts = stages(work)
    g = torch.Generator().manual_seed(seed)
    out = {m: {"rank": torch.empty(len(parts), len(x)), "abs_rank": torch.empty(len(parts), len(x))} for m in methods}
    for s, (_, modules) in enumerate(parts):
        reinit_(modules, g)
        for m in methods:
            current = registry.get(m)(work, x, target)
            out[m]["rank"][s] = spearman(reference[m], current)
            out[m]["abs_rank"][s] = spearman(reference[m].abs(), current.abs())
    return out


def evaluate(
    lm: LoadedModel,
    paths: Sequence[str | os.PathLike],
    methods: Sequence[str] | None = None,
    target: str = "predicted",
    batch_size: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The cascade over ``paths``: mean (and s.e.) rank correlation per method and stage
    (``methods``: default the single-pass ones)."""
    methods = list(registry.single_pass() if methods is None else methods)
    check_request(methods, target)
    model = lm.model
    names = [name for name, _ in stages(model)]
    per = {m: {"rank": [], "abs_rank": []} for m in methods}
    errors: list[str] = []
    for x, cls in target_batches(lm, paths, target, batch_size, "sanity", progress, errors):
        for m, r in cascade(model, x, cls, methods, seed).items():
            per[m]["rank"].append(r["rank"])
            per[m]["abs_rank"].append(r["abs_rank"])
    if not any(per[m]["rank"] for m in methods):
        raise ValueError("no readable images to check: " + "; ".join(errors[:3]))
    results = {}
    for m in methods:
        results[m] = {}
        for key in ("rank", "abs_rank"):
            r = torch.cat(per[m][key], dim=1)  # [S, N]
            n = r.shape[1]
            results[m][key] = r.mean(dim=1).tolist()
            results[m][key + "_se"] = (r.std(dim=1) / n**0.5).tolist() if n > 1 else [0.0] * len(names)
    count = torch.cat(per[methods[0]]["rank"], dim=1).shape[1]
    return {"images": count, "target": target, "seed": seed, "stages": names, "methods": results, "errors": errors}


def format_results(result: dict[str, Any]) -> str:
    """A readable table: mean rank correlation with the trained model's map, per stage."""
    cols = [0, 1, len(result["stages"]) // 2, len(result["stages"]) - 1]
    head = ["randomised down to:"] + [result["stages"][c] for c in cols]
    lines = [f"model-randomisation check over {result['images']} images (Spearman rank correlation with the trained model's map)",
             "".join(f"{h:>18}" for h in head)]
    for m, v in result["methods"].items():
        lines.append(f"{m:>18}" + "".join(f"{v['rank'][c]:>18.3f}" for c in cols))
    lines += [f"skipped: {e}" for e in result["errors"]]
    return "\n".join(lines)
