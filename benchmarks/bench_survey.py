"""Survey benchmarks (issue 20). Not a test: figures to quote, never assertions.

(a) imagenet - ``python -m vit_demo survey --images SAMPLE --out DIR`` on the 1000 shared ImageNet photos with
               the default method (lrp-gated) and the shipped DeiT-Tiny, as a user runs it: wall time, the
               process's CPU time and its peak resident memory (``ru_maxrss``), with ``--limit 200`` first
               and then all 1000, each in a fresh process (the memory must not grow with the folder:
               the maps are kept on the patch grid and the pictures go to disk as they are done).
(b) lesson   - the Clever-Hans lesson with the defaults: ``data shapes --shortcut watermark --seed S
               --out DIR`` (and the same without the shortcut), ``train --data DIR --out FILE`` with no other
               flag for each, and a test set the models never saw (``--per-class 100 --seed S+1``, with and
               without the watermark). Each model is surveyed on the watermarked test set: the share of
               the watermarked test pictures of the target class in one cluster, that cluster's
               prototype's mass on the watermark's patches, the largest such mass of any cluster; and
               its accuracy on both test sets (the shortcut's pictures with and without the mark).

    python benchmarks/bench_survey.py [imagenet lesson] [--seed 0] [--device auto] [--work DIR] [--parallel]
                                      [--figure PNG] [--json FILE]

Run it with ``nice`` on a shared machine; the load average is printed next to every time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing (the figure imports vit_demo)
SAMPLE = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared")) / "imagenet-sample"


def load() -> float:
    return round(os.getloadavg()[0], 2)


class Command:
    """One command (``python -m vit_demo ...``) in a fresh process, started now; :meth:`result` waits
    for it: its JSON (or stdout), wall and CPU seconds and peak resident memory, read from that
    process alone (``os.wait4``)."""

    def __init__(self, *args: str, device: str = "auto", threads: int | None = None) -> None:
        extra = ["--device", device] if device != "auto" and args[0] in ("train", "survey") else []
        env = {**os.environ, "HF_HUB_OFFLINE": "1"} | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
        self.args, self.load0, self.t0 = args, load(), time.perf_counter()
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.p = subprocess.Popen([sys.executable, "-m", "vit_demo", *args, *extra], cwd=ROOT, stdout=self.out,
                                  stderr=self.err, env=env)

    def result(self) -> dict:
        _, status, ru = os.wait4(self.p.pid, 0)
        self.p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - self.t0
        self.out.seek(0), self.err.seek(0)
        stdout, stderr = self.out.read(), self.err.read()
        self.out.close(), self.err.close()
        if self.p.returncode:
            raise SystemExit(f"{' '.join(self.args[:2])} failed (exit code {self.p.returncode}):\n{stderr[-3000:]}")
        try:
            result = json.loads(stdout)
        except ValueError:
            result = {"stdout": stdout.strip()}
        return {"result": result, "wall_s": round(wall, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
                "peak_rss_mib": round(ru.ru_maxrss / 1024, 1), "load_avg_1min": [self.load0, load()],
                "cores": os.cpu_count()}


def vit_demo(*args: str, device: str = "auto") -> dict:
    """Run one command to its end (see :class:`Command`)."""
    return Command(*args, device=device).result()


# ----------------------------------------------------------------------------- (a) the 1000 ImageNet photos


def bench_imagenet(tmp: Path, device: str) -> dict:
    if len(list(SAMPLE.glob("*.JPEG"))) != 1000:
        raise SystemExit(f"needs the 1000-photo ImageNet sample at {SAMPLE}")
    out = {}
    for n in (200, 1000):
        r = vit_demo("survey", "--images", str(SAMPLE), "--limit", str(n), "--out", str(tmp / f"survey{n}"), "--json",
                     device=device)
        res = r.pop("result")
        classes = {c["class"] for c in res["clusters"]}
        out[f"{n} photos"] = {**r, "seconds_in_survey": res["seconds"], "method": res["method"], "device": res["device"],
                              "accuracy": res["accuracy"], "clusters": len(res["clusters"]),
                              "predicted_classes": len(classes), "embedding": res["embedding"],
                              "ms_per_photo": round(1000 * r["wall_s"] / n, 1)}
        print(f"  {n} photos: {r['wall_s']} s wall, {r['cpu_s']} s CPU, peak RSS {r['peak_rss_mib']} MiB "
              f"(load {r['load_avg_1min']})", file=sys.stderr, flush=True)
    a, b = out["200 photos"], out["1000 photos"]
    out["peak RSS, 1000 over 200"] = round(b["peak_rss_mib"] / a["peak_rss_mib"], 3)
    return out


# ----------------------------------------------------------------------------- (b) the lesson with the defaults


def lesson_data(work: Path, seed: int) -> dict[str, Path]:
    """The four folders of the lesson, through the ``data shapes`` command with its defaults (a
    folder already in ``work`` is kept: the same seed writes the same files)."""
    folders = {"train (watermark)": (work / "shapes-wm", ["--shortcut", "watermark", "--seed", str(seed)]),
               "train (clean)": (work / "shapes-clean", ["--seed", str(seed)]),
               "test (watermark)": (work / "test-wm", ["--shortcut", "watermark", "--seed", str(seed + 1), "--per-class", "100"]),
               "test (clean)": (work / "test-clean", ["--seed", str(seed + 1), "--per-class", "100"])}
    for path, flags in folders.values():
        if not (path / "boxes.json").is_file():
            print(f"  data shapes --out {path.name} {' '.join(flags)}", file=sys.stderr, flush=True)
            vit_demo("data", "shapes", "--out", str(path), *flags)
    return {k: v[0] for k, v in folders.items()}


def lesson_training(data: Path, device: str, threads: int | None) -> Command | Path:
    """``train --data DIR --out FILE`` and nothing else; continued with ``--resume`` where an
    interrupted run left its state (it ends where the uninterrupted run would); a finished
    checkpoint (written at the end only) is kept: then its path comes back instead of a command."""
    ckpt = data.with_suffix(".safetensors")
    state = ckpt.with_name(ckpt.name + ".train-state")
    if ckpt.is_file():
        return ckpt
    resume = ["--resume"] if state.is_file() else []
    print(f"  train --data {data.name} --out {ckpt.name} {' '.join(resume)}", file=sys.stderr, flush=True)
    return Command("train", "--data", str(data), "--out", str(ckpt), *resume, "--json", "--no-progress", device=device,
                   threads=threads)


def lesson_survey(ckpt: Path, folders: dict[str, Path], tmp: Path, device: str) -> dict:
    """One model surveyed on the watermarked test set (the finding) and on the clean one (accuracy)."""
    marked = vit_demo("survey", "--images", str(folders["test (watermark)"]), "--weights", str(ckpt),
                      "--out", str(tmp / f"survey-{ckpt.stem}"), "--json", device=device)
    clean = vit_demo("survey", "--images", str(folders["test (clean)"]), "--weights", str(ckpt),
                     "--out", str(tmp / f"survey-{ckpt.stem}-clean"), "--json", device=device)
    r, c = marked["result"], clean["result"]
    target = r["shortcut"]["class"]
    per_class = {}
    for name, res in (("test (watermark)", r), ("test (clean)", c)):
        pics = [im for im in res["images"] if im["label"] == target]
        per_class[name] = round(sum(im["correct"] for im in pics) / len(pics), 4)
    return {"finding": r["watermark"],
            "clusters": [{k: cl[k] for k in ("id", "class", "size", "accuracy", "watermarked", "mass_on_watermark")}
                         for cl in r["clusters"]],
            "accuracy": {"test (watermark)": r["accuracy"], "test (clean)": c["accuracy"]},
            f"accuracy on '{target}'": per_class, "survey_wall_s": marked["wall_s"]}


def lesson_figure(work: Path, results: dict, path: Path, tiles: int = 6) -> Path:
    """The lesson in one picture: for each model, the prototype of the cluster holding most of the
    marked test circles (the mark outlined) and some of its members with their maps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from vit_demo.viz.export import save_figure

    rows = [("watermark model", "shapes-wm"), ("clean model", "shapes-clean")]
    fig, axes = plt.subplots(len(rows), tiles + 1, figsize=(2.0 * (tiles + 1), 3.0 * len(rows)))
    for row, (name, stem) in zip(axes, rows):
        report = json.loads((work / f"survey-{stem}" / "survey.json").read_text())
        f = report["watermark"]
        c = report["clusters"][f["cluster"]]
        marked = {im["path"] for im in report["images"] if im.get("watermark")}
        members = [im for im in report["images"] if im["cluster"] == c["id"]]
        members.sort(key=lambda im: (im["path"] not in marked, im["index"]))
        row[0].imshow(Image.open(work / f"survey-{stem}" / c["image"]))
        row[0].set_title(f"{name}: cluster {c['id']} ('{c['class']}')\n{f['share_in_cluster']:.0%} of the marked circles\n"
                         f"prototype: {c['mass_on_watermark']:.0%} on the mark", fontsize=8)
        for ax, im in zip(row[1:], members[:tiles]):
            ax.imshow(Image.open(work / f"survey-{stem}" / im["overlay"]))
            ax.set_title(f"{Path(im['path']).parent.name}{' + mark' if im['path'] in marked else ''}\n"
                         f"called {im['predicted']} {im['confidence']:.0%}", fontsize=8)
        for ax in row:
            ax.axis("off")
    fig.suptitle(f"The Clever-Hans lesson (seed {results['seed']}): the cluster holding most of the marked test circles",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, width_px=1400)
    plt.close(fig)
    return path


def bench_lesson(work: Path, seed: int, device: str, parallel: bool = False) -> dict:
    from safetensors import safe_open

    folders = lesson_data(work, seed)
    out: dict = {"seed": seed, "commands": f"data shapes --shortcut watermark --seed {seed}; train --data DIR --out FILE; "
                                           f"test sets: --per-class 100 --seed {seed + 1}"}
    models = {"watermark model": folders["train (watermark)"], "clean model": folders["train (clean)"]}
    runs = {}
    for name, data in models.items():  # one after the other, or both at once with one thread each
        runs[name] = lesson_training(data, device, 1 if parallel else None)
        if not parallel and isinstance(runs[name], Command):
            runs[name] = runs[name].result()
    for name, data in models.items():
        r = runs[name]
        ckpt = data.with_suffix(".safetensors")
        timing = r.result() if isinstance(r, Command) else r if isinstance(r, dict) else {}
        with safe_open(str(ckpt), "pt") as f:
            summary = json.loads(f.metadata()["training"])
        training = {k: summary.get(k) for k in ("epochs", "best_epoch", "best_val_accuracy", "val_accuracy")}
        training |= {k: timing[k] for k in ("wall_s", "cpu_s", "load_avg_1min") if k in timing}
        out[name] = {"training": training, **lesson_survey(ckpt, folders, work, device)}
        f = out[name]["finding"]
        print(f"  {name}: {f['share_in_cluster']:.0%} of the marked '{f['class']}' test pictures in cluster {f['cluster']}, "
              f"its prototype {f['cluster_mass_on_watermark']:.0%} on the mark; the most of any cluster "
              f"{f['most_watermark_mass']:.0%}", file=sys.stderr, flush=True)
    wm, clean = out["watermark model"]["finding"], out["clean model"]["finding"]
    out["passed (>= 90% in one cluster, > 50% of its prototype on the mark; the clean model: no cluster > 50%)"] = bool(
        wm["share_in_cluster"] >= 0.9 and wm["cluster_mass_on_watermark"] > 0.5 and clean["most_watermark_mass"] <= 0.5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("which", nargs="*", default=["imagenet", "lesson"])
    ap.add_argument("--seed", type=int, default=0, help="lesson: the shapes' seed (the test sets take seed + 1)")
    ap.add_argument("--device", default="auto", help="where to train and survey (default: auto)")
    ap.add_argument("--work", type=Path, help="keep the folders, checkpoints and reports here (default: a temporary "
                                              "folder); lesson: a finished step is kept, an interrupted training resumed")
    ap.add_argument("--parallel", action="store_true", help="lesson: train both models at once, one thread each")
    ap.add_argument("--figure", type=Path, help="lesson: draw the two models' clusters on the mark here (PNG)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        work = args.work or Path(d)
        work.mkdir(parents=True, exist_ok=True)
        for which in args.which:
            print(f"-- {which} (load {load()})", file=sys.stderr, flush=True)
            fn = {"imagenet": lambda: bench_imagenet(work, args.device),
                  "lesson": lambda: bench_lesson(work, args.seed, args.device, args.parallel)}[which]
            results[which] = fn()
            print(json.dumps({which: results[which]}), flush=True)
            if which == "lesson" and args.figure:
                print(f"  figure: {lesson_figure(work, results[which], args.figure)}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
