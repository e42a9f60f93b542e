"""Training benchmarks (issue 9). Not a test: figures to quote, never assertions.

(a) scratch  - the acceptance run: ``python -m vit_demo train --data SHAPES --out FILE`` with no
               other flag on the default shapes set (4 x 1000 pictures, 32 px); wall time, the
               process's CPU time, and validation accuracy.
(b) finetune - DeiT-Tiny (the embedded checkpoint) fine-tuned on real ImageNet sample photos
               grouped into four coarse classes (dogs / birds / reptiles / food, by class index).
(c) step     - training step time (forward + backward + AdamW) of the scratch model over timm's
               VisionTransformer with the same config and batch, interleaved in one process: at
               the shapes size and at 224 px DeiT-Tiny. Images per second for both.
(d) ddp      - the same no-flag shapes run under ``torchrun --standalone --nproc_per_node=2`` (gloo, one
               thread per process) next to the one-process run: validation accuracy and time.

    python benchmarks/bench_train.py [scratch finetune step ddp] [--json FILE]

On a shared machine the wall times are disturbed by whatever else runs; the CPU time and the
load average are printed next to them, and (c) gives ratios measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
# ImageNet class-index ranges (the sample has one photo per class, sorted by wnid = index)
COARSE = {"bird": [*range(7, 25), *range(80, 101), *range(127, 147)], "dog": list(range(151, 269)),
          "reptile": list(range(25, 69)), "food": list(range(924, 970))}


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_train(args: list[str], processes: int = 1) -> dict:
    """Run the train command as a user would (under torchrun for more than one process); wall and
    CPU seconds with the summary."""
    cpu0, t0, load0 = child_cpu(), time.perf_counter(), os.getloadavg()[0]
    launch = [sys.executable, "-m", "vit_demo"] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m", "vit_demo"]
    r = subprocess.run([*launch, "train", *args, "--json", "--no-progress"], cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, child_cpu() - cpu0
    if r.returncode:
        raise SystemExit(f"train failed:\n{r.stderr[-3000:]}")
    sys.stderr.write(r.stderr)
    return {**json.loads(r.stdout), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_avg_1min": [round(load0, 1), round(os.getloadavg()[0], 1)], "cores": os.cpu_count()}


def bench_scratch(tmp: Path) -> dict:
    from vit_demo.train.data import make_shapes

    make_shapes(tmp / "shapes", seed=0, progress=False)  # the defaults: 4 x 1000, 32 px
    return run_train(["--data", str(tmp / "shapes"), "--out", str(tmp / "shapes.safetensors")])


def bench_ddp(tmp: Path) -> dict:
    from vit_demo.train.data import make_shapes

    make_shapes(tmp / "shapes", seed=0, progress=False)
    out = {}
    for processes in (1, 2):
        r = run_train(["--data", str(tmp / "shapes"), "--out", str(tmp / f"ddp{processes}.safetensors")], processes)
        out[f"{processes} process{'es' if processes > 1 else ''}"] = {
            k: r[k] for k in ("val_accuracy", "best_val_accuracy", "epochs", "seconds", "wall_s", "cpu_s")}
    return out


def coarse_folder(dest: Path, per_class: int = 40) -> Path:
    """Four coarse classes of real photos from the ImageNet sample (copied into ``dest``)."""
    files = sorted(SAMPLE.glob("*.JPEG"))
    if len(files) != 1000:
        raise SystemExit(f"needs the 1000-photo ImageNet sample at {SAMPLE}")
    for name, idx in COARSE.items():
        (dest / name).mkdir(parents=True, exist_ok=True)
        chosen = [idx[i * len(idx) // per_class] for i in range(min(per_class, len(idx)))]
        for i in chosen:
            shutil.copy(files[i], dest / name / files[i].name)
    return dest


def bench_finetune(tmp: Path) -> dict:
    data = coarse_folder(tmp / "coarse")
    return run_train(["--data", str(data), "--out", str(tmp / "coarse.safetensors"), "--from"])


def step_times(make_a, make_b, x, y, reps: int = 12) -> tuple[list[float], list[float]]:
    """Interleaved forward+backward+AdamW step times of two models on the same batch."""
    import torch
    import torch.nn.functional as F

    runs = []
    for make in (make_a, make_b):
        torch.manual_seed(0)
        m = make().train()
        opt = torch.optim.AdamW(m.parameters(), 1e-3)
        runs.append((m, opt))

    def step(m, opt) -> float:
        t = time.perf_counter()
        out = m(x)
        logits = out.logits if hasattr(out, "logits") else out
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t

    for m, opt in runs:  # warm-up
        step(m, opt)
        step(m, opt)
    ta, tb = [], []
    for i in range(reps):
        order = runs if i % 2 == 0 else runs[::-1]
        for m, opt in order:
            (ta if m is runs[0][0] else tb).append(step(m, opt))
    return ta, tb


def bench_step() -> dict:
    import timm.models.vision_transformer as tv
    import torch

    from vit_demo.model import VisionTransformer
    from vit_demo.train.recipe import scratch_config

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    out = {}
    cfg_small = scratch_config(32, 4)
    cfg_deit = scratch_config(32, 4).__class__(embed_dim=192, depth=12, num_heads=3, num_classes=1000)
    for name, cfg, batch in (("shapes 32 px", cfg_small, 64), ("DeiT-Tiny 224 px", cfg_deit, 16)):
        def timm_model(cfg=cfg):
            return tv.VisionTransformer(img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.embed_dim,
                                        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio,
                                        num_classes=cfg.num_classes)
        x = torch.randn(batch, 3, *cfg.img_size)
        y = torch.randint(0, cfg.num_classes, (batch,))
        def scratch_model(cfg=cfg):
            return VisionTransformer(cfg).init_weights()
        # both creation orders: the model built first gets the first memory, which alone moved
        # the ratio by a few per cent between runs
        ta, tb = step_times(scratch_model, timm_model, x, y)
        tb2, ta2 = step_times(timm_model, scratch_model, x, y)
        by_order = {"scratch built first": statistics.median(ta) / statistics.median(tb),
                    "timm built first": statistics.median(ta2) / statistics.median(tb2)}
        a, b = statistics.median(ta + ta2), statistics.median(tb + tb2)
        ratio = statistics.geometric_mean(by_order.values())  # each ratio from one interleaved run
        out[name] = {"batch": batch, "scratch_ms": round(a * 1e3, 1), "timm_ms": round(b * 1e3, 1),
                     "ratio_scratch_over_timm": round(ratio, 3), "scratch_img_s": round(batch / a, 1),
                     "timm_img_s": round(batch / b, 1), "ratio_by_build_order": {k: round(v, 3) for k, v in by_order.items()}}
        print(name, out[name], file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", nargs="*", default=["step", "finetune", "scratch"])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for which in args.which:
            fn = {"scratch": lambda: bench_scratch(Path(d)), "finetune": lambda: bench_finetune(Path(d)),
                  "step": bench_step, "ddp": lambda: bench_ddp(Path(d))}[which]
            results[which] = fn()
            print(json.dumps({which: results[which]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
