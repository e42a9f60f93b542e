"""``deck``: a ready-made slide deck (PowerPoint, PDF, or both from one run) about one or more images,
with a progress bar on stderr ("slide 3 of 9")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..evaluate.curves import RANDOM_SEEDS
from ..images import find_images, load_image
from ..present.deck import build_slides, display_name
from ..present.slides import FORMATS, write
from ..progress import part, reporting
from .common import UserError, add_model_args, add_output, load_from_args, parse_class


def register(sub: Any) -> None:
    p = sub.add_parser("deck", help="a ready-made slide deck (PowerPoint or PDF) about one or more images",
                              description="Write a 16:9 slide deck: one section per image, then the check against "
                                          "timm and the model. Speaker notes on every slide.")
    p.add_argument("images", nargs="+", help="image files or folders")
    add_model_args(p)
    p.add_argument("--class", dest="target", help="class to explain: index or label (default each image's top-1)")
    add_output(p, "--out", "file", required=True, help="output file, e.g. talk.pptx (its folder is made when missing)")
    p.add_argument("--format", choices=(*FORMATS, "both"),
                   help="pptx (default), pdf, or both (talk.pptx and talk.pdf from one run); default from the --out suffix")
    p.add_argument("--width", type=int, default=2400, help="pixel width of the rendered figures (default 2400)")
    p.add_argument("--cmap", default="inferno", help="any matplotlib colormap (default inferno)")
    p.add_argument("--shared-scale", action="store_true",
                   help="several images: the comparison slide's maps on ONE colour scale (default: each its own, "
                        "so one hot spot does not darken the others)")
    p.add_argument("--atlas", metavar="JSON",
                   help="the atlas.json of this model (from the atlas command): adds a slide of its most important heads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--random-orders", type=int, default=len(RANDOM_SEEDS),
                   help=f"random patch orders averaged for the faithfulness baseline (default {len(RANDOM_SEEDS)})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths = find_images(args.images)
    if not paths:
        raise UserError("no images found in " + ", ".join(args.images))
    if args.random_orders < 1:
        raise UserError("--random-orders: the random baseline needs at least 1 order")
    out = Path(args.out)
    fmt = args.format or (out.suffix.lstrip(".").lower() if out.suffix.lower() in (".pptx", ".pdf") else "pptx")
    outs = [out.with_suffix(f".{f}") for f in (FORMATS if fmt == "both" else (fmt,))]
    lm = load_from_args(args)
    target = None
    if args.target is not None:
        if lm.model.cfg.num_classes == 0:
            raise UserError(f"--class: {lm.name} is headless (no classifier)")
        target = parse_class(args.target, lm.labels)
    if lm.model.cfg.num_classes == 0:
        raise UserError(f"{lm.name} is headless: a deck needs a classifier (predictions, relevance)")
    atlas = read_atlas(args.atlas, lm) if args.atlas else None
    images = [load_image(p) for p in paths]
    names = [display_name(p.stem) for p in paths]
    with tqdm(total=1000, desc="deck", unit="", bar_format="{desc}: {percentage:3.0f}% |{bar}| {postfix}",
              disable=args.no_progress, leave=False) as bar, reporting(progress_bar(bar)):
        with part(0.0, 0.9, ""):
            slides = build_slides(lm, images, names, target, args.weights, args.width, args.cmap,
                                  tuple(range(args.random_orders)), shared_scale=args.shared_scale, atlas=atlas)
        for i, path in enumerate(outs):
            with part(0.9 + 0.1 * i / len(outs), 0.9 + 0.1 * (i + 1) / len(outs), f"writing {path.name}"):
                write(slides, path, path.suffix.lstrip("."))
    for path in outs:
        print(f"wrote {path} ({len(slides)} slides)")
    check = next((s.meta for s in slides if "verdict" in s.meta), None)
    if check is not None:  # what the timm slide says, and in which precision it compared
        print(f"checked against timm: {check['verdict']}")
    return 0


def read_atlas(path: str, lm: Any) -> dict[str, Any]:
    """An atlas.json (the atlas command's ``--out``), checked to be of a model with ``lm``'s heads."""
    try:
        atlas = json.loads(Path(path).read_text(encoding="utf-8"))
        heads = {(h["layer"], h["head"]) for h in atlas["heads"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--atlas {path}: not an atlas.json of the atlas command ({e})") from None
    depth, per = lm.model.cfg.depth, lm.model.blocks[0].attn.num_heads
    if heads != {(layer, head) for layer in range(1, depth + 1) for head in range(1, per + 1)}:
        raise UserError(f"--atlas {path}: its heads are not those of {lm.name} ({depth} layers x {per} heads)")
    return atlas


def progress_bar(bar: tqdm):
    """A :func:`vit_demo.progress.reporting` callback that moves a tqdm bar and names the step."""
    def show(share: float, text: str) -> None:
        bar.n = round(1000 * share)
        bar.set_postfix_str(text, refresh=False)
        bar.refresh()

    return show
