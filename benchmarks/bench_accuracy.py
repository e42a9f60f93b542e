"""Top-1 / top-5 accuracy of the scratch model and of timm's own (same weights, each with its
own preprocessing: ours re-implemented, timm's create_transform) on the shared ImageNet sample.

    python benchmarks/bench_accuracy.py [--weights FILE] [--images DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
SHARED = ROOT.parent / "shared"


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deit_tiny_patch16_224")
    ap.add_argument("--weights", type=Path, default=SHARED / "weights" / "deit_tiny_patch16_224.safetensors")
    ap.add_argument("--images", type=Path, default=SHARED / "imagenet-sample")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from PIL import Image
    from timm.data import create_transform, resolve_data_config
    from tqdm import tqdm

    from vit_demo.checkpoints.load import load_model
    from vit_demo.checkpoints.verify import timm_twin
    from vit_demo.images import find_images, load_image
    from vit_demo.labels import class_from_filename
    from vit_demo.preprocess import preprocess

    lm = load_model(args.model, args.weights, device="cpu")
    tm = timm_twin(lm, args.weights)
    timm_tf = create_transform(**resolve_data_config({}, model=tm))
    paths = find_images([args.images])
    labels = torch.tensor([class_from_filename(p.name) for p in paths])
    ours_top5, timm_top5, max_diff, t0 = [], [], 0.0, time.perf_counter()
    for i in tqdm(range(0, len(paths), args.batch_size), desc="accuracy", unit="batch"):
        chunk = paths[i : i + args.batch_size]
        x = torch.stack([preprocess(load_image(p), lm.data_config)[0] for p in chunk])
        xt = torch.stack([timm_tf(Image.open(p).convert("RGB")) for p in chunk])  # timm's own pipeline
        a, b = lm.model(x).logits, tm(xt)
        # Model parity on identical inputs. (The pipelines differ on purpose for EXIF-rotated
        # photos: ours turns them upright, timm's reads the raw pixels.)
        max_diff = max(max_diff, (a - tm(x)).abs().max().item())
        ours_top5.append(a.topk(5).indices)
        timm_top5.append(b.topk(5).indices)
    o, t = torch.cat(ours_top5), torch.cat(timm_top5)
    r = {
        "images": len(paths),
        "scratch_top1": (o[:, 0] == labels).float().mean().item(),
        "scratch_top5": (o == labels[:, None]).any(1).float().mean().item(),
        "timm_top1": (t[:, 0] == labels).float().mean().item(),
        "timm_top5": (t == labels[:, None]).any(1).float().mean().item(),
        "top1_agreement": (o[:, 0] == t[:, 0]).float().mean().item(),
        "max_abs_logit_diff_same_input": max_diff,
        "seconds": time.perf_counter() - t0,
    }
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"{r['images']} photos: scratch top-1 {r['scratch_top1']:.1%} top-5 {r['scratch_top5']:.1%}; "
          f"timm top-1 {r['timm_top1']:.1%} top-5 {r['timm_top5']:.1%}; same top-1 on {r['top1_agreement']:.1%}; "
          f"max |logit diff| on the same inputs {r['max_abs_logit_diff_same_input']:.1e}")


if __name__ == "__main__":
    main()
