"""``data shapes``: procedural training pictures with their boxes."""

from __future__ import annotations

import argparse
from typing import Any

from ..train.data import BOXES_FILE, make_shapes


def register(sub: Any) -> None:
    p = sub.add_parser("data", help="make training data (procedural shapes with bounding boxes)")
    kinds = p.add_subparsers(dest="data_command", required=True)
    s = kinds.add_parser("shapes", help="circles, squares, triangles and stars as an ImageFolder + boxes.json")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--per-class", type=int, default=1000, help="pictures per class (default 1000)")
    s.add_argument("--size", type=int, default=32, help="picture size in pixels (default 32)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    meta = make_shapes(args.out, args.per_class, args.size, args.seed)
    n = meta["per_class"] * len(meta["classes"])
    print(f"wrote {n} pictures ({', '.join(meta['classes'])}; {args.size} px) and {BOXES_FILE} to {args.out}")
    return 0
