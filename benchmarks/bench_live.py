"""The Live tab in Chromium with a fake camera: frames a second shown, distinct pictures, latency.

    python benchmarks/bench_live.py [--seconds 20] [--photo PATH] [--map rollout] [--baseline] [--json]

Starts ``app.py`` (the defaults: DeiT-Tiny, ``--precision auto``) on a free loopback port and
Chromium (/usr/bin/chromium, never downloaded) with a camera that plays a y4m clip panning across a
photo (scikit-image's astronaut by default; written to a temp folder, never kept), each frame's
number drawn in (tests/live_camera.py). Opens the Live tab, clicks "Click to Access Webcam" if
shown, then the first button whose text begins with Start or Record, waits for the first picture
and 3 s more, then over ``--seconds`` notes every change of the Live picture:

- changes a second and distinct pictures (acceptance: >= 8 a second, >= 20 distinct over 20 s);
- end-to-end latency: the number read off the picture against the number the camera shows at
  that moment, over the clip's frame rate (median and 90th percentile);
- the server's CPU time per picture shown (the app's process, all its threads) and Chromium's.

``--baseline`` also measures Gradio's own streaming of a trivial colour inversion (the same camera,
frame size and pace as the Live tab) right after, for scale: the ratio in one run on a shared
machine. The load average is printed before and after every measurement: a figure is the
acceptance's only on a quiet machine (load below 1 on these 2 cores).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # app_server (the app on a free port), live_camera (the fake camera)
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CLIP_SIZE, CLIP_FPS, CLIP_SECONDS = (384, 288), 30, 10
BASELINE_APP = textwrap.dedent("""
    import sys, gradio as gr
    side = {"ideal": 256}
    with gr.Blocks() as demo:
        cam = gr.Image(sources=["webcam"], streaming=True, elem_id="live-camera",
                       webcam_options=gr.WebcamOptions(mirror=False, constraints={"video": {"width": side, "height": side}}))
        out = gr.Image(elem_id="live-view", format="jpeg")
        cam.stream(lambda im: None if im is None else 255 - im, [cam], [out], stream_every=0.05, concurrency_limit=2)
    demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[1]), ssr_mode=False)
""")


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and its children (Chromium's renderer, GPU and network processes)."""
    import psutil

    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def browse(url: str, clip: Path, seconds: float, map_kind: str | None, server_pid: int) -> dict:
    """One measurement: Chromium on ``url`` with the clip as its camera."""
    from live_camera import camera_args, measure, start_live
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", *camera_args(clip)])
        try:
            pg = b.new_page(viewport={"width": 1400, "height": 1000})
            pg.goto(url)
            if map_kind is not None:  # the app: the tab, then a map other than the default
                pg.wait_for_selector("#upload", timeout=120_000)
                if map_kind != "rollout":  # the Map menu's entry
                    from vit_demo.app.live import MAPS

                    pg.get_by_role("tab", name="Live").click()
                    pg.locator("#live-map input").click()
                    pg.get_by_role("option", name=MAPS[map_kind]).click()
                start_live(pg)
            else:  # Gradio's own demo: one page, its Record button
                pg.wait_for_selector("#live-camera", timeout=60_000)
                access = pg.get_by_text("Click to Access Webcam")
                if access.count():
                    access.first.click()
                pg.locator("#live-camera button").filter(has_text="Record").first.click()
            load0, cpu0, browser0 = os.getloadavg()[0], cpu_seconds(server_pid), cpu_seconds(b_pid(b))
            out = measure(pg, seconds, CLIP_SIZE, CLIP_FPS, CLIP_FPS * CLIP_SECONDS)
            server, browser = cpu_seconds(server_pid) - cpu0, cpu_seconds(b_pid(b)) - browser0
        finally:
            b.close()
    shown = max(1, out["changes"])
    return {**out, "load_before": load0, "load_after": os.getloadavg()[0],
            "server_cpu_ms_per_picture": 1000 * server / shown, "browser_cpu_ms_per_picture": 1000 * browser / shown}


def b_pid(browser) -> int:
    """Chromium's main process (Playwright's driver starts it; found by its command line)."""
    import psutil

    for q in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if q.name().startswith("chrom") and "--type=" not in " ".join(q.cmdline()):
                return q.pid
        except psutil.Error:
            continue
    return os.getpid()


def baseline(clip: Path, seconds: float) -> dict:
    """Gradio's own streaming of a trivial colour inversion, measured the same way."""
    import urllib.request

    from app_server import free_port

    def answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url + "config", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", BASELINE_APP, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 60
        while not answers(url) and time.monotonic() < deadline:
            time.sleep(0.3)
        return browse(url, clip, seconds, None, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="the measuring window (default 20)")
    ap.add_argument("--photo", help="the photo the clip pans across (default: scikit-image's astronaut)")
    ap.add_argument("--map", default="rollout", choices=["rollout", "attention", "lrp-amortised"])
    ap.add_argument("--baseline", action="store_true", help="also Gradio's own trivial stream, for scale")
    ap.add_argument("--app-args", default="", help="more flags for app.py (e.g. '--precision fp32')")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from app_server import running_app
    from live_camera import dumps, write_clip

    from vit_demo.app.examples import package_dir

    photo = Path(args.photo) if args.photo else package_dir("skimage") / "data" / "astronaut.png"
    with tempfile.TemporaryDirectory(prefix="bench_live_") as tmp:
        clip = write_clip(Path(tmp) / "clip.y4m", photo, CLIP_SIZE, CLIP_FPS, CLIP_SECONDS)
        env = {k: v for k, v in os.environ.items() if k != "VIT_DEMO_NO_BF16"}  # --precision auto, as a user runs it
        with running_app(args.app_args.split(), env=env) as app:
            time.sleep(5)  # the warm-up (the model loaded and run once)
            result = {"live": browse(app.url, clip, args.seconds, args.map, app.proc.pid), "map": args.map,
                      "cores": os.cpu_count()}
        if args.baseline:
            result["gradio_trivial"] = baseline(clip, args.seconds)
            result["ratio_to_trivial"] = result["live"]["per_second"] / max(1e-9, result["gradio_trivial"]["per_second"])
    print(dumps(result) if args.json else report(result))
    return 0


def report(r: dict) -> str:
    lines = []
    for name in ("live", "gradio_trivial"):
        m = r.get(name)
        if m is None:
            continue
        lat = (f", latency median {m['latency_median_s']:.2f} s, p90 {m['latency_p90_s']:.2f} s "
               f"({m['latency_read']} read)" if name == "live" and m.get("latency_median_s") is not None else "")
        lines.append(f"{name:15s} {m['per_second']:5.1f} changes/s, {m['distinct']} distinct in {m['seconds']:.0f} s{lat}; "
                     f"CPU per picture: server {m['server_cpu_ms_per_picture']:.0f} ms, "
                     f"browser {m['browser_cpu_ms_per_picture']:.0f} ms; load {m['load_before']:.1f} -> {m['load_after']:.1f}")
    if "ratio_to_trivial" in r:
        lines.append(f"Live / Gradio's trivial stream: {r['ratio_to_trivial']:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
