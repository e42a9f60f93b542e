"""``pointing``: do the explanation maps point at the shapes (their boxes)?"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..evaluate.pointing import evaluate, format_results
from .common import add_model_args, load_from_args, parse_methods


def register(sub: Any) -> None:
    p = sub.add_parser("pointing", help="pointing game: do the explanation maps point at the shapes?")
    p.add_argument("--data", required=True, help="a shapes folder with boxes.json (python -m vit_demo data shapes)")
    add_model_args(p)
    p.add_argument("--methods", default="all", help="comma-separated registered method names, or 'all' (the default)")
    p.add_argument("--target", default="label", choices=["label", "predicted"],
                   help="class the class-specific maps explain: the folder's (true) class or the predicted one")
    p.add_argument("--limit", type=int, help="use N pictures spread through the set")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    methods = parse_methods(args.methods)
    lm = load_from_args(args)
    r = evaluate(lm, args.data, methods, args.target, args.limit, args.batch_size, progress=not args.json)
    print(json.dumps(r, indent=2) if args.json else format_results(r))
    return 0
