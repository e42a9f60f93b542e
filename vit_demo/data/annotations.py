"""A shapes folder's ``boxes.json``: the box of every shape and of every watermark.

``boxes.json`` maps each picture's path relative to the folder to ``[x0, y0, x1, y1]`` in pixel
coordinates of the written picture (continuous, x1 / y1 exclusive) under ``"boxes"``; a folder
made with a shortcut lists its watermarks' boxes the same way under ``"watermarks"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BOXES_FILE = "boxes.json"


class DataError(ValueError):
    """A data folder that cannot be used (trained on, or its boxes read); the message says why, in one line."""


def read_boxes(root: str | os.PathLike) -> dict[str, list[float]]:
    """``relative path -> [x0, y0, x1, y1]`` from a shapes folder's ``boxes.json``."""
    p = Path(root) / BOXES_FILE
    if not p.is_file():
        raise DataError(f"{root}: no {BOXES_FILE} (make one with `python -m vit_demo data shapes --out DIR`)")
    try:
        return dict(json.loads(p.read_text())["boxes"])
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{p}: not a boxes file this project wrote ({type(e).__name__}: {e})") from e


def read_watermarks(root: str | os.PathLike) -> dict[str, list[float]]:
    """``relative path -> box`` of every watermarked picture of a shapes folder (empty without a shortcut)."""
    p = Path(root) / BOXES_FILE
    try:
        return dict(json.loads(p.read_text()).get("watermarks", {})) if p.is_file() else {}
    except (ValueError, TypeError, AttributeError) as e:
        raise DataError(f"{p}: not a boxes file this project wrote ({type(e).__name__}: {e})") from e
