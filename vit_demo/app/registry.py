"""The model registry: the models a user can pick, loaded lazily and shared by every session.

Checkpoints found on disk (``--weights``, ``weights/``, ``$VIT_DEMO_WEIGHTS``), a random-weights
model, hub names tried only when picked, and checkpoints a user loads from the UI (on that
user's menu only). Loaded models and their timm twins share one memory budget (least recently
used leave first, never the model in use); the analyses (one per image and model) are kept in
an :class:`~vit_demo.analysis.AnalysisCache` with a budget of its own. No Gradio here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from .. import viz
from ..analysis import Analysis, AnalysisCache, analyze, class_maps
from ..budget import DEFAULT_CACHE_MB, DEFAULT_MODELS_MB, MB, ByteLRU, module_nbytes
from ..checkpoints.files import CheckpointError, UnsupportedModelError
from ..checkpoints.hf import is_hf_folder
from ..checkpoints.load import (
    DEFAULT_CHECKPOINT,
    DEFAULT_MODEL,
    LoadedModel,
    discover_checkpoints,
    load_model,
    local_checkpoint,
)
from ..checkpoints.timm import HubUnavailableError
from ..checkpoints.verify import timm_twin
from ..methods.attention import head_maps

RANDOM_MODEL = "deit_tiny_patch16_224"
HUB_MODELS = (  # offered when the user wants pretrained weights from the hub (tried only when picked)
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_base_distilled_patch16_224",
    "deit3_small_patch16_224",
    "vit_base_patch16_224",
    "vit_small_patch16_224.dino",
)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the model menu. ``key`` is what the menu and the API pass around."""

    key: str  # "file:/abs/path", "random:NAME" or "hub:NAME"
    label: str
    kind: str  # "file", "random", "hub"
    name: str | None  # timm architecture name (None: read it from the file)
    path: Path | None = None


class ModelError(ValueError):
    """A model that cannot be loaded, in one readable line."""


def _file_label(path: Path, name: str | None) -> str:
    arch = name or path.name.split(".")[0]
    return f"{arch}  ·  {path.name}"


def _weight(item: Any) -> int:
    """Bytes of a loaded model (a LoadedModel) or a timm twin (an nn.Module)."""
    return module_nbytes(item.model if isinstance(item, LoadedModel) else item)


class ModelRegistry:
    """The models on offer, loaded on first use and kept in memory within ``models_bytes``.

    ``weights``: checkpoint files given on the command line (``--weights``); ``model_name``:
    the architecture for them (``--model``) and the model to select first. ``allow_paths``:
    whether a user may load any checkpoint path from the UI (off when the app is exposed);
    ``allow_uploads``: whether a user may upload one. ``models_bytes``: the budget for loaded
    models and their timm twins together (the least recently used leave; the model in use
    stays, whatever its size); ``cache_bytes``: the budget for analyses.
    """

    def __init__(
        self,
        weights: Sequence[str | os.PathLike] = (),
        model_name: str | None = None,
        hub_names: Sequence[str] = HUB_MODELS,
        device: str = "cpu",
        allow_paths: bool = True,
        allow_uploads: bool = True,
        models_bytes: int = DEFAULT_MODELS_MB * MB,
        cache_bytes: int = DEFAULT_CACHE_MB * MB,
    ) -> None:
        self.device = device
        self.allow_paths = allow_paths
        self.allow_uploads = allow_uploads
        self.model_name = model_name
        self._specs: dict[str, ModelSpec] = {}
        self._private: set[str] = set()  # keys one session added (an upload, a typed path): not on everyone's menu
        # ("model", key) -> LoadedModel and ("twin", key) -> timm's nn.Module, one budget
        self._models: ByteLRU[tuple[str, str], Any] = ByteLRU(models_bytes, _weight, on_evict=self._evicted)
        self._pictures: dict[tuple[str, str], Image.Image] = {}
        self._lock = threading.RLock()  # re-entrant: add_checkpoint holds it while _forget takes it
        self._key_locks: dict[str, threading.Lock] = {}
        given = [Path(w) for w in weights]
        for p in given:
            self._add(self._file_spec(p, model_name))
        default = DEFAULT_CHECKPOINT
        if default.is_file():  # the embedded DeiT-Tiny: the first pick when no --weights is given
            self._add(ModelSpec(f"file:{default.resolve()}", f"{DEFAULT_MODEL}  ·  ImageNet-1k (the default, "
                                f"ships with vit_demo)", "file", DEFAULT_MODEL, default.resolve()))
        for p in discover_checkpoints():
            spec = self._file_spec(p, None)
            if spec.key not in self._specs:
                self._add(spec)
        self.has_checkpoint = bool(self._specs)
        self._add(ModelSpec(f"random:{RANDOM_MODEL}", f"{RANDOM_MODEL}  ·  RANDOM weights (no checkpoint needed)",
                            "random", RANDOM_MODEL))
        names = list(hub_names)
        if model_name and model_name not in names and not given:
            names.insert(0, model_name)
        for n in names:
            if local_checkpoint(n) is None:  # a name with a file here is on the menu as that file
                self._add(ModelSpec(f"hub:{n}", f"{n}  ·  download from the hub once (needs internet)", "hub", n))
        self.analyses = AnalysisCache(cache_bytes)

    # -- the menu

    @staticmethod
    def _file_spec(path: Path, name: str | None) -> ModelSpec:
        p = path.expanduser().resolve()
        return ModelSpec(f"file:{p}", _file_label(p, name), "file", name, p)

    def _add(self, spec: ModelSpec) -> ModelSpec:
        self._specs.setdefault(spec.key, spec)
        return self._specs[spec.key]

    def specs(self, extra: Sequence[str] = ()) -> list[ModelSpec]:
        """The public menu, plus the session's own checkpoints (``extra`` keys) after the files."""
        base = [s for s in self._specs.values() if not s.key.startswith("file:") or s.key not in self._private]
        mine = [self._specs[k] for k in extra if k in self._specs and k in self._private]
        files = [s for s in base if s.kind == "file"]
        rest = [s for s in base if s.kind != "file"]
        return files + mine + rest

    def choices(self, extra: Sequence[str] = ()) -> list[tuple[str, str]]:
        return [(s.label, s.key) for s in self.specs(extra)]

    def default_key(self) -> str:
        """The model named by ``--model`` when it has a local file, else the first checkpoint
        (``--weights`` first, then the embedded DeiT-Tiny), else the random-weights model. Never
        the hub: start-up stays offline."""
        files = [s for s in self._specs.values() if s.kind == "file" and s.key not in self._private]
        if self.model_name:
            named = [s for s in files
                     if s.name == self.model_name or (s.path and s.path.name.startswith(self.model_name))]
            if named:
                return named[0].key
        return files[0].key if files else f"random:{RANDOM_MODEL}"

    def spec(self, key: str) -> ModelSpec:
        if key in self._specs:
            return self._specs[key]
        raise ModelError(f"unknown model {key!r}: pick one from the menu")

    def add_checkpoint(self, path: str | os.PathLike, name: str | None = None, uploaded: bool = False) -> ModelSpec:
        """A checkpoint the user pointed at from the UI (a typed path or an upload). It is
        loaded right away, only through :mod:`vit_demo.checkpoints` (safetensors, or ``torch.load``
        with ``weights_only=True``), so a file that is not a checkpoint fails here."""
        if not uploaded and not self.allow_paths:
            raise ModelError("loading a server-side path is disabled while the app is exposed; upload the file instead")
        if uploaded and not self.allow_uploads:
            raise ModelError("checkpoint upload is off on this exposed app (start it with --allow-checkpoint-upload)")
        p = Path(str(path).strip().strip('"').strip("'")).expanduser()
        if not str(path).strip():
            raise ModelError("give the path of a checkpoint file (.safetensors, .pth, .bin or .npz)")
        if not p.is_file() and not is_hf_folder(p):  # a file, or a transformers model folder
            raise ModelError(f"{p}: no such file (or transformers folder with a config.json)")
        spec = self._file_spec(p, (name or "").strip() or None)
        if spec.key in self._specs and spec.key not in self._private:  # already on everyone's menu
            self.get(spec.key)
            return self._specs[spec.key]
        if uploaded:
            label = f"{spec.name or 'uploaded'}  ·  {p.name} (uploaded)"
            spec = ModelSpec(spec.key, label, "file", spec.name, spec.path)
        with self._lock:
            self._specs[spec.key] = spec
            self._private.add(spec.key)
            self._forget(spec.key)  # the same path with another architecture name: reload
        try:
            self.get(spec.key)  # fail now, with the loader's message, rather than on the next image
        except ModelError:
            with self._lock:
                self._specs.pop(spec.key, None)
                self._private.discard(spec.key)
            raise
        return spec

    # -- loading

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, key: str) -> LoadedModel:
        """The loaded model for ``key`` (loading it once; other sessions wait for that load)."""
        spec = self.spec(key)
        lm = self._models.get(("model", key))
        if lm is not None:
            return lm
        with self._key_lock(key):
            lm = self._models.get(("model", key))
            if lm is None:
                lm = self._load(spec)
                self._models.put(("model", key), lm, keep_oversize=True)  # in use: stays, others leave
            return lm

    def _evicted(self, item: tuple[str, str], _value: Any) -> None:
        """A model left the budget: its twin and pictures go with it (a twin alone may go)."""
        kind, key = item
        if kind == "model":
            self._forget(key)

    def _forget(self, key: str) -> None:
        self._models.pop(("model", key))
        self._models.pop(("twin", key))
        with self._lock:
            for k in [k for k in self._pictures if k[0] == key]:
                self._pictures.pop(k, None)

    def _load(self, spec: ModelSpec) -> LoadedModel:
        try:
            if spec.kind == "file":
                lm = load_model(spec.name, spec.path, device=self.device)
            elif spec.kind == "random":
                lm = load_model(spec.name, random_init=True, device=self.device)
            else:
                lm = load_model(spec.name, device=self.device)
        except HubUnavailableError as e:  # the CLI's advice (--weights FILE) is no use on the page
            raise ModelError(f"cannot download {spec.name}: the model hub is not reachable from this computer. Pick a "
                             "model already in the menu's file list, or load a checkpoint file under "
                             "'Use your own checkpoint' below.") from e
        except (CheckpointError, UnsupportedModelError, ValueError, OSError) as e:
            raise ModelError(str(e)) from e
        if spec.kind == "file" and spec.name is None and lm.timm_name is None:
            lm.name = spec.path.name if spec.path else lm.name
        return lm

    def is_private(self, key: str) -> bool:
        """A checkpoint one session added (shown on that session's menu only)."""
        return key in self._private

    def is_loaded(self, key: str) -> bool:
        return ("model", key) in self._models

    @property
    def models_nbytes(self) -> int:
        """Bytes the loaded models and twins hold now."""
        return self._models.nbytes

    def needs_download(self, key: str) -> bool:
        """A hub model whose weights are not on disk yet: picking it downloads them (once)."""
        spec = self.spec(key)
        return spec.kind == "hub" and not self.is_loaded(key) and local_checkpoint(spec.name or "") is None

    def timm_twin(self, key: str) -> Any:
        """timm's own model with the same weights, built once per model."""
        lm = self.get(key)
        with self._key_lock("twin:" + key):
            tm = self._models.get(("twin", key))
            if tm is None:
                spec = self.spec(key)
                try:
                    tm = timm_twin(lm, spec.path if spec.kind == "file" else None)
                except Exception as e:  # an architecture timm cannot build with these weights
                    why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                    raise ModelError(f"cannot build timm's {lm.timm_name or lm.name}: {why}") from e
                # in use with its model: both stay (whatever the budget), the least recent others leave
                self._models.put(("twin", key), tm, protect=[("model", key)], keep_oversize=True)
            return tm

    def analyze(self, key: str, img: Image.Image) -> Analysis:
        return self.analyses.get(self.get(key), img)

    def model_picture(self, key: str, what: str, draw: Callable[[LoadedModel], Image.Image]) -> Image.Image:
        """A picture that depends on the model only (e.g. its position-embedding similarity),
        drawn by ``draw`` once per model and ``what``."""
        if (key, what) not in self._pictures:
            self._pictures[key, what] = draw(self.get(key))
        return self._pictures[key, what]

    def warm_up(self, key: str | None = None) -> None:
        """Load the default model and run it once (first calls are slow), for a snappy first image."""
        key = key or self.default_key()
        lm = self.get(key)
        img = Image.new("RGB", tuple(reversed(lm.data_config.input_size)), (128, 128, 128))
        a = analyze(lm, img)  # not kept: a grey square is nobody's photo (and 0.35 GB for a ViT-B/8)
        if lm.model.cfg.num_classes:
            class_maps(a, lm)
        viz.heads_image(a.picture, head_maps(a.attentions, a.layout, a.depth - 1)[0])  # warms the renderers
