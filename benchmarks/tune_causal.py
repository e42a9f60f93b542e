"""How causal LRP's settings were chosen (issue 11). Not a test: a table to quote.

Deletion / insertion (the faithfulness command's protocol, true label, embedded DeiT-Tiny) of
the candidates on 50 ImageNet sample photos OUTSIDE the quick subset: sorted indices 5, 25, ...,
985 (the quick subset is every 10th file from 0, so none of these is in it). The evaluation
photos were never used to choose anything.

    python benchmarks/tune_causal.py [--limit N]

About 40 CPU-minutes on a 2-core machine (each 256-mask candidate is 256 forward passes per photo).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"


def main() -> None:
    import torch

    from vit_demo import methods
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.curves import curves, patch_order
    from vit_demo.evaluate.faithfulness import labels_from_names
    from vit_demo.methods.perturb import CausalSettings, RiseSettings, causal_lrp, rise, unit_range
    from vit_demo.preprocess import load_inputs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=50)
    args = ap.parse_args()
    files = sorted(SAMPLE.glob("*.JPEG"))
    if len(files) != 1000:
        raise SystemExit(f"needs the 1000-photo ImageNet sample at {SAMPLE}")
    paths = files[5::20][: args.limit]
    lm = load_model()
    model = lm.model
    xs, _ = load_inputs(paths, lm.data_config)
    x, y = torch.stack(xs), torch.tensor(labels_from_names(paths))
    gated = torch.cat([methods.get("lrp-gated")(model, x[i : i + 8], y[i : i + 8]).detach() for i in range(0, len(x), 8)])

    def per_batch(fn) -> torch.Tensor:
        t = time.perf_counter()
        out = torch.cat([fn(x[i : i + 8], y[i : i + 8], gated[i : i + 8]) for i in range(0, len(x), 8)])
        print(f"  ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        return out

    rise_map = per_batch(lambda xb, yb, gb: rise(model, xb, yb, RiseSettings()))
    candidates = {
        "lrp-gated": gated,
        "rise (256 random masks)": rise_map,
        "lrp-gated x rise": unit_range(gated.clamp(min=0)) * unit_range(rise_map),
    }
    for masks, jitter in ((128, 0.1), (128, 0.2), (256, 0.2)):
        s = CausalSettings(masks=masks, jitter=jitter)
        candidates[f"causal LRP, {masks} masks, jitter {jitter}"] = per_batch(
            lambda xb, yb, gb, s=s: causal_lrp(model, xb, yb, s, seed_map=gb))
    names = list(candidates)
    dels, ins = [], []
    for i in range(0, len(x), 8):
        orders = torch.stack([patch_order(candidates[n][i : i + 8]) for n in names], dim=1)
        d, n_ = curves(model, x[i : i + 8], orders, y[i : i + 8], per_step=14)
        dels.append(d.mean(-1))
        ins.append(n_.mean(-1))
    d, n_ = torch.cat(dels).mean(0), torch.cat(ins).mean(0)
    print(f"| candidate ({len(x)} tuning photos) | deletion | insertion |\n|---|---|---|")
    for k, name in enumerate(names):
        print(f"| {name} | {float(d[k]):.3f} | {float(n_[k]):.3f} |")


if __name__ == "__main__":
    main()
