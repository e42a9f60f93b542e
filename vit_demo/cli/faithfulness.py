"""``faithfulness``: deletion / insertion scores of the explanation methods over a folder."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import methods as registry
from ..evaluate.curves import RANDOM_SEEDS
from ..evaluate.faithfulness import TARGETS, evaluate, format_results
from ..evaluate.srg_saco import KINDS, evaluate_folder, format_measures
from .common import UserError, add_images_and_methods_args, images_and_methods, load_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("faithfulness", help="deletion/insertion scores of the explanation methods")
    add_images_and_methods_args(p, "folder (or image file) of <wnid>_<name>.JPEG photos")
    p.add_argument("--seeds", type=int, default=len(RANDOM_SEEDS),
                   help=f"random patch orders averaged into the 'random' baseline (default {len(RANDOM_SEEDS)}; 0: none)")
    p.add_argument("--target", default="predicted", choices=list(TARGETS),
                   help="class whose probability is tracked: top-1 on the clean image, or the file name's class")
    p.add_argument("--batch-size", type=int, default=8, help="images per batch")
    p.add_argument("--srg-saco", action="store_true",
                   help="SRG and SaCo too (with deletion, insertion and seconds per image), for each --replacement")
    p.add_argument("--replacement", default=",".join(KINDS),
                   help=f"with --srg-saco: what a removed patch shows, comma-separated of {', '.join(KINDS)}")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths, methods = images_and_methods(args)
    if args.seeds < 0:
        raise UserError(f"--seeds must be 0 or more, got {args.seeds}")
    lm = load_from_args(args)
    if args.srg_saco:
        kinds = [k for k in args.replacement.split(",") if k]
        if not kinds or set(kinds) - set(KINDS):
            raise UserError(f"--replacement takes {', '.join(KINDS)}, not {args.replacement!r}")
        r = evaluate_folder(lm, paths, {m: registry.get(m) for m in methods}, args.target, kinds, args.batch_size)
        r.pop("per_image")
        print(json.dumps(r, indent=2) if args.json else format_measures(r))
        return 0
    r = evaluate(lm, paths, methods, args.target, args.batch_size, progress=True, random_seeds=range(args.seeds))
    print(json.dumps(r, indent=2) if args.json else format_results(r))
    return 0
