"""Merge the JSON of several `python -m vit_demo faithfulness --json` runs over disjoint photo
folders into one result, as if one run had seen every photo.

Each run's curves are means over its photos, so the merge weights them by the run's photo
count; the AUCs are recomputed from the merged curves (the mean of a curve, as in
faithfulness.evaluate). The "random" baseline differs slightly from one unsplit run, because
each run starts the random patch orders from the same seeds.

    python benchmarks/merge_faithfulness.py RUN.json [RUN.json ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One faithfulness result from several over disjoint photos (same methods, target, points)."""
    first = runs[0]
    for r in runs[1:]:
        for key in ("target", "points"):
            if r[key] != first[key]:
                raise SystemExit(f"runs differ in {key}: {first[key]!r} vs {r[key]!r}")
        if list(r["methods"]) != list(first["methods"]):
            raise SystemExit(f"runs differ in methods: {list(first['methods'])} vs {list(r['methods'])}")
    total = sum(r["images"] for r in runs)
    methods = {}
    for name in first["methods"]:
        curves = {}
        for kind in ("deletion", "insertion"):
            per_run = [(r["images"], r["methods"][name][f"{kind}_curve"]) for r in runs]
            curves[kind] = [sum(n * c[j] for n, c in per_run) / total for j in range(first["points"])]
        methods[name] = {"deletion_auc": sum(curves["deletion"]) / first["points"],
                         "insertion_auc": sum(curves["insertion"]) / first["points"],
                         "deletion_curve": curves["deletion"], "insertion_curve": curves["insertion"]}
    return {"images": total, "target": first["target"], "points": first["points"], "methods": methods,
            "errors": [e for r in runs for e in r["errors"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files written by faithfulness --json")
    ap.add_argument("--json", action="store_true", help="print the merged JSON instead of the table")
    args = ap.parse_args()
    merged = merge([json.loads(p.read_text()) for p in args.runs])
    if args.json:
        print(json.dumps(merged, indent=2))
    else:
        from vit_demo.evaluate.faithfulness import format_results

        print(format_results(merged))


if __name__ == "__main__":
    main()
