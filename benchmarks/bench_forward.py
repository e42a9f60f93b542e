"""Scratch forward time / timm forward time, same process, same threads, same weights.

    python benchmarks/bench_forward.py [--models deit_tiny_patch16_224 vit_base_patch16_224 ...] [--repeats 7]
    python benchmarks/bench_forward.py --families [--batches 1]

Runs alternate between the two models so that machine noise hits both alike; medians are
reported. Target: ratio <= 1.0 on the fast (no capture) path. The default models: DeiT-Tiny and
ViT-B/16 (the plain ViT), EVA-02-Tiny (RoPE, packed SwiGLU, q/v biases) and SigLIP-B/16 (the
attention-pool head), random init. Batches of 32 on a base model take seconds per forward pass:
they get ``--repeats-large`` runs. The machine's load (``os.getloadavg``) is printed before and
after: on a shared machine the ratios are the part to read. ``--families``: instead, one model of
each later family (:data:`FAMILIES`: differential attention, the parallel blocks, SAM's encoder
at 256x256 instead of 1024x1024, NaFlex at its position table's size).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


FAMILIES = [  # (timm name, constructor keywords)
    ("vit_dwee_patch16_reg1_gap_256", {}),  # differential attention
    ("vit_pwee_patch16_reg1_gap_256", {}),  # parallel scaling blocks
    ("vit_dpwee_patch16_reg1_gap_256", {}),  # differential attention in parallel scaling blocks
    ("vit_small_patch16_18x2_224", {}),  # two parallel branches per block
    ("samvit_base_patch16", {"img_size": 256}),  # SAM's encoder: windows, global blocks, decomposed positions, neck
    ("naflexvit_base_patch16_gap", {}),  # NaFlex: Linear patch projection, its positions
]


def timed(fn, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


@torch.inference_mode()
def bench(name: str, batch: int, repeats: int, **kwargs) -> dict:
    from vit_demo.checkpoints.timm import from_timm, timm_model

    torch.manual_seed(0)
    tm = timm_model(name, **kwargs)
    model, _ = from_timm(tm)
    x = torch.randn(batch, 3, *model.cfg.img_size)
    scratch = lambda t: model(t).logits  # noqa: E731
    for _ in range(1 if repeats <= 3 else 2):  # warm-up
        timed(scratch, x), timed(tm, x)
    a, b = [], []
    for i in range(repeats):  # alternate who goes first: caches and clocks favour neither
        if i % 2:
            b.append(timed(tm, x))
            a.append(timed(scratch, x))
        else:
            a.append(timed(scratch, x))
            b.append(timed(tm, x))
    sa, sb = statistics.median(a), statistics.median(b)
    return {"model": name, "batch": batch, "scratch_ms": 1000 * sa, "timm_ms": 1000 * sb, "ratio": sa / sb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["deit_tiny_patch16_224", "vit_base_patch16_224",
                                                    "eva02_tiny_patch14_224", "vit_base_patch16_siglip_224"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--repeats-large", type=int, default=3, help="repeats at batch >= 32 of a base-size model")
    ap.add_argument("--families", action="store_true", help="one model of each later family (FAMILIES) instead")
    args = ap.parse_args()
    runs = FAMILIES if args.families else [(name, {}) for name in args.models]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f} (before)")
    print("| model | batch | scratch ms | timm ms | scratch / timm |\n|---|---|---|---|---|")
    for name, kwargs in runs:
        for batch in args.batches:
            large = batch >= 32 and ("base" in name or "large" in name)
            r = bench(name, batch, args.repeats_large if large else args.repeats, **kwargs)
            print(f"| {r['model']} | {r['batch']} | {r['scratch_ms']:.1f} | {r['timm_ms']:.1f} | {r['ratio']:.3f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (after)")


if __name__ == "__main__":
    main()
