"""The atlases the app's Atlas tab shows, without Gradio: the atlas of a checkpoint's model over
the example photos, kept on disk (:func:`cache_root`, one folder per weights hash, atlas code and
photos) and computed once, in the background (:class:`ExampleAtlases`); the atlases built from
uploads and the uploads coded with an atlas's concepts, kept in memory (:class:`AtlasStore`);
and the report of a built atlas as it is downloaded, naming no server path (:func:`public_report`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..analysis import Analysis
from ..checkpoints.load import LoadedModel, file_sha256
from ..evaluate import atlas as atlas_code
from ..evaluate import concepts
from ..evaluate.atlas_codes import picture_codes
from ..evaluate.survey import Loader
from ..present import atlas_report
from ..present.atlas_report import Crops, write_report
from ..progress import reporting
from .registry import ModelError, ModelRegistry

REPORT_ZIP = "atlas-report.zip"  # what the report downloads as (the survey's: survey-report.zip)
CACHE_ENV = "VIT_DEMO_CACHE"  # where the example photos' atlases are kept (default: ~/.cache/vit_demo)
FORMAT = 1  # the cache folder's layout (part of its key, with the atlas code's hash)
KEEP = 8  # example atlases kept on disk (the least recently used go)
STORE = 16  # atlases built from uploads kept by the app (the oldest forgotten first)
CODED = 32  # uploads whose tokens are coded, kept


def cache_root() -> Path:
    """``$VIT_DEMO_CACHE/atlas``, else ``$XDG_CACHE_HOME/vit_demo/atlas`` (``~/.cache/vit_demo/atlas``)."""
    env = os.environ.get(CACHE_ENV)
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vit_demo"
    return base / "atlas"


@lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the code an atlas comes from (the atlas, its concepts, its report and this cache's layout)."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for mod in (atlas_code, concepts, atlas_report):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:12]


def cache_key(weights: Path, pictures: list[Path]) -> str:
    """The cache folder's name: the weights' hash, the atlas code's hash and the pictures' names and sizes."""
    size_time = weights.stat()
    h = hashlib.sha256(file_sha256(str(weights), size_time.st_size, size_time.st_mtime_ns).encode()
                       + code_version().encode())
    for p in pictures:
        h.update(f"{p.name}:{p.stat().st_size};".encode())
    return h.hexdigest()[:24]


@dataclass
class Atlas:
    """One atlas the tab shows: the atlas's result, its NMF dictionary, its crops, whose model."""

    result: dict[str, Any]
    components: np.ndarray  # [K, 2C]: the NMF's H over [relu(x), relu(-x)] of the tokens
    crops: Crops  # report/crops/ of its folder
    model_key: str
    source: str  # what it was made from, in words

    def crop(self, t: dict[str, Any]) -> Image.Image | None:
        rel = self.crops(t["path"], t["row"], t["col"])
        return Image.open(self.crops.out / rel).convert("RGB") if rel is not None else None

    def head(self, layer: int, head: int) -> dict[str, Any]:
        return next(h for h in self.result["heads"] if h["layer"] == layer and h["head"] == head)


def finish(lm: LoadedModel, result: dict[str, Any], components: np.ndarray, out: Path, key: str, source: str,
           load: Loader | None = None) -> Atlas:
    """The report (its page and the crops of every head and concept, the pictures read with
    ``load``) and the dictionary in ``out``."""
    write_report(result, out / "report", lm.data_config, lm.model.cfg.patch_size, load)
    np.save(out / "components.npy", components)
    return Atlas(result, components, Crops(out / "report", lm.data_config, lm.model.cfg.patch_size, load), key, source)


def build_atlas(lm: LoadedModel, pictures: Path, out: Path, key: str, source: str, load: Loader | None = None,
                isolated: bool = False) -> Atlas:
    """The atlas of the folder ``pictures`` (its default layer and number of concepts), made with
    a copy of the model: the atlas hooks into the blocks (it replaces heads' outputs to ablate
    them), and the app's model runs every other session's forward passes meanwhile. ``load``: how
    a user's picture is read (the upload's limits: :func:`vit_demo.app.uploads.picture_loader`);
    ``isolated``: NMF in a child process, which the job's time limit stops."""
    fitted: dict[str, Any] = {}
    own = dataclasses.replace(lm, model=copy.deepcopy(lm.model))
    result = atlas_code.atlas(own, pictures, progress=False, fitted=fitted, load=load, isolated=isolated)
    return finish(lm, result, fitted["concepts"].components, out, key, source, load)


def public_report(at: Atlas, out: Path) -> Path:
    """The report of an atlas built in ``out`` as it is downloaded (:data:`REPORT_ZIP`): its
    ``atlas.json`` names the pictures by their file names only, never a server path."""
    public = json.loads(json.dumps(at.result))
    for item in (*public["heads"], *public["concepts"]):
        for t in item["top"]:
            t["path"] = Path(t["path"]).name
    public["folder"], public["report"] = "the upload", "report.html"
    (out / "report" / "atlas.json").write_text(json.dumps(public, indent=1), encoding="utf-8")
    return Path(shutil.make_archive(str(out / Path(REPORT_ZIP).stem), "zip", out, "report"))


class ExampleAtlases:
    """The atlas of each checkpoint's model over the example photos, from the disk cache or
    computed once (one model at a time; a second caller waits for the first)."""

    def __init__(self, reg: ModelRegistry, examples: list[Path]) -> None:
        self.reg, self.examples = reg, examples
        self.ready: dict[str, Atlas] = {}
        self.progress: dict[str, str] = {}  # key -> what its computation is doing
        self.lock = threading.Lock()

    def folder(self, key: str) -> Path | None:
        """Where the atlas of ``key`` is kept; None for a model without a public file or without examples."""
        spec = self.reg.spec(key)
        if spec.path is None or not self.examples or self.reg.is_private(key) or not spec.path.is_file():
            return None
        return cache_root() / cache_key(spec.path, self.examples)

    def cached(self, key: str) -> Atlas | None:
        """The atlas of ``key`` if it is in memory or on disk (never computes)."""
        if key in self.ready:
            return self.ready[key]
        out = self.folder(key)
        if out is None or not (out / "atlas.json").is_file():
            return None
        lm = self.reg.get(key)
        result = json.loads((out / "atlas.json").read_text(encoding="utf-8"))
        at = Atlas(result, np.load(out / "components.npy"), Crops(out / "report", lm.data_config,
                   lm.model.cfg.patch_size), key, f"the {result['images']} example photos")
        os.utime(out)  # recently used: kept
        self.ready[key] = at
        return at

    def compute(self, key: str) -> Atlas:
        """The atlas of ``key`` over the example photos, computed here unless it is kept already."""
        with self.lock:
            at = self.cached(key)
            if at is not None:
                return at
            out = self.folder(key)
            if out is None:
                raise ModelError("no atlas of the example photos is kept for this model (no checkpoint file of its "
                                 "own, or no example photos): build one from your pictures")
            shutil.rmtree(out, ignore_errors=True)  # a computation that did not finish
            (out / "pictures").mkdir(parents=True)
            for i, p in enumerate(self.examples):
                shutil.copyfile(p, out / "pictures" / f"{i:02d}_{p.name}")
            try:
                at = build_atlas(self.reg.get(key), out / "pictures", out, key, "")
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)
                raise
            at.source = f"the {at.result['images']} example photos"
            tmp = out / f"atlas.json.{secrets.token_hex(4)}"
            tmp.write_text(json.dumps(at.result), encoding="utf-8")
            os.replace(tmp, out / "atlas.json")  # last: a folder with atlas.json is complete
            trim_cache(cache_root(), KEEP)
            self.ready[key] = at
            return at

    def background(self, key: str) -> None:
        """Compute the atlas of ``key`` in a thread, if it is not kept (start-up, a first opening)."""
        if key in self.progress or self.cached(key) is not None or self.folder(key) is None:
            return

        def run() -> None:
            try:
                with reporting(lambda share, text: self.progress.__setitem__(key, f"{text} · {share:.0%}")):
                    self.compute(key)
                self.progress.pop(key, None)
            except Exception as e:  # noqa: BLE001 - said in the tab
                self.progress[key] = f"failed: {e}"

        self.progress[key] = "starting"
        threading.Thread(target=run, daemon=True, name="atlas-examples").start()


def trim_cache(root: Path, keep: int) -> None:
    """Only the ``keep`` most recently used atlas folders of ``root`` stay."""
    folders = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for d in folders[keep:]:
        shutil.rmtree(d, ignore_errors=True)


class AtlasStore:
    """What the tab keeps in memory for every session: the atlases built from uploads (the newest
    :data:`STORE`, each under an id no one can guess) and the uploads' patches coded with an
    atlas's concepts (the newest :data:`CODED`)."""

    def __init__(self) -> None:
        self.built: OrderedDict[str, Atlas] = OrderedDict()
        self.coded: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self.lock = threading.Lock()

    def add(self, at: Atlas) -> str:
        """Keep a built atlas; its id."""
        atlas_id = secrets.token_hex(16)
        with self.lock:
            self.built[atlas_id] = at
            while len(self.built) > STORE:
                self.built.popitem(last=False)
        return atlas_id

    def __contains__(self, atlas_id: object) -> bool:
        return isinstance(atlas_id, str) and atlas_id in self.built

    def __getitem__(self, atlas_id: str) -> Atlas:
        return self.built[atlas_id]

    def codes(self, lm: LoadedModel, a: Analysis, at: Atlas) -> np.ndarray:
        """The analysed picture's patches coded with the atlas's concepts: [gh, gw, K] (``lm``: the atlas's model)."""
        key = (a.key, id(at))
        with self.lock:
            if key not in self.coded:
                self.coded[key] = picture_codes(lm, a.x, at.result["concept_layer"], at.components, a.layout.grid)
                while len(self.coded) > CODED:
                    self.coded.popitem(last=False)
            return self.coded[key]
