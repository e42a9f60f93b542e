"""What bfloat16 does to the model and its maps (issue 44): the same photos through the model in float32
and in bfloat16 (vit_demo.precision), every number compared with its float32 value.

Default mode, over --images (the 1000 shared ImageNet photos; labels from the file names):

- top-1 agreement of bfloat16 with float32, and the accuracy in both precisions;
- every layer's attention probabilities: the largest absolute difference per photo and layer, its
  median and its maximum over the photos (per layer and over all layers);
- the rank correlation (Spearman) of each photo's rollout and of each class-specific method's map
  (--methods; "none": forward passes only) with its float32 map, for the float32 model's top-1 class.
  Every method runs in bfloat16 here, whether the registry ships it so (``bf16_ok``) or not.

``--srg-saco``: SRG and SaCo (vit_demo.evaluate.srg_saco; mean colour and blur) on the 100 held-out
photos (sorted index mod 10 == 3, as docs/faithfulness.md), true label, of lrp-amortised, lrp-gated and
chefer (--methods) with their maps made in float32 and in bfloat16, all scored by the float32 model
(the same protocol for both), with the paired differences bfloat16 - float32.

    python benchmarks/bench_precision.py [--images DIR] [--limit N] [--methods a,b|none] [--batch-size 8] [--json OUT]
                                       [--threads N]
    python benchmarks/bench_precision.py --srg-saco [--images DIR] [--limit N] [--methods a,b] [--json OUT]

Cost on the 2-core machine at 1 thread, measured under load 5-10 (2026-11-27): forwards only (--methods
none) over the 1000 photos 275 s; every class-specific single-pass method in both precisions 16 s a
photo (506 s for --limit 32); --srg-saco 71 s a photo (2122 s for --limit 30).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
SRG_METHODS = ("lrp-amortised", "lrp-gated", "chefer")
HELD_OUT = 3  # sorted index mod 10: the held-out photos of docs/faithfulness.md


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two maps (average ranks for ties); 1.0 for two equal constant maps, NaN for one."""
    from scipy.stats import spearmanr

    a, b = a.flatten().double().numpy(), b.flatten().double().numpy()
    if a.min() == a.max() or b.min() == b.max():
        return 1.0 if (a == b).all() else math.nan
    return float(spearmanr(a, b)[0])


def models():
    """(the float32 LoadedModel, a copy of its model in bfloat16)."""
    from vit_demo.checkpoints.load import load_model
    from vit_demo.precision import set_precision

    lm = load_model(device="cpu", progress=False)  # the shipped DeiT-Tiny, float32
    return lm, set_precision(copy.deepcopy(lm.model), "bf16")


def summary(values: list[float]) -> dict:
    ok = [v for v in values if not math.isnan(v)]
    if not ok:
        return {"n": 0, "nan": len(values)}
    q = sorted(ok)
    return {"n": len(ok), "nan": len(values) - len(ok), "median": statistics.median(ok), "mean": statistics.fmean(ok),
            "p05": q[int(0.05 * (len(q) - 1))], "min": q[0]}


@torch.inference_mode()
def forwards(lm, m16, x: torch.Tensor, out: dict) -> torch.Tensor:
    """Both precisions' capture forward of a batch: logits, attention differences, rollout correlations;
    the float32 top-1 classes."""
    from vit_demo.methods.attention import in_float32
    from vit_demo.methods.rollout import rollout

    a, b = lm.model(x, capture=True), in_float32(m16(x, capture=True))
    out["logits32"].append(a.logits.float())
    out["logits16"].append(b.logits.float())
    diffs = torch.stack([(p - q).abs().flatten(1).amax(dim=1) for p, q in zip(a.attentions, b.attentions)], dim=1)
    out["attn_max"].append(diffs)  # [B, L]
    ra, rb = rollout(a.attentions, a.layout), rollout(b.attentions, b.layout)
    out["rho"].setdefault("rollout", []).extend(spearman(p, q) for p, q in zip(ra, rb))
    return a.logits.argmax(dim=-1)


def method_maps(model, x: torch.Tensor, t: torch.Tensor, names: list[str], bf16: bool) -> dict[str, torch.Tensor]:
    """Each method's maps, sharing passes; every method in the model's precision when ``bf16``."""
    from contextlib import nullcontext

    from vit_demo import methods
    from vit_demo.methods.registry import every_method_in_bf16

    with every_method_in_bf16() if bf16 else nullcontext(), methods.reuse(model, x):
        return {n: methods.get(n)(model, x, t).detach().float().cpu() for n in names}


def fidelity(images: Path, limit: int | None, names: list[str], batch_size: int) -> dict:
    from vit_demo.evaluate.faithfulness import labels_from_names, spread
    from vit_demo.images import find_images
    from vit_demo.preprocess import load_inputs
    from vit_demo.progress import batches

    lm, m16 = models()
    paths = find_images([images])
    paths = spread(paths, limit) if limit else paths
    out: dict = {"logits32": [], "logits16": [], "attn_max": [], "rho": {}}
    seconds = {"fp32": 0.0, "bf16": 0.0}
    for chunk in batches(paths, batch_size, "precision", True):
        tensors, errors = load_inputs(chunk, lm.data_config)
        if any(e is not None for e in errors):
            raise SystemExit("unreadable: " + "; ".join(e for e in errors if e))
        x = torch.stack(tensors)
        t = forwards(lm, m16, x, out).clone()  # a normal tensor: the classes index gradient passes
        if names:
            t0 = time.perf_counter()
            want = method_maps(lm.model, x, t, names, False)
            t1 = time.perf_counter()
            got = method_maps(m16, x, t, names, True)
            seconds["fp32"] += t1 - t0
            seconds["bf16"] += time.perf_counter() - t1
            for n in names:
                out["rho"].setdefault(n, []).extend(spearman(p, q) for p, q in zip(want[n], got[n]))
    y = torch.tensor(labels_from_names(paths))
    l32, l16 = torch.cat(out["logits32"]), torch.cat(out["logits16"])
    attn = torch.cat(out["attn_max"])  # [photos, L]
    return {
        "photos": len(paths), "model": lm.name, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "top1_agreement": float((l32.argmax(1) == l16.argmax(1)).float().mean()),
        "top1_disagreements": int((l32.argmax(1) != l16.argmax(1)).sum()),
        "accuracy_fp32": float((l32.argmax(1) == y).float().mean()),
        "accuracy_bf16": float((l16.argmax(1) == y).float().mean()),
        "max_abs_logit_diff": float((l32 - l16).abs().max()),
        "median_max_abs_logit_diff": float((l32 - l16).abs().amax(dim=1).median()),
        "attention_max_diff": {"largest": float(attn.max()), "median": float(attn.median()),
                               "per_layer_largest": attn.amax(dim=0).tolist(),
                               "per_layer_median": attn.median(dim=0).values.tolist()},
        "spearman": {n: summary(v) for n, v in out["rho"].items()},
        "map_seconds_per_photo": {k: v / len(paths) for k, v in seconds.items()} if names else {},
        "per_photo": {"images": [Path(p).name for p in paths], "spearman": out["rho"],
                      "attention_max_diff": attn.tolist()},
    }


def srg_saco(images: Path, limit: int | None, names: list[str], batch_size: int) -> dict:
    """SRG and SaCo of every method's float32 and bfloat16 maps, scored alike by the float32 model."""
    from vit_demo import methods
    from vit_demo.evaluate.faithfulness import spread
    from vit_demo.evaluate.srg_saco import KINDS, evaluate_folder
    from vit_demo.images import find_images
    from vit_demo.methods.registry import every_method_in_bf16

    lm, m16 = models()
    paths = [p for i, p in enumerate(sorted(find_images([images]))) if i % 10 == HELD_OUT]
    paths = spread(paths, limit) if limit else paths

    def in_bf16(name: str):
        def make(model, x, t):
            with every_method_in_bf16():
                return methods.get(name)(m16, x, t)  # the bfloat16 copy's map, whatever model scores it
        return make

    makers = {}
    for n in names:
        makers[f"{n} fp32"] = methods.get(n)
        makers[f"{n} bf16"] = in_bf16(n)
    r = evaluate_folder(lm, paths, makers, "label", KINDS, batch_size)
    paired = {}
    for kind in KINDS:
        for n in names:
            for measure in ("srg", "saco"):
                a = torch.tensor(r["per_image"][kind][f"{n} bf16"][measure], dtype=torch.float64)
                b = torch.tensor(r["per_image"][kind][f"{n} fp32"][measure], dtype=torch.float64)
                d = a - b
                paired[f"{n} {kind} {measure}"] = {"mean": float(d.mean()),
                                                   "se": float(d.std() / math.sqrt(len(d))) if len(d) > 1 else 0.0}
    r["paired_bf16_minus_fp32"] = paired
    return r


def print_fidelity(r: dict) -> None:
    print(f"{r['photos']} photos, {r['model']}, torch {r['torch']}, {r['threads']} threads")
    print("| measure | value |\n|---|---|")
    print(f"| top-1 agreement, bf16 with fp32 | {100 * r['top1_agreement']:.1f} % ({r['top1_disagreements']} photos differ) |")
    print(f"| accuracy fp32 / bf16 | {100 * r['accuracy_fp32']:.1f} % / {100 * r['accuracy_bf16']:.1f} % |")
    print(f"| logits: largest / median largest abs difference | {r['max_abs_logit_diff']:.3f} / "
          f"{r['median_max_abs_logit_diff']:.3f} |")
    a = r["attention_max_diff"]
    print(f"| attention probabilities, per layer and photo: largest / median abs difference | "
          f"{a['largest']:.4f} / {a['median']:.4f} |")
    print("\n| map | Spearman with fp32: median | 5th percentile | min | photos (NaN) |\n|---|---|---|---|---|")
    for n, s in r["spearman"].items():
        if s["n"]:
            print(f"| {n} | {s['median']:.4f} | {s['p05']:.4f} | {s['min']:.4f} | {s['n']} ({s['nan']}) |")
        else:
            print(f"| {n} | - | - | - | 0 ({s['nan']}) |")
    if r["map_seconds_per_photo"]:
        s = r["map_seconds_per_photo"]
        print(f"\nall maps of a photo, passes shared: {s['fp32']:.3f} s in fp32, {s['bf16']:.3f} s in bf16 (this run)")


def print_srg(r: dict, names: list[str]) -> None:
    print(f"{r['images']} held-out photos, true label; maps in fp32 and in bf16, scored by the fp32 model")
    print("| method | replacement | SRG fp32 | SRG bf16 | bf16 - fp32 | SaCo fp32 | SaCo bf16 | bf16 - fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in r["kinds"]:
        for n in names:
            s32, s16 = r["scores"][kind][f"{n} fp32"], r["scores"][kind][f"{n} bf16"]
            d = r["paired_bf16_minus_fp32"]
            ds, dc = d[f"{n} {kind} srg"], d[f"{n} {kind} saco"]
            print(f"| {n} | {kind} | {s32['srg']['mean']:.4f} | {s16['srg']['mean']:.4f} | {ds['mean']:+.4f} ± {ds['se']:.4f} "
                  f"| {s32['saco']['mean']:.3f} | {s16['saco']['mean']:.3f} | {dc['mean']:+.3f} ± {dc['se']:.3f} |")
    sec = r["seconds_per_photo"]
    print("\nseconds per photo (each map on its own): " + ", ".join(f"{k} {v:.3f}" for k, v in sec.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path, default=SAMPLE)
    ap.add_argument("--limit", type=int, help="N photos spread evenly through the sorted folder (the held-out ones)")
    ap.add_argument("--methods", help="comma-separated; 'none': forward passes only (default: every class-specific "
                                      f"single-pass method; with --srg-saco {', '.join(SRG_METHODS)})")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--srg-saco", action="store_true", help="SRG and SaCo on the 100 held-out photos instead")
    ap.add_argument("--json", type=Path, help="write the whole result (per-photo values included) to this file")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default; 1 on a loaded machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.images.is_dir():
        raise SystemExit(f"no photos at {args.images} (the shared ImageNet sample); pass --images DIR")
    from vit_demo import methods

    if args.methods is None:
        names = list(SRG_METHODS) if args.srg_saco else methods.names(slow=False, class_specific=True)
    else:
        names = [] if args.methods == "none" else [m for m in args.methods.split(",") if m]
    print(f"load average {os.getloadavg()[0]:.1f} (before)", file=sys.stderr)
    t0 = time.perf_counter()
    if args.srg_saco:
        r = srg_saco(args.images, args.limit, names, min(args.batch_size, 4))
        print_srg(r, names)
    else:
        r = fidelity(args.images, args.limit, names, args.batch_size)
        print_fidelity(r)
    print(f"\n{time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} (after)")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
