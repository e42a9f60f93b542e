"""``python -m vit_demo COMMAND``: the parser, built from one module per command, and the one
place where expected errors become a line on stderr with exit code 2."""

from __future__ import annotations

import argparse
import os
import sys

from ..checkpoints.timm import HubUnavailableError
from . import atlas, data, deck, explain, faithfulness, pointing, port, predict, sanity, steps, survey, train, verify
from .common import UserError, prepare_outputs

COMMANDS = (predict, port, verify, explain, steps, faithfulness, sanity, data, train, pointing, survey, atlas, deck)
"""Each has ``register(subparsers)``; the order is the order of ``--help``."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vit-demo", description="A Vision Transformer from scratch, checked against timm.")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "0")
    args = build_parser().parse_args(argv)
    try:
        prepare_outputs(args)  # every output's folder made, or refused, before any work
        return args.func(args)
    except (UserError, HubUnavailableError, ValueError) as e:  # ValueError: ImageError, CheckpointError, DataError...
        print(f"error: {e}", file=sys.stderr)
        return 2
