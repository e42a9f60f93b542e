"""Seconds per photo of each explanation method (vit_demo.methods), on the CPU or a GPU.

Every method runs on the same photos in the same batches, the true label as target; the first
batch of each method is a warm-up and is not counted. On CUDA the clock waits for the device.

The "forward" row is one plain forward pass of the same batches: every method's cost over it is
its cost in forward passes on this machine, in this run (over the float32 forward).

The precision column (issue 44): the model loaded in each of ``--precision`` (default fp32,bf16), the
precisions interleaved batch by batch. A method the registry does not mark ``bf16_ok`` runs in float32
on a bf16 model too (its row says so).

    python benchmarks/bench_methods.py [--images DIR] [--photos 32] [--batch-size 8] [--device auto|cpu|cuda]
                                       [--methods a,b] [--precision fp32,bf16] [--threads N] [--json]
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


def bench(images: Path, photos: int, batch_size: int, device: str, names: list[str] | None = None,
          precisions: tuple[str, ...] = ("fp32",)) -> dict:
    from vit_demo import methods
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.faithfulness import labels_from_names, spread
    from vit_demo.images import find_images
    from vit_demo.preprocess import load_inputs

    lms = {p: load_model(device=device, progress=False, precision=p) for p in precisions}
    lm = next(iter(lms.values()))
    paths = spread(find_images([images]), photos + batch_size)  # + one warm-up batch
    tensors, errors = load_inputs(paths, lm.data_config)
    if any(e is not None for e in errors):
        raise SystemExit("unreadable: " + "; ".join(e for e in errors if e))
    x_all = torch.stack(tensors).to(lm.device)
    y_all = torch.tensor(labels_from_names(paths), device=lm.device)
    result = {"device": str(lm.device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "photos": len(paths) - batch_size, "batch_size": batch_size, "seconds_per_photo": {},
              "precision": {p: m.precision_note for p, m in lms.items()}, "ran_in": {}}
    if lm.device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(lm.device)
    for name in ["forward", *(names or methods.names())]:
        fn = plain if name == "forward" else methods.get(name)
        spent = dict.fromkeys(lms, 0.0)
        for k, start in enumerate(range(0, len(paths), batch_size)):
            x, y = x_all[start : start + batch_size], y_all[start : start + batch_size]
            for p, one in lms.items():
                _sync(lm.device)
                t0 = time.perf_counter()
                fn(one.model, x, y)
                _sync(lm.device)
                if k > 0:
                    spent[p] += time.perf_counter() - t0
        for p in lms:
            key = name if len(lms) == 1 else f"{name} {p}"
            result["seconds_per_photo"][key] = spent[p] / result["photos"]
            bf16 = lms[p].precision == "bf16" and (name == "forward" or methods.get(name).bf16_ok)
            result["ran_in"][key] = "bf16" if bf16 else "fp32"
            print(f"{key:<20}{spent[p] / result['photos']:.4f} s per photo", file=sys.stderr, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path, default=SHARED / "imagenet-sample")
    ap.add_argument("--photos", type=int, default=32, help="timed photos (one more batch is the warm-up)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--methods", default="", help="comma-separated registered names (default: all)")
    ap.add_argument("--precision", default="fp32,bf16",
                    help="comma-separated of auto, fp32, bf16: a row per method and precision (default fp32,bf16)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.images.is_dir():
        raise SystemExit(f"no photos at {args.images} (the shared ImageNet sample); pass --images DIR")
    r = bench(args.images, args.photos, args.batch_size, args.device, [m for m in args.methods.split(",") if m],
              tuple(p for p in args.precision.split(",") if p))
    if args.json:
        print(json.dumps(r, indent=2))
        return
    where = r.get("gpu", f"CPU, {r['threads']} threads")
    print(f"seconds per photo, {r['photos']} photos in batches of {r['batch_size']}, {where}, torch {r['torch']}, "
          f"load average {os.getloadavg()[0]:.1f}; " + "; ".join(f"{p}: {note}" for p, note in r["precision"].items()))
    print("| method | precision | s per photo | forward passes (fp32) |\n|---|---|---|---|")
    secs = r["seconds_per_photo"]
    fwd = secs.get("forward", secs.get("forward fp32")) or next(iter(secs.values()))
    for key, s in secs.items():
        name = key.rsplit(" ", 1)[0] if len(r["precision"]) > 1 else key
        print(f"| {name} | {r['ran_in'][key]} | {s:.4f} | {s / fwd:.1f} |")


if __name__ == "__main__":
    main()
