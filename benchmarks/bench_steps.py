"""How long "Step inside" takes (vit_demo.inside): one step-through of a photo and every step's picture,
against timm's forward pass of the same model on the same input, in the same run.

    python benchmarks/bench_steps.py [--repeats 7] [--threads 2] [--image FILE] [--layer 7] [--head 2] [--json]

Timed, each the median of ``--repeats`` after one warm-up: timm's ``deit_tiny_patch16_224`` forward
on the shipped weights (the reference), the scratch model's capturing forward, ``step_through`` (that
forward with the hooks, the values, the texts), every step's picture at the app's scale
(``Walk.render(name)``, 13 of them), and ``with_temperature`` (a slider's move: no forward pass).
Reported as seconds and as ratios to timm's forward; the app's target is every picture within 2 s of
a click on 2 cores (step_through + all pictures). On a shared machine the seconds stretch with the
load (the script prints it); the ratios, measured side by side, are the reliable part, and with
``--threads 1`` the CPU time (printed beside) is a stable measure of the work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

ROOT = Path(__file__).resolve().parents[1]


CPU: dict[str, float] = {}  # name -> the median CPU time of the process (all threads), beside the wall time


def median_time(fn, repeats: int, name: str = "") -> float:
    fn()  # warm-up
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU[name] = statistics.median(cpu)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--image", default="", help="a photo (default: scikit-image's cat)")
    ap.add_argument("--layer", type=int, default=7)
    ap.add_argument("--head", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import safetensors.torch
    import timm
    from PIL import Image

    from vit_demo.checkpoints.load import load_model
    from vit_demo.inside import step_through
    from vit_demo.preprocess import preprocess

    torch.set_num_threads(args.threads)
    weights = ROOT / "weights" / "deit_tiny_patch16_224.safetensors"
    lm = load_model("deit_tiny_patch16_224", weights, device="cpu")
    tm = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    tm.load_state_dict(safetensors.torch.load_file(str(weights)))
    img = Image.open(args.image).convert("RGB") if args.image else Image.fromarray(__import__("skimage.data").data.chelsea())
    x, picture = preprocess(img, lm.input_config(img.size))
    x = x[None]

    def walk():
        return step_through(lm.model, x, (5, 9), args.layer, args.head, 1.0, picture, lm.labels, lm.name)

    w = walk()
    with torch.inference_mode():
        s = {"timm_forward": median_time(lambda: tm(x), args.repeats, "timm_forward"),
             "scratch_capture_forward": median_time(lambda: lm.model(x, capture=True), args.repeats,
                                                    "scratch_capture_forward")}
    s["step_through"] = median_time(walk, args.repeats, "step_through")
    s["all_pictures"] = median_time(lambda: [w.render(step.name) for step in w.steps], args.repeats, "all_pictures")
    s["with_temperature"] = median_time(lambda: w.with_temperature(2.0), args.repeats, "with_temperature")
    s["click_to_pictures"] = s["step_through"] + s["all_pictures"]
    CPU["click_to_pictures"] = CPU["step_through"] + CPU["all_pictures"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = {"threads": args.threads, "load": round(load, 2), "seconds": {k: round(v, 4) for k, v in s.items()},
           "cpu_seconds": {k: round(v, 4) for k, v in CPU.items()},
           "ratio_to_timm_forward": {k: round(v / s["timm_forward"], 2) for k, v in s.items()}}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.threads} threads, load {load:.2f} (1-minute average)")
    for k, v in s.items():
        print(f"  {k:24s} {v * 1000:9.1f} ms   {v / s['timm_forward']:6.2f} x timm's forward   "
              f"(CPU {CPU[k] * 1000:8.1f} ms)")


if __name__ == "__main__":
    main()
