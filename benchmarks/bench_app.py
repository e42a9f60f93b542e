"""How fast the app feels: drive a running app with gradio_client, as the browser would.

    python benchmarks/bench_app.py [--weights FILE] [--url http://127.0.0.1:7860/] [--repeats 20] [--json]

Without --url it starts ``app.py`` on a free loopback port (with --weights, default the
shared DeiT-Tiny) and stops it afterwards. Measured, over distinct photos so that every
upload really runs the model (the cache is keyed by image content):

- upload -> first result: ``/analyze``, the browser's upload event: upload the file, one
  forward pass capturing attention, predictions and the first pictures (model input, patch
  grid, sequence, attention, rollout), and download them;
- slider re-render: ``/attention`` with another layer (no model run, the cached analysis);
- ``/predict``: the JSON endpoint, for scripts.

Each is measured twice: the client's round trip, and the server-side time of the handler alone
(the app started with ``VIT_DEMO_TIMING=1`` logs ``[timing] HANDLER: N ms`` for every event; the
difference is Gradio's own work: queueing, pre/post-processing, moving files, the HTTP and SSE
round trips). With ``--url`` only the round trips are measured (the log is not ours to read).

Targets (2-core CPU, DeiT-Tiny), p50: upload -> first result <= 1.5 s round trip and <= 150 ms
in the handler; slider <= 0.3 s round trip and <= 50 ms in the handler.
Reports p50 / p95 / max in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))  # app_server: start the app on a free port
sys.path.insert(0, str(ROOT))


def photos(n: int) -> list[Path]:
    """``n`` distinct photos: the shared ImageNet sample when present, else variations of the
    bundled example photos (so that no two have the same content)."""
    sample = sorted((SHARED / "imagenet-sample").glob("*.JPEG"))
    if len(sample) >= n:
        return sample[:: max(1, len(sample) // n)][:n]
    from PIL import Image

    from vit_demo.app.examples import builtin_examples

    base = [Image.open(e.path).convert("RGB") for e in builtin_examples()]
    if not base:
        raise SystemExit("no photos: needs ../shared/imagenet-sample or matplotlib / scikit-image sample data")
    out_dir = Path(tempfile.mkdtemp(prefix="bench_app_"))
    out = []
    for i in range(n):
        img = base[i % len(base)]
        s = 1.0 - 0.02 * (i // len(base))
        w, h = int(img.width * s), int(img.height * s)
        p = out_dir / f"photo_{i:03d}.png"
        img.crop((0, 0, w, h)).save(p)
        out.append(p)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def summary(xs: list[float]) -> dict:
    ms = [1000 * x for x in xs]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p95_ms": pct(ms, 95), "max_ms": max(ms),
            "min_ms": min(ms)}


def server_times(log: str, handler: str) -> list[float]:
    """The handler's times (s) from the app's ``[timing]`` lines, in order."""
    tag = f"[timing] {handler}: "
    return [float(line.split(tag, 1)[1].split()[0]) / 1000 for line in log.splitlines() if tag in line]


def run(url: str, repeats: int, slider_repeats: int, log=None) -> dict:
    """Round trips through ``url``; ``log()`` (the server's output so far) adds server-side times."""
    from gradio_client import Client, handle_file

    marks: dict[str, int] = {}

    def mark(name: str) -> None:
        if log is not None:
            marks[name] = len(log())

    client = Client(url, verbose=False)
    imgs = photos(repeats + 1)
    # warm-up: the first request also waits for the model to finish loading
    t0 = time.perf_counter()
    client.predict(handle_file(str(imgs[-1])), api_name="/analyze")
    first_call = time.perf_counter() - t0

    mark("upload")
    upload = []
    for p in imgs[:repeats]:
        t0 = time.perf_counter()
        out = client.predict(handle_file(str(p)), api_name="/analyze")
        upload.append(time.perf_counter() - t0)
        assert out[4]["label"], out[4]  # predictions arrived

    mark("slider")
    slider = []
    for i in range(slider_repeats):
        layer = i % 12
        t0 = time.perf_counter()
        out = client.predict(layer, "all", "[class] token", 0, "inferno", 0.6, True, api_name="/attention")
        slider.append(time.perf_counter() - t0)
        assert f"layer {layer}" in out[1], out[1]

    mark("predict")
    predict = []
    for p in imgs[:repeats]:
        t0 = time.perf_counter()
        client.predict(handle_file(str(p)), api_name="/predict")  # cached analysis: upload + JSON
        predict.append(time.perf_counter() - t0)

    mark("end")
    report = {
        "url": url,
        "first_call_s (model load + warm-up)": first_call,
        "upload_to_first_result": summary(upload),
        "slider_rerender": summary(slider),
        "predict_json_cached": summary(predict),
    }
    if log is not None:
        time.sleep(0.5)  # the last timing lines
        text = log()
        for name, start, end, handler in (("upload_to_first_result", "upload", "slider", "on_image"),
                                          ("slider_rerender", "slider", "predict", "on_attention"),
                                          ("predict_json_cached", "predict", "end", "on_predict")):
            times = server_times(text[marks[start]:marks[end]], handler)
            if times:
                report[f"server: {name}"] = summary(times)
    return report


def versus(baseline: Path, weights: Path | None, repeats: int, slider_repeats: int) -> dict:
    """This checkout's app and ``baseline``'s (another checkout, e.g. ``git archive main``) side
    by side, each request sent to one then the other: both see the same machine load, which on
    a shared machine moves more than the difference measured. Reports both, and the ratios."""
    from app_server import start_app
    from gradio_client import Client, handle_file

    app_args = ["--weights", str(weights)] if weights else []
    env = {"VIT_DEMO_TIMING": "1"}
    apps = {"this": start_app(app_args, env=env)}
    try:
        apps["baseline"] = start_app(app_args, env=env, root=baseline.resolve())
        clients = {k: Client(a.url, verbose=False) for k, a in apps.items()}
        imgs = photos(repeats + 1)
        for c in clients.values():
            c.predict(handle_file(str(imgs[-1])), api_name="/analyze")  # model loaded, warm
        times: dict[str, dict[str, list[float]]] = {k: {} for k in apps}

        def one(kind: str, handler: str, call) -> None:
            for k, c in clients.items():
                seen = len(server_times(apps[k].log(10_000_000), handler))
                t0 = time.perf_counter()
                call(c)
                times[k].setdefault(kind, []).append(time.perf_counter() - t0)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    server = server_times(apps[k].log(10_000_000), handler)
                    if len(server) > seen:
                        times[k].setdefault("server: " + kind, []).append(server[-1])
                        break
                    time.sleep(0.02)

        for p in imgs[:repeats]:
            one("upload_to_first_result", "on_image", lambda c, p=p: c.predict(handle_file(str(p)), api_name="/analyze"))
        for i in range(slider_repeats):
            one("slider_rerender", "on_attention", lambda c, i=i: c.predict(
                i % 12, "all", "[class] token", 0, "inferno", 0.6, True, api_name="/attention"))
    finally:
        for a in apps.values():
            a.stop()
    report = {k: {kind: summary(v) for kind, v in t.items()} for k, t in times.items()}
    report["ratio_p50 (this / baseline)"] = {
        kind: round(report["this"][kind]["p50_ms"] / report["baseline"][kind]["p50_ms"], 2) for kind in report["this"]}
    return report


def in_process(weights: Path | None, n: int = 5) -> dict:
    """The same steps without HTTP: forward pass, first pictures, the class-specific maps
    (a follow-up event in the app), for reading the server numbers against."""
    import torch

    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.tabs.attention import HEAD_ALL, attention_view
    from vit_demo.app.tabs.patches import patch_picture, sequence_picture
    from vit_demo.app.tabs.relevance import method_maps, pending_titles
    from vit_demo.images import load_image
    from vit_demo.viz import tiles_image

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))  # as app.py: cores / concurrency (2)
    reg = ModelRegistry([weights] if weights else [])
    key = reg.default_key()
    reg.warm_up(key)
    fwd, first, cmaps = [], [], []
    for p in photos(n):
        img = load_image(p)
        t0 = time.perf_counter()
        a = reg.analyze(key, img)
        t1 = time.perf_counter()
        attention_view(a, a.depth - 1, HEAD_ALL, None)
        tiles_image(a.picture, method_maps(a, None), pending=pending_titles(a, None))
        patch_picture(a)
        sequence_picture(a)
        t2 = time.perf_counter()
        method_maps(a, reg.get(key))
        t3 = time.perf_counter()
        fwd.append(t1 - t0)
        first.append(t2 - t1)
        cmaps.append(t3 - t2)
    return {"forward_with_attention": summary(fwd), "first_pictures": summary(first),
            "class_specific_maps": summary(cmaps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running app (default: start one)")
    ap.add_argument("--weights", type=Path, default=SHARED / "weights" / "deit_tiny_patch16_224.safetensors")
    ap.add_argument("--repeats", type=int, default=20, help="uploads (distinct photos)")
    ap.add_argument("--slider-repeats", type=int, default=48)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="another checkout (e.g. git archive main | tar -x -C DIR): both apps, requests interleaved")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # as app.py does
        os.environ.setdefault(var, str(max(1, (os.cpu_count() or 1) // 2)))
    weights = args.weights if args.weights and args.weights.exists() else None

    if args.baseline:
        print(json.dumps(versus(args.baseline, weights, args.repeats, args.slider_repeats), indent=2))
        return
    if args.url:
        report = run(args.url, args.repeats, args.slider_repeats)
    else:
        from app_server import running_app

        app_args = ["--weights", str(weights)] if weights else []
        with running_app(app_args, env={"VIT_DEMO_TIMING": "1"}) as app:
            report = run(app.url, args.repeats, args.slider_repeats, log=lambda: app.log(10_000_000))
    report["in_process"] = in_process(weights)
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                         "weights": str(weights) if weights else "random weights (deit_tiny_patch16_224)"}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"app benchmark ({report['machine']['cpus']} CPUs; {report['machine']['weights']})")
    print(f"  first call (model load + warm-up): {report['first_call_s (model load + warm-up)']:.2f} s")
    rows = [("upload -> first result (/analyze)", report["upload_to_first_result"], 1500),
            ("slider re-render (/attention)", report["slider_rerender"], 300),
            ("/predict JSON (cached analysis)", report["predict_json_cached"], None)]
    targets = {"upload_to_first_result": 150, "slider_rerender": 50}
    rows += [(f"  server-side: {k[8:].replace('_', ' ')}", v, targets.get(k[8:]))
             for k, v in report.items() if k.startswith("server: ")]
    rows += [(f"in-process: {k.replace('_', ' ')}", v, None) for k, v in report["in_process"].items()]
    print(f"  {'':40s} {'p50':>8s} {'p95':>8s} {'max':>8s}  target")
    for name, s, target in rows:
        verdict = "" if target is None else (f"<= {target} ms " + ("OK" if s["p50_ms"] <= target else "MISSED"))
        print(f"  {name:40s} {s['p50_ms']:7.0f}ms {s['p95_ms']:7.0f}ms {s['max_ms']:7.0f}ms  {verdict}")


if __name__ == "__main__":
    main()
