"""Where a model's weights come from: a file the user gave (any checkpoint format, or a
transformers folder), ``weights/``, timm's random initialisation, or the hub (only when it is
reachable, failing fast otherwise), and the :class:`LoadedModel` every command and the app use."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ..labels import labels_for
from ..model import VisionTransformer
from ..precision import describe, resolve, set_precision
from ..preprocess import DataConfig, fit_to_sequence
from .files import FORMAT_TAG, CheckpointError, from_saved, read_checkpoint, save
from .hf import META_ARCHITECTURE, from_hf_folder, is_hf_folder
from .timm import from_hub, from_timm, from_timm_file, timm_model

CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz")
ENV_WEIGHTS = "VIT_DEMO_WEIGHTS"  # extra checkpoint files or folders, os.pathsep-separated
ENV_WEIGHTS_DIR = "VIT_DEMO_WEIGHTS_DIR"  # overrides the default weights/ folder

# The checkpoint that ships with the repository (see weights/README.md): a real ImageNet DeiT-Tiny.
DEFAULT_MODEL = "deit_tiny_patch16_224"
DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "weights" / f"{DEFAULT_MODEL}.safetensors"
DEFAULT_SHA256 = "9c82f0d7bd2e747b8c1112c01d124ba5f7682cd4a802eea337dcf14fad2f6684"
DEFAULT_BYTES = 22_883_432  # its size: a file of another size is not it (no hash read)
META_CLASS_NAMES = "class_names"  # safetensors metadata key: JSON list of the head's class names


def weights_dir() -> Path:
    """The project's ``weights/`` folder (or $VIT_DEMO_WEIGHTS_DIR)."""
    env = os.environ.get(ENV_WEIGHTS_DIR)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "weights"


@cache
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file (cached per path, size and modification time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_checkpoint() -> Path:
    """The embedded DeiT-Tiny, its sha256 verified (once per process and file version).

    Raises CheckpointError with what to do when it is missing, truncated or corrupted."""
    p = DEFAULT_CHECKPOINT
    if not p.is_file():
        raise CheckpointError(
            f"the default checkpoint {p} is missing: restore it with `git checkout -- weights/` "
            f"(it ships with the repository; see weights/README.md)"
        )
    st = p.stat()
    digest = file_sha256(str(p), st.st_size, st.st_mtime_ns)
    if digest != DEFAULT_SHA256:
        raise CheckpointError(
            f"the default checkpoint {p} is corrupted or truncated ({st.st_size} bytes, sha256 "
            f"{digest[:12]}..., expected {DEFAULT_SHA256[:12]}...): restore it with "
            f"`git checkout -- weights/{p.name}` (see weights/README.md)"
        )
    return p


def is_shipped(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is the DeiT-Tiny that ships with the project, by content (its sha256, read once
    per file version and only for a file of its size): the model the project's measured figures were
    taken on (docs/performance.md, docs/faithfulness.md), which no other model may quote."""
    if path is None:
        return False
    try:
        st = Path(path).stat()
    except OSError:
        return False
    return (st.st_size == DEFAULT_BYTES and Path(path).is_file()
            and file_sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns) == DEFAULT_SHA256)


def from_checkpoint(
    path: str | os.PathLike, model_name: str | None = None
) -> tuple[VisionTransformer, DataConfig, dict[str, str]]:
    """Load a checkpoint file into a scratch model: a file this project saved carries its config
    and loads with no timm (:func:`~.files.from_saved`); a timm-layout file needs the timm model
    name for its architecture (``model_name``, or the file's stem when it is a timm name, e.g.
    ``deit_tiny_patch16_224.safetensors``; :func:`~.timm.from_timm_file`)."""
    p = Path(path)
    sd, meta = read_checkpoint(p)
    if meta.get("format") == FORMAT_TAG:
        model, dc = from_saved(p, sd, meta)
        return model, dc, meta
    return from_timm_file(p, sd, model_name)


def class_names_from_meta(meta: dict[str, str]) -> tuple[str, ...] | None:
    """Class names stored in a checkpoint's metadata (``class_names``: a JSON list), if any."""
    raw = meta.get(META_CLASS_NAMES)
    if not raw:
        return None
    try:
        names = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"the checkpoint's class_names metadata is not valid JSON ({e})") from e
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError("the checkpoint's class_names metadata must be a JSON list of strings")
    return tuple(names)


def discover_checkpoints() -> list[Path]:
    """Checkpoint files in ``weights/`` and in $VIT_DEMO_WEIGHTS (no duplicates)."""
    roots = [weights_dir(), *[p for p in os.environ.get(ENV_WEIGHTS, "").split(os.pathsep) if p]]
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
    class_names: tuple[str, ...] | None = None  # from the checkpoint's metadata (ported / trained)
    precision: str = "fp32"  # what the model runs in: "fp32", or "bf16" (vit_demo.precision.set_precision)
    precision_note: str = "fp32"  # that choice and why, in words: "bf16 (auto: this CPU has AVX512-BF16)"
    # the DeiT-Tiny that ships with the project (is_shipped, read from the file at load: the app renames
    # source), the only model the project's measured figures (fidelity, faithfulness) may be quoted for
    shipped: bool = False

    @property
    def labels(self) -> tuple[str, ...]:
        """The checkpoint's own class names when it has them, else ImageNet's (or ``class i``)."""
        if self.class_names is not None and len(self.class_names) == self.model.cfg.num_classes:
            return self.class_names
        return labels_for(self.model.cfg.num_classes)

    @property
    def public_source(self) -> str:
        """:attr:`source` fit to print in a slide, a figure or a page: a file by its name only,
        never its folder on this computer."""
        if self.source.startswith("file "):
            return f"the file {Path(self.source[5:]).name}"
        return self.source

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def input_config(self, size: tuple[int, int]) -> DataConfig:
        """The transform for a picture of ``size`` (w, h): the data config, or for a NaFlex model
        the picture's own aspect ratio within the model's patch budget (its patch grid follows)."""
        if self.model.cfg.naflex:
            return fit_to_sequence(self.data_config, size, self.model.cfg.patch_size)
        return self.data_config


def load_model(
    name: str | None = None,
    weights: str | os.PathLike | None = None,
    random_init: bool = False,
    device: str = "auto",
    progress: bool = True,
    precision: str = "fp32",
) -> LoadedModel:
    """Resolve a model the way the CLI and the app do.

    - nothing: the embedded default checkpoint (``weights/deit_tiny_patch16_224.safetensors``);
    - ``weights``: that file (``name`` gives the architecture for plain timm-layout files), or a
      Hugging Face transformers model folder (ported on the fly; see checkpoints/hf.py);
    - ``random_init``: timm's random initialisation of ``name`` (no download), seeded with 0;
    - ``name`` alone: ``weights/NAME.*`` if present, else timm's pretrained weights from the
      hub, ported once to ``weights/NAME.safetensors`` (fails fast offline).

    ``precision``: "fp32" (the default here; the commands and the app default to "auto"), "bf16",
    or "auto": bf16 where the device computes it natively (:mod:`vit_demo.precision`).
    """
    dev = resolve_device(device)
    if weights is not None:
        if Path(weights).resolve() == DEFAULT_CHECKPOINT:
            default_checkpoint()  # sha256 check of the embedded file: a clear error, not a crash
        if is_hf_folder(weights):  # a transformers model folder, ported on the fly
            model, dc, meta = from_hf_folder(weights)
        else:
            model, dc, meta = from_checkpoint(weights, name)
        # a file ported from transformers has no timm twin; others name their timm architecture
        timm_name = None if meta.get(META_ARCHITECTURE) else (meta.get("model_name") or name)
        lm = LoadedModel(model, dc, meta.get("model_name") or name or Path(weights).stem, f"file {weights}", timm_name,
                         class_names=class_names_from_meta(meta), shipped=is_shipped(weights))
    elif random_init:
        if not name:
            raise ValueError("--random-init needs --model NAME (any ViT name timm knows)")
        torch.manual_seed(0)
        model, dc = from_timm(timm_model(name))
        lm = LoadedModel(model, dc, f"{name} (random weights)", "timm random initialisation", name, True)
    elif name:
        local = local_checkpoint(name)
        if local is None:
            local = download_to_weights(name, progress=progress)
        return load_model(name, local, device=device, precision=precision)
    else:
        return load_model(DEFAULT_MODEL, default_checkpoint(), device=device, precision=precision)
    lm.model.to(dev).eval()
    return with_precision(lm, precision)


def with_precision(lm: LoadedModel, setting: str) -> LoadedModel:
    """``lm`` set to run in ``setting`` (auto, fp32 or bf16) on its device: its model instance and its
    ``precision`` / ``precision_note``."""
    lm.precision, lm.precision_note = resolve(setting, lm.device), describe(setting, lm.device)
    set_precision(lm.model, lm.precision)
    return lm


def local_checkpoint(name: str) -> Path | None:
    """A checkpoint for timm model ``name`` already on disk: ``weights/NAME.*`` (or a file in
    $VIT_DEMO_WEIGHTS named so), else the embedded one when ``name`` is the default model."""
    base = name.split(".")[0]
    found = discover_checkpoints()
    for p in found:  # the exact name first (e.g. a tagged vit_small_patch16_224.augreg_in1k)
        if p.stem == name:
            return p
    for p in found:
        if p.name.split(".")[0] == base:
            return p
    return DEFAULT_CHECKPOINT if base == DEFAULT_MODEL and DEFAULT_CHECKPOINT.is_file() else None


def download_to_weights(name: str, progress: bool = True) -> Path:
    """timm's pretrained weights for ``name`` from the hub (timm's own download, into the
    Hugging Face cache, with a progress bar), ported once to ``weights/NAME.safetensors``."""
    out = weights_dir() / f"{name}.safetensors"
    if progress:
        print(f"{name}: not in {weights_dir()}; downloading timm's pretrained weights from the hub (once)",
              file=sys.stderr, flush=True)
    model, dc = from_hub(name, progress=progress)
    save(model, dc, out, name=name, source=f"hub:{name}")
    if progress:
        print(f"{name}: ported to {out} (later starts load it offline)", file=sys.stderr, flush=True)
    return out
