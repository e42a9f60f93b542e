"""The model registry: the models a user can pick, loaded lazily and shared by every session.

Checkpoints found on disk (``--weights``, ``weights/``, ``$VIT_DEMO_WEIGHTS``), a random-weights
model, hub names tried only when picked, and checkpoints a user loads from the UI (on that
user's menu only). Loaded models and their timm twins share one memory budget (least recently
used leave first, never the model in use); the analyses (one per image and model) are kept in
an :class:`~vit_demo.analysis.AnalysisCache` with a budget of its own. No Gradio here.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from .. import viz
from ..analysis import (
    Analysis,
    AnalysisCache,
    analyze,
    attention_nbytes,
    backward_working_set,
    class_maps,
    forward_working_set,
)
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
from ..progress import check

RANDOM_MODEL = "deit_tiny_patch16_224"
WARM_UP_BACKWARD_BYTES = 64 << 20  # the warm-up computes class maps only for models with this much attention or less
HUB_MODELS = (  # offered when the user wants pretrained weights from the hub (tried only when picked)
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_base_distilled_patch16_224",
    "deit3_small_patch16_224",
    "vit_base_patch16_224",
    "vit_small_patch16_224.dino",
    # the other families (docs/families.md): ImageNet classifiers first, then feature models
    "eva02_tiny_patch14_336.mim_in22k_ft_in1k",  # EVA-02: RoPE, SwiGLU
    "beitv2_base_patch16_224.in1k_ft_in1k",  # BEiT v2: relative position bias
    "vit_relpos_small_patch16_224.sw_in1k",  # relative-position MLP, no [class]
    "vit_small_patch14_reg4_dinov2.lvd142m",  # DINOv2 with registers (headless)
    "vit_small_patch16_dinov3.lvd1689m",  # DINOv3: its RoPE, registers (headless)
    "vit_base_patch16_siglip_224.webli",  # SigLIP: attention-pool head (headless)
    "vit_pe_core_tiny_patch16_384.fb",  # Perception Encoder: RoPE, attention pool, CLIP projection
)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the model menu. ``key`` is what the menu and the API pass around."""

    key: str  # "file:NAME.safetensors" (with "~" and a short hash when two files share a name), "random:NAME",
    # "hub:NAME", "upload:NAME~RANDOM" (a user's checkpoint) or "trained:NAME~RANDOM" (trained here): never a server path
    label: str
    kind: str  # "file", "random", "hub"
    name: str | None  # timm architecture name (None: read it from the file)
    path: Path | None = None


class ModelError(ValueError):
    """A model that cannot be loaded, in one readable line."""


class Downloads:
    """An exposed app's hub downloads (``--allow-downloads``): one at a time, only where
    :meth:`ModelRegistry.download` allows it (the model menu's pick, in the slow lane), within
    ``budget`` bytes of disk over the app's run. A download is charged before it starts, from the
    model's size (:func:`download_bytes`: its weights twice, the hub's cache and the port in
    weights/); anyone naming a hub model elsewhere (an API call, a tool) is refused."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used = int(budget), 0
        self.lock = threading.Lock()  # held while a download runs
        self.here = threading.local()  # .allowed: this thread may download now

    @property
    def allowed(self) -> bool:
        return bool(getattr(self.here, "allowed", False))


def download_bytes(name: str) -> int:
    """Disk a hub model takes once downloaded: its parameters and buffers in float32, twice (the
    hub's cache and its port in weights/), counted on a model built without memory (``meta``)."""
    import torch

    from ..checkpoints.timm import timm_model

    with torch.device("meta"):
        tm = timm_model(name)
    return 2 * 4 * sum(t.numel() for t in (*tm.parameters(), *tm.buffers()))


def short_name(name: str, n: int = 40) -> str:
    """A file name of at most ``n`` characters for a menu key (the extension kept when cut)."""
    if len(name) <= n:
        return name
    suffix = Path(name).suffix[:13]
    return name[: n - 1 - len(suffix)] + "…" + suffix


def _digest(path: Path | None) -> str:
    """8 hex characters that tell two paths apart (and say nothing of them)."""
    return hashlib.sha256(str(path).encode()).hexdigest()[:8]


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
    stays, whatever its size); ``cache_bytes``: the budget for analyses. ``random_names``: timm
    architectures offered with random weights (teaching, tests). ``hub_names``: the hub models on
    the menu (with ``model_name`` when no file has it), ``hub``: whether any is (not on an exposed
    app without ``--allow-downloads``); ``downloads``: an exposed app's rules for downloading them
    (:class:`Downloads`; None: downloaded when picked). ``precision``: what the models run
    in (auto, fp32, bf16; the app's ``--precision``).
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
        random_names: Sequence[str] = (RANDOM_MODEL,),
        downloads: Downloads | None = None,
        hub: bool = True,
        precision: str = "fp32",
    ) -> None:
        self.device = device
        self.downloads = downloads  # None: a local app downloads whatever is picked
        self.precision = precision  # auto, fp32 or bf16: what every model loaded here runs in (vit_demo.precision)
        self.allow_paths = allow_paths
        self.allow_uploads = allow_uploads
        self.model_name = model_name
        self._specs: dict[str, ModelSpec] = {}
        self._private: set[str] = set()  # keys one session added (an upload, a typed path): not on everyone's menu
        # ("model", key) -> LoadedModel and ("twin", key) -> timm's nn.Module, one budget
        self._models: ByteLRU[tuple[str, str], Any] = ByteLRU(models_bytes, _weight, on_evict=self._evicted)
        self._pictures: dict[tuple[str, str], Any] = {}  # (model, what) -> a picture of the model alone, or its caption
        self._lock = threading.RLock()  # re-entrant: add_checkpoint holds it while _forget takes it
        self._key_locks: dict[str, threading.Lock] = {}
        self._discovered: set[str] = set()  # keys of files found in weights/ (they may come and go)
        self._mtimes: dict[str, int] = {}  # key -> modification time of the file when it was loaded
        given = [Path(w) for w in weights]
        for p in given:
            self._add(self._file_spec(p, model_name))
        default = DEFAULT_CHECKPOINT
        if default.is_file() and self.find_path(default) is None:  # the embedded DeiT-Tiny: first when no --weights
            self._add(ModelSpec(f"file:{default.name}", f"{DEFAULT_MODEL}  ·  ImageNet-1k (the default, "
                                f"ships with vit_demo)", "file", DEFAULT_MODEL, default.resolve()))
        self._discover()
        self.has_checkpoint = bool(self._specs)
        for n in random_names:
            self._add(ModelSpec(f"random:{n}", f"{n}  ·  RANDOM weights (no checkpoint needed)", "random", n))
        names = list(hub_names) if hub else []
        if hub and model_name and model_name not in names and not given:
            names.insert(0, model_name)
        for n in names:
            if local_checkpoint(n) is None:  # a name with a file here is on the menu as that file
                self._add(ModelSpec(f"hub:{n}", f"{n}  ·  download from the hub once (needs internet)", "hub", n))
        self.analyses = AnalysisCache(cache_bytes)

    # -- the menu

    @staticmethod
    def _file_spec(path: Path, name: str | None) -> ModelSpec:
        p = path.expanduser().resolve()
        short = short_name(p.name)
        key = f"file:{short}" if short == p.name else f"file:{short}~{_digest(p)}"  # a cut name: made unique
        return ModelSpec(key, _file_label(p, name), "file", name, p)

    def _add(self, spec: ModelSpec) -> ModelSpec:
        """Put ``spec`` on the menu; a file whose name another file already has gets a short
        hash of its path after its key (the key names the file, never where it is)."""
        old = self._specs.get(spec.key)
        if old is not None and spec.path is not None and old.path != spec.path:
            spec = ModelSpec(f"{spec.key.split('~')[0]}~{_digest(spec.path)}", spec.label, spec.kind, spec.name,
                             spec.path)
        self._specs.setdefault(spec.key, spec)
        return self._specs[spec.key]

    def find_path(self, path: str | os.PathLike, private: bool | None = False) -> ModelSpec | None:
        """The menu entry of the checkpoint at ``path`` (a public one; a private one with
        ``private=True``; either with None), if there is one."""
        p = Path(path).expanduser().resolve()
        for s in self._specs.values():
            if s.path == p and (private is None or (s.key in self._private) == private):
                return s
        return None

    def _discover(self) -> list[ModelSpec]:
        """Add the checkpoint files in ``weights/`` and ``$VIT_DEMO_WEIGHTS`` not on the menu yet
        (a file a hub entry downloaded is on the menu as that entry); return the new ones."""
        hub_files = {p.resolve() for s in self._specs.values() if s.kind == "hub"
                     for p in [local_checkpoint(s.name or "")] if p is not None}
        new = []
        for p in discover_checkpoints():
            if self.find_path(p) is None and p.resolve() not in hub_files:
                spec = self._add(self._file_spec(p, None))
                new.append(spec)
                self._discovered.add(spec.key)
        return new

    def refresh(self) -> list[ModelSpec]:
        """Bring the menu up to date with the disk, without a restart: checkpoints that appeared in
        ``weights/`` since the start (e.g. one ``train`` just wrote) join it, found ones that were
        deleted leave it (unless loaded), and a loaded file that was rewritten is read again on its
        next use. One directory listing; returns the new entries."""
        with self._lock:
            new = self._discover()
            for key in list(self._discovered):
                spec = self._specs.get(key)
                if spec is None or spec.path is None:
                    continue
                if not spec.path.is_file():
                    if not self.is_loaded(key):
                        self._specs.pop(key, None)
                        self._discovered.discard(key)
                elif key in self._mtimes and spec.path.stat().st_mtime_ns != self._mtimes[key]:
                    self._mtimes.pop(key)
                    self._forget(key)
            return new

    def specs(self, extra: Sequence[str] = ()) -> list[ModelSpec]:
        """The public menu, plus the session's own checkpoints (``extra`` keys) after the files."""
        base = [s for s in self._specs.values() if s.key not in self._private]
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
        randoms = [s.key for s in self._specs.values() if s.kind == "random"]
        return files[0].key if files else (randoms[0] if randoms else f"random:{RANDOM_MODEL}")

    def spec(self, key: str) -> ModelSpec:
        if isinstance(key, str) and key in self._specs:
            return self._specs[key]
        shown = str(key)[:40] + ("…" if len(str(key)) > 40 else "")
        raise ModelError(f"unknown model {shown!r}: pick one from the menu")

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
            shown = p.name[:40]
            raise ModelError(f"{shown}: no such file (or transformers folder with a config.json)")
        spec = self._file_spec(p, (name or "").strip()[:80] or None)
        public = self.find_path(p)
        if public is not None:  # already on everyone's menu
            self.get(public.key)
            return public
        mine = self.find_path(p, private=True)
        tag = mine.key.rsplit("~", 1)[-1] if mine is not None else secrets.token_hex(4)
        short = short_name(p.name)
        if uploaded:
            label = f"{spec.name or 'uploaded'}  ·  {short} (uploaded)"
            spec = ModelSpec(f"upload:{short}~{tag}", label, "file", spec.name, spec.path)
        else:
            spec = ModelSpec(f"file:{short}~{tag}", spec.label, "file", spec.name, spec.path)
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

    def add_trained(self, path: str | os.PathLike, label: str) -> ModelSpec:
        """A checkpoint the app itself just trained (the Train tab, ``/train``): on the menu of the
        session that trained it only (``trained:NAME~RANDOM``), loaded when first used. The path is
        the app's own, so this works on an exposed app too (where a typed path is refused)."""
        p = Path(path).resolve()
        spec = ModelSpec(f"trained:{short_name(p.stem, 24)}~{secrets.token_hex(4)}", label, "file", None, p)
        with self._lock:
            self._specs[spec.key] = spec
            self._private.add(spec.key)
        return spec

    def remove(self, key: str) -> None:
        """Take a session's own checkpoint off the menu and out of memory (its session has ended)."""
        with self._lock:
            if key not in self._private:
                return
            self._specs.pop(key, None)
            self._private.discard(key)
            self._mtimes.pop(key, None)
            self._forget(key)

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
                mtime = spec.path.stat().st_mtime_ns if spec.path and spec.path.is_file() else None
                lm = load_model(spec.name, spec.path, device=self.device, precision=self.precision)
                if mtime is not None:
                    self._mtimes[spec.key] = mtime
            elif spec.kind == "random":
                lm = load_model(spec.name, random_init=True, device=self.device, precision=self.precision)
            else:
                if self.downloads is not None and not self.downloads.allowed and self.needs_download(spec.key):
                    raise ModelError(f"{spec.name} is not on this app yet: pick it in the model menu, which downloads "
                                     "it (once)")
                lm = load_model(spec.name, device=self.device, precision=self.precision)
        except HubUnavailableError as e:  # the CLI's advice (--weights FILE) is no use on the page
            raise ModelError(f"cannot download {spec.name}: the model hub is not reachable from this computer. Pick a "
                             "model already in the menu's file list, or load a checkpoint file under "
                             "'Use your own checkpoint' below.") from e
        except (CheckpointError, UnsupportedModelError, ValueError, OSError) as e:
            msg = str(e)
            if spec.path is not None:  # a file's name as the menu shows it (an upload's name is the user's)
                msg = msg.replace(str(spec.path), spec.path.name).replace(spec.path.name, short_name(spec.path.name))
            raise ModelError(msg) from e
        if spec.kind == "file" and spec.name is None and lm.timm_name is None:
            lm.name = spec.path.name if spec.path else lm.name
        if spec.kind == "file":  # the menu's name for it (unique here), never the server path: slides show it
            lm.source = "file " + spec.key.split(":", 1)[1]
        lm.model.register_forward_pre_hook(lambda _module, _args: check())  # a job past its time limit stops here
        return lm

    def is_private(self, key: str) -> bool:
        """A checkpoint one session added (shown on that session's menu only)."""
        return key in self._private

    def is_loaded(self, key: str) -> bool:
        return ("model", key) in self._models

    def needs_download(self, key: str) -> bool:
        """A hub model whose weights are not on disk yet: picking it downloads them (once)."""
        spec = self.spec(key)
        return spec.kind == "hub" and not self.is_loaded(key) and local_checkpoint(spec.name or "") is None

    def download(self, key: str) -> LoadedModel:
        """The model of ``key``, downloaded here if it must be: on an exposed app (:class:`Downloads`),
        one download at a time (another is refused at once) and within the download budget."""
        d = self.downloads
        if d is None or not self.needs_download(key):
            return self.get(key)
        name = self.spec(key).name or ""
        if not d.lock.acquire(blocking=False):
            raise ModelError("another model is being downloaded on this app: try again in a minute")
        try:
            need = download_bytes(name)
            if d.used + need > d.budget:
                raise ModelError(f"{name} (about {need / MB:.0f} MB on disk) would pass this app's download budget "
                                 f"({d.budget / MB:.0f} MB, {d.used / MB:.0f} MB used): pick a model already on the menu")
            d.used += need
            d.here.allowed = True
            try:
                return self.get(key)
            finally:
                d.here.allowed = False
        finally:
            d.lock.release()

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

    def slow_job_room(self):
        """Room in the analyses' budget for one slow job (a deck, an animation, a side-by-side
        figure: an analysis and its class maps of their own): the working set of the largest
        model loaded, so that the job's peak counts in the budget too."""
        models = [m for (kind, _), m in self._models.items() if kind == "model"]
        need = max((forward_working_set(m) + backward_working_set(m) for m in models), default=0)
        return self.analyses.room(need)

    def model_picture(self, key: str, what: str, draw: Callable[[LoadedModel], Any]) -> Any:
        """A picture that depends on the model only (e.g. its position-embedding similarity), or
        its caption, made by ``draw`` once per model and ``what``."""
        if (key, what) not in self._pictures:
            self._pictures[key, what] = draw(self.get(key))
        return self._pictures[key, what]

    def warm_up(self, key: str | None = None) -> None:
        """Load the default model and run it once (first calls are slow), for a snappy first image."""
        key = key or self.default_key()
        lm = self.get(key)
        img = Image.new("RGB", tuple(reversed(lm.data_config.input_size)), (128, 128, 128))
        a = analyze(lm, img)  # not kept: a grey square is nobody's photo (and 0.35 GB for a ViT-B/8)
        if lm.model.cfg.num_classes and attention_nbytes(lm) <= WARM_UP_BACKWARD_BYTES:
            class_maps(a, lm)  # (a big model's backward passes would take minutes and GBs for nobody)
        viz.heads_image(a.picture, head_maps(a.attentions, a.layout, a.depth - 1)[0])  # warms the renderers
