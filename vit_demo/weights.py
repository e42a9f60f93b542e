"""Where a model's weights come from: a file the user gave, ``weights/``, timm's random
initialisation, or the hub (only when it is reachable, failing fast otherwise)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .labels import labels_for
from .model import VisionTransformer
from .port import CheckpointError, from_checkpoint, from_hub, from_timm, timm_model
from .preprocess import DataConfig

CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
ENV_WEIGHTS = "VIT_DEMO_WEIGHTS"  # extra checkpoint files or folders, os.pathsep-separated
ENV_WEIGHTS_DIR = "VIT_DEMO_WEIGHTS_DIR"  # overrides the default weights/ folder


def weights_dir() -> Path:
    """The project's ``weights/`` folder (or $VIT_DEMO_WEIGHTS_DIR)."""
    env = os.environ.get(ENV_WEIGHTS_DIR)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "weights"


def discover_checkpoints(extra: list[str | os.PathLike] = ()) -> list[Path]:
    """Checkpoint files in ``weights/``, in $VIT_DEMO_WEIGHTS and in ``extra`` (no duplicates)."""
    roots = [weights_dir(), *[p for p in os.environ.get(ENV_WEIGHTS, "").split(os.pathsep) if p], *extra]
    found: list[Path] = []
    seen: set[Path] = set()
    for root in map(Path, roots):
        files = sorted(root.iterdir()) if root.is_dir() else [root]
        for f in files:
            if f.is_file() and f.name.endswith(CHECKPOINT_SUFFIXES) and f.resolve() not in seen:
                seen.add(f.resolve())
                found.append(f)
    return found


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then the CPU."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is available on this machine")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("--device mps: Apple MPS is not available on this machine")
    return torch.device(device)


@dataclass
class LoadedModel:
    """A ready-to-run scratch model and everything needed to use and describe it."""

    model: VisionTransformer
    data_config: DataConfig
    name: str  # what to show people
    source: str  # where the weights came from, in words
    timm_name: str | None  # timm architecture name, for comparisons (None if unknown)
    random_weights: bool = False

    @property
    def labels(self) -> tuple[str, ...]:
        return labels_for(self.model.cfg.num_classes)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_model(
    name: str | None = None,
    weights: str | os.PathLike | None = None,
    random_init: bool = False,
    device: str = "auto",
    seed: int = 0,
) -> LoadedModel:
    """Resolve a model the way the CLI and the app do.

    - ``weights``: that file (``name`` gives the architecture for plain timm-layout files);
    - ``random_init``: timm's random initialisation of ``name`` (no download);
    - ``name`` alone: ``weights/NAME.*`` if present, else the hub (fails fast offline).
    """
    dev = resolve_device(device)
    if weights is not None:
        model, dc, meta = from_checkpoint(weights, name)
        timm_name = meta.get("model_name") or name
        lm = LoadedModel(model, dc, timm_name or Path(weights).stem, f"file {weights}", timm_name)
    elif random_init:
        if not name:
            raise ValueError("--random-init needs --model NAME (any ViT name timm knows)")
        torch.manual_seed(seed)
        model, dc = from_timm(timm_model(name))
        lm = LoadedModel(model, dc, f"{name} (random weights)", "timm random initialisation", name, True)
    elif name:
        local = [p for p in discover_checkpoints() if p.name.split(".")[0] == name.split(".")[0] or p.stem == name]
        if local:
            return load_model(name, local[0], device=device)
        model, dc = from_hub(name)
        lm = LoadedModel(model, dc, name, "hub (timm pretrained)", name)
    else:
        found = discover_checkpoints()
        if not found:
            raise CheckpointError(
                f"no model given and no checkpoint in {weights_dir()}: pass --model NAME and "
                f"--weights FILE, or see weights/README.md"
            )
        return load_model(None, found[0], device=device)
    lm.model.to(dev).eval()
    return lm
