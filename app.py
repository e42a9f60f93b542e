"""The vit_demo app: see how a Vision Transformer looks at your image, in the browser.

    python app.py [--host 127.0.0.1] [--port 7860] [--model NAME] [--weights FILE] [--examples DIR] [--share]
                  [--cache-mb 1024] [--models-mb 1536] [--max-upload-mb 25] [--allow-checkpoint-upload]
                  [--allowed-host NAME] [--trusted-proxy ADDR] [--max-megapixels 40] [--upload-budget-mb 100]
                  [--session-minutes 30] [--job-seconds 180] [--exports-mb 512] [--header-seconds 10]
                  [--train-minutes-max 10] [--allow-downloads] [--downloads-mb 2048] [--openapi] [--mcp]
                  [--precision auto|fp32|bf16]

Binds to 127.0.0.1 (this computer only) unless told otherwise, and then answers only requests
addressed to 127.0.0.1 or localhost; no analytics; start-up makes no network connection (the hub
is only tried when a user picks a hub model). Its files live in one temp folder of its own,
removed on exit (and at the next start if it was killed).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import signal
import sys
import threading
import time

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported anywhere


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (and ``$VIT_DEMO_ARGS``), checked: no negative number, every proxy an address."""
    ap = argparse.ArgumentParser(description="The vit_demo app: how a Vision Transformer sees your image.")
    add_app_flags(ap)
    add_limit_flags(ap)
    if argv is None:  # a host that runs `python app.py` as it is (a Space) gives its flags in $VIT_DEMO_ARGS
        argv = shlex.split(os.environ.get("VIT_DEMO_ARGS", "")) + sys.argv[1:]
    args = ap.parse_args(argv)
    for flag in NUMBERS:
        if (getattr(args, flag) or 0) < 0:
            ap.error(f"--{flag.replace('_', '-')} cannot be negative")
    for addr in args.trusted_proxy:
        try:
            ipaddress.ip_network(addr, strict=False)
        except ValueError:
            ap.error(f"--trusted-proxy {addr}: not an address or a network")
    return args


def add_app_flags(ap: argparse.ArgumentParser) -> None:
    """Where the app listens, what it offers (models, examples) and how it runs them."""
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1",
                    help="address to bind (default 127.0.0.1: this computer only; $GRADIO_SERVER_NAME, which a "
                         "Hugging Face Space sets to 0.0.0.0)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT") or 7860))
    ap.add_argument("--model",
                    help="timm architecture name, for --weights files not named after it (and the first pick)")
    ap.add_argument("--weights", action="append", default=[], metavar="FILE",
                    help="a checkpoint to offer (repeatable); weights/ and $VIT_DEMO_WEIGHTS are searched too")
    ap.add_argument("--examples", action="append", default=[], metavar="DIR",
                    help="a folder of your own example photos (repeatable; also $VIT_DEMO_EXAMPLES)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                    help="where the model runs (auto: a GPU when there is one)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="what the models run in (auto: bfloat16 where the device computes it natively, a CPU with "
                         "AVX512-BF16 or AMX or a GPU with bf16, else fp32; the Compare tab always checks in fp32)")
    ap.add_argument("--share", action="store_true", help="a public gradio.live link (exposes the app to the internet)")
    ap.add_argument("--max-queue", type=int, default=32,
                    help="requests waiting at most; more get a 'queue is full' message")
    ap.add_argument("--concurrency", type=int, default=2, help="model runs at the same time")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per model run (default: CPU cores / --concurrency, at least 1)")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="do not load the default model in the background at start-up")
    ap.add_argument("--mcp", action="store_true",
                    help="also serve the app as tools for agents: Gradio's MCP server at /gradio_api/mcp/ "
                         "(predict, explain, attention, verify; needs gradio[mcp])")
    ap.add_argument("--exposed", action="store_true",
                    help=argparse.SUPPRESS)  # tests: the exposed app's limits while bound to 127.0.0.1


def add_limit_flags(ap: argparse.ArgumentParser) -> None:
    """What the app may keep and accept: the :class:`vit_demo.app.server.limits.Limits` fields of
    the same names (:data:`NUMBERS`; their defaults are there: not imported here, so that numpy
    loads after the thread count is set)."""
    ap.add_argument("--cache-mb", type=float,
                    help="memory for the analyses kept for instant re-renders; the least recently used "
                         "leave first (default 1024)")
    ap.add_argument("--models-mb", type=float,
                    help="memory for loaded models and their timm twins (default 1536; the model in use "
                         "always stays)")
    ap.add_argument("--max-upload-mb", type=float, help="largest image file accepted (default 25)")
    ap.add_argument("--allow-checkpoint-upload", action="store_true",
                    help="let users upload checkpoints even when the app is exposed (--share or --host)")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="a name the app answers to besides 127.0.0.1 and localhost (repeatable; when exposed, "
                         "giving one makes the app answer only to these names)")
    ap.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                    help="a proxy (address or network) whose X-Forwarded-For is believed (repeatable; default: "
                         "none, every client is the address it connects from)")
    ap.add_argument("--max-megapixels", type=float, help="largest image accepted, in decoded pixels (default 40)")
    ap.add_argument("--upload-budget-mb", type=float,
                    help="what one client (address) may upload per 10 minutes when exposed (default 100)")
    ap.add_argument("--session-minutes", type=float,
                    help="an idle session forgets its image after this long (default 30)")
    ap.add_argument("--sessions-mb", type=float,
                    help="memory for the pictures all sessions keep (default 256; the least recently used go)")
    ap.add_argument("--job-seconds", type=float,
                    help="time limit of one slow job: a deck, a slow method, an animation, an export (default 180)")
    ap.add_argument("--exports-mb", type=float,
                    help="disk for slides, decks and animations made for users (default 512; the oldest go)")
    ap.add_argument("--header-seconds", type=float,
                    help="a connection that has not sent its request headers within this long is closed, and a "
                         "request body gets this long before it must arrive at 16 KB/s (default 10)")
    ap.add_argument("--train-minutes-max", type=float, metavar="N",
                    help="the Train tab's (and /train's) longest run in minutes, one run at a time on the server "
                         "(default 10 on this computer; OFF when exposed unless given; 0 turns training off)")
    ap.add_argument("--allow-downloads", action="store_true",
                    help="let users make an exposed app download hub models (one at a time, in the slow lane, "
                         "within --downloads-mb); always on for a local app")
    ap.add_argument("--downloads-mb", type=float,
                    help="disk for the hub models an exposed app downloads while it runs (default 2048)")
    ap.add_argument("--openapi", action="store_true",
                    help="serve Gradio's OpenAPI schema (/gradio_api/openapi.json) even when exposed")


NUMBERS = ("max_upload_mb", "cache_mb", "models_mb", "max_megapixels", "upload_budget_mb", "session_minutes",
           "sessions_mb", "job_seconds", "exports_mb", "header_seconds",
           "downloads_mb", "train_minutes_max")  # the flags that are Limits fields of the same name


def limits(args: argparse.Namespace):
    """The flags -> what the app may keep and accept (a :class:`vit_demo.app.server.limits.Limits`)."""
    from vit_demo.app.server.limits import Limits

    exposed = args.exposed or args.share or not is_loopback(args.host)
    given = {k: getattr(args, k) for k in NUMBERS if getattr(args, k) is not None}
    return Limits.for_exposure(exposed, args.allow_checkpoint_upload, max_queue=args.max_queue,
                               concurrency=args.concurrency, allowed_hosts=tuple(args.allowed_host),
                               trusted_proxies=tuple(args.trusted_proxy), bind=args.host,
                               allow_downloads=args.allow_downloads, openapi=args.openapi, **given)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this computer only (127.0.0.0/8, ::1, localhost)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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

    from vit_demo.budget import return_large_frees_to_os

    torch.set_num_threads(threads)
    return_large_frees_to_os()  # freed attention maps leave the process, so the budgets bound its memory
    lim = limits(args)
    prepare_server(lim, graceful=args.share)
    guard_server(lim, share=args.share)
    if lim.exposed:
        print(exposure_warning(args, lim), file=sys.stderr)

    from vit_demo.app.build import AppConfig, build, launch_kwargs

    cfg = AppConfig(weights=args.weights, model=args.model, examples=args.examples, device=args.device, limits=lim,
                    mcp=args.mcp, precision=args.precision)
    app = build(cfg)
    if not args.no_warm_up:  # the first image should not wait for the model to load
        threading.Thread(target=_warm_up, args=(app.reg, app.server.warm_up), daemon=True, name="warm-up").start()
    app.demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_kwargs(app.server))
    return 0


def exposure_warning(args: argparse.Namespace, lim) -> str:
    """What an exposed app prints at start: who can reach it and what they can upload."""
    if args.share:
        what = "--share makes the app public on the internet through a gradio.live link"
    elif args.exposed:
        what = "--exposed: the limits of an exposed app, on this computer only"
    else:
        what = f"--host {args.host} makes the app reachable from other computers on port {args.port}"
    uploads = ("images and checkpoints" if lim.allow_checkpoint_upload
               else "images (checkpoint upload is off: --allow-checkpoint-upload turns it on)")
    downloads = (f"can make it download hub models (--allow-downloads, within {lim.downloads_mb:.0f} MB)"
                 if lim.allow_downloads else "cannot make it download hub models (--allow-downloads turns it on)")
    return (f"WARNING: {what}: anyone who can reach it can upload {uploads}, {downloads}, and use this machine's "
            f"CPU. Loading checkpoints by server path is switched off.")


def prepare_server(lim, graceful: bool = False) -> None:
    """Before Gradio is imported: the app's own temp folder (stale ones removed) as Gradio's, the
    proxies whose X-Forwarded-For uvicorn may believe (none unless --trusted-proxy), and SIGTERM
    removing the folder before the process ends, at once (``graceful``, with --share: like
    Ctrl-C, Gradio closes the server and its tunnel first, then atexit removes the folder)."""
    from vit_demo.app.server.workspace import workspace

    ws = workspace()
    os.environ["GRADIO_TEMP_DIR"] = str(ws.gradio)
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(lim.trusted_proxies)  # "": no address is trusted

    def stop(_signum, _frame):
        if graceful:
            raise KeyboardInterrupt  # Gradio's launch() closes the server and the share tunnel on it
        ws.remove()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # at once: nothing of the app's is left to save

    signal.signal(signal.SIGTERM, stop)


def guard_server(lim, share: bool = False) -> None:
    """Before the server starts: every connection's headers within ``--header-seconds`` and its
    bodies at a minimum rate; all connections together within a share of the file limit;
    exposed, at most ``connections_per_address`` open connections per client (not for a trusted
    proxy, nor for the share tunnel, which connects from this computer for every visitor);
    repeated log lines dropped beyond 20 a minute. The soft file limit is raised to the hard one
    first, and the start-up line says the limit."""
    from vit_demo.app.server.connections import ConnectionRules, describe, guard_connections, raise_file_limit
    from vit_demo.app.server.quietlog import quiet_repeats

    exempt = (*lim.trusted_proxies, *(("127.0.0.1", "::1") if share else ()))
    per_address = lim.connections_per_address if lim.exposed else None
    rules = ConnectionRules(lim.header_seconds, per_address, exempt)
    guard_connections(rules)
    print(describe(rules, *raise_file_limit()), file=sys.stderr, flush=True)
    quiet_repeats()


def _warm_up(reg, sections_warm_up) -> None:
    """The default model loaded, then the sections' own warm-up (:attr:`vit_demo.app.server.settings.ServerSettings.warm_up`:
    the Atlas tab's atlas of the examples, when it is not kept on disk yet)."""
    t0 = time.perf_counter()
    try:
        reg.warm_up()
        print(f"warm-up: {reg.default_key()} ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    except Exception as e:  # a broken default checkpoint: the UI says so when it is used
        print(f"note: could not warm up the default model: {e}", file=sys.stderr)
        return
    try:
        sections_warm_up()
    except Exception as e:  # noqa: BLE001 - the tab says what is missing when it is opened
        print(f"note: a section's warm-up failed: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
