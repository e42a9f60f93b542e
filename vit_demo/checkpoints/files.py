"""Checkpoint files: read any of the formats (safetensors, weights-only ``.pth``/``.bin``,
``.npz``), check a state dict against the model key by key and shape by shape, and save the
project's own format (safetensors with the config in its metadata; reloads without timm).

Strict, like nanoGPT's ``from_pretrained``: every checkpoint key must be used, every shape must
match, and an error names what does not.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..model import VisionTransformer, ViTConfig
from ..preprocess import DataConfig

FORMAT_TAG = "vit_demo/1"  # stored in safetensors metadata under "format"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model; the message names the keys."""


class UnsupportedModelError(ValueError):
    """A timm model outside the plain-ViT family this project implements."""


# ----------------------------------------------------------------------------- strict loading


def expected_state(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs (the scratch model, or timm's), with its shape (timm's key names)."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Raise :class:`CheckpointError` naming missing, unexpected, mis-shaped and non-finite keys."""
    want = expected_state(model)
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    misshaped = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {want[k]}"
        for k in want
        if k in sd and tuple(sd[k].shape) != want[k]
    ]
    nonfinite = [k for k in want if k in sd and sd[k].is_floating_point() and not bool(torch.isfinite(sd[k]).all())]
    if missing or unexpected or misshaped or nonfinite:
        lines = [f"{source} does not fit this architecture:"]
        for what, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                           ("wrong shapes", misshaped), ("NaN/Inf values in", nonfinite)):
            if keys:
                shown = ", ".join(keys[:12]) + (f", ... ({len(keys)} in all)" if len(keys) > 12 else "")
                lines.append(f"  {what}: {shown}")
        raise CheckpointError("\n".join(lines))


def load_state_dict_strict(model: VisionTransformer, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``sd`` into ``model`` after checking every key and shape. All or nothing."""
    check_state_dict(model, sd, source)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(sd[k].to(v.dtype))


# ----------------------------------------------------------------------------- reading files


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (timm key layout) and metadata from a .safetensors, .pth/.bin or .npz file.

    ``.pth`` / ``.bin`` are opened with ``torch.load(weights_only=True)``: a pickle that would
    build arbitrary objects or run code is refused, never executed.
    """
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file")
    if (size := p.stat().st_size) < 8:
        raise CheckpointError(f"{p.name}: file is {size} byte{'' if size == 1 else 's'}, too small to be a checkpoint")
    suffix = p.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(p), framework="pt") as f:
                meta = f.metadata() or {}
                return {k: f.get_tensor(k) for k in f.keys()}, meta
        if suffix in (".pth", ".pt", ".bin", ".ckpt"):
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
            return _unwrap_state_dict(obj, p), {}
        if suffix == ".npz":
            with np.load(str(p), allow_pickle=False) as z:
                return {k: torch.from_numpy(np.array(z[k])) for k in z.files}, {}
    except CheckpointError:
        raise
    except Exception as e:  # safetensors/torch/numpy raise many types for broken files
        msg = str(e).strip().split("\n")[0][:300]
        if isinstance(e, pickle.UnpicklingError) and "weights only load failed" in str(e).lower():
            # torch's message advises weights_only=False: never echo that; name what was asked for
            glob = re.search(r"GLOBAL (\S+?)\.? ", str(e))
            if glob:
                raise CheckpointError(
                    f"{p.name}: refused - the pickle asks for {glob.group(1)}, not plain tensors "
                    f"(loading it could run code). Only weights-only checkpoints are loaded."
                ) from e
            op = re.search(r"Unsupported operand \d+", str(e))
            met = op.group(0).lower() if op else "a forbidden instruction"
            raise CheckpointError(
                f"{p.name}: refused - not a weights-only checkpoint (the safe loader met {met}: "
                f"a corrupt file, or one that could run code)."
            ) from e
        raise CheckpointError(f"{p.name}: cannot read the checkpoint ({type(e).__name__}: {msg})") from e
    raise CheckpointError(f"{p.name}: unknown checkpoint format {suffix!r} (use .safetensors, .pth, .bin or .npz)")


def _unwrap_state_dict(obj: Any, p: Path) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_ema", "module"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
        sd = {k.removeprefix("module."): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if sd:
            return sd
    raise CheckpointError(f"{p.name}: no tensors found (expected a state_dict)")


def is_timm_layout(sd: dict[str, Any]) -> bool:
    return "patch_embed.proj.weight" in sd or any(k.startswith("blocks.") for k in sd)



def from_saved(path: Path, sd: dict[str, torch.Tensor], meta: dict[str, str]) -> tuple[VisionTransformer, DataConfig]:
    """A model from a file this project saved (``meta["format"] == FORMAT_TAG``): its stored
    config, checked on the meta device first, so that a forged config cannot make us allocate."""
    try:
        cfg = ViTConfig.from_dict(json.loads(meta["config"]))
        dc = DataConfig.from_dict(json.loads(meta["data_config"]))
        with torch.device("meta"):  # shapes only
            skeleton = VisionTransformer(cfg)
    except (KeyError, TypeError, ValueError, ArithmeticError, RuntimeError) as e:
        msg = str(e).strip().split("\n")[0][:300]
        raise CheckpointError(
            f"{path.name}: its stored config is unreadable or invalid ({type(e).__name__}: {msg})"
        ) from e
    check_state_dict(skeleton, sd, source=path.name)  # the file must fit the config before any real model
    model = VisionTransformer(cfg)
    model.load_state_dict(sd, strict=True)  # checked above: keys, shapes and values fit
    return model.eval(), dc


# ----------------------------------------------------------------------------- saving


def save(
    model: VisionTransformer,
    dc: DataConfig,
    path: str | os.PathLike,
    name: str = "",
    source: str = "",
    class_names: list[str] | tuple[str, ...] | None = None,
    extra_meta: dict[str, str] | None = None,
) -> Path:
    """Write weights (timm key layout) and config to safetensors; reloads without timm.

    ``class_names`` (one per output) are stored as JSON under ``class_names``; ``extra_meta``
    adds string entries (e.g. a training summary)."""
    from safetensors.torch import save_file

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT_TAG,
        "config": json.dumps(model.cfg.to_dict()),
        "data_config": json.dumps(dc.to_dict()),
        "model_name": name,
        "source": source,
        **(extra_meta or {}),
    }
    if class_names is not None:
        if len(class_names) != model.cfg.num_classes:
            raise ValueError(f"{len(class_names)} class names for a head with {model.cfg.num_classes} outputs")
        meta["class_names"] = json.dumps(list(class_names))
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = p.with_suffix(p.suffix + ".tmp")
    save_file(sd, str(tmp), metadata=meta)
    tmp.replace(p)  # never leave a half-written checkpoint in weights/
    return p

