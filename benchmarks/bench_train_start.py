"""How soon the Train tab's training starts. Not a test: figures to quote, never assertions.

A run in the app is a child process (vit_demo.train.live.LiveRun). This times, from the moment the
run is asked for, its first word (the child running), the plan (the data read, the size chosen,
the steps timed), and the end of its first epoch, on the built-in digits and on 90 photos in three
class folders (the ImageNet sample, as a zip's folder would be), for a child started two ways,
interleaved in one process:

- ``spawn``: a fresh interpreter that imports PyTorch, this package and torch._dynamo (the first
  optimiser imports it) on every run: how the app started its trainings before;
- ``forkserver``: forked from the fork server that the Train tab starts when it opens, PyTorch and
  the package imported there once (the fork server's own start is not counted, as the tab's
  opening has done it before the click).

Each run is stopped after its first epoch. The stages of the child (its "stage" messages) are
printed with their times, so the rest of the wait shows too (choosing the threads, the size).

    python benchmarks/bench_train_start.py [--repeats 2] [--sets digits,photos] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
PHOTO_CLASSES = {"bird": [*range(7, 25), *range(80, 101)], "dog": range(151, 269), "reptile": range(25, 69)}  # ImageNet


def photos(dest: Path, per_class: int = 30) -> Path:
    """90 photos of the sample (one per ImageNet class, sorted by index) in three class folders."""
    files = sorted(SAMPLE.glob("*.JPEG"))
    for name, idx in PHOTO_CLASSES.items():
        (dest / name).mkdir(parents=True)
        for i in list(idx)[:per_class]:
            shutil.copy(files[i], dest / name / files[i].name)
    return dest


def one_run(data: Path, out: Path, method: str, threads: int) -> dict:
    """One run in a child started by ``method``, stopped after its first epoch: seconds to each stage."""
    from vit_demo.train import live
    from vit_demo.train.loop import TrainOptions

    live.start_method = lambda: method  # the app's LiveRun, started the way asked
    out.mkdir(parents=True, exist_ok=True)
    opts = TrainOptions(data=str(data), out=str(out / "m.safetensors"), minutes=2.0, seed=0)
    t0, times, stages = time.perf_counter(), {}, []
    with live.LiveRun(opts, out / "snapshots", 600, threads) as run:
        while "first epoch" not in times:
            for kind, msg in run.events(0.05):
                now = round(time.perf_counter() - t0, 2)
                times.setdefault("first word", now)
                if kind == "stage" and (not stages or stages[-1][1].split(" ")[0] != msg["text"].split(" ")[0]):
                    stages.append((now, msg["text"]))
                if kind == "plan":
                    times["plan"] = now
                if kind == "epoch":
                    times["first epoch"] = now
                if kind == "error":
                    raise SystemExit(f"the run failed: {msg}")
    return {**times, "stages": stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sets", default="digits,photos")
    ap.add_argument("--threads", type=int, default=1, help="the child's torch threads (the app gives its own count)")
    args = ap.parse_args()
    from vit_demo.train import live
    from vit_demo.train.builtin import make_digits

    load0 = os.getloadavg()[0]
    live.start_server()  # what opening the Train tab does; its imports are not counted
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sets = {"digits": lambda: make_digits(tmp / "digits"), "photos": lambda: photos(tmp / "photos")}
        rows: dict = {}
        for name in args.sets.split(","):
            if name == "photos" and not SAMPLE.is_dir():
                print(f"photos: skipped, no {SAMPLE}")
                continue
            data = sets[name]()
            one_run(data, tmp / "warm", "forkserver", args.threads)  # the fork server ready (its imports done)
            for r in range(args.repeats):
                for method in ("spawn", "forkserver"):  # interleaved: the machine's load falls on both alike
                    res = one_run(data, tmp / f"{name}-{method}-{r}", method, args.threads)
                    rows.setdefault(name, {}).setdefault(method, []).append(res)
                    print(json.dumps({"set": name, "method": method, **res}), flush=True)
        print(f"\nload average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of "
              f"{args.repeats} runs, seconds from the request")
        for name, by in rows.items():
            for method, runs in by.items():
                med = {k: statistics.median(r[k] for r in runs) for k in ("first word", "plan", "first epoch")}
                print(f"{name:7} {method:10} " + "  ".join(f"{k} {v:5.1f}" for k, v in med.items()))
            spawn, fork = (statistics.median(r["first epoch"] for r in by[m]) for m in ("spawn", "forkserver"))
            print(f"{name:7} first epoch ends after {fork / spawn:.2f} of the time with the fork server")


if __name__ == "__main__":
    main()
