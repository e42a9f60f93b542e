"""Seconds per photo of each explanation method (vit_demo.methods), on the CPU or a GPU.

Every method runs on the same photos in the same batches, the true label as target; the first
batch of each method is a warm-up and is not counted. On CUDA the clock waits for the device.

The "forward" row is one plain forward pass of the same batches: every method's cost over it is
its cost in forward passes on this machine, in this run.

    python benchmarks/bench_methods.py [--images DIR] [--photos 32] [--batch-size 8] [--device auto|cpu|cuda]
                                       [--methods a,b] [--json]
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def plain(model, x, target=None):
    """One plain forward pass: the unit of the methods' costs."""
    return model(x).logits


def bench(images: Path, photos: int, batch_size: int, device: str, names: list[str] | None = None) -> dict:
    from vit_demo import methods
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.faithfulness import labels_from_names, spread
    from vit_demo.images import find_images
    from vit_demo.preprocess import load_inputs

    lm = load_model(device=device, progress=False)
    paths = spread(find_images([images]), photos + batch_size)  # + one warm-up batch
    tensors, errors = load_inputs(paths, lm.data_config)
    if any(e is not None for e in errors):
        raise SystemExit("unreadable: " + "; ".join(e for e in errors if e))
    x_all = torch.stack(tensors).to(lm.device)
    y_all = torch.tensor(labels_from_names(paths), device=lm.device)
    result = {"device": str(lm.device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "photos": len(paths) - batch_size, "batch_size": batch_size, "seconds_per_photo": {}}
    if lm.device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(lm.device)
    for name in ["forward", *(names or methods.names())]:
        fn = plain if name == "forward" else methods.get(name)
        spent = 0.0
        for k, start in enumerate(range(0, len(paths), batch_size)):
            x, y = x_all[start : start + batch_size], y_all[start : start + batch_size]
            _sync(lm.device)
            t0 = time.perf_counter()
            fn(lm.model, x, y)
            _sync(lm.device)
            if k > 0:
                spent += time.perf_counter() - t0
        result["seconds_per_photo"][name] = spent / result["photos"]
        print(f"{name:<14}{spent / result['photos']:.4f} s per photo", file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path, default=SHARED / "imagenet-sample")
    ap.add_argument("--photos", type=int, default=32, help="timed photos (one more batch is the warm-up)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--methods", default="", help="comma-separated registered names (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.images.is_dir():
        raise SystemExit(f"no photos at {args.images} (the shared ImageNet sample); pass --images DIR")
    r = bench(args.images, args.photos, args.batch_size, args.device, [m for m in args.methods.split(",") if m])
    if args.json:
        print(json.dumps(r, indent=2))
        return
    where = r.get("gpu", f"CPU, {r['threads']} threads")
    print(f"seconds per photo, {r['photos']} photos in batches of {r['batch_size']}, {where}, torch {r['torch']}")
    print("| method | s per photo | forward passes |\n|---|---|---|")
    fwd = r["seconds_per_photo"]["forward"]
    for name, s in r["seconds_per_photo"].items():
        print(f"| {name} | {s:.4f} | {s / fwd:.1f} |")


if __name__ == "__main__":
    main()
