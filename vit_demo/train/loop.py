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
import statistics
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
from ..data.annotations import DataError
from ..distributed.torchrun import Dist, init_distributed
from ..model import VisionTransformer
from ..preprocess import DataConfig
from ..progress import report
from ..viz.charts import training_figure
from ..viz.export import save_figure
from .augment import eval_batch, train_batch
from .baseline import fit_verdict, pixel_baseline
from .budget import (
    PROBE_STEPS,
    default_minutes,
    epochs_for,
    eval_estimate,
    fastest_threads,
    format_eta,
    seconds_per_step,
)
from .cifar import DOWNLOADS, CifarLayout, cifar_layout, class_names, download_cifar, load_cifar_dir
from .data import FolderIndex, TrainData, check_class_sizes, index_folder, load_folder, size_share, split_indices
from .fast import fast_input, fast_layout, plain_layout, step_context, use_bf16
from .recipe import (
    STEMS,
    Recipe,
    finetune_recipe,
    make_optimizer,
    scratch_config,
    scratch_data_config,
    scratch_recipe,
    warmup_cosine,
    with_new_head,
)
from .sizing import SizeChoice, choose_size, default_step, probe_step

STATE_SUFFIX = ".train-state"  # beside OUT; not a checkpoint suffix, so the app never lists it


def no_hook(*_: Any) -> None:
    """The default :attr:`TrainOptions.on_epoch`: nothing."""


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
    precision: str = "auto"  # "auto": bf16 autocast from scratch where the device has bf16 arithmetic; "fp32"; "bf16"
    amp: bool = False  # --amp, the old name of --precision bf16
    compile: bool = False  # torch.compile the training forward pass
    # called as on_epoch(setup, row, model) before the first epoch (row: {"epoch": 0}: the untrained model) and
    # after every epoch (row: its history row), on every process; an exception raised there stops the run
    on_epoch: Callable[[Setup, dict[str, Any], VisionTransformer], None] = no_hook


def budgeted(opts: TrainOptions) -> bool:
    """The run trains for a time budget (from scratch without ``--epochs``, or with ``--minutes``)."""
    return opts.epochs is None and (opts.from_ is None or opts.minutes is not None)


def bf16_of(opts: TrainOptions, device: torch.device) -> bool:
    """Whether the run trains in bf16 autocast: ``--precision`` (``--amp`` is ``bf16``), ``auto`` by
    the device (:func:`~.fast.use_bf16`)."""
    if opts.amp and opts.precision == "fp32":
        raise DataError("--amp is --precision bf16: give one of them, not --amp with --precision fp32")
    if device.type not in ("cpu", "cuda") and (opts.amp or opts.precision == "bf16"):
        raise DataError(f"--precision bf16 (--amp): bf16 autocast is for the CPU and CUDA, not {device.type}")
    try:
        return use_bf16("bf16" if opts.amp else opts.precision, device, scratch=opts.from_ is None)
    except ValueError as e:
        raise DataError(str(e)) from e


def step_settings(opts: TrainOptions, device: torch.device, dist: Dist, say: Callable[[str], None]) -> bool:
    """Whether the run trains in bf16 (:func:`bf16_of`); a budgeted run on a CPU, one process, first
    keeps the torch threads its steps are fastest on (:func:`~.budget.fastest_threads`), so that
    every probe after it times the steps the run will make."""
    bf16 = bf16_of(opts, device)
    if device.type == "cpu" and dist.world == 1 and budgeted(opts):
        fastest_threads(default_step(device, bf16), say)
    return bf16


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
    size: SizeChoice | None = None  # from scratch: the input size, and why
    pace_s: float | None = None  # seconds an epoch takes at the run's pace (:func:`epoch_pace`); before the first, the plan's
    budgeted: bool = False  # a time budget sets the epochs (they may change as the run goes: keep_to_budget)


def build(opts: TrainOptions, log: Callable[[str], None], dist: Dist | None = None,
          device: torch.device | None = None) -> Setup:
    """Read the data, build the model and resolve the recipe (flags override the defaults); from
    scratch with no ``--img-size``, the size comes from the pictures and the budget (:mod:`.sizing`)."""
    if opts.from_ is None and opts.freeze_backbone:
        raise DataError("--freeze-backbone needs --from CHECKPOINT (there is no trained backbone to freeze)")
    if any(v is not None and v <= 0 for v in (opts.epochs, opts.batch_size, opts.lr)):
        raise DataError("--epochs and --batch-size must be >= 1 and --lr > 0")
    if opts.minutes is not None and not opts.minutes > 0:
        raise DataError(f"--minutes must be more than 0 (a time budget for the run), got {opts.minutes:g}")
    if opts.minutes is not None and opts.epochs is not None:
        raise DataError("give --epochs or --minutes, not both (--minutes picks the epochs that fit the time)")
    report(0.0, "listing the pictures")
    cifar = find_cifar(opts.data)
    index = None if cifar else index_folder(opts.data)
    if index is not None:
        check_class_sizes(index, opts.val_split)
    num_classes = len(class_names(cifar)) if cifar else len(index.classes)
    chosen = None
    if opts.from_ is None:
        stem = opts.stem or STEMS[0]
        chosen = scratch_input_size(opts, index, num_classes, stem, dist or Dist(), device or torch.device("cpu"))
        if chosen.note:
            log(chosen.note)
        try:
            cfg = scratch_config(chosen.size, num_classes, opts.patch_size or chosen.patch, stem)
        except DataError as e:
            raise DataError(f"{e} ({chosen.note})" if chosen.note else str(e)) from e
        size = chosen.size
        model = VisionTransformer(cfg).init_weights()
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
    return Setup(model, dc, data, recipe, mode, base, chosen)


def scratch_input_size(opts: TrainOptions, index: FolderIndex | None, num_classes: int, stem: str, dist: Dist,
                       device: torch.device) -> SizeChoice:
    """From scratch: ``--img-size``, CIFAR's 32 px, the size of the run being resumed, or what
    :func:`~.sizing.choose_size` picks for the folder (on rank 0; every process takes its choice)."""
    if opts.img_size is not None:
        return SizeChoice(opts.img_size, "")
    if index is None:
        return SizeChoice(32, "")
    saved = state_path(opts.out)
    if opts.resume and saved.is_file():
        cfg = torch.load(saved, map_location="cpu", weights_only=True)["fingerprint"]["config"]
        size, patch = int(cfg["img_size"][0]), int(cfg["patch_size"])
        return SizeChoice(size, f"training at {size} px, patch {patch}, the size of the run being resumed", patch=patch)
    choice = None
    if dist.main:
        report(0.0, "looking at the pictures' sizes")
        picture, share = size_share(index.files)
        recipe = scratch_recipe(flip=opts.flip)
        per_rank = max(1, (opts.batch_size or recipe.batch_size) // dist.world)
        train_idx, val_idx = split_indices(index.targets, opts.val_split, opts.seed)
        minutes = opts.minutes if opts.minutes is not None else default_minutes(device)
        batch = min(per_rank, max(1, len(train_idx)))  # a folder smaller than a batch trains on all of it a step
        choice = choose_size(picture, share, stem, opts.patch_size,
                             lambda n: probe_step(n, num_classes, stem, opts.patch_size, recipe, batch, device,
                                                  bf16_of(opts, device)),
                             steps_per_epoch=max(1, len(train_idx) // per_rank // dist.world),
                             val_steps=len(val_idx) / batch / dist.world, seconds=60 * minutes, epochs=opts.epochs,
                             budget_words=f"{minutes:g} minutes (the default budget)" if opts.epochs else "")
    return agree(choice, dist)


def agree(value: Any, dist: Dist) -> Any:
    """Rank 0's ``value`` on every process (under torchrun; ``value`` itself in one process)."""
    if dist.world == 1:
        return value
    import torch.distributed as tdist

    box = [value]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def find_cifar(data: str) -> CifarLayout | None:
    """``cifar10`` / ``cifar100`` (downloaded once), a folder of CIFAR python-version files, or None
    (an ImageFolder)."""
    if data.lower() in DOWNLOADS:
        return download_cifar(data.lower())
    return cifar_layout(data)


# ----------------------------------------------------------------------------- loops


def train_one_epoch(model: nn.Module, opt, sched, s: Setup, epoch: int, seed: int, dist: Dist,
                    device: torch.device, progress: bool, bf16: bool = False, eta: str = "") -> tuple[float, float]:
    """One pass over this rank's shard (``bf16``: the forward pass under bf16 autocast, :mod:`.fast`).
    Returns (mean train loss, images/s over all ranks)."""
    from tqdm import tqdm

    r, x_all, y_all = s.recipe, s.data.train_x, s.data.train_y
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
        x = fast_input(train_batch(x_all[idx].to(device), s.dc, r.augment, g), device)
        y = y_all[idx].to(device)
        with step_context(device, bf16):
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
        report((i + 1) / steps, f"epoch {epoch + 1}: step {i + 1} of {steps}")
    bar.close()
    return float(total) / max(1, count), count * dist.world / (time.perf_counter() - t0)


@torch.no_grad()
def evaluate(model: VisionTransformer, s: Setup, device: torch.device, batch_size: int = 256) -> tuple[float, float]:
    """(mean loss, accuracy) on the validation pictures (NaN, NaN when there are none)."""
    x_all, y_all = s.data.val_x, s.data.val_y
    if len(x_all) == 0:
        return float("nan"), float("nan")
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x_all), batch_size):
        x, y = eval_batch(x_all[i : i + batch_size].to(device), s.dc), y_all[i : i + batch_size].to(device)
        logits = model(x).logits
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    return loss / len(x_all), correct / len(x_all)


# ----------------------------------------------------------------------------- state


def state_path(out: str | os.PathLike) -> Path:
    return Path(str(out) + STATE_SUFFIX)


def fingerprint(opts: TrainOptions, s: Setup, dist: Dist) -> dict[str, Any]:
    """What must be unchanged for ``--resume`` to reach the same result."""
    return {"data": opts.data.lower() if opts.data.lower() in DOWNLOADS else str(Path(opts.data).resolve()),
            "classes": s.data.classes, "from": opts.from_, "config": s.model.cfg.to_dict(),
            "recipe": json.loads(json.dumps(asdict(s.recipe))), "val_split": opts.val_split, "seed": opts.seed,
            "freeze_backbone": opts.freeze_backbone, "world_size": dist.world, "train_images": len(s.data.train_x)}


def save_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: a crash mid-write leaves the previous epoch's state intact


def load_state(path: Path, fp: dict[str, Any]) -> dict[str, Any]:
    if not path.is_file():
        raise ResumeError(f"--resume: no training state at {path} (start without --resume)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    diff = [k for k in fp if state["fingerprint"].get(k) != fp[k]]
    if diff:
        raise ResumeError(f"--resume: {path.name} was saved by a run with different {', '.join(diff)}; "
                        f"resume with the same flags and data, or start without --resume")
    return state


def resume_state(path: Path, fp: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer,
                 sched: torch.optim.lr_scheduler.LRScheduler) -> tuple[list[dict[str, float]], dict[str, Any], int]:
    """The saved state at ``path`` (checked against ``fp``) loaded into the model, the optimiser and the
    schedule; returns (history, best, epochs done)."""
    st = load_state(path, fp)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["optimizer"])
    sched.load_state_dict(st["scheduler"])
    return st["history"], st["best"], st["epoch"]


# ----------------------------------------------------------------------------- the run


def run(opts: TrainOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train as ``opts`` says; return the summary (the ``--json`` object). A budgeted run on a CPU may
    train on fewer torch threads (:func:`~.budget.fastest_threads`); the count is restored at the end."""
    threads = torch.get_num_threads()
    try:
        return train_run(opts, log)
    finally:
        torch.set_num_threads(threads)


def train_run(opts: TrainOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """:func:`run` itself."""
    t_start = time.perf_counter()
    device = resolve_device(opts.device)
    dist = init_distributed(device)
    if device.type == "cuda" and dist.world > 1:
        device = torch.device("cuda", dist.local_rank)
    say = log if dist.main else (lambda msg: None)
    torch.manual_seed(opts.seed)
    bf16 = step_settings(opts, device, dist, say)
    s = build(opts, say, dist, device)
    model = fast_layout(s.model.to(device), device)
    s, budget = plan_epochs(opts, s, dist, device, time.perf_counter() - t_start, bf16)
    r = s.recipe
    opt = make_optimizer(model, r, opts.freeze_backbone)
    steps = max(1, len(s.data.train_x) // max(1, r.batch_size // dist.world) // dist.world)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(r.epochs * steps, round(r.warmup_epochs * steps)))
    fp = fingerprint(opts, s, dist) | ({"bf16": True} if bf16 else {})  # a bf16 run resumes in bf16 (fp32 states predate the key)
    spath = state_path(opts.out)
    history: list[dict[str, float]] = []
    best: dict[str, Any] = {"acc": -1.0, "epoch": 0, "state": None}
    start = 0
    if opts.resume:
        history, best, start = resume_state(spath, fp, model, opt, sched)
        say(f"resuming after epoch {start}/{r.epochs} from {spath}")
    say(header(s, model, opts, dist, device, bf16))
    ddp = training_module(model, opts, dist, device)
    opts.on_epoch(s, {"epoch": start}, model)
    eta, ends = "", [time.perf_counter()]
    epoch = start - 1
    while (epoch := epoch + 1) < r.epochs:
        train_loss, ips = train_one_epoch(ddp, opt, sched, s, epoch, opts.seed, dist, device, opts.progress, bf16, eta)
        val_loss, val_acc = evaluate(model, s, device)
        ends.append(time.perf_counter())
        s = replace(s, pace_s=epoch_pace(ends))
        if budget is not None:  # the epochs' own clock keeps the run to its budget
            s, r = keep_to_budget(s, sched, steps, fp, budget - (ends[-1] - t_start), ends, epoch + 1, dist, say)
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": val_loss, "val_accuracy": val_acc,
                        "images_per_s": ips})
        opts.on_epoch(s, history[-1], model)
        best = kept(best, val_acc if val_acc == val_acc else -train_loss, epoch + 1, model)  # no validation: lowest loss
        eta = format_eta(s.pace_s * (r.epochs - epoch - 1))  # the one estimate of the run's end (the app's too)
        say(f"epoch {epoch + 1:>3}/{r.epochs}  train loss {train_loss:.4f}  val loss {val_loss:.4f}  "
            f"val acc {val_acc:.4f}  {ips:,.0f} img/s  ETA {eta}  {kept_note(best, epoch + 1, val_acc == val_acc)}")
        if dist.main:
            save_state(spath, {"fingerprint": fp, "epoch": epoch + 1, "history": history, "best": best,
                               "model": model.state_dict(), "optimizer": opt.state_dict(),
                               "scheduler": sched.state_dict()})
    summary = finish(opts, s, plain_layout(model), history, best, dist, t_start, budget)
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()
    return summary


OVERRUN = 1.10  # a budgeted run heading past 110 % of its budget trains fewer epochs (keep_to_budget)
PACE_EPOCHS = 3  # the run's pace: the median of its last few epochs (epoch_pace)


def kept(best: dict[str, Any], score: float, epoch: int, model: nn.Module) -> dict[str, Any]:
    """The weights the checkpoint will hold: this epoch's when its ``score`` is the best so far."""
    if score >= best["acc"] or best["state"] is None:
        return {"acc": score, "epoch": epoch, "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
    return best


def epoch_pace(ends: list[float]) -> float:
    """Seconds an epoch takes at the run's pace, from ``ends`` (the clock at the start and after each
    epoch): the median of the last :data:`PACE_EPOCHS` epochs, so that one slow epoch (a snapshot, a
    moment of other work) neither cuts the plan nor moves the ETA, while a lasting slowdown does."""
    times = [b - a for a, b in zip(ends, ends[1:])][-PACE_EPOCHS:]
    return statistics.median(times) if times else 0.0


def keep_to_budget(s: Setup, sched: torch.optim.lr_scheduler.LambdaLR, steps: int, fp: dict[str, Any], left: float,
                   ends: list[float], done: int, dist: Dist, say: Callable[[str], None]) -> tuple[Setup, Recipe]:
    """After each epoch of a budgeted run (``ends``: the clock at the start and after each epoch of this
    process): the first epoch re-plans the run by its own time (:func:`replan`); a later one, when the
    epochs left at the run's pace (:func:`epoch_pace`: the median of the last three) would end more
    than 10 % past the budget - the machine got busier -, trains only the epochs that fit, the rest
    of the learning-rate schedule squeezed into them, so that it still anneals to 0 at the last one
    (:func:`shrink`)."""
    if len(ends) == 2 and done == 1:
        return replan(s, sched, steps, fp, left, ends[1] - ends[0], dist, say)
    return shrink(s, sched, steps, fp, left, epoch_pace(ends), done, dist, say)


def shrink(s: Setup, sched: torch.optim.lr_scheduler.LambdaLR, steps: int, fp: dict[str, Any], left: float,
           pace: float, done: int, dist: Dist, say: Callable[[str], None]) -> tuple[Setup, Recipe]:
    """Fewer epochs when the ones left (``pace`` seconds each) would overrun the time ``left`` by more
    than :data:`OVERRUN`; never more epochs. ``--epochs`` with the new count does not repeat such a
    run exactly (its schedule changed mid-way); the line says so."""
    r = s.recipe
    wanted = r.epochs - done
    if wanted <= 1 or wanted * pace <= OVERRUN * max(left, 0.0):
        return s, r
    fit = int(agree(max(1, math.floor(0.95 * max(left, 0.0) / max(pace, 1e-9))), dist))
    if fit >= wanted:
        return s, r
    epochs = done + fit
    for f in {id(f): f for f in sched.lr_lambdas}.values():  # each schedule once (param groups may share one)
        f.end_at(done * steps, epochs * steps)
    say(f"epochs now take {pace:.1f} s (the machine is busier): {epochs} epochs fit the budget (planned {r.epochs}); "
        "the learning rate still anneals to 0 at the last one (--epochs no longer repeats this run exactly)")
    r = replace(r, epochs=epochs)
    fp["recipe"] = json.loads(json.dumps(asdict(r)))
    return replace(s, recipe=r), r


def replan(s: Setup, sched: torch.optim.lr_scheduler.LambdaLR, steps: int, fp: dict[str, Any], left: float, first: float,
           dist: Dist, say: Callable[[str], None]) -> tuple[Setup, Recipe]:
    """After the first epoch of a budgeted run: the epochs that fit the time ``left``, timed by that
    epoch (``first`` seconds) instead of the probe's few steps, which a busy machine can mislead.
    The learning-rate schedule is stretched or shrunk to the new count from the next step on (the
    warm-up keeps its length), and the fingerprint follows, so that ``--resume`` continues it."""
    epochs = int(agree(1 + max(1, math.floor(0.95 * left / max(first, 1e-9))), dist))
    r = s.recipe
    if epochs == r.epochs:
        return s, r
    say(f"the first epoch took {first:.1f} s: {epochs} epochs fit the budget (planned {r.epochs})")
    sched.lr_lambdas = [warmup_cosine(epochs * steps, round(r.warmup_epochs * steps))] * len(sched.lr_lambdas)
    r = replace(r, epochs=epochs)
    fp["recipe"] = json.loads(json.dumps(asdict(r)))
    return replace(s, recipe=r), r


def plan_epochs(opts: TrainOptions, s: Setup, dist: Dist, device: torch.device, spent: float,
                bf16: bool = False) -> tuple[Setup, float | None]:
    """The epochs of the run and its time budget in seconds (None when ``--epochs`` or a fine-tune's
    default fixes them): from scratch without ``--epochs``, the budget is ``--minutes`` or
    :func:`~.budget.default_minutes`; a resumed run keeps the epochs it started with; under torchrun
    every process takes rank 0's figure. A size chosen by the clock (:mod:`.sizing`) comes with its
    step's time: the plan is then the one the choice made (the first epoch re-plans both alike)."""
    if opts.epochs is not None or (opts.from_ is not None and opts.minutes is None):
        return s, None
    budget = 60 * (opts.minutes if opts.minutes is not None else default_minutes(device))
    saved = state_path(opts.out)
    if opts.resume and saved.is_file():
        epochs = int(torch.load(saved, map_location="cpu", weights_only=True)["fingerprint"]["recipe"]["epochs"])
    else:
        r = s.recipe
        per_rank = max(1, r.batch_size // dist.world)
        steps = max(1, len(s.data.train_x) // per_rank // dist.world)
        if s.size is not None and s.size.step_s is not None:  # the size probe timed this model: its estimate, again
            step_s, probe_s = s.size.step_s, 0.0
            eval_s = eval_estimate(step_s, len(s.data.val_x) / min(per_rank, len(s.data.train_x)) / dist.world)
        else:
            report(0.0, "timing a few training steps")
            step_s = seconds_per_step(s.model, lambda m: make_optimizer(m, r, opts.freeze_backbone), s.data.train_x,
                                      s.data.train_y, per_rank, s.dc, r.augment, device, bf16)
            probe_s = step_s * sum(PROBE_STEPS)
            report(0.5, "timing a validation pass")
            t0 = time.perf_counter()
            evaluate(s.model, s, device)
            eval_s = (time.perf_counter() - t0) / dist.world
        epochs = epochs_for(budget - spent - probe_s, step_s, steps, eval_s)
        s = replace(s, pace_s=step_s * steps + eval_s)
    epochs = int(agree(epochs, dist))
    warmup = min(5, max(1, epochs // 20))
    return replace(s, recipe=replace(s.recipe, epochs=epochs, warmup_epochs=warmup), budgeted=True), budget


def header(s: Setup, model: VisionTransformer, opts: TrainOptions, dist: Dist, device: torch.device,
           bf16: bool = False) -> str:
    """The run's first line: the data, the model and the recipe."""
    r = s.recipe
    repeat = f"{s.size.flags} " if s.size is not None and s.size.flags else ""  # the size or grid came from the clock
    return (f"{s.mode} on {s.data.source}: {len(s.data.train_x)} training and {len(s.data.val_x)} validation pictures, "
            f"{len(s.data.classes)} classes ({', '.join(s.data.classes[:8])}{', ...' if len(s.data.classes) > 8 else ''}), "
            f"{s.data.skipped} skipped; {model.num_params:,} parameters, {s.dc.input_size[0]} px, "
            f"patch {model.cfg.patch_size}{', conv stem' if model.cfg.conv_stem else ''}; {r.epochs} epochs"
            f"{f' (what fits the time budget; {repeat}--epochs N repeats a run exactly)' if budgeted(opts) else ''}, "
            f"batch {r.batch_size}, lr {r.lr:g}; on {device}"
            + (f", {dist.world} processes ({dist.backend})" if dist.world > 1 else "")
            + f", {precision_words(opts, bf16)}" + (", compiled" if opts.compile else ""))


def precision_words(opts: TrainOptions, bf16: bool) -> str:
    """How the header names the run's precision, and why when ``auto`` chose it."""
    if opts.amp or opts.precision != "auto":
        return "bf16 autocast" if bf16 else "fp32"
    if bf16:
        return "bf16 autocast (this device multiplies bf16 in hardware; --precision fp32 turns it off)"
    return "fp32" + ("" if opts.from_ else " (no bf16 arithmetic in hardware here)")


def kept_note(best: dict[str, Any], epoch: int, validated: bool) -> str:
    """Which epoch's weights the checkpoint will hold, as the epoch line says it."""
    why = "best val acc" if validated else "lowest train loss (no validation pictures)"
    return f"kept: epoch {best['epoch']}, {why}" + (" (this one)" if best["epoch"] == epoch else "")


def training_module(model: VisionTransformer, opts: TrainOptions, dist: Dist, device: torch.device) -> nn.Module:
    """What the steps call: the model, wrapped for DDP under torchrun, compiled with ``--compile``
    (validation always runs the plain model)."""
    m: nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        m = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(m) if opts.compile else m


def finish(opts: TrainOptions, s: Setup, model: VisionTransformer, history: list[dict[str, float]],
           best: dict[str, Any], dist: Dist, t_start: float, budget: float | None) -> dict[str, Any]:
    """Save the best checkpoint and the curves, score the pixel baseline (rank 0) and return the
    summary."""
    last = history[-1] if history else {}
    val_acc = last.get("val_accuracy", float("nan"))
    accs = [h["val_accuracy"] for h in history if h["val_accuracy"] == h["val_accuracy"]]
    report(0.0, "finishing: logistic regression on the pixels (the baseline)")
    base_acc, _ = pixel_baseline(s.data.train_x, s.data.train_y, s.data.val_x, s.data.val_y, opts.seed) \
        if dist.main else (None, 0.0)
    fit, fit_words = fit_verdict(history)
    summary = {
        "classes": s.data.classes, "train_images": len(s.data.train_x), "val_images": len(s.data.val_x),
        "skipped_files": s.data.skipped, "epochs": s.recipe.epochs,
        "val_accuracy": None if val_acc != val_acc else round(val_acc, 6),
        "best_val_accuracy": round(max(accs), 6) if accs else None, "best_epoch": best["epoch"],
        "seconds": 0.0, "out": str(opts.out),
        "device": str(next(model.parameters()).device), "processes": dist.world,
        "budget_seconds": None if budget is None else round(budget, 1),
        "baseline_accuracy": None if base_acc is None else round(base_acc, 6), "fit": fit, "fit_note": fit_words,
    }
    summary["seconds"] = round(time.perf_counter() - t_start, 2)  # in the checkpoint; the returned one adds the saving
    if dist.main:
        report(0.5, "finishing: saving the checkpoint and the curves")
        model.load_state_dict(best["state"])
        meta = {"training": json.dumps({**summary, "mode": s.mode, "base": s.base_name,
                                        "seed": opts.seed, "val_split": opts.val_split, "data": s.data.source,
                                        "recipe": asdict(s.recipe), "history": history})}
        save(model, s.dc, opts.out, name="", source=f"trained here ({s.mode}) on "
             f"{s.data.source}", class_names=s.data.classes, extra_meta=meta)
        save_figure(training_figure(history, title=f"{Path(opts.out).name} ({s.mode})"), curves_path(opts.out), width_px=900)
    summary["seconds"] = round(time.perf_counter() - t_start, 2)
    return summary


def curves_path(out: str | os.PathLike) -> Path:
    p = Path(out)
    return p.with_name(p.name.split(".")[0] + ".curves.png")

