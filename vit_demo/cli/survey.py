"""``survey``: a whole folder through the model and one explanation method; the maps clustered per
predicted class (SpRAy); an HTML report, and the JSON (:mod:`vit_demo.evaluate.survey`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import methods
from ..evaluate.grouping import POOLED_NAMES
from ..evaluate.survey import DEFAULT_METHOD, survey
from ..present.survey_report import Thumbnails, accuracy_words, write_report
from .common import UserError, add_folder_job_args, end_folder_job, start_folder_job


def register(sub: Any) -> None:
    p = sub.add_parser("survey", help="a whole folder at once: every picture's map, clusters of maps, an HTML report")
    add_folder_job_args(p, "folder for report.html, survey.json and the thumbnails")
    p.add_argument("--method", default=DEFAULT_METHOD,
                   help=f"the explanation method (default {DEFAULT_METHOD}); one of {', '.join(methods.names())}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        args.method = methods.find(args.method)  # any case; an unknown name with the names it may mean
    except ValueError as e:
        raise UserError(str(e)) from None
    lm, progress = start_folder_job(args)
    out = Path(args.out)
    result = survey(lm, args.images, args.method, args.labels, args.limit, args.batch_size, each=Thumbnails(out),
                    progress=progress)
    if result is None:  # a torchrun process other than the first: process 0 writes and prints
        return 0
    page = write_report(result, out)
    return end_folder_job(args, result, lambda: summary_lines(result, page))


def summary_lines(result: dict[str, Any], page: Path) -> str:
    """What the command says when it is done (without --json)."""
    by_folder = result.get("grouped_by") == "folder"
    acc = accuracy_words(result)
    where = f" on {result['processes']} processes" if result["processes"] > 1 else ""
    groups = "folders" if by_folder else "predicted classes"
    lines = [f"surveyed {result['count']} pictures with {result['model']} and {result['method']} ({acc}) "
             f"in {result['seconds']:.1f} s{where}",
             f"{len(result['clusters'])} clusters of maps over {len({c['class'] for c in result['clusters']})} "
             f"{groups}; {groups} with more than one: {classes_with_several(result)}"]
    w = result.get("watermark")
    if w:
        lines.append(f"watermark: {w['watermarked']} marked pictures of '{w['class']}', {w['share_in_cluster']:.0%} in "
                     f"cluster {w['cluster']}, whose prototype has {w['cluster_mass_on_watermark']:.0%} of its mass on the mark")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines += [f"skipped: {e}" for e in result["errors"]]
    lines.append(f"report: {page} (open it in a browser; it works offline)")
    return "\n".join(lines)


def classes_with_several(result: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for c in result["clusters"]:
        if c["class"] not in POOLED_NAMES:
            counts[c["class"]] = counts.get(c["class"], 0) + 1
    several = [f"{k} ({n})" for k, n in counts.items() if n > 1]
    return ", ".join(several[:8]) + (", ..." if len(several) > 8 else "") if several else "none"
