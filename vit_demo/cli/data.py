"""``data shapes``: procedural training pictures with their boxes (and, on request, a Clever-Hans shortcut);
``data digits``: scikit-learn's handwritten digits as an ImageFolder."""

from __future__ import annotations

import argparse
from typing import Any

from ..data.annotations import BOXES_FILE
from ..train.builtin import make_digits
from ..train.data import CORNERS, MARKS, MORE_SHAPES, SHAPES, SHORTCUTS, ShapeStyle, Shortcut, make_shapes
from .common import add_output


def register(sub: Any) -> None:
    p = sub.add_parser("data", help="make training data (procedural shapes with bounding boxes, or the handwritten digits)")
    kinds = p.add_subparsers(dest="data_command", required=True)
    s = kinds.add_parser("shapes", help="circles, squares, triangles, stars (and more) as an ImageFolder + boxes.json")
    add_output(s, "--out", "folder", required=True, help="output folder (made when missing)")
    s.add_argument("--per-class", type=int, default=1000, help="pictures per class (default 1000)")
    s.add_argument("--size", type=int, default=32, help="picture size in pixels (default 32)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--classes", default=",".join(SHAPES),
                   help=f"comma-separated shapes from {', '.join(SHAPES + MORE_SHAPES)}, a count (the first N), "
                        f"or 'all' (default: the first four)")
    s.add_argument("--polarity", choices=("random", "bright"), default="random",
                   help="random (default): shapes lighter or darker than the background; bright: always lighter (easy)")
    s.add_argument("--distractors", type=int, default=3, help="up to this many marks of no class per picture (default 3)")
    s.add_argument("--texture", choices=("random", "none"), default="random",
                   help="random (default): textured backgrounds and some textured shapes; none: flat colours")
    s.add_argument("--easy", action="store_true", help="the original easy set: --polarity bright --distractors 0 --texture none")
    s.add_argument("--shortcut", choices=SHORTCUTS, help="a Clever-Hans lesson: 'watermark' stamps a small mark into "
                   "a corner of most pictures of one class and of a few of the others")
    s.add_argument("--shortcut-class", help="the class that gets the mark (default: the first, circle)")
    s.add_argument("--shortcut-rate", type=float, default=Shortcut.rate,
                   help=f"share of that class's pictures with the mark (default {Shortcut.rate})")
    s.add_argument("--shortcut-leak", type=float, default=Shortcut.leak,
                   help=f"share of every other class's pictures with the mark (default {Shortcut.leak})")
    s.add_argument("--shortcut-corner", choices=CORNERS, default=Shortcut.corner,
                   help=f"where the mark goes (default {Shortcut.corner})")
    s.add_argument("--shortcut-mark", choices=MARKS, default=Shortcut.mark,
                   help=f"what it looks like: a 2x2 black-and-white checker or a plain white square (default {Shortcut.mark})")
    s.set_defaults(func=run)
    d = kinds.add_parser("digits", help="scikit-learn's 1,797 handwritten digits (8x8 scans) as an ImageFolder")
    add_output(d, "--out", "folder", required=True, help="output folder (made when missing)")
    d.set_defaults(func=run_digits)


def run_digits(args: argparse.Namespace) -> int:
    make_digits(args.out)
    print(f"wrote 1797 digits (8x8 px, 10 classes: digit0 .. digit9) to {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    style = (ShapeStyle("bright", 0, False) if args.easy
             else ShapeStyle(args.polarity, args.distractors, args.texture == "random"))
    shortcut = Shortcut(args.shortcut, args.shortcut_class, args.shortcut_rate, args.shortcut_leak, args.shortcut_corner,
                        args.shortcut_mark) if args.shortcut else None
    meta = make_shapes(args.out, args.per_class, args.size, args.seed, classes=args.classes, style=style,
                       shortcut=shortcut)
    n = meta["per_class"] * len(meta["classes"])
    how = f"polarity {style.polarity}, up to {style.distractors} distractors, {'textured' if style.texture else 'flat'}"
    if shortcut:
        sc = meta["shortcut"]
        how += (f"; a watermark ({sc['corner']} corner) on {len(meta['watermarks'])} of them: {sc['rate']:.0%} of "
                f"'{sc['class']}', {sc['leak']:.0%} of the others")
    print(f"wrote {n} pictures ({', '.join(meta['classes'])}; {args.size} px; {how}) and {BOXES_FILE} to {args.out}")
    return 0
