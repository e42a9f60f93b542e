"""``survey``: a whole folder through the model and one explanation method; the maps clustered per
predicted class (SpRAy); an HTML report, and the JSON (:mod:`vit_demo.evaluate.survey`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .. import methods
from ..checkpoints.load import load_model
from ..evaluate.survey import DEFAULT_METHOD, LABEL_MODES, survey
from ..present.survey_report import Thumbnails, write_report
from .common import UserError, add_model_args, device_for_rank, say_precision


def register(sub: Any) -> None:
    p = sub.add_parser("survey", help="a whole folder at once: every picture's map, clusters of maps, an HTML report")
    p.add_argument("--images", required=True, help="a folder: an ImageFolder (DIR/<class>/<image>) or ImageNet-named files")
    add_model_args(p, precision="auto")
    p.add_argument("--method", default=DEFAULT_METHOD,
                   help=f"the explanation method (default {DEFAULT_METHOD}); one of {', '.join(methods.names())}")
    p.add_argument("--labels", default="auto", choices=LABEL_MODES,
                   help="where the true classes come from: the sub-folders, the ImageNet file names, or auto (default)")
    p.add_argument("--limit", type=int, help="use N pictures spread evenly through the sorted folder")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", required=True, help="folder for report.html, survey.json and the thumbnails")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.method not in methods.names():
        raise UserError(f"unknown method {args.method!r}; known: {', '.join(methods.names())}")
    if args.limit is not None and args.limit < 1:
        raise UserError("--limit must be at least 1")
    lm = load_model(args.model, args.weights, device=device_for_rank(args.device), precision=args.precision)
    say_precision(lm)
    out = Path(args.out)
    result = survey(lm, args.images, args.method, args.labels, args.limit, args.batch_size, each=Thumbnails(out),
                    progress=not (args.no_progress or args.json))
    if result is None:  # a torchrun process other than the first: process 0 writes and prints
        return 0
    page = write_report(result, out)
    if args.json:
        print(json.dumps(result))
    else:
        print(summary_lines(result, page))
    return 0


def summary_lines(r: dict[str, Any], page: Path) -> str:
    """What the command says when it is done (without --json)."""
    acc = "no labels" if r["accuracy"] is None else f"accuracy {r['accuracy']:.3f} on {r['labelled']} labelled"
    where = f" on {r['processes']} processes" if r["processes"] > 1 else ""
    lines = [f"surveyed {r['count']} pictures with {r['model']} and {r['method']} ({acc}) in {r['seconds']:.1f} s{where}",
             f"{len(r['clusters'])} clusters of maps over {len({c['class'] for c in r['clusters']})} predicted classes; "
             f"classes with more than one: {classes_with_several(r)}"]
    w = r.get("watermark")
    if w:
        lines.append(f"watermark: {w['watermarked']} marked pictures of '{w['class']}', {w['share_in_cluster']:.0%} in "
                     f"cluster {w['cluster']}, whose prototype has {w['cluster_mass_on_watermark']:.0%} of its mass on the mark")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines += [f"skipped: {e}" for e in r["errors"]]
    lines.append(f"report: {page} (open it in a browser; it works offline)")
    return "\n".join(lines)


def classes_with_several(r: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for c in r["clusters"]:
        counts[c["class"]] = counts.get(c["class"], 0) + 1
    several = [f"{k} ({n})" for k, n in counts.items() if n > 1]
    return ", ".join(several[:8]) + (", ..." if len(several) > 8 else "") if several else "none"
