"""Probed LRP (an experiment) and Integrated Gradients' baselines, on tuning and held-out photos (issue 32).

Not a test: tables to quote (docs/faithfulness.md). Probed LRP is ``vit_demo/methods/probe.py``.

Two disjoint sets of the 1000 shared ImageNet photos (sorted file order):

- ``--split tune``: sorted indices 5, 25, ..., 985 (the photos causal LRP was tuned on), where
  Integrated Gradients' baselines were compared (``--ig``; mean colour; ``--per-step 28``) and the
  cheaper tests of the gated map were tried (``--quick``: causal LRP's test with 8-24 masks, a
  block test; ``--free``: rules on the gated map's own passes; ``--ensemble``: products with other
  single-pass maps), each beside ``lrp-gated`` with ``--kinds mean,blur --share``;
- ``--split heldout``: sorted indices 3, 13, ..., 993 (100 photos nobody tuned anything on:
  neither the quick subset, every 10th from 0, nor the tuning photos), both replacement kinds.

Deletion, insertion, SRG and SaCo (:mod:`vit_demo.evaluate.srg_saco`), true label, embedded
DeiT-Tiny; seconds per photo of each method, timed on its own on the same batches, and of one
plain forward pass (the ratio is the method's cost in forward passes on this machine, this run).

    python benchmarks/tune_probe.py --split tune|heldout [--limit N] [--methods a,b] [--kinds mean,blur] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
SPLITS = {"tune": (5, 20), "heldout": (3, 10)}  # first sorted index, step


def ig_candidates() -> dict:
    """Integrated Gradients with other baselines and steps (issue 32: why is it weak?)."""
    import torch
    import torch.nn.functional as F

    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.integrated_gradients import integrated_gradients

    def ig(baseline, steps=16):
        def make(model, x, t):
            base = None if baseline is None else baseline(x)
            r = integrated_gradients(model, x, t, steps, base).sum(dim=1, keepdim=True)
            p = model.cfg.patch_size
            return F.avg_pool2d(r, p, p)[:, 0] * (p * p)
        return make

    return {
        "ig black 16": ig(None),
        "ig mean 16": ig(torch.zeros_like),
        "ig blur 16": ig(lambda x: gaussian_blur(x, 10.0)),
    }


def candidates() -> dict:
    """Other settings of probed LRP (``lrp-probed`` is groups=8), by name."""
    from vit_demo.methods.probe import PATH, ProbeSettings, probed_map

    def probe(**kw):
        return lambda model, x, t: probed_map(model, x, t, ProbeSettings(**kw))

    return {
        "lrp-path": lambda model, x, t: probed_map(model, x, t, PATH),  # not registered: an experiment
        "probe g12": probe(groups=12),
        "probe g6 show": probe(groups=6, show=True),
    }


@dataclass(frozen=True)
class QuickSettings:
    """Quick causal LRP, an experiment: causal LRP's test of the gated map (vit_demo/methods/perturb.py)
    with a few dozen masks that cut the gated ranking at a few ``levels`` only."""

    levels: tuple[float, ...] = (0.1, 0.25)  # shares of the patches (by gated rank) the masks cut at
    per_level: int = 3  # masks per level, direction (show / hide the top) and kind of replacement
    jitter: float = 0.1  # N(0, 1) noise on the gated ranks, in units of all patches
    fills: tuple[str, ...] = ("mean", "blur")  # what a hidden patch shows (blur: sigma 8 px)
    antithetic: bool = False  # each noise draw also used with its sign flipped (per_level even)
    floor: float = 0.0  # map = u(gated+) x (floor + u(effect))
    swap: float = 0.0  # > 0 instead: the gated ranking moved by about swap x n x effect / its spread
    bf16: bool = False  # masked passes under bfloat16 autocast (1.6-1.8x faster on a CPU with AVX512-BF16)

    @property
    def masks(self) -> int:
        return len(self.levels) * 2 * self.per_level * len(self.fills)


def quick_effects(model, x, seed, t, s: QuickSettings):
    """Each patch's effect [B, gh, gw]: masks showing (hiding) the patches whose jittered gated rank
    lies below a level, scored per kind of replacement; per group of masks (fill, direction, level)
    the centred least-squares slope of the class probability on the patch's presence."""
    import torch

    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.passes import masked_scores
    from vit_demo.methods.perturb import patch_effects

    B, gh, gw = seed.shape
    n, F, L, K = gh * gw, len(s.fills), len(s.levels), s.per_level
    rank = seed.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1).float() / n
    g = torch.Generator().manual_seed(0)
    if s.antithetic:
        half = torch.randn(F, 2, L, K // 2, n, generator=g)
        noise = torch.cat([half, -half], dim=3)
    else:
        noise = torch.randn(F, 2, L, K, n, generator=g)
    top = rank[:, None, None, None, None, :] + noise[None] * s.jitter < torch.tensor(s.levels)[:, None, None]
    shown = torch.stack([top[:, :, 0], ~top[:, :, 1]], dim=2).reshape(B, F, 2 * L * K, gh, gw)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=s.bf16):
        scores = [masked_scores(model, x, shown[:, k], t, 16, "probes",
                                fill=None if kind == "mean" else gaussian_blur(x, 8.0)) for k, kind in enumerate(s.fills)]
    group = torch.arange(F * 2 * L).repeat_interleave(K)
    return patch_effects(torch.cat(scores, dim=1), shown.flatten(1, 2), group)


def swapped(seed, effect, swap: float):
    """The seed's values [B, gh, gw] in a new order: each patch's rank moved up by ``swap`` x n x its
    effect over the effects' spread (untested patches, effect 0, keep their rank)."""
    n = seed[0].numel()
    rank = seed.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1).double()
    e = effect.flatten(1).double()
    spread = (e.pow(2).sum(1, keepdim=True) / (e != 0).sum(1, keepdim=True).clamp(min=1)).sqrt().clamp(min=1e-12)
    new_rank = (rank - swap * n * e / spread).argsort(dim=1, stable=True).argsort(dim=1)
    return seed.flatten(1).sort(dim=1, descending=True).values.gather(1, new_rank).reshape(seed.shape)


def quick_candidates() -> dict:
    """Settings of quick causal LRP and a block test, by name; variants that differ only in ``floor``
    or ``swap`` share their masked passes (their seconds are then partial)."""
    from dataclasses import replace

    from vit_demo.methods.lrp import gated_lrp_map
    from vit_demo.methods.passes import targets
    from vit_demo.methods.perturb import unit_range

    memo: dict = {}

    def quick(**kw):
        s = QuickSettings(**kw)

        def make(model, x, t):
            if memo.get("x") is not x:
                memo.clear()
                memo["x"] = x
            key = replace(s, floor=0.0, swap=0.0)
            if key not in memo:
                tt = targets(t, model(x).logits)
                seed = gated_lrp_map(model, x, tt).detach()
                memo[key] = (seed, quick_effects(model, x, seed, tt, s))
            seed, effect = memo[key]
            if s.swap > 0:
                return swapped(seed.clamp(min=0), effect, s.swap)
            return unit_range(seed.clamp(min=0)) * (s.floor + unit_range(effect))
        return make

    cut = dict(levels=(1 / 14, 2 / 14), jitter=0.04, per_level=2, antithetic=True, bf16=True)  # the curves' first steps
    return {
        "q mb .1,.25 k3": quick(),
        "q mb .1,.25 k2": quick(per_level=2),
        "q mb .15 k2": quick(levels=(0.15,), per_level=2),
        "q mb .15 k2 f.3": quick(levels=(0.15,), per_level=2, floor=0.3),
        "q m .1,.25 k2": quick(fills=("mean",), per_level=2),
        "blocks m 28/4": blocks(top=28, count=4, fills=("mean",)),
        "q cut swap.04": quick(**cut, swap=0.04),
        "q cut swap.08": quick(**cut, swap=0.08),
        "q cut f.3": quick(**cut, floor=0.3),
        "q .1,.25 k2 f.3": quick(per_level=2, floor=0.3, bf16=True),
    }


def path_effects(model, x, t, seed, groups: int, fills: tuple[str, ...], both: bool, bf16: bool):
    """Each rank group's conditional effect along the curves [B, groups]: its rise when it is shown
    after the groups above it (insertion / LeRF order), and with ``both`` also its fall when it is
    hidden after the groups above it (deletion order), summed over the kinds of replacement."""
    import torch

    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.passes import masked_scores
    from vit_demo.methods.probe import rank_groups

    B, gh, gw = seed.shape
    group = rank_groups(seed, groups)  # [B, n], 0 = top
    upto = group[:, None, :] < torch.arange(groups + 1)[:, None]  # [B, groups + 1, n]: groups above k shown
    shown = torch.cat([upto, ~upto], 1) if both else upto
    eff = 0
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        for kind in fills:
            fill = None if kind == "mean" else gaussian_blur(x, 8.0)
            sc = masked_scores(model, x, shown.reshape(B, -1, gh, gw), t, 16, "probes", fill=fill).double()
            eff = eff + sc[:, 1 : groups + 1] - sc[:, :groups]
            if both:
                d = sc[:, groups + 1 :]
                eff = eff + d[:, :groups] - d[:, 1:]
    return eff


def path_candidates() -> dict:
    """Probed LRP with conditional effects along the curves instead of each group hidden alone."""
    from vit_demo.methods.lrp import gated_lrp_map
    from vit_demo.methods.passes import targets
    from vit_demo.methods.perturb import unit_range
    from vit_demo.methods.probe import rank_groups

    memo: dict = {}

    def path(groups=8, fills=("mean",), both=False, floor=0.05, bf16=False):
        def make(model, x, t):
            if memo.get("x") is not x:
                memo.clear()
                memo["x"] = x
            key = (groups, fills, both, bf16)
            if key not in memo:
                tt = targets(t, model(x).logits)
                seed = gated_lrp_map(model, x, tt).detach()
                memo[key] = (seed, path_effects(model, x, tt, seed, groups, fills, both, bf16))
            seed, eff = memo[key]
            factor = unit_range(eff[:, :, None].float())[:, :, 0].gather(1, rank_groups(seed, groups)) + floor
            return unit_range(seed.clamp(min=0)) * factor.reshape(seed.shape)
        return make

    return {
        "path ins m": path(),
        "path ins m f.3": path(floor=0.3),
        "path both m": path(both=True),
        "path ins mb": path(fills=("mean", "blur"), bf16=True),
    }


def free_candidates() -> dict:
    """Rules on the passes the gated map already makes (CP-LRP and grad-rollout): no pass more."""
    import torch.nn.functional as F

    from vit_demo.methods.gradients import grad_rollout_map
    from vit_demo.methods.lrp import cp_lrp_map
    from vit_demo.methods.perturb import unit_range

    def parts(model, x, t):
        return cp_lrp_map(model, x, t), grad_rollout_map(model, x, t)

    def smooth(m):
        return F.avg_pool2d(m[:, None], 3, 1, 1, count_include_pad=False)[:, 0]

    def signed(model, x, t):
        lrp, gr = parts(model, x, t)
        return lrp * gr

    def tie_g(model, x, t):
        lrp, gr = parts(model, x, t)
        g = lrp.clamp(min=0) * gr
        return g + 1e-3 * g.flatten(1).amax(1)[:, None, None] * unit_range(gr)

    def tie_signed(model, x, t):
        lrp, gr = parts(model, x, t)
        g = lrp.clamp(min=0) * gr
        return g + 1e-3 * g.flatten(1).amax(1)[:, None, None] * unit_range(lrp * gr)

    def smoothed(model, x, t):
        lrp, gr = parts(model, x, t)
        g = lrp.clamp(min=0) * gr
        return unit_range(g) + unit_range(smooth(g))

    def smoothed_signed(model, x, t):
        lrp, gr = parts(model, x, t)
        g = lrp * gr
        return unit_range(g) + unit_range(smooth(g))

    def gr2(model, x, t):
        lrp, gr = parts(model, x, t)
        return lrp.clamp(min=0) * gr * gr

    return {"signed": signed, "tie g": tie_g, "tie signed": tie_signed, "smooth": smoothed,
            "smooth signed": smoothed_signed, "lrp x gr^2": gr2}


def ensemble_candidates() -> dict:
    """Products of the gated map with other single-pass maps (Chefer: the same passes; AttnLRP: one
    forward and backward pass more; GradCAM: one more)."""
    from vit_demo.methods.gradcam import gradcam_map
    from vit_demo.methods.gradients import chefer_map, grad_rollout_map
    from vit_demo.methods.lrp import attn_lrp_map, cp_lrp_map

    def prod(*fns):
        def make(model, x, t):
            out = 1
            for fn in fns:
                out = out * fn(model, x, t).clamp(min=0)
            return out
        return make

    return {
        "lrp x chefer": prod(cp_lrp_map, chefer_map),
        "gated x chefer": prod(cp_lrp_map, grad_rollout_map, chefer_map),
        "gated x attnlrp": prod(cp_lrp_map, grad_rollout_map, attn_lrp_map),
        "attnlrp x gr": prod(attn_lrp_map, grad_rollout_map),
        "gated x gradcam": prod(cp_lrp_map, grad_rollout_map, gradcam_map),
    }


def blocks(top: int = 42, count: int = 6, fills: tuple[str, ...] = ("mean", "blur"), sigma: float = 8.0):
    """An experiment: the gated map's top ``top`` patches in ``count`` rank blocks; each block's
    effect is its fall when hidden alone plus its rise when it alone of the top is shown, the map
    u(gated+) x u(effect), the patches outside the top at the blocks' mean effect."""
    import torch

    from vit_demo.evaluate.srg_saco import gaussian_blur
    from vit_demo.methods.lrp import gated_lrp_map
    from vit_demo.methods.passes import masked_scores, targets
    from vit_demo.methods.perturb import unit_range

    def make(model, x, t):
        with torch.no_grad():
            logits = model(x).logits.float()
            tt = targets(t, logits)
            clean = logits.softmax(-1).gather(1, tt[:, None])
        seed = gated_lrp_map(model, x, tt).detach()
        B, gh, gw = seed.shape
        rank = seed.flatten(1).argsort(dim=1, descending=True, stable=True).argsort(dim=1)
        block = torch.where(rank < top, rank * count // top, -1)  # [B, n]
        alone = block[:, None, :] == torch.arange(count)[:, None]  # [B, count, n]
        in_top = (rank < top)[:, None, :]
        shown = torch.cat([~in_top, ~in_top | alone, ~alone], 1).reshape(B, -1, gh, gw)
        eff = 0
        for kind in fills:
            fill = None if kind == "mean" else gaussian_blur(x, sigma)
            sc = masked_scores(model, x, shown, tt, 16, "probes", fill=fill).double()
            eff = eff + (sc[:, 1 : count + 1] - sc[:, :1]) + (clean - sc[:, count + 1 :])
        per = torch.cat([eff, eff.mean(1, keepdim=True)], 1)  # [B, count + 1]: the last for the rest
        effect = per.gather(1, torch.where(block < 0, count, block)).reshape(B, gh, gw).float()
        return unit_range(seed.clamp(min=0)) * unit_range(effect)
    return make


def merge(runs: list[dict]) -> dict:
    """Shards of one run as one: per-image values concatenated, seconds weighted by images."""
    import torch

    from vit_demo.evaluate.srg_saco import summarise

    out = dict(runs[0])
    out["images"] = sum(r["images"] for r in runs)
    out["photos"] = [p for r in runs for p in r["photos"]]
    out["load"] = [r["load"] for r in runs]
    out["seconds_per_photo"] = {k: sum(r["seconds_per_photo"][k] * r["images"] for r in runs) / out["images"]
                                for k in runs[0]["seconds_per_photo"]}
    out["per_image"] = {kind: {name: {m: [v for r in runs for v in r["per_image"][kind][name][m]] for m in ms}
                               for name, ms in per.items()} for kind, per in runs[0]["per_image"].items()}
    out["scores"] = {kind: {name: {m: summarise(torch.tensor(v, dtype=torch.float64)) for m, v in ms.items()}
                            for name, ms in per.items()} for kind, per in out["per_image"].items()}
    out["errors"] = [e for r in runs for e in r["errors"]]
    return out


def main() -> None:
    import torch

    from vit_demo import methods
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.srg_saco import KINDS, evaluate_folder, format_measures

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=list(SPLITS), required=True)
    ap.add_argument("--limit", type=int, default=0, help="first N photos of the split (0: all)")
    ap.add_argument("--skip", type=int, default=0, help="leave out the split's first N photos (a later run)")
    ap.add_argument("--methods", default="", help="registered methods (default: the candidates on 'tune', "
                    "lrp-gated, lrp-probed, lrp-causal on 'heldout')")
    ap.add_argument("--candidates", action="store_true", help="add the tuning candidates")
    ap.add_argument("--ig", action="store_true", help="Integrated Gradients' candidates instead")
    ap.add_argument("--quick", action="store_true", help="quick causal LRP's candidates instead")
    ap.add_argument("--path", action="store_true", help="probed LRP with effects along the curves instead")
    ap.add_argument("--ensemble", action="store_true", help="products with other single-pass maps instead")
    ap.add_argument("--free", action="store_true", help="rules on the gated map's own passes instead")
    ap.add_argument("--kinds", default="", help="replacement kinds (default: mean on 'tune', mean,blur on 'heldout')")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--per-step", type=int, default=0, help="patches per curve step (default: one grid row)")
    ap.add_argument("--share", action="store_true", help="the makers share passes (their seconds are then partial)")
    ap.add_argument("--shard", default="0/1", help="k/n: every n-th photo of the split from its k-th (parallel runs)")
    ap.add_argument("--out", default="", help="write the JSON here")
    ap.add_argument("--merge", nargs="+", default=[], help="merge these JSON files (shards of one run) and print")
    args = ap.parse_args()
    if args.merge:
        r = merge([json.loads(Path(f).read_text()) for f in args.merge])
        print(format_measures(r))
        if args.out:
            Path(args.out).write_text(json.dumps(r, indent=1))
        return
    files = sorted(SAMPLE.glob("*.JPEG"))
    if len(files) != 1000:
        raise SystemExit(f"needs the 1000-photo ImageNet sample at {SAMPLE}")
    first, step = SPLITS[args.split]
    k, n = (int(v) for v in args.shard.split("/"))
    paths = files[first::step][args.skip : args.limit or None][k::n]
    default = "lrp-gated" if args.split == "tune" else "lrp-gated,lrp-probed,lrp-causal"
    extra = candidates()  # "--methods lrp-path" names the experiment
    makers = {m: extra[m] if m in extra else methods.get(m) for m in (args.methods or default).split(",") if m}
    if args.ig:
        makers.update(ig_candidates())
    elif args.quick:
        makers.update(quick_candidates())
    elif args.path:
        makers.update(path_candidates())
    elif args.ensemble:
        makers.update(ensemble_candidates())
    elif args.free:
        makers.update(free_candidates())
    elif args.candidates or args.split == "tune":
        makers.update(candidates())
    kinds = (args.kinds or ("mean" if args.split == "tune" else ",".join(KINDS))).split(",")
    lm = load_model(progress=False)
    runs = []
    for start in range(0, len(paths), args.batch_size):  # one batch at a time, written as it comes
        chunk = paths[start : start + args.batch_size]
        r = evaluate_folder(lm, chunk, makers, "label", kinds, args.batch_size, progress=False,
                            per_step=args.per_step or None, share=args.share, random_seed=start)
        r.update(split=args.split, photos=[p.name for p in chunk], threads=torch.get_num_threads(),
                 load=os.getloadavg())
        runs.append(r)
        r = merge(runs)
        print(f"{r['images']} of {len(paths)} photos", file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(r, indent=1))
    print(f"{args.split} photos, load average {os.getloadavg()[0]:.1f}, {torch.get_num_threads()} threads")
    print(format_measures(r))


if __name__ == "__main__":
    main()
