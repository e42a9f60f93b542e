"""Every benchmark, one Markdown report: ``python benchmarks/run_all.py [--out benchmarks/RESULTS.md] [--parts ...]``.

Each part runs in its own process on this machine (same thread count for scratch and timm),
and reports medians of repeated runs:
- scratch vs timm forward: DeiT-Tiny, ViT-B/16, EVA-02-Tiny, SigLIP-B/16, batch 1 and 32 (target ratio <= 1.0);
- the later families (differential attention, parallel blocks, SAM's encoder, NaFlex), batch 1;
- prediction + all attention maps + rollout vs timm's plain forward (target <= 1.05);
- the app: upload -> first result and slider re-render, p50/p95 (targets 1.5 s, 0.3 s);
- accuracy of the scratch model and timm on the 1000 shared photos;
- faithfulness (deletion / insertion) of the explanation methods on the quick subset.
Takes about 5-10 minutes on a 2-core CPU; ``--parts forward explain`` runs only those, and the
other sections keep what the earlier report said, marked with the date it was measured on.
The load average is printed with the machine and next to every part.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
HERE = Path(__file__).resolve().parent
DEIT = SHARED / "weights" / "deit_tiny_patch16_224.safetensors"
SAMPLE = SHARED / "imagenet-sample"


PARTS = {"forward": "## Forward pass", "families": "## Later families", "explain": "## Prediction + every", "app": "## The app",
         "accuracy": "## Accuracy", "faithfulness": "## Faithfulness"}  # each part's section heading
LOADS: list[str] = []  # one line per part run: its time and the load average before and after


def run(args: list[str], what: str) -> str:
    print(f"-- {what} ...", file=sys.stderr, flush=True)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed:\n{r.stderr[-3000:]}")
    dt = time.perf_counter() - t0
    LOADS.append(f"{what}: {dt:.0f} s, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"   {dt:.0f} s", file=sys.stderr, flush=True)
    return r.stdout


def kept_sections(old: str, parts: set[str]) -> dict[str, tuple[str, str]]:
    """From an earlier report, for each part not re-run: its section (heading to the next one)
    and the date it was measured on."""
    found = re.search(r"on (\d{4}-\d{2}-\d{2})\.", old)
    date = found.group(1) if found else "an unknown date"
    out = {}
    for part, head in PARTS.items():
        if part in parts:
            continue
        section = next((s for s in old.split("\n## ") if ("## " + s).startswith(head)), "")
        section = section.split("\nTotal time")[0].strip()
        note = re.search(r"\*Not re-run on [\d-]+: from the report of ([\w -]+)\.\*", section)
        section = re.sub(r"\n*\*Not re-run on .*\*", "", section)
        out[part] = ("## " + section if section else f"{head} (not in the earlier report)", note.group(1) if note else date)
    return out


def table_part(out: str) -> str:
    """The Markdown table lines of a benchmark's output."""
    return "\n".join(line for line in out.splitlines() if line.startswith("|"))


def forward_part(args: argparse.Namespace) -> list[str]:
    return ["## Forward pass: scratch vs timm (random weights, same process, medians)", "",
            table_part(run([str(HERE / "bench_forward.py"), "--repeats", "5", "--batches", *args.forward_batches],
                           "forward"))]


def families_part(args: argparse.Namespace) -> list[str]:
    return ["## Later families: scratch vs timm forward (random weights, batch 1, medians)", "",
            table_part(run([str(HERE / "bench_forward.py"), "--families", "--repeats", "5", "--batches", "1"],
                           "families"))]


def explain_part(args: argparse.Namespace) -> list[str]:
    return ["## Prediction + every attention map + rollout vs timm's plain forward (one image)", "",
            table_part(run([str(HERE / "bench_explain.py")], "explain")), "",
            "The same with `--precision auto` (ours in bf16 where the CPU computes it natively; timm in fp32):", "",
            table_part(run([str(HERE / "bench_explain.py"), "--precision", "auto"], "explain, auto precision"))]


def app_part(args: argparse.Namespace) -> list[str]:
    app = json.loads(run([str(HERE / "bench_app.py"), "--json", "--weights", str(DEIT)], "app"))
    lines = ["## The app (DeiT-Tiny, driven through its API with gradio_client)", "",
             "| measure | p50 ms | p95 ms | target |", "|---|---|---|---|"]
    for name, key, target in (("upload -> predictions + first figures (/analyze)", "upload_to_first_result", "<= 1500"),
                              ("slider re-render (/attention)", "slider_rerender", "<= 300"),
                              ("/predict JSON (cached analysis)", "predict_json_cached", "")):
        s = app[key]
        lines.append(f"| {name} | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {target} |")
    return lines


def accuracy_part(args: argparse.Namespace) -> list[str]:
    acc = json.loads(run([str(HERE / "bench_accuracy.py"), "--json"], "accuracy"))
    return [f"## Accuracy on the {acc['images']} shared photos (shared DeiT-Tiny)", "",
            "| model | top-1 | top-5 |", "|---|---|---|",
            f"| scratch (vit_demo) | {acc['scratch_top1']:.1%} | {acc['scratch_top5']:.1%} |",
            f"| timm | {acc['timm_top1']:.1%} | {acc['timm_top5']:.1%} |", "",
            f"Same top-1 on {acc['top1_agreement']:.1%} of the photos; max |logit difference| on identical "
            f"inputs {acc['max_abs_logit_diff_same_input']:.1e}."]


def faithfulness_part(args: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        photos = sorted(SAMPLE.glob("*.JPEG"))
        step = max(1, len(photos) // args.faithfulness_images)
        for p in photos[::step][: args.faithfulness_images]:
            os.symlink(p, Path(tmp) / p.name)
        faith = json.loads(run(["-m", "vit_demo", "faithfulness", "--images", tmp, "--weights", str(DEIT),
                                "--target", "label", "--json"], "faithfulness"))
    lines = [f"## Faithfulness on {faith['images']} photos (true-label target; deletion: lower is better, "
             "insertion: higher is better)", "", "| method | deletion AUC | insertion AUC |", "|---|---|---|"]
    return lines + [f"| {name} | {m['deletion_auc']:.3f} | {m['insertion_auc']:.3f} |" for name, m in faith["methods"].items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--faithfulness-images", type=int, default=100, help="quick subset size (every k-th photo)")
    ap.add_argument("--forward-batches", nargs="+", default=["1", "32"], help="batch sizes of the forward part")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS),
                    help="run only these; the others keep their section of --out, marked with its date")
    args = ap.parse_args()
    if not DEIT.exists() or not SAMPLE.exists():
        raise SystemExit(f"needs the shared data in {SHARED} (DeiT-Tiny weights and the ImageNet sample)")
    kept = kept_sections(args.out.read_text() if args.out.exists() else "", set(args.parts))
    t0, load = time.perf_counter(), os.getloadavg()
    cpu = platform.processor() or platform.machine()
    lines = [
        "# Benchmark report",
        "",
        f"Machine: {os.cpu_count()} CPU cores ({cpu}), {platform.system()}, Python {platform.python_version()}, "
        f"torch {torch.__version__} on the CPU, {torch.get_num_threads()} threads; load average at the start "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min). Generated by "
        f"`python benchmarks/run_all.py{' '.join(['', *sys.argv[1:]])}` on {time.strftime('%Y-%m-%d')}.",
    ]
    makers = {"forward": forward_part, "families": families_part, "explain": explain_part, "app": app_part,
              "accuracy": accuracy_part, "faithfulness": faithfulness_part}
    for part, make in makers.items():
        if part in kept:
            section, date = kept[part]
            lines += ["", section, "", f"*Not re-run on {time.strftime('%Y-%m-%d')}: from the report of {date}.*"]
        else:
            lines += ["", *make(args)]
    lines += ["", f"Total time: {time.perf_counter() - t0:.0f} s ({'; '.join(LOADS)}).", ""]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
