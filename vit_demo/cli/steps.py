"""``steps``: one picture through the model, step by step (vit_demo.inside): every step's title and
text on stdout (or the whole walk as JSON), and with ``--out`` each step's picture and the values."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..images import load_image
from ..inside import check_temperature, step_through
from ..preprocess import preprocess
from .common import UserError, add_model_args, add_output, load_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("steps", help="one picture through the ViT, step by step, every number the model's own",
                       description="Walk one picture through the model: a patch's pixels, its projection and position, "
                                   "one head's query meeting every key, the softmax, the weighted sum, the MLP, the "
                                   "residual stream, the logit lens and the logits. Indices count from 0.")
    p.add_argument("image", help="an image file")
    add_model_args(p, precision="fp32")
    p.add_argument("--patch", nargs=2, type=int, metavar=("ROW", "COL"),
                   help="the patch to follow, from 0 (default: the one the readout attends to most in the last layer)")
    p.add_argument("--layer", type=int, default=0, help="the block whose attention to step into, from 0 (default 0)")
    p.add_argument("--head", type=int, default=0, help="the head, from 0 (default 0)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="the softmax temperature (default 1: the model's own; others are a what-if)")
    p.add_argument("--json", action="store_true", help="print the steps and every value as one JSON object")
    add_output(p, "--out", "folder", help="a folder for each step's picture (NN-name.png), steps.json and values.npz "
               "(made when missing)")
    p.add_argument("--scale", type=float, default=2.0, help="the pictures' scale (1: about 960 px wide; default 2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not Path(args.image).is_file():
        raise UserError(f"{args.image}: no such image file")
    if not 0.25 <= args.scale <= 4:
        raise UserError(f"--scale {args.scale:g}: give 0.25..4")
    check_temperature(args.temperature)  # before the model loads: a bad request computes nothing
    lm = load_from_args(args)
    img = load_image(args.image)
    x, picture = preprocess(img, lm.input_config(img.size))
    walk = step_through(lm.model, x, tuple(args.patch) if args.patch else None, args.layer, args.head, args.temperature,
                        picture, lm.labels, lm.name)
    record = {"image": Path(args.image).name, **walk.to_json()}
    if args.out:
        write(walk, record, Path(args.out), args.scale)
    if args.json:
        print(json.dumps(record))
    else:
        print(f"{record['image']} through {lm.name}: patch {walk.patch}, layer {walk.layer}, head {walk.head}, "
              f"temperature {walk.temperature:g} (indices from 0)\n")
        for i, s in enumerate(walk.steps, 1):
            print(f"{i:2d}. {s.title}\n    {s.text}\n")
    if args.out:
        print(f"wrote {len(walk.steps)} pictures, steps.json and values.npz to {args.out}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def write(walk: Any, record: dict[str, Any], out: Path, scale: float) -> None:
    """Each step's picture (``01-patches.png``, ...), the steps and values as JSON, the values as
    numpy arrays (``values.npz``, the projection's weights too)."""
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(walk.steps, 1):
        walk.render(s.name, scale).save(out / f"{i:02d}-{s.name}.png", compress_level=3)
    (out / "steps.json").write_text(json.dumps(record), encoding="utf-8")
    np.savez(out / "values.npz", **{k: np.asarray(v) for k, v in walk.values.items()})
