"""Probed LRP (an experiment) and Integrated Gradients' baselines, on tuning and held-out photos (issue 32).

Not a test: tables to quote (docs/faithfulness.md). Probed LRP is ``vit_demo/methods/probe.py``.

Two disjoint sets of the 1000 shared ImageNet photos (sorted file order):

- ``--split tune``: sorted indices 5, 25, ..., 985 (the photos causal LRP was tuned on), where
  Integrated Gradients' baselines were compared (``--ig``; mean colour; ``--per-step 28``);
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
    from vit_demo.methods.probe import ProbeSettings, probed_map

    def probe(**kw):
        return lambda model, x, t: probed_map(model, x, t, ProbeSettings(**kw))

    return {
        "probe g12": probe(groups=12),
        "probe g6 show": probe(groups=6, show=True),
    }


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
    makers = {m: methods.get(m) for m in (args.methods or default).split(",") if m}
    if args.ig:
        makers.update(ig_candidates())
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
