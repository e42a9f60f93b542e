"""Prediction + every layer's attention maps + rollout for one image, as a ratio over timm's
plain forward on the same image, same process, same threads. Target: <= 1.05x (issue 30).

    python benchmarks/bench_explain.py [--models deit_tiny_patch16_224 vit_base_patch16_224] [--repeats 9]
                                       [--threads N]

On a machine loaded beyond its cores, two torch threads spin-wait for each other at every
parallel operator, and the ratio measures the scheduler more than the work: ``--threads 1``
measures the work.
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


@torch.inference_mode()
def bench(name: str, repeats: int) -> dict:
    from vit_demo.checkpoints.timm import from_timm, timm_model

    torch.manual_seed(0)
    tm = timm_model(name)
    model, _ = from_timm(tm)
    x = torch.randn(1, 3, *model.cfg.img_size)

    def ours() -> None:
        out = model(x, capture=True)  # prediction + all attention probabilities
        out.logits.softmax(-1).topk(5)
        head_maps(out.attentions, out.layout)  # every layer x head [class] map
        rollout(out.attentions, out.layout)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for _ in range(2):
        timed(ours), timed(lambda: tm(x))
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours))
        b.append(timed(lambda: tm(x)))
    sa, sb = statistics.median(a), statistics.median(b)
    return {"model": name, "ours_ms": 1000 * sa, "timm_ms": 1000 * sb, "ratio": sa / sb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["deit_tiny_patch16_224", "vit_base_patch16_224"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} (before)")
    print("| model | predict + all maps + rollout (ms) | timm forward (ms) | ratio |\n|---|---|---|---|")
    for name in args.models:
        r = bench(name, args.repeats)
        print(f"| {r['model']} | {r['ours_ms']:.1f} | {r['timm_ms']:.1f} | {r['ratio']:.3f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (after)")


if __name__ == "__main__":
    main()
