"""``vit_demo.load()`` and the :class:`Model` it returns: predictions, attention, explanations and
the check against timm for pictures given from Python, computed by the code the command line and
the app run (:func:`~vit_demo.checkpoints.load.load_model`, :func:`~vit_demo.predict.probabilities`,
the app's :class:`~vit_demo.analysis.AnalysisCache` and :func:`~vit_demo.analysis.class_maps`,
:mod:`vit_demo.methods`, :mod:`vit_demo.checkpoints.verify`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from .. import methods
from ..analysis import Analysis, AnalysisCache, class_maps, on_demand_map
from ..checkpoints.files import CheckpointError, UnsupportedModelError
from ..checkpoints.hf import is_hf_folder
from ..checkpoints.load import CHECKPOINT_SUFFIXES, LoadedModel, load_model
from ..checkpoints.timm import HubUnavailableError
from ..evaluate.srg_saco import measures
from ..labels import check_k, topk
from ..methods.rollout import rollout
from ..predict import probabilities
from ..preprocess import preprocess
from .checks import Verification, verify_image, verify_noise
from .inputs import ImageLike, Images, read_images
from .results import MEASURES, Attention, Comparison, Explanation, Prediction, Results
from .steps import Steps

DEFAULT_METHOD = "lrp-amortised"  # the most faithful map of one backward pass (docs/faithfulness.md)


class LoadError(ValueError):
    """A model that cannot be loaded; the message says why and what to do, in one line."""


class Model:
    """A Vision Transformer loaded by :func:`load`, and what you may ask of it about pictures.

    Every method takes ``image``: a path, a PIL image, a numpy array (HxW or HxWx3, uint8 or
    float in 0..1) or a tensor ([3,H,W], or [B,3,H,W] for a batch), or a list of them. One image
    gives one result, a list a :class:`~.results.Results` of them. Pictures analysed once are kept
    (the app's cache, by content): asking for attention, then for a map, runs the model once.
    """

    def __init__(self, lm: LoadedModel, random_init: bool = False) -> None:
        self.loaded = lm  # the LoadedModel the command line and the app use
        self.random_init = random_init
        self.cache = AnalysisCache()
        self.twin: torch.nn.Module | None = None  # timm's model, built on the first verify(image)

    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def module(self) -> torch.nn.Module:
        """The scratch :class:`~vit_demo.model.VisionTransformer` (a torch module, in eval mode)."""
        return self.loaded.model

    @property
    def config(self) -> Any:
        return self.loaded.model.cfg

    @property
    def labels(self) -> tuple[str, ...]:
        return self.loaded.labels

    @property
    def num_classes(self) -> int:
        return self.loaded.model.cfg.num_classes

    @property
    def weights(self) -> Path | None:
        """The checkpoint file (or transformers folder) the weights came from; None for random weights."""
        src = self.loaded.source
        return Path(src[5:]) if src.startswith("file ") else None

    def __repr__(self) -> str:
        c = self.config
        classes = f"{c.num_classes} classes" if c.num_classes else "headless"
        return (f"<vit_demo.Model {self.name!r}: {c.depth} layers x {c.num_heads} heads, {c.embed_dim}-d, {classes}, "
                f"on {self.loaded.device}>")

    # ------------------------------------------------------------------------- asking

    def predict(self, image: Images, k: int = 5) -> Prediction | Results[Prediction]:
        """The top-``k`` classes of each picture: the numbers of ``python -m vit_demo predict --json``
        (``k``: 1 or more; above the model's classes, all of them)."""
        self.need_classes("predict")
        k = check_k(k, self.num_classes)
        pics, single = read_images(image)
        shown = [preprocess(img, self.loaded.input_config(img.size)) for _, img in pics]
        with torch.inference_mode():
            probs = probabilities(self.loaded, [x for x, _ in shown])
        out = []
        for (name, _), (_, pic), p in zip(pics, shown, probs):
            top = topk(p, k, self.labels)
            out.append(Prediction(image=name, model=self.name, indices=np.array([t["index"] for t in top]),
                                  labels=tuple(t["label"] for t in top),
                                  probs=np.array([t["prob"] for t in top], dtype=np.float32), picture=np.asarray(pic)))
        return out[0] if single else Results(tuple(out))

    def attention(self, image: Images) -> Attention | Results[Attention]:
        """Every layer's and head's attention [L, H, N, N], the rollout [gh, gw] (the app's: mean of
        the heads, nothing discarded, from the first layer) and the token layout of each picture."""
        pics, single = read_images(image)
        out = [self.attention_of(name, self.analysis(img)) for name, img in pics]
        return out[0] if single else Results(tuple(out))

    def explain(self, image: Images, method: str | Sequence[str] = DEFAULT_METHOD, target: int | str | None = None,
                faithfulness: bool = False) -> Explanation | Comparison | Results:
        """``method``'s map of each picture for class ``target`` (an index or a label; default each
        picture's top-1). Several methods (a list) give a :class:`~.results.Comparison` per picture.
        ``faithfulness``: also score each map on its picture (deletion, insertion, SRG, SaCo with
        mean-colour replacement, :func:`vit_demo.evaluate.srg_saco.measures`: some 50 masked forward
        passes per map). Methods: :func:`vit_demo.methods.names`."""
        names = self.check_methods([method] if isinstance(method, str) else list(method), faithfulness)
        cls = None if target is None else class_index(target, self.labels)
        pics, single = read_images(image)
        out = []
        for name, img in pics:
            row = self.explain_one(name, self.analysis(img), names, cls, faithfulness)
            out.append(row[0] if isinstance(method, str) else Comparison(tuple(row)))
        return out[0] if single else Results(tuple(out))

    def steps(self, image: ImageLike, patch: tuple[int, int] | int | None = None, layer: int = 0, head: int = 0,
              temperature: float = 1.0) -> Steps:
        """One picture walked through the model, step by step, every number the model's own: the
        patch ``(row, col)`` (from 0; None: the one the readout attends to most in the last layer)
        through the projection, its position, ``layer``'s query meeting every key of ``head``, the
        softmax at ``temperature`` (1: the model's own), the weighted sum, the MLP, the residual
        stream, the readout, the logit lens and the logits (:mod:`vit_demo.inside`; one forward
        pass). A bad patch, layer, head or temperature: ValueError naming the allowed range."""
        from ..inside import step_through

        pics, single = read_images(image)
        if not single or len(pics) != 1:
            raise ValueError("steps walks one picture through the model: give one image, not a list")
        name, img = pics[0]
        x, picture = preprocess(img, self.loaded.input_config(img.size))
        walk = step_through(self.loaded.model, x, patch, layer, head, temperature, picture, self.labels, self.name)
        return Steps(image=name, model=self.name, walk=walk)

    def verify(self, image: Images | None = None, tol: float = 1e-4, precision: str = "fp32") -> Verification | Results:
        """The scratch model against timm's own on the same weights. No image: ``python -m vit_demo
        verify`` (8 random-noise inputs); a picture: the app's "Compare with timm" on it (logits,
        top-5 and every layer's attention). ``precision``: "fp32" (like with like: both in float32,
        whatever the module was set to), or "bf16" to see bfloat16's rounding against timm's fp32
        (labelled so, never a mismatch); the result's ``precision`` and ``compared`` say which."""
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision {precision!r}: fp32 (the parity check) or bf16 (bfloat16's rounding)")
        if image is None:
            return verify_noise(self.loaded, self.weights, self.random_init, tol, precision)
        pics, single = read_images(image)
        if self.twin is None:
            from ..checkpoints.verify import timm_twin

            weights = self.weights
            self.twin = timm_twin(self.loaded, weights if weights is not None and not is_hf_folder(weights) else None)
        out = [verify_image(self.loaded, self.twin, name, self.analysis(img), tol, precision) for name, img in pics]
        return out[0] if single else Results(tuple(out))

    # ------------------------------------------------------------------------- the parts

    def analysis(self, img: Image.Image) -> Analysis:
        """The app's analysis of one picture (cached by content): input, logits, every attention."""
        return self.cache.get(self.loaded, img)

    def need_classes(self, what: str) -> None:
        if self.num_classes == 0:
            raise ValueError(f"{self.name} is headless (num_classes=0: no classifier), so it has no class scores to "
                             f"{what}; its attention and the class-agnostic maps "
                             f"({', '.join(methods.names(class_specific=False))}) work")

    def check_methods(self, names: list[str], faithfulness: bool) -> list[str]:
        """The names as registered (any case: "Chefer" is chefer; ValueError with the names an unknown
        one may mean and the known ones); none that needs classes on a headless model."""
        if not names:
            raise ValueError(f"no method given; known: {', '.join(methods.names())}")
        names = [methods.find(n) for n in names]
        specs = [methods.get(n) for n in names]
        needy = [s.name for s in specs if s.class_specific]
        if self.num_classes == 0 and needy:
            raise ValueError(f"{', '.join(needy)} explain{'s' if len(needy) == 1 else ''} one class, and {self.name} is "
                             f"headless (num_classes=0: no classifier, no class scores to explain); the class-agnostic "
                             f"maps work: {', '.join(methods.names(class_specific=False))}")
        if faithfulness:
            self.need_classes("measure faithfulness on (the probability of a class as patches go)")
        return names

    def explain_one(self, image: str, a: Analysis, names: list[str], cls: int | None, faithfulness: bool
                    ) -> list[Explanation]:
        """Each method's map of one analysed picture (the class-specific ones as the app computes them)."""
        lm = self.loaded
        cls = a.top1 if cls is None and a.logits.numel() else cls
        fast = [n for n in names if methods.get(n).class_specific and not methods.get(n).slow]
        maps = {n: m for n, m in class_maps(a, lm, cls, fast).items() if n in fast} if fast else {}
        for n in names:
            spec = methods.get(n)
            if spec.slow:
                maps[n] = on_demand_map(a, lm, n, cls)
            elif not spec.class_specific:
                maps[n] = spec(lm.model, a.x, None)[0].detach().float().cpu().numpy()
        scores = self.scores(a, [maps[n] for n in names], cls) if faithfulness else None
        preds = tuple(a.topk(5)) if a.logits.numel() else ()
        label = a.labels[cls] if cls is not None else None
        prob = float(a.probs[cls]) if cls is not None else None
        out = []
        for k, n in enumerate(names):
            spec = methods.get(n)
            mine = spec.class_specific  # a class-agnostic map explains no class
            out.append(Explanation(
                image=image, model=self.name, method=n, title=spec.title, map=np.asarray(maps[n], dtype=np.float32),
                picture=np.asarray(a.picture), target=cls if mine else None, label=label if mine else None,
                prob=prob if mine else None, predictions=preds,
                faithfulness=None if scores is None else {m: float(scores[m][0, k]) for m in MEASURES},
                value="relevance" if mine else "value"))
        return out

    def scores(self, a: Analysis, maps: list[np.ndarray], cls: int) -> dict[str, torch.Tensor]:
        """Deletion, insertion, SRG and SaCo of ``maps`` on the analysed picture for class ``cls``."""
        with torch.no_grad():
            return measures(self.loaded.model, a.x, [torch.from_numpy(np.asarray(m))[None] for m in maps],
                            torch.tensor([cls], device=a.x.device), "mean")

    def attention_of(self, image: str, a: Analysis) -> Attention:
        maps = [t[0].numpy() for t in a.attentions]
        same = all(m.shape == maps[0].shape for m in maps)
        lay = a.layout
        return Attention(
            image=image, model=self.name, maps=np.stack(maps) if same else tuple(maps),
            rollout=rollout(a.attentions, lay, "mean", 0.0, 0)[0].numpy(), grid=tuple(lay.grid),
            patch_size=a.patch_size, tokens=tuple(lay.names()), cls_index=lay.cls_index, dist_index=lay.dist_index,
            reg_indices=tuple(lay.reg_indices), probe=None if lay.probe is None else lay.probe[0].float().numpy(),
            picture=np.asarray(a.picture), predictions=tuple(a.topk(5)) if a.logits.numel() else ())


def class_index(target: int | str, labels: Sequence[str]) -> int:
    """A class given as an index or a label (case-insensitive) as its index; ValueError saying what
    would do instead."""
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        if not 0 <= int(target) < len(labels):
            raise ValueError(f"target {target} is outside the model's classes 0..{len(labels) - 1}")
        return int(target)
    if isinstance(target, str):
        hits = [i for i, name in enumerate(labels) if name.lower() == target.strip().lower()]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"target {target!r} names classes {', '.join(map(str, hits))}; give the index")
        near = [name for name in labels if target.strip().lower() in name.lower()][:5]
        hint = f" (labels containing it: {', '.join(near)})" if near else ""
        raise ValueError(f"target {target!r}: no class has that label{hint}; give a label of model.labels or an index "
                         f"0..{len(labels) - 1}")
    raise TypeError(f"target must be a class index or a label, not {type(target).__name__}")


def load(name_or_path: str | os.PathLike | None = None, *, timm_name: str | None = None, device: str = "auto",
         random_init: bool = False) -> Model:
    """Load a model, the way ``python -m vit_demo`` and the app do.

    - ``vit_demo.load()``: the DeiT-Tiny that ships with the project (ImageNet-1k, offline);
    - ``vit_demo.load("vit_small_patch16_224.augreg_in21k_ft_in1k")``: a timm model by name, from
      ``weights/NAME.safetensors`` when it is there, else downloaded once from the hub and ported
      (offline this fails within seconds, saying so);
    - ``vit_demo.load("file.safetensors")``: a checkpoint file (this project's, or timm's layout:
      .safetensors, .pth/.bin, .npz; a timm-layout file not named after its model needs
      ``timm_name=``), or a Hugging Face transformers model folder;
    - ``random_init=True`` with a timm name: timm's random initialisation (no download).

    ``device``: "auto" (CUDA, then Apple MPS, then the CPU), "cpu", "cuda" or "mps". Raises
    :class:`LoadError` with one line saying what went wrong and what to do.

    >>> m = vit_demo.load()
    >>> m.explain("cat.jpg", method="chefer")
    """
    try:
        if name_or_path is None:
            lm = load_model(timm_name, random_init=random_init, device=device)
        elif isinstance(name_or_path, os.PathLike) or Path(name_or_path).exists() or looks_like_a_path(name_or_path):
            if not Path(name_or_path).exists():
                raise LoadError(f"{name_or_path}: no such checkpoint file or folder")
            lm = load_model(timm_name, name_or_path, device=device)
        else:
            lm = load_model(str(name_or_path), random_init=random_init, device=device)
    except LoadError:
        raise
    except HubUnavailableError as e:
        msg = one_line(e)
        hint = "vit_demo.load('FILE')"
        raise LoadError(msg.replace("--weights FILE", hint) if "--weights FILE" in msg else f"{msg} ({hint})") from None
    except (CheckpointError, UnsupportedModelError, ValueError, OSError, RuntimeError) as e:
        raise LoadError(one_line(e).replace("--model NAME", "timm_name='NAME'")) from None
    return Model(lm, random_init)


def looks_like_a_path(text: str | os.PathLike) -> bool:
    """A string meant as a file, not a timm name: a checkpoint suffix, or a folder separator."""
    s = str(text)
    return s.endswith(CHECKPOINT_SUFFIXES) or "/" in s or os.sep in s or s.startswith(".")


def one_line(e: BaseException) -> str:
    return (str(e).strip().split("\n")[0] or type(e).__name__)
