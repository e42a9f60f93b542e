"""``sanity``: the model-randomisation check of the explanation methods (Adebayo et al. 2018)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..evaluate.faithfulness import TARGETS
from ..evaluate.sanity import evaluate, format_results
from ..viz.charts import sanity_figure
from ..viz.export import save_figure
from .common import UserError, add_images_and_methods_args, add_output, images_and_methods, load_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("sanity", help="model-randomisation sanity check of the explanation methods")
    add_images_and_methods_args(p, "folder (or image file) of photos")
    p.add_argument("--target", default="predicted", choices=list(TARGETS),
                   help="class explained: top-1 of the trained model, or the file name's class")
    p.add_argument("--batch-size", type=int, default=4, help="images per batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the re-initialisation")
    add_output(p, "--out", "folder", help="folder for the figure (sanity_randomisation.png) and the JSON")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths, methods = images_and_methods(args)
    lm = load_from_args(args)
    if lm.model.cfg.num_classes == 0:
        raise UserError(f"{lm.name} is headless (no classifier): the class-specific maps need class scores")
    r = evaluate(lm, paths, methods, args.target, args.batch_size, args.seed, progress=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        r["figure"] = str(save_figure(sanity_figure(r), out / "sanity_randomisation.png", width_px=2000))
        (out / "sanity_randomisation.json").write_text(json.dumps(r, indent=1) + "\n")
    print(json.dumps(r, indent=2) if args.json else format_results(r))
    return 0
