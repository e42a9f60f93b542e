"""What the commands share: the one error type they report, the model flags, the class and
method arguments, the images-and-methods pair of the evaluation commands, the flags, the
prologue and the ending of the jobs over a folder (atlas, survey), and the outputs.

Every flag that names an output is declared with :func:`add_output` (a file, or a folder);
:func:`prepare_outputs` runs before the command does any work and makes each one's folder, with
its parents, or refuses in one line (exit code 2) when it cannot be made or written: a file in
the way, a folder where a file is wanted, no permission. No command then fails at its end, after
minutes of work, on a folder that does not exist."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import methods
from ..checkpoints.load import LoadedModel, load_model
from ..evaluate.faithfulness import spread
from ..evaluate.survey import LABEL_MODES
from ..images import find_images
from ..precision import PRECISIONS

DEVICES = ["auto", "cpu", "cuda", "mps"]
KINDS = ("file", "folder")  # what an output flag names


class UserError(Exception):
    """Reported as one line on stderr with exit code 2 (no traceback)."""


def add_model_args(parser: argparse.ArgumentParser, random_init: bool = False, precision: str | None = None) -> None:
    """--model / --weights / --device, shared by every command that loads a model; --precision with
    ``precision`` as its default where given (the commands without it run in float32)."""
    parser.add_argument("--model", help="timm model name: weights/NAME.safetensors, else downloaded from the hub once "
                   "(default: the embedded deit_tiny_patch16_224)")
    parser.add_argument("--weights", help="checkpoint file (.safetensors, .pth/.bin or .npz in timm layout) or a "
                   "transformers model folder (default: weights/deit_tiny_patch16_224.safetensors)")
    if random_init:
        parser.add_argument("--random-init", action="store_true", help="timm's random initialisation (no download)")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    if precision is not None:
        parser.add_argument("--precision", default=precision, choices=PRECISIONS,
                            help=f"auto: bfloat16 where the device computes it natively (a CPU with AVX512-BF16 or "
                                 f"AMX, a GPU with bf16), float32 elsewhere; fp32; bf16 (default {precision}; "
                                 f"docs/performance.md says what bf16 costs in fidelity)")


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    """The model the model flags name, in the precision --precision asks for (float32 without the flag)."""
    return load_model(args.model, args.weights, random_init=getattr(args, "random_init", False), device=args.device,
                      precision=getattr(args, "precision", "fp32"))


def say_precision(lm: LoadedModel) -> None:
    """The header line on stderr: the model, where it runs and in what precision, and why
    ("deit_tiny_patch16_224 on cpu in bf16 (auto: this CPU has AVX512-BF16)"). Under torchrun, process 0 only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{lm.name} on {lm.device.type} in {lm.precision_note}", file=sys.stderr, flush=True)


def parse_class(text: str, labels: tuple[str, ...]) -> int:
    """A --class value: an index, or a label naming exactly one class."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        i = int(text)
        if not 0 <= i < len(labels):
            raise UserError(f"--class {i} is outside 0..{len(labels) - 1}")
        return i
    hits = [i for i, name in enumerate(labels) if name.lower() == text.lower()]
    if not hits:
        raise UserError(f"--class {text!r}: no class has that label; give its index (0..{len(labels) - 1})")
    if len(hits) > 1:
        raise UserError(f"--class {text!r} names classes {', '.join(map(str, hits))}; give the index")
    return hits[0]


def parse_methods(spec: str) -> list[str]:
    """A --methods value: comma-separated registered names (as :func:`vit_demo.methods.find` reads
    them: any case), or ``all``; checked, each unknown one with the names it may mean."""
    known = methods.names()
    if spec.strip().lower() == "all":
        return list(known)
    chosen = [m.strip() for m in spec.split(",") if m.strip()]
    unknown = [m for m in chosen if not is_method(m)]
    if unknown or not chosen:
        said = ", ".join(f"{m}{methods.did_you_mean(m, known)}" for m in unknown) or "(none given)"
        raise UserError(f"unknown method(s) {said}; known: {', '.join(known)}, all")
    return [methods.find(m) for m in chosen]


def is_method(name: str) -> bool:
    """Whether ``name`` is a registered method as :func:`vit_demo.methods.find` reads it."""
    try:
        methods.find(name)
    except ValueError:
        return False
    return True


def method_arg(choices: list[str]) -> Callable[[str], str]:
    """An argparse ``type`` for a --method taking ``choices``: the name as :func:`vit_demo.methods.find`
    reads it (any case), or an error with the names it may mean."""

    def parse(text: str) -> str:
        try:
            return methods.find(text, choices)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "method"
    return parse


def add_images_and_methods_args(parser: argparse.ArgumentParser, images_help: str) -> None:
    """--images, the model flags, --methods and --limit: what :func:`images_and_methods` reads."""
    parser.add_argument("--images", required=True, help=images_help)
    add_model_args(parser)
    parser.add_argument("--methods", default=",".join(methods.single_pass()),
                   help=f"comma-separated, from {', '.join(methods.names())}; or 'all' "
                        f"(default: all but {', '.join(methods.slow())})")
    parser.add_argument("--limit", type=int, help="use N images evenly spaced through the sorted folder")


def images_and_methods(args: argparse.Namespace) -> tuple[list[Path], list[str]]:
    """--images (spread over --limit) and --methods (names or ``all``), checked."""
    paths = find_images([args.images])
    if not paths:
        raise UserError(f"no images found in {args.images}")
    if args.limit is not None:
        paths = spread(paths, args.limit)
    return paths, parse_methods(args.methods)


def device_for_rank(device: str) -> str:
    """Under torchrun on GPUs, each process takes the GPU of its local rank."""
    local = os.environ.get("LOCAL_RANK")
    if local is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1 and device in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(int(local))
            return f"cuda:{int(local)}"
    return device


def add_folder_job_args(parser: argparse.ArgumentParser, out_help: str) -> None:
    """The flags of a job over a folder of pictures (atlas, survey): --images, the model flags,
    --labels, --limit, --batch-size, --out (``out_help``), --no-progress and --json."""
    parser.add_argument("--images", required=True, help="a folder: an ImageFolder (DIR/<class>/<image>) or ImageNet-named files")
    add_model_args(parser, precision="auto")
    parser.add_argument("--labels", default="auto", choices=LABEL_MODES,
                   help="where the true classes come from: the sub-folders, the ImageNet file names, or auto (default)")
    parser.add_argument("--limit", type=int, help="use N pictures spread evenly through the sorted folder")
    parser.add_argument("--batch-size", type=int, default=16)
    add_output(parser, "--out", "folder", required=True, help=out_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def start_folder_job(args: argparse.Namespace) -> tuple[LoadedModel, bool]:
    """A folder job's prologue: --limit checked, the model the flags name (on this process's GPU
    under torchrun) in the precision --precision asks for, its header line on stderr, and whether
    to show a progress bar (not with --no-progress or --json)."""
    if args.limit is not None and args.limit < 1:
        raise UserError("--limit must be at least 1")
    lm = load_model(args.model, args.weights, device=device_for_rank(args.device), precision=args.precision)
    say_precision(lm)
    return lm, not (args.no_progress or args.json)


def end_folder_job(args: argparse.Namespace, result: dict[str, Any], summary: Callable[[], str]) -> int:
    """A folder job's last words: the result as one JSON object with --json, else ``summary()``."""
    print(json.dumps(result) if args.json else summary())
    return 0


# ----------------------------------------------------------------------------- outputs


def add_output(parser: argparse.ArgumentParser, flag: str, kind: str, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(flag, **kwargs)``, recorded as an output of ``kind`` ("file": its folder
    is made; "folder": the folder itself is made) for :func:`prepare_outputs`."""
    if kind not in KINDS:
        raise ValueError(f"an output is a {' or a '.join(KINDS)}, not {kind!r}")
    action = parser.add_argument(flag, **kwargs)
    parser.set_defaults(outputs=(*(parser.get_default("outputs") or ()), (action.dest, flag, kind)))
    return action


def declared_outputs(args: argparse.Namespace) -> tuple[tuple[str, str, str], ...]:
    """(dest, flag, kind) of every output the parsed command declared."""
    return tuple(getattr(args, "outputs", None) or ())


def prepare_outputs(args: argparse.Namespace) -> list[Path]:
    """Make the folder of every output the command was given (``None``: a flag left out); returns the
    folders. Raises :class:`UserError` before any of them is half made when one cannot be."""
    wanted = []
    for dest, flag, kind in declared_outputs(args):
        value = getattr(args, dest, None)
        if value is None or str(value) == "":
            continue
        wanted.append((flag, Path(value), kind))
    for flag, path, kind in wanted:  # refuse on any of them before making the others' folders
        check_output(flag, path, kind)
    made = []
    for flag, path, kind in wanted:
        folder = path if kind == "folder" else path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{flag} {path}: cannot make the folder {folder} ({e.strerror or e})") from None
        made.append(folder)
    return made


def check_output(flag: str, path: Path, kind: str) -> None:
    """Refuse ``path`` when it cannot become an output of ``kind``: it is the other kind already, a
    file stands where one of its folders should be, or the nearest existing folder is read-only."""
    if kind == "file" and path.is_dir():
        raise UserError(f"{flag} {path}: that is a folder; give a file name (in it, or elsewhere)")
    if kind == "folder" and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: that is a file, not a folder; give a folder (it is made when missing)")
    folder = path if kind == "folder" else path.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        why = "not a folder" if existing == folder else f"so the folder {folder} cannot be made"
        raise UserError(f"{flag} {path}: {existing} is a file, {why}")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path}: {existing} is not writable (no permission)")

