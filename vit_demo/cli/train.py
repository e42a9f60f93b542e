"""``train``: the scratch ViT from scratch, or a checkpoint fine-tuned, on a folder of pictures."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..checkpoints.load import DEFAULT_CHECKPOINT
from ..present.animate import write_slideshow
from ..train.fast import PRECISIONS
from ..train.loop import TrainOptions, curves_path, state_path
from ..train.loop import run as train
from ..train.snapshots import Recorder
from .common import DEVICES, add_output


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train the ViT from scratch or fine-tune a checkpoint on an image folder")
    p.add_argument("--data", required=True, help="ImageFolder (one sub-folder per class), a folder of CIFAR-10/100 "
                   "python-version files (official split, offline), or 'cifar10' / 'cifar100' (downloads once)")
    add_output(p, "--out", "file", required=True, help="checkpoint to write (.safetensors; its folder is made when "
                                                          "missing)")
    p.add_argument("--from", dest="from_", nargs="?", const=str(DEFAULT_CHECKPOINT), default=None,
                   help="fine-tune this checkpoint (no value: the embedded DeiT-Tiny); default: from scratch")
    p.add_argument("--img-size", type=int, help="model input size (default: the pictures' own size from scratch, "
                                                "the checkpoint's when fine-tuning)")
    p.add_argument("--patch-size", type=int, help="from scratch: patch size (default: about 8 patches a side)")
    p.add_argument("--stem", choices=("conv", "patch"), help="from scratch: 'conv' (default), a convolutional stem before the "
                                                             "transformer; 'patch', the plain ViT (timm has its twin)")
    p.add_argument("--epochs", type=int, help="a fixed number of epochs (from scratch the default is what fits --minutes; "
                                              "fine-tuning 5, linear probe 8)")
    p.add_argument("--minutes", type=float, help="a time budget: the run times a few steps and trains for the epochs that fit "
                                                 "(from scratch the default: 10 on a CPU, 3 on a GPU)")
    p.add_argument("--flip", action="store_true", help="from scratch: add horizontal flips (for pictures whose mirror image "
                                                       "is the same class, such as photos; off by default: a mirrored "
                                                       "digit or letter is not)")
    p.add_argument("--batch-size", type=int, help="global batch (split across torchrun processes); default 64 / 16")
    p.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    p.add_argument("--freeze-backbone", action="store_true", help="with --from: train the head only (linear probe)")
    p.add_argument("--val-split", type=float, default=0.2, help="share of each class held out (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="fixes the split, the init and every augmentation")
    p.add_argument("--resume", action="store_true", help="continue from OUT.train-state (last finished epoch)")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="the training forward pass's arithmetic: 'auto' (default) trains from scratch under bf16 autocast "
                        "where the CPU or GPU multiplies bf16 in hardware, else in fp32; 'fp32'; 'bf16'")
    p.add_argument("--amp", action="store_true", help="the same as --precision bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile the training step's model (needs a C++ compiler "
                                                          "on the CPU; the first epoch includes the compilation)")
    add_output(p, "--snapshots", "folder", metavar="DIR", help="write what the model sees every few epochs into DIR: a frame per "
                   "snapshot (rollout and the last layer's mean attention on one validation picture per class, up to 4, "
                   "and each layer's mean attention distance), filmstrip.png (the frames' maps side by side) and "
                   "snapshots.gif / snapshots.mp4")
    p.add_argument("--snapshot-every", type=int, metavar="N", help="with --snapshots: a frame every N epochs (default: "
                   "about 10 frames over the run, plus the untrained model's and the last epoch's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print one JSON summary on stdout (logs go to stderr)")
    p.set_defaults(func=run)


def end_lines(summary: dict[str, Any], curves: Any) -> str:
    """What the run ends with: the checkpoint, the time against the budget, the pixel baseline, the fit."""
    budget = summary.get("budget_seconds")
    took = f"{summary['seconds']:.0f} s" + (f" of a {budget:.0f} s budget" if budget else "")
    lines = [f"saved {summary['out']}: the weights of epoch {summary['best_epoch']} of {summary['epochs']} "
             f"(val accuracy {summary['best_val_accuracy']}, the best; the last epoch: {summary['val_accuracy']}; "
             f"{took}); curves in {curves}"]
    base, best = summary.get("baseline_accuracy"), summary.get("best_val_accuracy")
    if base is not None and best is not None:
        verdict = "the ViT learned more than the pixels give" if best > base else \
            "the ViT did NOT beat it: train longer (--minutes) or check the data"
        lines.append(f"baseline: logistic regression on the raw pixels gets {base:.4f} on the same validation split; {verdict}")
    if summary.get("fit_note"):
        lines.append(summary["fit_note"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    opts = TrainOptions(data=args.data, out=args.out, from_=args.from_, img_size=args.img_size,
                        patch_size=args.patch_size, stem=args.stem, epochs=args.epochs, minutes=args.minutes,
                        flip=args.flip, batch_size=args.batch_size, lr=args.lr,
                        freeze_backbone=args.freeze_backbone, val_split=args.val_split, seed=args.seed,
                        resume=args.resume, device=args.device, progress=not args.no_progress, amp=args.amp,
                        precision=args.precision,
                        compile=args.compile)
    if args.snapshot_every is not None and args.snapshot_every < 1:
        print("error: --snapshot-every must be 1 or more", file=sys.stderr)
        return 2
    recorder = Recorder(args.snapshots, args.snapshot_every) if args.snapshots else None
    if recorder is not None:
        opts.on_epoch = recorder
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    try:
        summary = train(opts, log)
    except KeyboardInterrupt:
        done = state_path(args.out)
        print(f"interrupted; {'resume with --resume (state in ' + str(done) + ')' if done.exists() else 'no epoch finished'}",
              file=sys.stderr)
        return 130
    if int(os.environ.get("RANK", "0")) == 0:
        if recorder is not None:
            summary["snapshots"] = write_snapshots(recorder)
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            print(end_lines(summary, curves_path(args.out)))
            if recorder is not None:
                print(f"snapshots: {len(recorder.frames)} frames, filmstrip.png, snapshots.gif and snapshots.mp4 in "
                      f"{args.snapshots}")
    return 0


def write_snapshots(recorder: Recorder) -> dict[str, Any]:
    """The run's snapshots as a filmstrip, a GIF and an MP4 beside the frames; what the summary says of them."""
    strip = recorder.out / "filmstrip.png"
    recorder.strip().save(strip)
    gif, mp4 = write_slideshow(recorder.frames, recorder.out / "snapshots")
    return {"dir": str(recorder.out), "epochs": [s.epoch for s in recorder.snaps],
            "frames": [p.name for p in recorder.frames], "filmstrip": strip.name, "gif": gif.name, "mp4": mp4.name}
