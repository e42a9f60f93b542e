"""``atlas``: what each head and each learned concept of the model looks for, over a folder; an
HTML report that leads with its finding, and the JSON (:mod:`vit_demo.evaluate.atlas`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..checkpoints.load import load_model
from ..evaluate.atlas import DEFAULT_CONCEPTS, atlas
from ..evaluate.survey import LABEL_MODES
from ..present.atlas_report import write_report
from .common import UserError, add_model_args, device_for_rank, say_precision


def register(sub: Any) -> None:
    p = sub.add_parser("atlas", help="what each head and each concept looks for, over a folder: an HTML report "
                       "(shards its pictures under torchrun)")
    p.add_argument("--images", required=True, help="a folder: an ImageFolder (DIR/<class>/<image>) or ImageNet-named files")
    add_model_args(p, precision="auto")
    p.add_argument("--layer", type=int,
                   help="the block whose output tokens make the concepts, from 1; 0: the embeddings (default: the last but one)")
    p.add_argument("--concepts", type=int, default=DEFAULT_CONCEPTS, help=f"how many concepts (default {DEFAULT_CONCEPTS})")
    p.add_argument("--labels", default="auto", choices=LABEL_MODES,
                   help="where the true classes come from: the sub-folders, the ImageNet file names, or auto (default)")
    p.add_argument("--limit", type=int, help="use N pictures spread evenly through the sorted folder")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="for the NMF and the random concepts of the faithfulness check")
    p.add_argument("--out", required=True, help="folder for report.html, atlas.json and the crops")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise UserError("--limit must be at least 1")
    lm = load_model(args.model, args.weights, device=device_for_rank(args.device), precision=args.precision)
    say_precision(lm)
    result = atlas(lm, args.images, args.layer, args.concepts, args.labels, args.limit, args.batch_size,
                   progress=not (args.no_progress or args.json), seed=args.seed)
    if result is None:  # a torchrun process other than 0: process 0 writes the report
        return 0
    write_report(result, args.out, lm.data_config, lm.model.cfg.patch_size)
    if args.json:
        print(json.dumps(result))
    else:
        print(summary_lines(result))
    return 0


def summary_lines(r: dict[str, Any]) -> str:
    """What the command says when it is done (without --json)."""
    f = r["findings"]
    lines = [f"atlas of {r['model']} over {r['images']} pictures in {r['seconds']:.1f} s: {len(r['heads'])} heads, "
             f"{len(r['concepts'])} concepts at layer {r['concept_layer']} (NMF error {r['reconstruction_error']:.3f})"]
    for k in f["suspicious_concepts"]:
        lines.append(f"possible Clever-Hans feature: concept {k['id']} (top for {', '.join(k['top_for'])}): "
                     f"{k['one_place_share']:.0%} of its top patches at one place "
                     f"(row {k['place']['row']}, column {k['place']['col']}), {k['border_share']:.0%} on the border")
    lines.append("most important heads: " + "; ".join(f"layer {h['layer']} head {h['head']} ({h['importance']:+.3f})"
                                                     for h in f["top_heads"][:3]))
    fa = r["faithfulness"]
    lines.append(f"faithfulness: top concepts removed {fa['top_fall']:.3f}, random {fa['random_fall']:.3f} "
                 f"({'passes' if fa['passed'] else 'fails'})")
    lines += [f"skipped: {e}" for e in r["errors"]]
    lines.append(f"report: {r['report']} (open it in a browser; it works offline)")
    return "\n".join(lines)
