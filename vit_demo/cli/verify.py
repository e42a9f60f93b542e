"""``verify``: the scratch model against timm's (or transformers') on the same weights."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..checkpoints.verify import format_report, verify
from .common import UserError, add_model_args


def register(sub: Any) -> None:
    p = sub.add_parser("verify", help="compare the scratch model with timm's (or transformers') on the same weights")
    add_model_args(p, random_init=True, precision="fp32")
    p.add_argument("--reference", metavar="DIR",
                   help="a transformers model folder: compare with transformers' own model (needs transformers)")
    p.add_argument("--images", help="folder or image file (default: 8 random-noise inputs)")
    p.add_argument("--input-size", help="HxW model input, e.g. 256x384 (timm with dynamic_img_size)")
    p.add_argument("--tol", type=float, default=1e-4, help="max abs logit difference allowed")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.weights and args.random_init:
        raise UserError("--weights and --random-init exclude each other")
    size = None
    if args.input_size:
        h, _, w = args.input_size.lower().partition("x")
        size = (int(h), int(w or h))
    images = [args.images] if args.images else []
    if args.reference and args.random_init:
        raise UserError("--reference and --random-init exclude each other")
    r = verify(args.model, args.weights, args.random_init, images, args.device, args.tol, size, args.batch_size,
               reference=args.reference, precision=args.precision)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return 0 if r["passed"] else 1
