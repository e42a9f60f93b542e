"""``predict``: top-k classes for image files or folders."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..images import find_images
from ..labels import check_k
from ..predict import format_predictions, predict_images
from .common import UserError, add_model_args, load_from_args, say_precision


def register(sub: Any) -> None:
    p = sub.add_parser("predict", help="top-k ImageNet predictions for images or folders")
    p.add_argument("images", nargs="+", help="image files or folders")
    add_model_args(p, precision="auto")
    p.add_argument("--topk", type=int, default=5, help="classes listed per image: 1 or more (default 5)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths = find_images(args.images)
    if not paths:
        raise UserError("no images found in " + ", ".join(args.images))
    lm = load_from_args(args)
    say_precision(lm)
    k = check_k(args.topk, lm.model.cfg.num_classes, "--topk") if lm.model.cfg.num_classes else args.topk
    results = predict_images(lm, paths, k=k, batch_size=args.batch_size)
    print(json.dumps(results, indent=2) if args.json else format_predictions(results))
    return 1 if any("error" in r for r in results) else 0
