"""Train the from-scratch ViT: from scratch on a folder of pictures, or by fine-tuning a
checkpoint (a new head; ``freeze_backbone`` for a linear probe). One process, or several
with ``torchrun`` (DistributedDataParallel; gloo on CPU, nccl on GPU).

The hyper-parameters are :mod:`.recipe`'s; validation runs through the model's eval transform.
The pictures sit in memory as uint8 tensors and are augmented a batch at a time (:mod:`.augment`).

Nothing is lost: after every epoch the whole training state goes to ``OUT.train-state``, and
``resume`` continues from the last finished epoch to the same result as an uninterrupted run
(every random draw comes from a generator seeded by (seed, epoch, rank)).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoints.files import save
from ..checkpoints.load import load_model, resolve_device
from ..distributed.torchrun import Dist, init_distributed
from ..model import VisionTransformer
from ..preprocess import DataConfig
from ..viz.charts import training_figure
from ..viz.export import save_figure
from .augment import eval_batch, train_batch
from .baseline import fit_verdict, pixel_baseline
from .budget import PROBE_STEPS, default_minutes, epochs_for, format_eta, seconds_per_step
from .cifar import DOWNLOADS, CifarLayout, cifar_layout, class_names, download_cifar, load_cifar_dir
from .data import DataError, TrainData, check_class_sizes, common_size, index_folder, load_folder
from .recipe import (
    STEMS,
    Recipe,
    finetune_recipe,
    make_optimizer,
    scratch_config,
    scratch_data_config,
    scratch_recipe,
    scratch_size,
    warmup_cosine,
    with_new_head,
)

STATE_SUFFIX = ".train-state"  # beside OUT; not a checkpoint suffix, so the app never lists it


class ResumeError(ValueError):
    """``resume`` cannot continue: no saved state, or one saved by a different run."""


@dataclass
class TrainOptions:
    """What the ``train`` command was asked to do (its flags)."""

    data: str
    out: str
    from_: str | None = None  # checkpoint to fine-tune; None: from scratch
    img_size: int | None = None
    patch_size: int | None = None
    stem: str | None = None  # from scratch: "conv" (default) or "patch" (the plain ViT)
    epochs: int | None = None
    minutes: float | None = None  # a time budget: the epochs that fit it (from scratch: the default)
    flip: bool = False  # from scratch: horizontal flips in the augmentation (fine-tuning always flips)
    batch_size: int | None = None  # global batch (split across torchrun processes)
    lr: float | None = None
    freeze_backbone: bool = False
    val_split: float = 0.2
    seed: int = 0
    resume: bool = False
    device: str = "auto"
    progress: bool = True
    amp: bool = False  # bf16 autocast for the training forward pass (CPU and CUDA)
    compile: bool = False  # torch.compile the training forward pass


# ----------------------------------------------------------------------------- distributed


def epoch_order(n: int, epoch: int, seed: int, dist: Dist, drop_last: bool) -> list[int]:
    """This rank's shuffled training indices for ``epoch`` (DistributedSampler when sharded)."""
    if dist.world == 1:
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), dist.world, dist.rank, shuffle=True, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


# ----------------------------------------------------------------------------- setup


@dataclass
class Setup:
    """Everything a run needs before its first step."""

    model: VisionTransformer
    dc: DataConfig
    data: TrainData
    recipe: Recipe
    mode: str  # "scratch", "finetune" or "linear-probe"
    base_name: str  # what the model was built from


def build(opts: TrainOptions, log: Callable[[str], None]) -> Setup:
    """Read the data, build the model and resolve the recipe (flags override the defaults)."""
    if opts.from_ is None and opts.freeze_backbone:
        raise DataError("--freeze-backbone needs --from CHECKPOINT (there is no trained backbone to freeze)")
    if any(v is not None and v <= 0 for v in (opts.epochs, opts.batch_size, opts.lr)):
        raise DataError("--epochs and --batch-size must be >= 1 and --lr > 0")
    if opts.minutes is not None and not opts.minutes > 0:
        raise DataError(f"--minutes must be more than 0 (a time budget for the run), got {opts.minutes:g}")
    if opts.minutes is not None and opts.epochs is not None:
        raise DataError("give --epochs or --minutes, not both (--minutes picks the epochs that fit the time)")
    cifar = find_cifar(opts.data)
    index = None if cifar else index_folder(opts.data)
    if index is not None:
        check_class_sizes(index, opts.val_split)
    num_classes = len(class_names(cifar)) if cifar else len(index.classes)
    if opts.from_ is None:
        size = opts.img_size or (32 if cifar else scratch_size(min(common_size(index.files))))
        model = VisionTransformer(scratch_config(size, num_classes, opts.patch_size, opts.stem or STEMS[0])).init_weights()
        dc, mode, base, store = scratch_data_config(size), "scratch", "scratch", size
    else:
        if opts.patch_size or opts.stem:
            raise DataError("--patch-size and --stem only apply from scratch (a checkpoint fixes its architecture)")
        lm = load_model(weights=opts.from_, device="cpu")
        model = with_new_head(lm.model, num_classes, opts.img_size)
        dc = lm.data_config.with_size(model.cfg.img_size)
        mode, base = ("linear-probe" if opts.freeze_backbone else "finetune"), lm.name
        store = dc.scale_size[0]
    data = load_cifar_dir(cifar, dc, store) if cifar else load_folder(index, dc, opts.val_split, opts.seed, store,
                                                                      progress=opts.progress, warn=log)
    recipe = scratch_recipe(flip=opts.flip) if opts.from_ is None else finetune_recipe(opts.freeze_backbone)
    recipe = replace(recipe, **{k: v for k, v in (("epochs", opts.epochs), ("batch_size", opts.batch_size),
                                                  ("lr", opts.lr)) if v is not None})
    return Setup(model, dc, data, recipe, mode, base)


def find_cifar(data: str) -> CifarLayout | None:
    """``cifar10`` / ``cifar100`` (downloaded once), a folder of CIFAR python-version files, or None
    (an ImageFolder)."""
    if data.lower() in DOWNLOADS:
        return download_cifar(data.lower())
    return cifar_layout(data)


# ----------------------------------------------------------------------------- loops


def train_one_epoch(model: nn.Module, opt, sched, setup: Setup, epoch: int, seed: int, dist: Dist,
                    device: torch.device, progress: bool, amp: bool = False, eta: str = "") -> tuple[float, float]:
    """One pass over this rank's shard (``amp``: the forward pass under bf16 autocast).
    Returns (mean train loss, images/s over all ranks)."""
    from tqdm import tqdm

    r, x_all, y_all = setup.recipe, setup.data.train_x, setup.data.train_y
    per_rank = max(1, r.batch_size // dist.world)
    order = epoch_order(len(x_all), epoch, seed, dist, drop_last=True)
    steps = max(1, len(order) // per_rank)  # drop the last partial batch (as timm does)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch * 1009 + dist.rank)
    model.train()
    total, count, t0 = torch.zeros((), dtype=torch.float64), 0, time.perf_counter()
    bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{r.epochs}{f' (run ETA {eta})' if eta else ''}", unit="batch", leave=False,
               disable=not (progress and dist.main), file=sys.stderr)
    for i in bar:
        idx = torch.tensor(order[i * per_rank : (i + 1) * per_rank] or order[:per_rank])
        x = train_batch(x_all[idx].to(device), setup.dc, r.augment, g)
        y = y_all[idx].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float(), y, label_smoothing=r.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if r.grad_clip:
            nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], r.grad_clip)
        opt.step()
        sched.step()
        total += loss.detach().double().cpu() * len(idx)
        count += len(idx)
        bar.set_postfix(loss=f"{float(total) / count:.3f}")
    bar.close()
    return float(total) / max(1, count), count * dist.world / (time.perf_counter() - t0)


@torch.no_grad()
def evaluate(model: VisionTransformer, setup: Setup, device: torch.device, batch_size: int = 256) -> tuple[float, float]:
    """(mean loss, accuracy) on the validation pictures (NaN, NaN when there are none)."""
    x_all, y_all = setup.data.val_x, setup.data.val_y
    if len(x_all) == 0:
        return float("nan"), float("nan")
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x_all), batch_size):
        x, y = eval_batch(x_all[i : i + batch_size].to(device), setup.dc), y_all[i : i + batch_size].to(device)
        logits = model(x).logits
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    return loss / len(x_all), correct / len(x_all)


# ----------------------------------------------------------------------------- state


def state_path(out: str | os.PathLike) -> Path:
    return Path(str(out) + STATE_SUFFIX)


def fingerprint(opts: TrainOptions, setup: Setup, dist: Dist) -> dict[str, Any]:
    """What must be unchanged for ``--resume`` to reach the same result."""
    return {"data": opts.data.lower() if opts.data.lower() in DOWNLOADS else str(Path(opts.data).resolve()),
            "classes": setup.data.classes, "from": opts.from_, "config": setup.model.cfg.to_dict(),
            "recipe": json.loads(json.dumps(asdict(setup.recipe))), "val_split": opts.val_split, "seed": opts.seed,
            "freeze_backbone": opts.freeze_backbone, "world_size": dist.world, "train_images": len(setup.data.train_x)}


def save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: a crash mid-write leaves the previous epoch's state intact


def load_state(path: Path, expected: dict[str, Any]) -> dict[str, Any]:
    if not path.is_file():
        raise ResumeError(f"--resume: no training state at {path} (start without --resume)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    diff = [k for k in expected if state["fingerprint"].get(k) != expected[k]]
    if diff:
        raise ResumeError(f"--resume: {path.name} was saved by a run with different {', '.join(diff)}; "
                        f"resume with the same flags and data, or start without --resume")
    return state


# ----------------------------------------------------------------------------- the run


def run(opts: TrainOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train as ``opts`` says; return the summary (the ``--json`` object)."""
    t_start = time.perf_counter()
    device = resolve_device(opts.device)
    dist = init_distributed(device)
    if device.type == "cuda" and dist.world > 1:
        device = torch.device("cuda", dist.local_rank)
    say = log if dist.main else (lambda msg: None)
    torch.manual_seed(opts.seed)
    s = build(opts, say)
    model = s.model.to(device)
    s, budget = plan_epochs(opts, s, dist, device, time.perf_counter() - t_start)
    r = s.recipe
    opt = make_optimizer(model, r, opts.freeze_backbone)
    steps = max(1, len(s.data.train_x) // max(1, r.batch_size // dist.world) // dist.world)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(r.epochs * steps, round(r.warmup_epochs * steps)))
    fp = fingerprint(opts, s, dist)
    spath = state_path(opts.out)
    history: list[dict[str, float]] = []
    best: dict[str, Any] = {"acc": -1.0, "epoch": 0, "state": None}
    start = 0
    if opts.resume:
        st = load_state(spath, fp)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        history, best, start = st["history"], st["best"], st["epoch"]
        say(f"resuming after epoch {start}/{r.epochs} from {spath}")
    say(header(s, model, opts, dist, device))
    ddp = training_module(model, opts, dist, device)
    t_epochs, eta = time.perf_counter(), ""
    epoch = start - 1
    while (epoch := epoch + 1) < r.epochs:
        train_loss, ips = train_one_epoch(ddp, opt, sched, s, epoch, opts.seed, dist, device, opts.progress, opts.amp, eta)
        val_loss, val_acc = evaluate(model, s, device)
        if epoch == 0 and budget is not None:  # the first epoch is a better clock than the probe's few steps
            s, r = replan(s, sched, steps, fp, budget - (time.perf_counter() - t_start), time.perf_counter() - t_epochs,
                          dist, say)
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc,
                        "images_per_s": ips})
        score = val_acc if val_acc == val_acc else -train_loss  # no validation: lowest training loss
        if score >= best["acc"] or best["state"] is None:
            best = {"acc": score, "epoch": epoch + 1,
                    "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        eta = format_eta((time.perf_counter() - t_epochs) / (epoch + 1 - start) * (r.epochs - epoch - 1))
        say(f"epoch {epoch + 1:>3}/{r.epochs}  train loss {train_loss:.4f}  val loss {val_loss:.4f}  "
            f"val acc {val_acc:.4f}  {ips:,.0f} img/s  ETA {eta}  {kept_note(best, epoch + 1, val_acc == val_acc)}")
        if dist.main:
            save_state(spath, {"fingerprint": fp, "epoch": epoch + 1, "history": history, "best": best,
                               "model": model.state_dict(), "optimizer": opt.state_dict(),
                               "scheduler": sched.state_dict()})
    summary = finish(opts, s, model, history, best, dist, t_start, budget)
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()
    return summary


def replan(setup: Setup, sched: torch.optim.lr_scheduler.LambdaLR, steps: int, run_fingerprint: dict[str, Any],
           left: float, first: float, dist: Dist, say: Callable[[str], None]) -> tuple[Setup, Recipe]:
    """After the first epoch of a budgeted run: the epochs that fit the time ``left``, timed by that
    epoch (``first`` seconds) instead of the probe's few steps, which a busy machine can mislead.
    The learning-rate schedule is stretched or shrunk to the new count from the next step on (the
    warm-up keeps its length), and the fingerprint follows, so that ``--resume`` continues it."""
    epochs = 1 + max(1, math.floor(0.95 * left / max(first, 1e-9)))
    if dist.world > 1:
        import torch.distributed as tdist

        box = [epochs]
        tdist.broadcast_object_list(box, src=0)
        epochs = int(box[0])
    r = setup.recipe
    if epochs == r.epochs:
        return setup, r
    say(f"the first epoch took {first:.1f} s: {epochs} epochs fit the budget (planned {r.epochs})")
    sched.lr_lambdas = [warmup_cosine(epochs * steps, round(r.warmup_epochs * steps))] * len(sched.lr_lambdas)
    r = replace(r, epochs=epochs)
    run_fingerprint["recipe"] = json.loads(json.dumps(asdict(r)))
    return replace(setup, recipe=r), r


def plan_epochs(opts: TrainOptions, setup: Setup, dist: Dist, device: torch.device, spent: float) -> tuple[Setup, float | None]:
    """The epochs of the run and its time budget in seconds (None when ``--epochs`` or a fine-tune's
    default fixes them): from scratch without ``--epochs``, the budget is ``--minutes`` or
    :func:`~.budget.default_minutes`; a resumed run keeps the epochs it started with; under torchrun
    every process takes rank 0's figure."""
    if opts.epochs is not None or (opts.from_ is not None and opts.minutes is None):
        return setup, None
    budget = 60 * (opts.minutes if opts.minutes is not None else default_minutes(device))
    saved = state_path(opts.out)
    if opts.resume and saved.is_file():
        epochs = int(torch.load(saved, map_location="cpu", weights_only=True)["fingerprint"]["recipe"]["epochs"])
    else:
        r = setup.recipe
        per_rank = max(1, r.batch_size // dist.world)
        step_s = seconds_per_step(setup.model, lambda m: make_optimizer(m, r, opts.freeze_backbone), setup.data.train_x,
                                  setup.data.train_y, per_rank, setup.dc, r.augment, device, opts.amp)
        t0 = time.perf_counter()
        evaluate(setup.model, setup, device)
        eval_s = (time.perf_counter() - t0) / dist.world
        steps = max(1, len(setup.data.train_x) // per_rank // dist.world)
        epochs = epochs_for(budget - spent - step_s * sum(PROBE_STEPS), step_s, steps, eval_s)
    if dist.world > 1:
        import torch.distributed as tdist

        box = [epochs]
        tdist.broadcast_object_list(box, src=0)
        epochs = int(box[0])
    warmup = min(5, max(1, epochs // 20))
    return replace(setup, recipe=replace(setup.recipe, epochs=epochs, warmup_epochs=warmup)), budget


def header(setup: Setup, model: VisionTransformer, opts: TrainOptions, dist: Dist, device: torch.device) -> str:
    """The run's first line: the data, the model and the recipe."""
    r, data = setup.recipe, setup.data
    budgeted = opts.epochs is None and (setup.mode == "scratch" or opts.minutes is not None)
    return (f"{setup.mode} on {data.source}: {len(data.train_x)} training and {len(data.val_x)} validation pictures, "
            f"{len(data.classes)} classes ({', '.join(data.classes[:8])}{', ...' if len(data.classes) > 8 else ''}), "
            f"{data.skipped} skipped; {model.num_params:,} parameters, {setup.dc.input_size[0]} px, "
            f"patch {model.cfg.patch_size}{', conv stem' if model.cfg.conv_stem else ''}; {r.epochs} epochs"
            f"{' (what fits the time budget; --epochs N repeats a run exactly)' if budgeted else ''}, "
            f"batch {r.batch_size}, lr {r.lr:g}; on {device}"
            + (f", {dist.world} processes ({dist.backend})" if dist.world > 1 else "")
            + "".join(f", {flag}" for flag, on in (("bf16 autocast", opts.amp), ("compiled", opts.compile)) if on))


def kept_note(best: dict[str, Any], epoch: int, validated: bool) -> str:
    """Which epoch's weights the checkpoint will hold, as the epoch line says it."""
    why = "best val acc" if validated else "lowest train loss (no validation pictures)"
    return f"kept: epoch {best['epoch']}, {why}" + (" (this one)" if best["epoch"] == epoch else "")


def training_module(model: VisionTransformer, opts: TrainOptions, dist: Dist, device: torch.device) -> nn.Module:
    """What the steps call: the model, wrapped for DDP under torchrun, compiled with ``--compile``
    (validation always runs the plain model)."""
    if opts.amp and device.type not in ("cpu", "cuda"):
        raise DataError(f"--amp: bf16 autocast is for the CPU and CUDA, not {device.type}")
    m: nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        m = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(m) if opts.compile else m


def finish(opts: TrainOptions, setup: Setup, model: VisionTransformer, history: list[dict[str, float]],
           best: dict[str, Any], dist: Dist, t_start: float, budget: float | None) -> dict[str, Any]:
    """Save the best checkpoint and the curves, score the pixel baseline (rank 0) and return the
    summary."""
    last = history[-1] if history else {}
    val_acc = last.get("val_accuracy", float("nan"))
    accs = [h["val_accuracy"] for h in history if h["val_accuracy"] == h["val_accuracy"]]
    base_acc, _ = pixel_baseline(setup.data.train_x, setup.data.train_y, setup.data.val_x, setup.data.val_y, opts.seed) \
        if dist.main else (None, 0.0)
    fit, fit_words = fit_verdict(history)
    summary = {
        "classes": setup.data.classes, "train_images": len(setup.data.train_x), "val_images": len(setup.data.val_x),
        "skipped_files": setup.data.skipped, "epochs": setup.recipe.epochs,
        "val_accuracy": None if val_acc != val_acc else round(val_acc, 6),
        "best_val_accuracy": round(max(accs), 6) if accs else None, "best_epoch": best["epoch"],
        "seconds": 0.0, "out": str(opts.out),
        "device": str(next(model.parameters()).device), "processes": dist.world,
        "budget_seconds": None if budget is None else round(budget, 1),
        "baseline_accuracy": None if base_acc is None else round(base_acc, 6), "fit": fit, "fit_note": fit_words,
    }
    summary["seconds"] = round(time.perf_counter() - t_start, 2)  # in the checkpoint; the returned one adds the saving
    if dist.main:
        model.load_state_dict(best["state"])
        meta = {"training": json.dumps({**summary, "mode": setup.mode, "base": setup.base_name,
                                        "seed": opts.seed, "val_split": opts.val_split, "data": setup.data.source,
                                        "recipe": asdict(setup.recipe), "history": history})}
        save(model, setup.dc, opts.out, name="", source=f"trained here ({setup.mode}) on "
             f"{setup.data.source}", class_names=setup.data.classes, extra_meta=meta)
        save_figure(training_figure(history, title=f"{Path(opts.out).name} ({setup.mode})"), curves_path(opts.out), width_px=900)
    summary["seconds"] = round(time.perf_counter() - t_start, 2)
    return summary


def curves_path(out: str | os.PathLike) -> Path:
    p = Path(out)
    return p.with_name(p.name.split(".")[0] + ".curves.png")

