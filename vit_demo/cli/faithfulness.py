"""``faithfulness``: deletion / insertion scores of the explanation methods over a folder."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..evaluate.curves import RANDOM_SEEDS
from ..evaluate.faithfulness import TARGETS, evaluate, format_results
from .common import UserError, add_images_and_methods_args, images_and_methods, load_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("faithfulness", help="deletion/insertion scores of the explanation methods")
    add_images_and_methods_args(p, "folder (or image file) of <wnid>_<name>.JPEG photos")
    p.add_argument("--seeds", type=int, default=len(RANDOM_SEEDS),
                   help=f"random patch orders averaged into the 'random' baseline (default {len(RANDOM_SEEDS)}; 0: none)")
    p.add_argument("--target", default="predicted", choices=list(TARGETS),
                   help="class whose probability is tracked: top-1 on the clean image, or the file name's class")
    p.add_argument("--batch-size", type=int, default=8, help="images per batch")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths, methods = images_and_methods(args)
    if args.seeds < 0:
        raise UserError(f"--seeds must be 0 or more, got {args.seeds}")
    lm = load_from_args(args)
    r = evaluate(lm, paths, methods, args.target, args.batch_size, progress=True, random_seeds=range(args.seeds))
    print(json.dumps(r, indent=2) if args.json else format_results(r))
    return 0
