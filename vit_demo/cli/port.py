"""``port``: timm or transformers weights -> a safetensors file that loads without either."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..checkpoints.files import save
from ..checkpoints.hf import from_hf_folder, is_hf_folder
from ..checkpoints.load import class_names_from_meta, from_checkpoint, weights_dir
from ..checkpoints.timm import from_hub
from .common import UserError, add_output


def register(sub: Any) -> None:
    p = sub.add_parser("port", help="port timm or transformers weights to a safetensors file that loads without either")
    p.add_argument("--model", help="timm model name (the architecture; not needed for a transformers folder)")
    p.add_argument("--from", dest="from_file",
                   help="local checkpoint file, or a transformers model folder (config.json + model.safetensors "
                        "or pytorch_model.bin); else timm's weights from the hub, when reachable")
    add_output(p, "--out", "file", help="output file (default weights/NAME.safetensors; its folder is made when missing)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
