"""Training benchmarks (issue 9). Not a test: figures to quote, never assertions.

(a) scratch  - the acceptance run (issue 19): ``python -m vit_demo data shapes --out DIR`` (the hard
               default: 4 x 1000 pictures, 32 px, random polarity, distractors, textures), then
               ``python -m vit_demo train --data DIR --out FILE`` with no other flag; wall time, the
               process's CPU time, the validation accuracy (last, best, and the epoch where 0.90 is
               first reached) and the verdict against "val accuracy >= 0.90 within 15 minutes".
               ``--size 64`` makes the pictures 64 px (the GPU figure of issue 19); ``--held-out``
               also trains on a set like the issue's held-out one (random polarity, no distractors,
               no texture, another seed).
(b) finetune - DeiT-Tiny (the embedded checkpoint) fine-tuned on real ImageNet sample photos
               grouped into four coarse classes (dogs / birds / reptiles / food, by class index).
(c) step     - training step time (forward + backward + AdamW) of the scratch model over timm's
               VisionTransformer with the same config and batch, interleaved in one process: at
               the shapes size and at 224 px DeiT-Tiny. Images per second for both.
(e) speed    - the training step (forward + backward + AdamW) of the no-flag scratch model with and
               without ``--amp`` (bf16 autocast) and ``--compile`` (torch.compile), interleaved in one
               process: images per second of each and the ratios to the plain step.
(f) suite    - the no-flag recipe on six unlike data sets made offline (benchmarks/suite/suite_data.py: the
               project's shapes, a second shape generator, outlines among clutter, scikit-learn's real
               handwritten digits, glyphs from fonts, procedural textures), each beside logistic
               regression and an RBF-SVM on the raw pixels and a same-size CNN on the same split
               (benchmarks/suite/suite_baselines.py); one markdown table (``--table FILE``). ``--scale``
               shrinks every set (CI runs 0.03 with ``--minutes 0.2``), ``--sets`` picks some.
(d) ddp      - the same no-flag shapes run under ``torchrun --standalone --nproc_per_node=2`` (gloo, one
               thread per process) next to the one-process run: validation accuracy and time.

    python benchmarks/bench_train.py [scratch finetune step ddp speed suite] [--size 64] [--held-out] [--device auto]
                                     [--json FILE] [--sets digits,blobs] [--scale 1.0] [--minutes M] [--table FILE]

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


def first_epoch_at(history: list[dict], level: float) -> int | None:
    return next((h["epoch"] for h in history if h["val_accuracy"] >= level), None)


def acceptance(data: Path, out: Path, device: str) -> dict:
    """``train --data DIR --out FILE`` and nothing else (``--device`` only when asked for one)."""
    from safetensors import safe_open

    r = run_train(["--data", str(data), "--out", str(out), *(["--device", device] if device != "auto" else [])])
    with safe_open(str(out), "pt") as f:
        history = json.loads(f.metadata()["training"])["history"]
    r["first_epoch_at_0.90"] = first_epoch_at(history, 0.90)
    r["val_accuracy_per_epoch"] = [round(h["val_accuracy"], 4) for h in history]
    r["minutes"] = round(r["wall_s"] / 60, 2)
    r["passed (best val acc >= 0.90 within 15 min)"] = bool(r["best_val_accuracy"] >= 0.90 and r["wall_s"] <= 900)
    return r


def bench_scratch(tmp: Path, size: int = 32, held_out: bool = False, device: str = "auto") -> dict:
    """The acceptance run: the generator's defaults (only ``--size`` when asked), then the no-flag train."""
    from vit_demo.train.data import ShapeStyle, make_shapes

    make_shapes(tmp / "shapes", size=size, seed=0, progress=False)  # the defaults: 4 x 1000, 32 px, hard
    out = {"hard default": acceptance(tmp / "shapes", tmp / "shapes.safetensors", device)}
    if held_out:  # like the held-out set: random colours and polarity, a noisy background, nothing else
        make_shapes(tmp / "held", size=size, seed=12345, progress=False, style=ShapeStyle("random", 0, False))
        out["random polarity, no distractors, no texture (seed 12345)"] = acceptance(tmp / "held", tmp / "held.safetensors",
                                                                                     device)
    return out


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


def bench_speed(device: str = "auto") -> dict:
    """Step time of the no-flag scratch model (batch 64, 32 px) as it is, under bf16 autocast,
    and compiled, interleaved step by step in one process; medians and ratios to the plain step."""
    import torch
    import torch.nn.functional as F

    from vit_demo.checkpoints.load import resolve_device
    from vit_demo.model import VisionTransformer
    from vit_demo.train.recipe import scratch_config

    dev = resolve_device(device)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    torch.manual_seed(0)
    batch = 64
    x, y = torch.randn(batch, 3, 32, 32, device=dev), torch.randint(0, 4, (batch,), device=dev)

    def variant(amp: bool, compiled: bool):
        model = VisionTransformer(scratch_config(32, 4)).init_weights().to(dev).train()
        fwd = torch.compile(model) if compiled else model
        opt = torch.optim.AdamW(model.parameters(), 1e-3)

        def step() -> float:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
                logits = fwd(x).logits
            loss = F.cross_entropy(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t
        return step

    names = {"plain": (False, False), "amp": (True, False), "compile": (False, True), "amp + compile": (True, True)}
    steps, warm = {}, {}
    for name, (amp, compiled) in names.items():
        steps[name] = variant(amp, compiled)
        t0 = time.perf_counter()
        for _ in range(3):  # compilation (and first-call overheads) out of the timing
            steps[name]()
        warm[name] = round(time.perf_counter() - t0, 1)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(30):
        for name in (list(names) if i % 2 == 0 else list(names)[::-1]):
            times[name].append(steps[name]())
    med = {n: statistics.median(t) for n, t in times.items()}
    out = {"device": str(dev), "batch": batch, "threads": torch.get_num_threads(), "first_3_steps_s": warm}
    for n in names:
        out[n] = {"ms_per_step": round(med[n] * 1e3, 2), "img_per_s": round(batch / med[n], 1),
                  "time_ratio_to_plain": round(med[n] / med["plain"], 3)}
    print(out, file=sys.stderr, flush=True)
    return out


SUITE_COLUMNS = ("set", "pictures", "classes", "ViT best", "ViT last", "epochs", "wall s", "CPU s", "load",
                 "logreg", "RBF-SVM", "CNN best", "CNN s", "train-val loss")


def bench_suite(tmp: Path, sets: list[str], scale: float, minutes: float | None, cnn_epochs: int) -> dict:
    """Each set made, trained with no flag but --data and --out (and --minutes when asked), and
    measured beside the pixel baselines and the same-size CNN on the very same split."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "suite"))
    import torch
    from safetensors import safe_open
    from suite_baselines import loss_gap, split_of, svm_baseline, train_cnn
    from suite_data import MAKERS

    torch.set_num_threads(os.cpu_count() or 1)
    rows = {}
    for name in sets:
        data = MAKERS[name](tmp / name, scale=scale)
        out = tmp / f"{name}.safetensors"
        r = run_train(["--data", str(data), "--out", str(out), *(["--minutes", str(minutes)] if minutes else [])])
        with safe_open(str(out), "pt") as f:
            history = json.loads(f.metadata()["training"])["history"]
        params = vit_params(out)
        d, dc = split_of(data)
        row = {"set": name, "pictures": r["train_images"] + r["val_images"], "classes": len(r["classes"]),
               "ViT best": r["best_val_accuracy"], "ViT last": r["val_accuracy"], "epochs": r["epochs"], "wall s": r["wall_s"],
               "CPU s": r["cpu_s"], "load": "-".join(str(v) for v in r["load_avg_1min"]),
               "fit": r["fit"], "train-val loss": loss_gap(history)}
        sk = svm_baseline(d)
        cnn = train_cnn(d, dc, params, epochs=cnn_epochs)
        row.update({"logreg": round(r["baseline_accuracy"], 4), "RBF-SVM": sk["svm"], "CNN best": cnn["cnn_best"],
                    "CNN s": cnn["cnn_s"],
                    "cnn_params": cnn["cnn_params"], "vit_params": params})
        rows[name] = row
        print(json.dumps(row), flush=True)
    return rows


def vit_params(ckpt: Path) -> int:
    """The parameter count of a checkpoint (BatchNorm statistics not counted)."""
    from safetensors.torch import load_file

    return sum(v.numel() for k, v in load_file(str(ckpt)).items() if not k.endswith(("running_mean", "running_var",
                                                                                        "num_batches_tracked")))


def suite_table(rows: dict) -> str:
    """The suite's rows as a markdown table."""
    lines = ["| " + " | ".join(SUITE_COLUMNS) + " |", "|" + "---|" * len(SUITE_COLUMNS)]
    for row in rows.values():
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in SUITE_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", nargs="*", default=["step", "finetune", "scratch"])
    ap.add_argument("--size", type=int, default=32, help="scratch: picture size of the shapes (default 32)")
    ap.add_argument("--held-out", action="store_true", help="scratch: also a set like the issue's held-out one")
    ap.add_argument("--device", default="auto", help="scratch / speed: where to train (default: auto)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--sets", default="shapes,blobs,outlines,digits,glyphs,textures", help="suite: which data sets")
    ap.add_argument("--scale", type=float, default=1.0, help="suite: pictures per class, as a share of each set's full size")
    ap.add_argument("--minutes", type=float, help="suite: pass --minutes to train (default: train's own default)")
    ap.add_argument("--cnn-epochs", type=int, default=40, help="suite: epochs of the same-size CNN (default 40)")
    ap.add_argument("--table", help="suite: write the markdown table here")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for which in args.which:
            fn = {"scratch": lambda: bench_scratch(Path(d), args.size, args.held_out, args.device),
                  "finetune": lambda: bench_finetune(Path(d)), "step": bench_step, "ddp": lambda: bench_ddp(Path(d)),
                  "speed": lambda: bench_speed(args.device),
                  "suite": lambda: bench_suite(Path(d), args.sets.split(","), args.scale, args.minutes, args.cnn_epochs)}[which]
            results[which] = fn()
            print(json.dumps({which: results[which]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if "suite" in results:
        table = suite_table(results["suite"])
        print(table)
        if args.table:
            Path(args.table).write_text(table)


if __name__ == "__main__":
    main()
