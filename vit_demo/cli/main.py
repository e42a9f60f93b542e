"""Command line: ``python -m vit_demo {predict,port,verify,explain,faithfulness} ...``.

Each sub-command is a thin wrapper around a library function; other modules add their own
sub-commands through a ``register(subparsers)`` function listed in ``PLUGINS``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

# modules with register(subparsers)
PLUGINS = ("vit_demo.explain_cli", "vit_demo.faithfulness", "vit_demo.sanity", "vit_demo.data", "vit_demo.train",
           "vit_demo.pointing", "vit_demo.deck")


class UserError(Exception):
    """Reported as one line on stderr with exit code 2 (no traceback)."""


def add_model_args(p: argparse.ArgumentParser, random_init: bool = False) -> None:
    """--model / --weights / --device, shared by every command that loads a model."""
    p.add_argument("--model", help="timm model name: weights/NAME.safetensors, else downloaded from the hub once "
                   "(default: the embedded deit_tiny_patch16_224)")
    p.add_argument("--weights", help="checkpoint file (.safetensors, .pth/.bin or .npz in timm layout) or a "
                   "transformers model folder (default: weights/deit_tiny_patch16_224.safetensors)")
    if random_init:
        p.add_argument("--random-init", action="store_true", help="timm's random initialisation (no download)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])


def load_from_args(args: argparse.Namespace):
    from .weights import load_model

    return load_model(args.model, args.weights, random_init=getattr(args, "random_init", False), device=args.device)


def cmd_predict(args: argparse.Namespace) -> int:
    from .images import find_images
    from .inference import format_predictions, predict_images

    paths = find_images(args.images)
    if not paths:
        raise UserError("no images found in " + ", ".join(args.images))
    lm = load_from_args(args)
    results = predict_images(lm, paths, k=args.topk, batch_size=args.batch_size)
    print(json.dumps(results, indent=2) if args.json else format_predictions(results))
    return 1 if any("error" in r for r in results) else 0


def cmd_port(args: argparse.Namespace) -> int:
    from .hf_port import from_hf_folder, is_hf_folder
    from .port import from_checkpoint, from_hub, save
    from .weights import class_names_from_meta, weights_dir

    extra: dict[str, str] = {}
    names = None
    if args.from_file and is_hf_folder(args.from_file):  # a transformers model folder
        model, dc, meta = from_hf_folder(args.from_file)
        name, source, names = meta["model_name"], meta["source"], class_names_from_meta(meta)
        extra = {k: v for k, v in meta.items() if k not in ("model_name", "source", "class_names")}
        default_out = Path(args.from_file).resolve().name
    elif not args.model:
        raise UserError("port needs --model NAME (a timm model), or --from DIR (a transformers model folder)")
    elif args.from_file:
        model, dc, _ = from_checkpoint(args.from_file, args.model)
        name, source, default_out = args.model, str(args.from_file), args.model
    else:
        model, dc = from_hub(args.model)
        name, source, default_out = args.model, f"hub:{args.model}", args.model
    out = Path(args.out) if args.out else weights_dir() / f"{default_out}.safetensors"
    save(model, dc, out, name=name, source=source, class_names=names, extra_meta=extra)
    what = f", {len(names)} class names" if names else ""
    print(f"saved {out} ({model.num_params:,} parameters{what}; reloads without timm or transformers)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import format_report, verify

    if args.weights and args.random_init:
        raise UserError("--weights and --random-init exclude each other")
    size = None
    if args.input_size:
        h, _, w = args.input_size.lower().partition("x")
        size = (int(h), int(w or h))
    images = [args.images] if args.images else []
    if args.reference and args.random_init:
        raise UserError("--reference and --random-init exclude each other")
    r = verify(args.model, args.weights, args.random_init, images, args.device, args.tol, size, args.batch_size,
               reference=args.reference)
    print(json.dumps(r, indent=2) if args.json else format_report(r))
    return 0 if r["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vit-demo", description="A Vision Transformer from scratch, checked against timm.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("predict", help="top-k ImageNet predictions for images or folders")
    p.add_argument("images", nargs="+", help="image files or folders")
    add_model_args(p)
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("port", help="port timm or transformers weights to a safetensors file that loads without either")
    p.add_argument("--model", help="timm model name (the architecture; not needed for a transformers folder)")
    p.add_argument("--from", dest="from_file",
                   help="local checkpoint file, or a transformers model folder (config.json + model.safetensors "
                        "or pytorch_model.bin); else timm's weights from the hub, when reachable")
    p.add_argument("--out", help="output file (default weights/NAME.safetensors)")
    p.set_defaults(func=cmd_port)

    p = sub.add_parser("verify", help="compare the scratch model with timm's (or transformers') on the same weights")
    add_model_args(p, random_init=True)
    p.add_argument("--reference", metavar="DIR",
                   help="a transformers model folder: compare with transformers' own model (needs transformers)")
    p.add_argument("--images", help="folder or image file (default: 8 random-noise inputs)")
    p.add_argument("--input-size", help="HxW model input, e.g. 256x384 (timm with dynamic_img_size)")
    p.add_argument("--tol", type=float, default=1e-4, help="max abs logit difference allowed")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_verify)

    for name in PLUGINS:
        try:
            importlib.import_module(name).register(sub)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "0")
    args = build_parser().parse_args(argv)
    from .images import ImageError
    from .port import CheckpointError, HubUnavailableError, UnsupportedModelError

    try:
        return args.func(args)
    except (UserError, ImageError, CheckpointError, HubUnavailableError, UnsupportedModelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
