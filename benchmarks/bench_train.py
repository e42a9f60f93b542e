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
(e) speed    - the training step (forward + backward + clipping + AdamW) of the no-flag scratch model
               in fp32 as before, in bf16 as ``train`` makes it now (``--precision``; math attention
               and channels-last on a CPU), and alternatives (batch, width, depth, fewer tokens;
               ``--compiled``: torch.compile), interleaved step by step in one process, at each of
               ``--threads`` (e.g. 1,2) and ``--sizes`` (32 and 8 px): medians of wall and process CPU
               milliseconds a step and their ratios per picture to the first.
(g) profile  - where one training step's time goes (indexing, augmentation, forward, loss, backward,
               clipping, AdamW), wall and CPU, at 32 and 8 px, fp32 before and bf16 now.
(f) suite    - the no-flag recipe on seven unlike data sets made offline (benchmarks/suite/suite_data.py: the
               project's shapes, a second shape generator, outlines among clutter, scikit-learn's real
               handwritten digits, handwriting-like 28x28 digits, glyphs from fonts, procedural textures), each beside logistic
               regression and an RBF-SVM on the raw pixels and a same-size CNN on the same split
               (benchmarks/suite/suite_baselines.py); one markdown table (``--table FILE``). ``--scale``
               shrinks every set (CI runs 0.03 with ``--minutes 0.2``), ``--sets`` picks some.
(d) ddp      - the same no-flag shapes run under ``torchrun --standalone --nproc_per_node=2`` (gloo, one
               thread per process) next to the one-process run: validation accuracy and time.

    python benchmarks/bench_train.py [scratch finetune step ddp speed profile suite] [--size 64] [--held-out] [--device auto]
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


def process_cpu() -> float:
    """CPU seconds of this process, every thread (a proxy for the work that other jobs on a shared
    machine disturb less than the wall clock: at one thread, not at two, see docs/training.md)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# name -> (overrides of the model's config, batch, precision, channels-last, compiled). "bf16" is the
# step that train makes under --precision bf16 (math attention on a CPU, channels-last there);
# "bf16 flash" is plain bf16 autocast with PyTorch's default attention kernel, in the default layout.
SPEED_VARIANTS: dict[str, tuple[dict, int, str, bool, bool]] = {
    "fp32 (before)": ({}, 64, "fp32", False, False),
    "fp32 channels-last": ({}, 64, "fp32", True, False),
    "bf16 flash": ({}, 64, "bf16 flash", False, False),
    "bf16": ({}, 64, "bf16", True, False),
    "bf16 batch 128": ({}, 128, "bf16", True, False),
    "bf16 batch 256": ({}, 256, "bf16", True, False),
    "bf16 width 64": ({"embed_dim": 64, "num_heads": 2}, 64, "bf16", True, False),
    "bf16 depth 3": ({"depth": 3}, 64, "bf16", True, False),
    "bf16 depth 2": ({"depth": 2}, 64, "bf16", True, False),
    "bf16 width 128": ({"embed_dim": 128}, 64, "bf16", True, False),
    "bf16 patch x2 (4x fewer tokens)": ({"patch": 2}, 64, "bf16", True, False),
}
COMPILED = {"fp32 compiled": ({}, 64, "fp32", True, True), "bf16 compiled": ({}, 64, "bf16", True, True)}


def speed_variant(size: int, classes: int, dev, over: dict, batch: int, precision: str, cl: bool, compiled: bool):
    """A training step (augmented batch excluded: forward, backward, clipping, AdamW) of the default
    from-scratch model at ``size`` px with ``over`` changed, as ``train`` runs it."""
    from dataclasses import replace

    import torch
    import torch.nn.functional as F

    from vit_demo.model import VisionTransformer
    from vit_demo.train.fast import step_context
    from vit_demo.train.recipe import make_optimizer, scratch_config, scratch_recipe

    torch.manual_seed(0)
    cfg = scratch_config(size, classes, stem="conv")
    over = dict(over)
    if "patch" in over:
        over["patch_size"] = cfg.patch_size * over.pop("patch")
    model = VisionTransformer(replace(cfg, **over)).init_weights().to(dev).train()
    fmt = torch.channels_last if cl else torch.contiguous_format
    model = model.to(memory_format=fmt)
    fwd = torch.compile(model) if compiled else model
    opt = make_optimizer(model, scratch_recipe(), False)
    x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev)
    flash = precision == "bf16 flash"

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16) if flash else step_context(dev, precision == "bf16"):
            logits = fwd(x).logits
        loss = F.cross_entropy(logits.float(), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    return step, batch, sum(p.numel() for p in model.parameters())


def bench_speed(device: str = "auto", sizes: tuple[int, ...] = (32, 8), threads: tuple[int, ...] = (1,),
                compiled: bool = False, reps: int = 12) -> dict:
    """Training steps of the default from-scratch model and of alternatives (:data:`SPEED_VARIANTS`;
    ``compiled``: also torch.compile'd), interleaved step by step in one process at each thread
    count of ``threads``: medians of wall and process CPU seconds a step, and their ratios to the
    first variant at the first thread count. 32 px: 4 classes (the shapes); 8 px: 10 (the digits)."""
    import torch

    from vit_demo.checkpoints.load import resolve_device

    dev = resolve_device(device)
    variants = SPEED_VARIANTS | (COMPILED if compiled else {})
    out: dict = {"device": str(dev), "threads": list(threads), "reps": reps}
    for size in sizes:
        steps, warm = {}, {}
        for name, (over, batch, precision, cl, comp) in variants.items():
            if dev.type != "cpu" and precision == "bf16 flash":
                continue
            steps[name] = speed_variant(size, 4 if size >= 16 else 10, dev, over, batch, precision, cl, comp)
            t0 = time.perf_counter()
            for _ in range(3):  # compilation and first-call overheads out of the timing
                steps[name][0]()
            warm[name] = round(time.perf_counter() - t0, 1)
        wall = {(n, t): [] for n in steps for t in threads}
        cpu = {(n, t): [] for n in steps for t in threads}
        keys = list(wall)
        for i in range(reps):
            for name, t in (keys if i % 2 == 0 else keys[::-1]):
                torch.set_num_threads(t)
                w0, c0 = time.perf_counter(), process_cpu()
                steps[name][0]()
                wall[(name, t)].append(time.perf_counter() - w0)
                cpu[(name, t)].append(process_cpu() - c0)
        base = keys[0]
        mw = {k: statistics.median(v) for k, v in wall.items()}
        mc = {k: statistics.median(v) for k, v in cpu.items()}
        rows = {}
        for name, t in keys:
            batch = steps[name][1]
            rows[f"{name}, {t} thread{'s' if t > 1 else ''}"] = {
                "batch": batch, "params": steps[name][2], "wall_ms": round(mw[(name, t)] * 1e3, 1),
                "cpu_ms": round(mc[(name, t)] * 1e3, 1), "img_per_s": round(batch / mw[(name, t)], 1),
                "wall_ratio_per_img": round(mw[(name, t)] / batch / (mw[base] / steps[base[0]][1]), 3),
                "cpu_ratio_per_img": round(mc[(name, t)] / batch / (mc[base] / steps[base[0]][1]), 3),
                "first_3_steps_s": warm[name]}
        out[f"{size} px"] = rows
        print(json.dumps({f"{size} px": rows}), file=sys.stderr, flush=True)
    out["load_avg_1min"] = round(os.getloadavg()[0], 1)
    return out


PROFILE_PARTS = ("index", "augment", "forward", "loss", "backward", "clip", "optimizer")


def bench_profile(device: str = "auto", steps: int = 20) -> dict:
    """Where a training step's time goes, as ``train`` makes it (:data:`PROFILE_PARTS`), at 32 px
    (4 classes, 3,200 pictures) and 8 px (10 classes), in fp32 as before and in bf16 as train makes it
    now (:mod:`vit_demo.train.fast`): wall and process CPU milliseconds of each part, the mean of
    ``steps`` steps after 3 untimed."""
    import torch

    from vit_demo.checkpoints.load import resolve_device

    dev = resolve_device(device)
    out: dict = {"device": str(dev), "threads": torch.get_num_threads()}
    for size, classes in ((32, 4), (8, 10)):
        for bf16 in (False, True):
            row = profile_steps(size, classes, bf16, dev, steps)
            out[f"{size} px, {'bf16 (train now)' if bf16 else 'fp32 (before)'}"] = row
            print(json.dumps({f"{size} px bf16={bf16}": row}), file=sys.stderr, flush=True)
    out["load_avg_1min"] = round(os.getloadavg()[0], 1)
    return out


def profile_steps(size: int, classes: int, bf16: bool, dev, steps: int) -> dict:
    """:func:`bench_profile`'s figures for one size and precision."""
    import torch
    import torch.nn.functional as F

    from vit_demo.model import VisionTransformer
    from vit_demo.train.augment import train_batch
    from vit_demo.train.fast import fast_input, fast_layout, step_context
    from vit_demo.train.recipe import make_optimizer, scratch_config, scratch_data_config, scratch_recipe

    torch.manual_seed(0)
    model = VisionTransformer(scratch_config(size, classes, stem="conv")).init_weights().to(dev).train()
    model = fast_layout(model, dev) if bf16 else model
    r = scratch_recipe()
    opt = make_optimizer(model, r, False)
    dc = scratch_data_config(size)
    x_all, y_all = torch.randint(0, 256, (3200, 3, size, size), dtype=torch.uint8), torch.randint(0, classes, (3200,))
    g = torch.Generator().manual_seed(0)
    tot = {p: [0.0, 0.0] for p in PROFILE_PARTS}

    def mark(marks: list) -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        marks.append((time.perf_counter(), process_cpu()))
    for i in range(steps + 3):
        marks: list[tuple[float, float]] = []
        mark(marks)
        idx = torch.randperm(len(x_all), generator=g)[:64]
        xb, yb = x_all[idx].to(dev), y_all[idx].to(dev)
        mark(marks)
        x = train_batch(xb, dc, r.augment, g)
        x = fast_input(x, dev) if bf16 else x
        mark(marks)
        with step_context(dev, bf16):
            logits = model(x).logits
        mark(marks)
        loss = F.cross_entropy(logits.float(), yb, label_smoothing=r.label_smoothing)
        mark(marks)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        mark(marks)
        torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
        mark(marks)
        opt.step()
        mark(marks)
        for p, (a, b) in zip(PROFILE_PARTS, zip(marks, marks[1:])) if i >= 3 else ():
            tot[p][0] += b[0] - a[0]
            tot[p][1] += b[1] - a[1]
    row = {p: {"wall_ms": round(w / steps * 1e3, 2), "cpu_ms": round(c / steps * 1e3, 2)} for p, (w, c) in tot.items()}
    row["step"] = {"wall_ms": round(sum(v[0] for v in tot.values()) / steps * 1e3, 1),
                   "cpu_ms": round(sum(v[1] for v in tot.values()) / steps * 1e3, 1)}
    return row


SUITE_COLUMNS = ("set", "pictures", "classes", "ViT best", "ViT last", "epochs", "wall s", "CPU s", "load",
                 "logreg", "RBF-SVM", "CNN best", "CNN s", "train-val loss")
SHORT_COLUMNS = ("best", "epochs", "grid", "wall s", "CPU s", "load")  # the short budget's, after "ViT best" ... "load"


def suite_makers() -> dict:
    """Every set the suite can make: the seven of ``suite_data`` and the issue-43 ones of ``heldout_data``."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "suite"))
    import heldout_data
    import suite_data

    return suite_data.MAKERS | heldout_data.MAKERS


def bench_suite(tmp: Path, sets: list[str], scale: float, minutes: float | None, cnn_epochs: int,
                short: float = 2.0) -> dict:
    """Each set made, trained with no flag but --data and --out (and ``--minutes`` when asked; 0: not
    at all), then again with ``--minutes short`` (0: not), and measured beside the pixel baselines and
    the same-size CNN (``cnn_epochs`` 0: not) on the very same split."""
    makers = suite_makers()  # benchmarks/suite on the path
    import torch
    from suite_baselines import split_of, svm_baseline, train_cnn

    torch.set_num_threads(os.cpu_count() or 1)
    rows = {}
    for name in sets:
        data = makers[name](tmp / name, scale=scale)
        row: dict = {"set": name}
        if minutes != 0:
            row |= default_run(data, tmp / f"{name}.safetensors", minutes)
        if short:
            row |= short_run(data, tmp / f"{name}-short.safetensors", short)
        out = tmp / f"{name}{'-short' if minutes == 0 else ''}.safetensors"
        params = vit_params(out)
        d, dc = split_of(data)
        row["RBF-SVM"] = svm_baseline(d)["svm"]
        if cnn_epochs:
            cnn = train_cnn(d, dc, params, epochs=cnn_epochs)
            row |= {"CNN best": cnn["cnn_best"], "CNN s": cnn["cnn_s"], "cnn_params": cnn["cnn_params"]}
        rows[name] = row | {"vit_params": params}
        print(json.dumps(rows[name]), flush=True)
    return rows


def default_run(data: Path, out: Path, minutes: float | None) -> dict:
    """``train --data DATA --out OUT`` (``--minutes M`` when given): the suite's main columns."""
    from safetensors import safe_open
    from suite_baselines import loss_gap

    r = run_train(["--data", str(data), "--out", str(out), *(["--minutes", str(minutes)] if minutes else [])])
    with safe_open(str(out), "pt") as f:
        history = json.loads(f.metadata()["training"])["history"]
    return {"pictures": r["train_images"] + r["val_images"], "classes": len(r["classes"]),
            "ViT best": r["best_val_accuracy"], "ViT last": r["val_accuracy"], "epochs": r["epochs"], "wall s": r["wall_s"],
            "CPU s": r["cpu_s"], "load": "-".join(str(v) for v in r["load_avg_1min"]),
            "fit": r["fit"], "train-val loss": loss_gap(history), "logreg": round(r["baseline_accuracy"], 4)}


def short_run(data: Path, out: Path, minutes: float) -> dict:
    """``train --data DATA --out OUT --minutes M``: the columns :data:`SHORT_COLUMNS`, named ``M-min ...``."""
    from safetensors import safe_open

    r = run_train(["--data", str(data), "--out", str(out), "--minutes", str(minutes)])
    with safe_open(str(out), "pt") as f:
        grid = json.loads(f.metadata()["config"])
    side = grid["img_size"][0] // grid["patch_size"]
    values = (r["best_val_accuracy"], r["epochs"], f"{side}x{side}", r["wall_s"], r["cpu_s"],
              "-".join(str(v) for v in r["load_avg_1min"]))
    return {f"{minutes:g}-min {c}": v for c, v in zip(SHORT_COLUMNS, values)} | {
        "pictures": r["train_images"] + r["val_images"], "classes": len(r["classes"]),
        "logreg": round(r["baseline_accuracy"], 4)}


def vit_params(ckpt: Path) -> int:
    """The parameter count of a checkpoint (BatchNorm statistics not counted)."""
    from safetensors.torch import load_file

    return sum(v.numel() for k, v in load_file(str(ckpt)).items() if not k.endswith(("running_mean", "running_var",
                                                                                        "num_batches_tracked")))


def suite_table(rows: dict) -> str:
    """The suite's rows as a markdown table (the short budget's columns after the default's load)."""
    short = [k for k in next(iter(rows.values()), {}) if k.split(" ", 1)[-1] in SHORT_COLUMNS and "-min " in k]
    at = SUITE_COLUMNS.index("load") + 1
    columns = [c for c in (*SUITE_COLUMNS[:at], *short, *SUITE_COLUMNS[at:]) if any(c in row for row in rows.values())]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows.values():
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", nargs="*", default=["step", "finetune", "scratch"])
    ap.add_argument("--size", type=int, default=32, help="scratch: picture size of the shapes (default 32)")
    ap.add_argument("--held-out", action="store_true", help="scratch: also a set like the issue's held-out one")
    ap.add_argument("--device", default="auto", help="scratch / speed: where to train (default: auto)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--sets", default="shapes,blobs,outlines,digits,digits28,glyphs,textures",
                    help="suite: which data sets (also sdfshapes, heldshapes, heldicons: benchmarks/suite/heldout_data.py)")
    ap.add_argument("--scale", type=float, default=1.0, help="suite: pictures per class, as a share of each set's full size")
    ap.add_argument("--minutes", type=float, help="suite: pass --minutes to train (default: train's own default; 0: only the "
                                                 "--short column)")
    ap.add_argument("--cnn-epochs", type=int, default=40, help="suite: epochs of the same-size CNN (default 40; 0: none)")
    ap.add_argument("--short", type=float, default=2.0, help="suite: also train with --minutes SHORT, a column of its own "
                                                             "(default 2; 0: not)")
    ap.add_argument("--table", help="suite: write the markdown table here")
    ap.add_argument("--sizes", default="32,8", help="speed: picture sizes (default 32,8)")
    ap.add_argument("--threads", default="1", help="speed: torch thread counts, interleaved (default 1; e.g. 1,2)")
    ap.add_argument("--compiled", action="store_true", help="speed: also torch.compile'd steps (compilation not timed)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for which in args.which:
            fn = {"scratch": lambda: bench_scratch(Path(d), args.size, args.held_out, args.device),
                  "finetune": lambda: bench_finetune(Path(d)), "step": bench_step, "ddp": lambda: bench_ddp(Path(d)),
                  "speed": lambda: bench_speed(args.device, tuple(map(int, args.sizes.split(","))),
                                               tuple(map(int, args.threads.split(","))), args.compiled),
                  "profile": lambda: bench_profile(args.device),
                  "suite": lambda: bench_suite(Path(d), args.sets.split(","), args.scale, args.minutes, args.cnn_epochs,
                                               args.short)}[which]
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
