"""How much memory the app takes with a big model: ViT-B/8, 24 different photos, one after another.

    python benchmarks/bench_memory.py [--photos 24] [--class-maps N] [--json] [--root DIR] [--kill-above-gib G]
                                      [-- APP_ARGS...]

Saves a random-initialised ViT-B/8 (``timm_model('vit_base_patch8_224')``, ported with
``vit_demo.checkpoints.files.save``) to a temporary folder, starts ``app.py --weights`` on it with the
default settings (plus any APP_ARGS after ``--``, e.g. ``--cache-mb 4096``), sends the photos to
``/predict`` through ``gradio_client`` one after another, and samples the server process's
resident memory (RSS, psutil, every 0.1 s) once the app's warm-up (one forward and one
backward pass of the default model) has finished, and during start-up separately. One ViT-B/8
analysis holds 12 layers x 12 heads x 785 x 785 attention floats = 0.35 GB.

``--class-maps N``: then the first N photos through the page's own events, as a browser sends
them (the upload's analysis, then the class-specific maps of the "Rollout & relevance" tab:
seven methods' gradient passes), the app's most memory-hungry common path.

Acceptance (issues 10 and 21): the peak of the /predict run stays under 3 GiB with the default
settings, start-up included (the class maps' peak is reported, not judged: see docs/performance.md, Reliability).

``--root DIR`` measures another checkout's app (e.g. ``git archive main`` unpacked: the
before); ``--kill-above-gib`` stops the server when it passes that much, to measure a version
that would take the shared machine's memory (the report then says so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # app_server: start the app on a free port
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
MODEL = "vit_base_patch8_224"


def save_checkpoint(folder: Path) -> Path:
    """A random-initialised ViT-B/8 in the project's checkpoint format (343 MB)."""
    import torch

    from vit_demo.checkpoints.files import save
    from vit_demo.checkpoints.timm import from_timm, timm_model

    torch.manual_seed(0)
    model, dc = from_timm(timm_model(MODEL))
    return save(model, dc, folder / f"{MODEL}.safetensors", name=MODEL, source="timm random initialisation")


class RssSampler:
    """The resident memory of one process (and its children), sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.1, kill_above: float | None = None) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.every = every
        self.kill_above = kill_above
        self.killed = False
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        import psutil

        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            return sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return 0

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - t0, self.rss()))
            if self.kill_above and self.samples[-1][1] > self.kill_above and not self.killed:
                self.killed = True
                self.proc.kill()
            self._stop.wait(self.every)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return max((r for _, r in self.samples), default=0)


def class_maps_pass(url: str, imgs: list[Path], rss: RssSampler) -> list[dict]:
    """Each photo through /analyze, then the class-specific maps, in one session (tests/attacks.py)."""
    from attacks import Raw, file_payload

    raw = Raw(url, timeout=3600)
    comps = {c["id"]: c for c in raw.config()["components"]}

    def values(name: str) -> list:
        return [(comps[c].get("props") or {}).get("value") if comps[c].get("type") != "state" else None
                for c in raw.events()[name]["inputs"]]

    out = []
    for p in imgs:
        t0 = time.perf_counter()
        data = values("analyze")
        data[0] = file_payload(raw.upload(p))
        a = raw.call("analyze", data, timeout=3600)
        m = raw.call("on_class_maps", values("on_class_maps"), timeout=3600)
        out.append({"photo": p.name, "s": round(time.perf_counter() - t0, 2), "rss_gib": round(rss.rss() / GIB, 3),
                    "ok": a.success and m.success, "peak_so_far_gib": round(rss.peak / GIB, 3)})
    return out


def run(n_photos: int, app_args: list[str], root: Path = ROOT, kill_above_gib: float | None = None,
        warm_up_wait: float = 300, n_class_maps: int = 0) -> dict:
    from app_server import running_app
    from bench_app import photos
    from gradio_client import Client, handle_file

    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        ckpt = save_checkpoint(Path(tmp))
        imgs = photos(n_photos)
        with running_app(["--weights", str(ckpt), *app_args], timeout=300, root=root.resolve()) as app:
            with RssSampler(app.proc.pid, kill_above=kill_above_gib and kill_above_gib * GIB) as rss:
                deadline = time.monotonic() + warm_up_wait
                while "warm-up:" not in app.log(100_000) and time.monotonic() < deadline and app.alive():
                    time.sleep(0.2)  # the default model loaded and run once (forward, backward)
                started, start_peak = rss.rss(), rss.peak
                rss.samples.clear()
                client = Client(app.url, verbose=False)
                per_photo = []
                for p in imgs:
                    t0 = time.perf_counter()
                    try:
                        out = client.predict(handle_file(str(p)), None, 5, api_name="/predict")
                    except Exception:
                        if rss.killed:
                            break
                        raise
                    per_photo.append({"photo": p.name, "s": round(time.perf_counter() - t0, 2),
                                      "rss_gib": round(rss.rss() / GIB, 3), "top1": out["topk"][0]["label"]})
                    assert out["model"] == MODEL, out
                predict_peak = rss.peak
                with_maps = class_maps_pass(app.url, imgs[:n_class_maps], rss) if n_class_maps else []
                time.sleep(2.0)  # anything still being freed
                final = rss.rss()
            log = app.log(100_000)
    return {
        "model": MODEL, "photos": len(imgs), "app_args": app_args,
        "rss_after_start_gib": round(started / GIB, 3),
        "rss_peak_during_start_gib": round(start_peak / GIB, 3),
        "rss_peak_gib": round(rss.peak / GIB, 3),
        "rss_peak_predict_gib": round(predict_peak / GIB, 3),
        "class_maps": with_maps,
        "rss_final_gib": round(final / GIB, 3),
        "passed": max(predict_peak, start_peak) < 3 * GIB and not rss.killed,
        "killed_above_gib": kill_above_gib if rss.killed else None,
        "root": str(root),
        "per_photo": per_photo,
        "server_log_tail": log[-1500:],
    }


def main() -> None:
    argv = sys.argv[1:]
    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", type=int, default=24)
    ap.add_argument("--class-maps", type=int, default=0, metavar="N",
                    help="then N photos through the upload and the class-specific maps (slow: minutes per photo)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app to measure (default: this one)")
    ap.add_argument("--kill-above-gib", type=float, help="stop the server when its RSS passes this")
    ap.add_argument("--warm-up-wait", type=float, default=300,
                    help="seconds to wait for the app's 'warm-up:' line (older versions do not print it)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = run(args.photos, app_args, args.root, args.kill_above_gib, args.warm_up_wait, args.class_maps)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"app memory, {MODEL} (random weights), {report['photos']} photos to /predict "
          f"{' '.join(app_args) or '(default settings)'}")
    for r in report["per_photo"]:
        print(f"  {r['photo']:32s} {r['s']:6.2f} s  RSS {r['rss_gib']:.2f} GiB")
    print(f"  RSS after start-up (model loaded, warm-up run) {report['rss_after_start_gib']:.2f} GiB "
          f"(peak during start-up {report['rss_peak_during_start_gib']:.2f} GiB)")
    for r in report["class_maps"]:
        print(f"  {r['photo']:32s} {r['s']:6.2f} s  RSS {r['rss_gib']:.2f} GiB  (analysis + class maps"
              f"{'' if r['ok'] else ', FAILED'})")
    print(f"  while answering /predict: peak {report['rss_peak_predict_gib']:.2f} GiB, final "
          f"{report['rss_final_gib']:.2f} GiB: {'PASS' if report['passed'] else 'FAIL'} (target < 3 GiB, start-up "
          "included)" + (f"; with the class maps: peak {report['rss_peak_gib']:.2f} GiB" if report["class_maps"] else ""))
    if report["killed_above_gib"]:
        print(f"  the server passed {report['killed_above_gib']} GiB after {len(report['per_photo'])} photos "
              "and was stopped")


if __name__ == "__main__":
    main()
