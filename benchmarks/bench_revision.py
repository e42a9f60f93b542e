"""The model at this checkout against the model at another git revision, in one process: DeiT-Tiny
(the shipped weights) built by both ``vit_demo/model`` packages, forward passes interleaved, medians,
ratio here / there (below 1: faster here). A change to the model's code is timed against the version
before it in the same minutes, so that a shared machine's noise hits both alike.

    python benchmarks/bench_revision.py --base 767572b [--repeats 15] [--threads 1] [--clock cpu]

Cases: the fast path and the capture path (every layer's attention), batch 1 and 8, and a capture
under bfloat16 autocast. Both packages are loaded under names of their own (they import only each
other's modules, relatively), and must give the same logits. Prints the load before and after. On a
machine loaded beyond its cores, ``--threads 1 --clock cpu`` (the process's CPU time, not the wall
clock) measures the work rather than the waits for a core.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights" / "deit_tiny_patch16_224.safetensors"
CASES = [("fast", 1, False, False), ("fast", 8, False, False), ("capture", 1, True, False),
         ("capture", 8, True, False), ("capture, bf16 autocast", 1, True, True)]


def load_both(base: str, into: Path) -> dict[str, torch.nn.Module]:
    """DeiT-Tiny from the model package at ``base`` and at this checkout, the same weights."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "vit_demo/model"], capture_output=True, check=True)
    (into / "model_there").mkdir()
    subprocess.run(["tar", "-x", "-C", str(into / "model_there"), "--strip-components=2"], input=archive.stdout, check=True)
    shutil.copytree(ROOT / "vit_demo" / "model", into / "model_here")
    sys.path.insert(0, str(into))
    from safetensors.torch import load_file

    sd, models = load_file(WEIGHTS), {}
    for name in ("there", "here"):
        pkg = importlib.import_module(f"model_{name}")
        models[name] = pkg.VisionTransformer(pkg.ViTConfig(embed_dim=192, depth=12, num_heads=3)).eval()
        models[name].load_state_dict(sd)
    return models


def timed(models: dict[str, torch.nn.Module], batch: int, capture: bool, bf16: bool, repeats: int,
          clock=time.perf_counter) -> dict[str, float]:
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"here": [], "there": []}
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        out = {k: m(x, capture=capture).logits for k, m in models.items()}
        if not torch.equal(out["here"], out["there"]):
            raise SystemExit(f"the two revisions' logits differ by {(out['here'] - out['there']).abs().max():.3g}")
        for i in range(repeats + 2):  # two warm-ups; who goes first alternates
            for k in ("here", "there") if i % 2 else ("there", "here"):
                t0 = clock()
                models[k](x, capture=capture)
                if i >= 2:
                    times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with (a commit, a branch)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: the process's CPU time")
    args = ap.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        models = load_both(args.base, Path(tmp))
        print(f"torch {torch.__version__}, {args.threads} threads, {args.clock} clock, "
              f"load average {os.getloadavg()[0]:.1f} (before)")
        print(f"| case | batch | {args.base} ms | here ms | here / {args.base} |\n|---|---|---|---|---|")
        for label, batch, capture, bf16 in CASES:
            t = timed(models, batch, capture, bf16, args.repeats, clock)
            print(f"| {label} | {batch} | {1000 * t['there']:.2f} | {1000 * t['here']:.2f} | "
                  f"{t['here'] / t['there']:.3f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} (after)")


if __name__ == "__main__":
    main()
