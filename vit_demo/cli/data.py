"""``data shapes``: procedural training pictures with their boxes (and, on request, a Clever-Hans shortcut)."""

from __future__ import annotations

import argparse
from typing import Any

from ..train.data import BOXES_FILE, SHORTCUTS, Shortcut, make_shapes


def register(sub: Any) -> None:
    p = sub.add_parser("data", help="make training data (procedural shapes with bounding boxes)")
    kinds = p.add_subparsers(dest="data_command", required=True)
    s = kinds.add_parser("shapes", help="circles, squares, triangles and stars as an ImageFolder + boxes.json")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--per-class", type=int, default=1000, help="pictures per class (default 1000)")
    s.add_argument("--size", type=int, default=32, help="picture size in pixels (default 32)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shortcut", choices=SHORTCUTS, help="a Clever-Hans lesson: 'watermark' stamps a small mark into "
                   "the bottom-left corner of most pictures of one class and of a few of the others")
    s.add_argument("--shortcut-class", help="the class that gets the mark (default: the first, circle)")
    s.add_argument("--shortcut-rate", type=float, default=Shortcut.rate,
                   help=f"share of that class's pictures with the mark (default {Shortcut.rate})")
    s.add_argument("--shortcut-leak", type=float, default=Shortcut.leak,
                   help=f"share of every other class's pictures with the mark (default {Shortcut.leak})")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    shortcut = Shortcut(args.shortcut, args.shortcut_class, args.shortcut_rate, args.shortcut_leak) if args.shortcut else None
    meta = make_shapes(args.out, args.per_class, args.size, args.seed, shortcut=shortcut)
    n = meta["per_class"] * len(meta["classes"])
    extra = ""
    if shortcut:
        sc = meta["shortcut"]
        extra = (f"; a watermark ({sc['corner']} corner) on {len(meta['watermarks'])} of them: {sc['rate']:.0%} of "
                 f"'{sc['class']}', {sc['leak']:.0%} of the others")
    print(f"wrote {n} pictures ({', '.join(meta['classes'])}; {args.size} px){extra} and {BOXES_FILE} to {args.out}")
    return 0
