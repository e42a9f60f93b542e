"""Prediction + every layer's attention maps + rollout for one image, as a ratio over timm's
plain float32 forward on the same image, same process, same threads. Targets: <= 1.05 in float32
(issue 30); with --precision auto on a CPU with AVX512-BF16 or AMX, <= 0.75 for DeiT-Tiny and
<= 0.60 for ViT-B/16 (issue 44: the scratch model in bfloat16, timm's forward in float32).

    python benchmarks/bench_explain.py [--models deit_tiny_patch16_224 vit_base_patch16_224] [--repeats 9]
                                       [--runs 3] [--threads N] [--precision auto|fp32|bf16] [--clock wall|cpu]

Each run interleaves ``--repeats`` timings of both after two warm-ups and takes their medians; the
ratio printed last is the median of the ``--runs`` runs' ratios. On a machine loaded beyond its
cores, two torch threads spin-wait for each other at every parallel operator, and the ratio measures
the scheduler more than the work: ``--threads 1`` measures the work, and ``--threads 1 --clock cpu``
times it by the process's CPU time instead of the wall clock, so that the minutes another process
holds the core are not counted (on a machine loaded several times over its cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vit_demo.methods.attention import head_maps  # noqa: E402
from vit_demo.methods.rollout import rollout  # noqa: E402
from vit_demo.precision import PRECISIONS, describe, resolve, set_precision  # noqa: E402


def models(name: str, precision: str):
    """timm's model (float32) and ours with the same weights, in ``precision`` (auto, fp32, bf16)."""
    from vit_demo.checkpoints.timm import from_timm, timm_model

    torch.manual_seed(0)
    tm = timm_model(name)
    model, _ = from_timm(tm)
    return tm, set_precision(model, resolve(precision, "cpu"))


@torch.inference_mode()
def bench(tm, model, repeats: int, clock=time.perf_counter) -> dict:
    x = torch.randn(1, 3, *model.cfg.img_size)

    def ours() -> None:
        out = model(x, capture=True)  # prediction + all attention probabilities
        out.logits.softmax(-1).topk(5)
        head_maps(out.attentions, out.layout).float()  # every layer x head [class] map
        rollout(out.attentions, out.layout)

    def timed(fn) -> float:
        t0 = clock()
        fn()
        return clock() - t0

    for _ in range(2):
        timed(ours), timed(lambda: tm(x))
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours))
        b.append(timed(lambda: tm(x)))
    sa, sb = statistics.median(a), statistics.median(b)
    return {"ours_ms": 1000 * sa, "timm_ms": 1000 * sb, "ratio": sa / sb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["deit_tiny_patch16_224", "vit_base_patch16_224"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--runs", type=int, default=3, help="runs per model; the ratio is their median")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="what our model runs in (timm's always runs in fp32); default fp32")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the process's CPU time, not the wall clock (with --threads 1 on a loaded machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} time, "
          f"load average {os.getloadavg()[0]:.1f} "
          f"(before); ours in {describe(args.precision, 'cpu')}, timm in fp32")
    print("| model | predict + all maps + rollout (ms) | timm forward (ms) | ratio per run | ratio (median) |\n"
          "|---|---|---|---|---|")
    for name in args.models:
        tm, model = models(name, args.precision)
        runs = [bench(tm, model, args.repeats, clock) for _ in range(args.runs)]
        ratio = statistics.median(r["ratio"] for r in runs)
        ours, timm_ms, ratios = (", ".join(f"{r[k]:{f}}" for r in runs)
                                 for k, f in (("ours_ms", ".1f"), ("timm_ms", ".1f"), ("ratio", ".3f")))
        print(f"| {name} | {ours} | {timm_ms} | {ratios} | **{ratio:.3f}** |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (after)")


if __name__ == "__main__":
    main()
