"""The vit_demo app: see how a Vision Transformer looks at your image, in the browser.

    python app.py [--host 127.0.0.1] [--port 7860] [--model NAME] [--weights FILE] [--examples DIR] [--share]

Binds to 127.0.0.1 (this computer only) unless told otherwise; no analytics; start-up makes
no network connection (the hub is only tried when a user picks a hub model).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported anywhere


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The vit_demo app: how a Vision Transformer sees your image.")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this computer only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--model",
                    help="timm architecture name, for --weights files not named after it (and the first pick)")
    ap.add_argument("--weights", action="append", default=[], metavar="FILE",
                    help="a checkpoint to offer (repeatable); weights/ and $VIT_DEMO_WEIGHTS are searched too")
    ap.add_argument("--examples", action="append", default=[], metavar="DIR",
                    help="a folder of your own example photos (repeatable; also $VIT_DEMO_EXAMPLES)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                    help="where the model runs (auto: a GPU when there is one)")
    ap.add_argument("--share", action="store_true", help="a public gradio.live link (exposes the app to the internet)")
    ap.add_argument("--max-queue", type=int, default=32,
                    help="requests waiting at most; more get a 'queue is full' message")
    ap.add_argument("--concurrency", type=int, default=2, help="model runs at the same time")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per model run (default: CPU cores / --concurrency, at least 1)")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="do not load the default model in the background at start-up")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for w in args.weights:
        if not os.path.isfile(w):
            print(f"error: --weights {w}: no such file", file=sys.stderr)
            return 2
    # One model run per request: a small model on a busy machine is fastest with few threads per
    # run (more threads than free cores makes every thread wait for the slowest: 10x slower).
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.concurrency))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy's BLAS, before it loads
        os.environ.setdefault(var, str(threads))
    import torch

    torch.set_num_threads(threads)
    exposed = args.share or not is_loopback(args.host)
    if exposed:
        if args.share:
            what = "--share makes the app public on the internet through a gradio.live link"
        else:
            what = f"--host {args.host} makes the app reachable from other computers on port {args.port}"
        print(f"WARNING: {what}: anyone who can reach it can upload images and checkpoints and use this "
              f"machine's CPU. Loading checkpoints by server path is switched off.", file=sys.stderr)

    from vit_demo.app.build import AppConfig, build, launch_kwargs

    cfg = AppConfig(weights=args.weights, model=args.model, examples=args.examples, device=args.device,
                    exposed=exposed, max_queue=args.max_queue, concurrency=args.concurrency)
    demo, reg = build(cfg)
    if not args.no_warm_up:  # the first image should not wait for the model to load
        threading.Thread(target=_warm_up, args=(reg,), daemon=True, name="warm-up").start()
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_kwargs(demo))
    return 0


def _warm_up(reg) -> None:
    try:
        reg.warm_up()
    except Exception as e:  # a broken default checkpoint: the UI says so when it is used
        print(f"note: could not warm up the default model: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
