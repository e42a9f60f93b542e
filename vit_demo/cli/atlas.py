"""``atlas``: what each head and each learned concept of the model looks for, over a folder; an
HTML report that leads with its finding, and the JSON (:mod:`vit_demo.evaluate.atlas`)."""

from __future__ import annotations

import argparse
from typing import Any

from ..evaluate.atlas import DEFAULT_CONCEPTS, atlas
from ..present.atlas_report import write_report
from .common import add_folder_job_args, end_folder_job, start_folder_job


def register(sub: Any) -> None:
    p = sub.add_parser("atlas", help="what each head and each concept looks for, over a folder: an HTML report "
                       "(shards its pictures under torchrun)")
    add_folder_job_args(p, "folder for report.html, atlas.json and the crops")
    p.add_argument("--layer", type=int,
                   help="the block whose output tokens make the concepts, from 1; 0: the embeddings (default: the last but one)")
    p.add_argument("--concepts", type=int, default=DEFAULT_CONCEPTS, help=f"how many concepts (default {DEFAULT_CONCEPTS})")
    p.add_argument("--seed", type=int, default=0, help="for the NMF and the random concepts of the faithfulness check")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    lm, progress = start_folder_job(args)
    result = atlas(lm, args.images, args.layer, args.concepts, args.labels, args.limit, args.batch_size,
                   progress=progress, seed=args.seed)
    if result is None:  # a torchrun process other than 0: process 0 writes the report
        return 0
    write_report(result, args.out, lm.data_config, lm.model.cfg.patch_size)
    return end_folder_job(args, result, lambda: summary_lines(result))


def summary_lines(result: dict[str, Any]) -> str:
    """What the command says when it is done (without --json)."""
    f = result["findings"]
    lines = [f"atlas of {result['model']} over {result['images']} pictures in {result['seconds']:.1f} s: "
             f"{len(result['heads'])} heads, {len(result['concepts'])} concepts at layer {result['concept_layer']} "
             f"(NMF error {result['reconstruction_error']:.3f})"]
    for k in f["suspicious_concepts"]:
        lines.append(f"possible Clever-Hans feature: concept {k['id']} (top for {', '.join(k['top_for'])}): "
                     f"{k['one_place_share']:.0%} of its top patches at one place "
                     f"(row {k['place']['row']}, column {k['place']['col']}), {k['border_share']:.0%} on the border")
    lines.append("most important heads: " + "; ".join(f"layer {h['layer']} head {h['head']} ({h['importance']:+.3f})"
                                                     for h in f["top_heads"][:3]))
    fa = result["faithfulness"]
    lines.append(f"faithfulness: top concepts removed {fa['top_fall']:.3f}, random {fa['random_fall']:.3f} "
                 f"({'passes' if fa['passed'] else 'fails'})")
    lines += [f"skipped: {e}" for e in result["errors"]]
    lines.append(f"report: {result['report']} (open it in a browser; it works offline)")
    return "\n".join(lines)
