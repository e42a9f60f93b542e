"""The Whole folder tab's work on a zip of class folders, step by step, this version against the
version before in the same run. Not a test: figures to quote, never assertions.

The zip: ``my_photos/bird/``, ``dog/``, ``reptile/``, 30 photos each from the shared ImageNet sample
(none of the three names is one of DeiT-Tiny's classes), about 10 MB. Each run does what
:meth:`vit_demo.app.tabs.folder.FolderTab.run_survey` does, without Gradio: unpack the zip within
the upload limits, survey it (the default method, the app's picture loader and batch, the clustering
in a child process), write the report, draw the 2-D view, zip the report. "before": 4 pictures a
batch and the clustering's process started when the clustering starts; "now": 8 a batch and the
process started with the survey, importing scikit-learn while the model works. The runs alternate
(before, now, before, now, ...) in one process, the default model loaded once.

    python benchmarks/bench_folder_tab.py [--runs 2] [--threads N] [--precision auto] [--json FILE]

Run it with ``nice`` on a shared machine; the load average is printed next to every time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"
FOLDERS = {"bird": [*range(7, 25), *range(80, 101), *range(127, 147)], "dog": list(range(151, 269)),
           "reptile": list(range(33, 69))}  # ImageNet class indices of each folder's photos
PER_FOLDER = 30


def load() -> float:
    return round(os.getloadavg()[0], 2)


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and its finished children (the clustering's)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def make_zip(path: Path) -> Path:
    """The zip of class folders: 30 photos of each of :data:`FOLDERS`, spread over its classes."""
    photos = sorted(SAMPLE.glob("*.JPEG"))
    with zipfile.ZipFile(path, "w") as z:
        for name, classes in FOLDERS.items():
            for i in range(PER_FOLDER):
                photo = photos[classes[round(i * (len(classes) - 1) / (PER_FOLDER - 1))]]
                z.write(photo, f"my_photos/{name}/{photo.name}")
    return path


class ColdChild:
    """The version before: the clustering's process started when the clustering starts."""

    def __init__(self, preload: tuple[str, ...] = (), what: str = "The work") -> None:
        self.what = what

    def run(self, work: Any, *args: Any) -> Any:
        from vit_demo.evaluate.child import in_child

        return in_child(work, *args, what=self.what)

    def __enter__(self) -> ColdChild:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def one_run(lm: Any, archive: Path, work: Path, before: bool) -> dict[str, Any]:
    """The tab's steps on ``archive``, each timed."""
    import vit_demo.evaluate.survey as survey_code
    from vit_demo.app.server.limits import Limits
    from vit_demo.app.tabs.folder import report_zip
    from vit_demo.app.uploads import BATCH, gather_uploads, picture_loader
    from vit_demo.evaluate.child import Child
    from vit_demo.images import Allowance
    from vit_demo.present.survey_report import Thumbnails, embedding_image, write_report

    shutil.rmtree(work, ignore_errors=True)
    survey_code.Child = ColdChild if before else Child
    limits, times, start, cpu0 = Limits(), {}, time.perf_counter(), cpu_seconds()
    t = time.perf_counter()
    pics, _ = gather_uploads([str(archive)], work, 1000, limits.max_upload_bytes,
                             Allowance(entries=20_000, read=1 << 30, written=1 << 30))
    times["unzip"] = time.perf_counter() - t
    t = time.perf_counter()
    result = survey_code.survey(lm, pics, each=Thumbnails(work / "report"), progress=False, isolated=True,
                                load=picture_loader(limits), batch_size=4 if before else BATCH)
    times["survey"] = time.perf_counter() - t
    survey_code.relative_paths(result)
    t = time.perf_counter()
    write_report(result, work / "report")
    embedding_image(result, work / "report", thumb=56)
    report_zip(work)
    times["report, 2-D view, zip"] = time.perf_counter() - t
    times["all"] = time.perf_counter() - start
    times["cpu"] = cpu_seconds() - cpu0
    survey_code.Child = Child
    return {"version": "before" if before else "now", "load_after": load(), "pictures": result["count"],
            "clusters": len(result["clusters"]), "grouped_by": result["grouped_by"],
            **{k: round(v, 2) for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="runs of each version, alternating (default 2)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--precision", default="auto", help="the app's default: auto (bf16 where the CPU has it)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if not SAMPLE.is_dir():
        sys.exit(f"needs the shared ImageNet sample at {SAMPLE}")
    import torch

    from vit_demo.checkpoints.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(device="cpu", progress=False, precision=args.precision)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        archive = make_zip(Path(tmp) / "my_photos.zip")
        print(f"zip {archive.stat().st_size / 1e6:.1f} MB, {lm.name} in {lm.precision}, {torch.get_num_threads()} "
              f"thread(s), load {load()}", flush=True)
        for i in range(2 * args.runs):
            rows.append(one_run(lm, archive, Path(tmp) / "work", before=i % 2 == 0))
            print(json.dumps(rows[-1]), flush=True)
    for version in ("before", "now"):
        mine = [r for r in rows if r["version"] == version]
        print(version, {k: round(sum(r[k] for r in mine) / len(mine), 2) for k in ("unzip", "survey", "all", "cpu")})

    def ratio(key: str) -> float:
        return sum(r[key] for r in rows if r["version"] == "now") / sum(r[key] for r in rows if r["version"] == "before")

    print(f"now / before: {ratio('all'):.2f} wall, {ratio('cpu'):.2f} CPU (the whole tab's work; load at the end {load()})")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "wall": ratio("all"), "cpu": ratio("cpu")}, indent=1))


if __name__ == "__main__":
    main()
