"""How soon after an upload the slower tabs are whole, in Chromium against ``python app.py``.

    python benchmarks/bench_tabs.py [--photos 6] [--weights FILE] [--baseline DIR] [--json]

Starts ``app.py`` with its defaults (``--precision auto``: bf16 on a CPU that computes it natively;
``$VIT_DEMO_NO_BF16`` is cleared for the app) on a free loopback port, waits until its start-up
work is over (the model's warm-up and the Atlas tab's atlas of the examples: the app's CPU time
stops growing), then for each of ``--photos`` photos no app has seen (scikit-image's and
matplotlib's photos with a few new pixels, and drawn scenes: ``tests/tab_timing.py``), with every app
idle again (the maps of the photo before are made in the background after its tab is finished), on a
fresh page: drop the photo, click the tab at once, and time until it is finished:

- **Rollout & relevance**: every tile drawn (raw attention, rollout, gradient rollout, Chefer, and
  the row of the other class-specific methods), no "computing..." placeholder left (checked on
  the pixels too); target: within 3 s on an idle 2-core machine, the README's "about a second";
- **Model diagnostics**: both charts (mean attention distance, position-embedding similarity)
  drawn; target: within 2 s.

Also printed: when the prediction's label appeared, and when the Rollout & relevance tab's top row
(raw attention, rollout, gradient rollout, Chefer) was first whole.

Each tab gets photos of its own. Prints the median, min and max seconds of each, with the load
average before and after. ``--baseline DIR`` (another checkout, e.g. ``git archive 767572b | tar -x
-C DIR``) starts its app too and alternates the two photo by photo (each photo shown to both:
they are separate processes, so both see it for the first time), so that both see the same load;
it adds the ratios (this / baseline). Needs Chromium at /usr/bin/chromium and the ``playwright``
package (never downloads a browser).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # app_server (start the app), tab_timing (the measurement)
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def measure(apps: dict, tabs: list[str], n: int, folder: Path) -> tuple[dict, dict]:
    """``n`` photos per tab, each dropped on every app in ``apps`` (name -> app) in turn, every app idle
    first (the previous photo's maps, still being made in the background, slowed the next one down):
    the times, and the photos a tab did not finish within 120 s (by app)."""
    from playwright.sync_api import sync_playwright
    from tab_timing import fresh_photos, wait_idle

    times: dict[str, dict[str, list[float]]] = {name: {t: [] for t in tabs} for name in apps}
    stuck: dict[str, list[str]] = {name: [] for name in apps}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for j, tab in enumerate(tabs):
                for i, photo in enumerate(fresh_photos(folder, n, seed=1000 * (j + 1) + int(time.time()) % 1000)):
                    order = list(apps) if i % 2 == 0 else list(reversed(apps))  # who goes first alternates
                    for name in order:
                        for app in apps.values():
                            wait_idle(app.proc.pid, quiet_s=1.5)
                        got = one(browser, apps[name].url, photo, tab)
                        if got is None:
                            stuck[name].append(f"{tab}: {photo.name}")
                            print(f"  {name:8s} {tab:20s} {photo.name}: NOT FINISHED in 120 s", file=sys.stderr)
                            continue
                        for what, t in got.items():
                            times[name].setdefault(what, []).append(t)
                        print(f"  {name:8s} {tab:20s} {photo.name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()),
                              file=sys.stderr, flush=True)
        finally:
            browser.close()
    return times, stuck


def one(browser, url: str, photo: Path, tab: str) -> dict[str, float] | None:
    """One photo on a fresh page of the app at ``url``, ``tab`` opened at once: seconds until the tab was
    finished, the first label, the top row (Rollout & relevance); None if it did not finish."""
    from playwright.sync_api import TimeoutError as Timeout
    from tab_timing import PLACEHOLDERS, RELEVANCE, grey_share, label_at, pictures_seen, time_tab, whole_at

    try:
        dt, ctx = time_tab(browser, url, photo, tab)
    except Timeout:
        return None
    try:
        pg = ctx.pages[0]
        grey = max((grey_share(pg, s) for s in PLACEHOLDERS[tab]), default=0.0)
        if grey > 0.02:
            raise SystemExit(f"{url}, {tab}: placeholders left ({grey:.0%} grey) when it said it was finished")
        out = {tab: dt, "first label": label_at(pg)}
        if tab == RELEVANCE:
            out["top row (rollout, Chefer)"] = whole_at(pictures_seen(pg), "#methods")
        return {k: v for k, v in out.items() if v is not None}
    finally:
        ctx.close()


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "median_s": round(statistics.median(xs), 3), "min_s": round(min(xs), 3),
            "max_s": round(max(xs), 3), "all_s": [round(x, 2) for x in xs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", type=int, default=6, help="photos per tab (each new to the app)")
    ap.add_argument("--weights", type=Path, default=ROOT / "weights" / "deit_tiny_patch16_224.safetensors")
    ap.add_argument("--baseline", type=Path, metavar="DIR", help="another checkout: its app too, photos alternated")
    ap.add_argument("--tabs", nargs="+", default=["relevance", "diagnostics"], choices=["relevance", "diagnostics"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from app_server import start_app
    from tab_timing import DIAGNOSTICS, RELEVANCE, wait_idle

    tabs = [{"relevance": RELEVANCE, "diagnostics": DIAGNOSTICS}[t] for t in args.tabs]
    env = {"VIT_DEMO_NO_BF16": "0"}  # the default precision as a user gets it (the tests switch bf16 off)
    app_args = ["--weights", str(args.weights)]
    roots = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    started = {}
    try:
        for name, root in roots.items():
            started[name] = start_app(app_args, env=env, root=root)
        waited = {name: round(wait_idle(a.proc.pid), 1) for name, a in started.items()}  # (at once: same load)
        load0 = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="bench_tabs_") as folder:
            times, stuck = measure(started, tabs, args.photos, Path(folder))
        load1 = os.getloadavg()
    finally:
        for a in started.values():
            a.stop()
    report: dict = {name: {what: summary(ts) for what, ts in t.items() if ts} for name, t in times.items()}
    report["not finished within 120 s"] = stuck
    report["start-up work waited for (s)"] = waited
    report["load average (1, 5, 15 min) before, after"] = [[round(x, 2) for x in load0], [round(x, 2) for x in load1]]
    report["cpus"] = os.cpu_count()
    if args.baseline:
        report["ratio of medians (this / baseline)"] = {
            what: round(report["this"][what]["median_s"] / report["baseline"][what]["median_s"], 3)
            for what in report["this"] if what in report["baseline"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"upload -> tab finished, Chromium, {args.photos} new photos per tab, {os.cpu_count()} CPUs, "
          f"load {load0[0]:.2f} -> {load1[0]:.2f}")
    for name in times:
        for what, s in report[name].items():
            print(f"  {name:8s} {what:26s} median {s['median_s']:.2f} s  (min {s['min_s']:.2f}, max {s['max_s']:.2f}, "
                  f"n {s['n']})")
    for name, photos in stuck.items():
        if photos:
            print(f"  {name}: not finished within 120 s: {', '.join(photos)}")
    if args.baseline:
        for what, r in report["ratio of medians (this / baseline)"].items():
            print(f"  this / baseline, {what}: {r:.2f}")


if __name__ == "__main__":
    main()
