"""How long the slide deck of one image takes, PowerPoint AND PDF from one build (what the app's
button makes), this checkout against another one in the same run.

    python benchmarks/bench_deck.py [--baseline DIR] [--repeats 3] [--threads 2] [--image FILE] [--json]

DIR: another checkout of the project, e.g. the version before (``git archive BASE | tar -x -C DIR``).
Each run is a fresh process (``PYTHONPATH`` = the checkout), so nothing is shared or cached
between them: load the model, build the slides of one photo (scikit-image's cat unless
``--image``) with the deck's defaults (figures 2400 px, 3 random orders), write talk.pptx, write
talk.pdf. The two checkouts alternate run by run, so that both see the same machine load.
Reported per checkout and phase (build, PowerPoint, PDF, total; model loading excluded): the
median wall time, and the median CPU time of the process (all threads). On a machine shared
with other jobs the wall times stretch with the load; the ratios between the two checkouts,
measured side by side, are the reliable part, and ``--threads 1`` makes the CPU time a stable
measure of the work (two torch threads spin-wait when the cores are busy elsewhere).

Target (issue 23): the deck in <= 15 s for one image on 2 idle cores, PowerPoint and PDF.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("build", "pptx", "pdf", "total")

ONE_RUN = r"""
import json, sys, time, torch
torch.set_num_threads({threads})
from PIL import Image
from vit_demo.checkpoints.load import load_model
from vit_demo.present import deck, slides as io
lm = load_model("deit_tiny_patch16_224", {weights!r}, device="cpu")
img = Image.open({image!r}).convert("RGB") if {image!r} else Image.fromarray(__import__("skimage.data").data.chelsea())
def clock():
    return time.perf_counter(), time.process_time()
w0, c0 = clock()
slides = deck.build_slides(lm, [img], ["cat"], width_px=2400)
w1, c1 = clock()
io.write_pptx(slides, {out_dir!r} + "/talk.pptx")
w2, c2 = clock()
io.write_pdf(slides, {out_dir!r} + "/talk.pdf")
w3, c3 = clock()
out = {{"slides": len(slides), "wall": {{"build": w1 - w0, "pptx": w2 - w1, "pdf": w3 - w2, "total": w3 - w0}},
       "cpu": {{"build": c1 - c0, "pptx": c2 - c1, "pdf": c3 - c2, "total": c3 - c0}}}}
print(json.dumps(out))
"""


def one_run(checkout: Path, threads: int, image: str, weights: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_deck_") as out_dir:
        code = ONE_RUN.format(threads=threads, weights=str(weights), image=image, out_dir=out_dir)
        env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=checkout, env=env)
        if r.returncode != 0:
            raise SystemExit(f"the deck failed in {checkout}:\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    return {"slides": runs[0]["slides"], "runs": len(runs),
            **{f"{kind}_s": {p: round(statistics.median(r[kind][p] for r in runs), 2) for p in PHASES}
               for kind in ("wall", "cpu")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with (e.g. the version before)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in each run (default 2)")
    ap.add_argument("--image", default="", help="a photo (default: scikit-image's cat)")
    ap.add_argument("--weights", type=Path, default=ROOT / "weights" / "deit_tiny_patch16_224.safetensors")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    runs: dict[str, list[dict]] = {k: [] for k in checkouts}
    load = os.getloadavg()
    for i in range(args.repeats):
        for name, path in (checkouts.items() if i % 2 == 0 else reversed(checkouts.items())):
            runs[name].append(one_run(path, args.threads, args.image, args.weights))
            print(f"run {i + 1} {name}: {runs[name][-1]['wall']['total']:.1f} s", file=sys.stderr, flush=True)
    report = {"threads": args.threads, "cpus": os.cpu_count(), "load_before": [round(v, 1) for v in load],
              "load_after": [round(v, 1) for v in os.getloadavg()], **{k: summary(v) for k, v in runs.items()}}
    if args.baseline:
        report["ratio (this / baseline)"] = {
            kind: {p: round(report["this"][f"{kind}_s"][p] / report["baseline"][f"{kind}_s"][p], 2) for p in PHASES}
            for kind in ("wall", "cpu")}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"| one-image deck, PowerPoint + PDF ({args.threads} torch threads, {args.repeats} runs each, load "
          f"{report['load_before'][0]} -> {report['load_after'][0]}) | build | PowerPoint | PDF | total |")
    print("|---|---|---|---|---|")
    for name in checkouts:
        for kind in ("wall", "cpu"):
            cells = " | ".join(f"{report[name][f'{kind}_s'][p]:.1f} s" for p in PHASES)
            print(f"| {name} ({report[name]['slides']} slides), {kind} | {cells} |")
    if args.baseline:
        for kind in ("wall", "cpu"):
            cells = " | ".join(f"{report['ratio (this / baseline)'][kind][p]:.2f}" for p in PHASES)
            print(f"| this / baseline, {kind} | {cells} |")


if __name__ == "__main__":
    main()
