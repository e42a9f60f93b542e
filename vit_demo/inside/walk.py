"""``step_through``: one picture through the ViT, step by step, every number the model's own.

    walk = step_through(model, x, patch=(5, 9), layer=7, head=2)   # one forward pass with hooks
    walk.steps          # 13 Step records in the order of the forward: name, title, text, exists
    walk.values         # {name: numpy array}: image, pixels, patch_vector, embedding, ..., lens, logits
    walk.render("softmax")          # the step's picture (PIL, fast), viz/steps.py
    walk.with_temperature(2.0)      # the softmax at another temperature, no forward pass

Indices count from 0 (as the Python API); the texts count layers and heads from 1, as people do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..model import VisionTransformer
from . import values as V
from .record import StepError, heads_per_layer, record, where
from .words import Facts, Step, facts_of, step_texts

STEPS = ("patches", "pixels", "projection", "position", "qkv", "scores", "softmax", "weighted_sum", "mlp", "residual",
         "readout", "lens", "logits")
"""Every step's name, in the order of the forward pass (a step a model lacks is there, saying so)."""

TEMPERATURE_RANGE = (0.1, 10.0)
"""The softmax temperatures the app's slider offers (a request outside is clamped by :func:`clamp_temperature`);
the Python API and the command take any finite temperature above 0."""

PARAMETERS = ("projection_weight", "projection_bias")  # the weights a step shows (not computed from the picture)


@dataclass(frozen=True, eq=False)
class Walk:
    """One picture's step-through: the steps, their numbers (numpy, by name), what they were taken at."""

    steps: tuple[Step, ...]
    values: dict[str, np.ndarray] = field(repr=False)
    facts: Facts = field(repr=False)
    picture: np.ndarray = field(repr=False)  # [H, W, 3] uint8: the model-input picture, for the pictures
    own: dict[str, np.ndarray] = field(repr=False, default_factory=dict)  # the model's attention at T = 1

    @property
    def patch(self) -> tuple[int, int]:
        return self.facts.row, self.facts.col

    @property
    def token(self) -> int:
        return self.facts.token

    @property
    def layer(self) -> int:
        return self.facts.layer

    @property
    def head(self) -> int:
        return self.facts.head

    @property
    def temperature(self) -> float:
        return self.facts.temperature

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; the steps: {', '.join(STEPS)}")

    def with_temperature(self, temperature: float) -> Walk:
        """The same walk with the softmax at ``temperature`` (attention, attention_parts, head_output
        and their texts; at 1 the model's own numbers again). No forward pass: a slider's move."""
        t = check_temperature(temperature)
        new = dict(self.values)
        new.update(self.own if t == 1.0 else V.at_temperature(self.values, t))
        facts = replace(self.facts, temperature=t)
        return replace(self, steps=step_texts(facts, new), values=new, facts=facts)

    def render(self, name: str, scale: float = 1.0, cmap: str = "inferno") -> Image.Image:
        """The picture of step ``name`` (PIL, RGB; ``scale`` 2 for slides): viz/steps.py's renderer."""
        from .draw import draw_step

        return draw_step(self, name, scale, cmap)

    def to_json(self, parameters: bool = False) -> dict[str, Any]:
        """The walk as plain JSON: what was chosen, the steps, the values as (nested) lists; the
        projection's weights only with ``parameters`` (DeiT-Tiny: 147,456 numbers)."""
        f = self.facts
        return {"model": f.model, "patch": [f.row, f.col], "token": f.token, "layer": f.layer, "head": f.head,
                "temperature": f.temperature,
                "steps": [{"name": s.name, "title": s.title, "text": s.text, "exists": s.exists} for s in self.steps],
                "values": {k: np.asarray(v).tolist() for k, v in self.values.items()
                           if parameters or k not in PARAMETERS}}


def check_temperature(t: Any) -> float:
    """``t`` as a float, or StepError when it is not a finite number above 0."""
    try:
        value = float(t)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0) or isinstance(t, bool):
        raise StepError(f"temperature {t!r}: give a finite number above 0 (1 is the model's own softmax; the app's "
                        f"slider spans {TEMPERATURE_RANGE[0]:g}..{TEMPERATURE_RANGE[1]:g})")
    return value


def clamp_temperature(t: Any) -> float:
    """``t`` within :data:`TEMPERATURE_RANGE` (the app's rule for a request); StepError for a
    temperature that is no finite number above 0."""
    lo, hi = TEMPERATURE_RANGE
    return min(hi, max(lo, check_temperature(t)))


def check_choice(model: VisionTransformer, x: torch.Tensor, patch: Any, layer: Any, head: Any
                 ) -> tuple[tuple[int, int] | None, int, int]:
    """The patch (row, col) or None, the layer and the head as indices, or StepError naming the
    allowed range; nothing is computed. ``patch`` may be (row, col) or a row-major index."""
    cfg = model.cfg
    depth, heads = cfg.depth, heads_per_layer(model)
    if not is_int(layer) or not -depth <= layer < depth:
        raise StepError(f"layer {layer!r}: this model has layers 0..{depth - 1} (counted from 0; -1 the last)")
    if not is_int(head) or not 0 <= head < heads:
        raise StepError(f"head {head!r}: this model has heads 0..{heads - 1} in each layer (counted from 0)")
    p = cfg.patch_size
    gh, gw = x.shape[-2] // p, x.shape[-1] // p
    if patch is None:
        return None, int(layer) % depth, int(head)
    if is_int(patch) and 0 <= patch < gh * gw:
        return divmod(int(patch), gw), int(layer) % depth, int(head)
    ok = isinstance(patch, (tuple, list)) and len(patch) == 2 and all(is_int(v) for v in patch)
    if not ok or not (0 <= patch[0] < gh and 0 <= patch[1] < gw):
        raise StepError(f"patch {patch!r} is outside the {gh}x{gw} patch grid: give (row, col) with rows 0..{gh - 1} "
                        f"and columns 0..{gw - 1} (or an index 0..{gh * gw - 1}, row by row)")
    return (int(patch[0]), int(patch[1])), int(layer) % depth, int(head)


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def display_picture(x: torch.Tensor) -> np.ndarray:
    """A picture of a normalised input [3, H, W] for drawing when none is given: each channel
    stretched to 0..255 (the colours are the input's, not the photo's)."""
    t = x.detach().float().cpu()
    lo, hi = t.amin(dim=(1, 2), keepdim=True), t.amax(dim=(1, 2), keepdim=True)
    return ((t - lo) / (hi - lo).clamp_min(1e-8) * 255 + 0.5).clamp(0, 255).byte().permute(1, 2, 0).numpy()


def step_through(model: VisionTransformer, x: torch.Tensor, patch: Any = None, layer: int = 0, head: int = 0,
                 temperature: float = 1.0, picture: Image.Image | np.ndarray | None = None,
                 labels: tuple[str, ...] | None = None, name: str = "") -> Walk:
    """Walk one picture through ``model``: ``x`` [1, 3, H, W] or [3, H, W] (the normalised input),
    ``patch`` (row, col) or a row-major index (None: the patch the readout attends to most in the last
    layer), ``layer`` and ``head`` from 0, the softmax ``temperature`` (1: the model's own).
    ``picture``: the model-input picture to draw on (default: ``x`` stretched to 0..255); ``labels``:
    the class names; ``name``: the model's, for the texts. One forward pass with hooks
    (:mod:`.record`); StepError (one line) for a bad request, checked before it runs."""
    if not isinstance(model, VisionTransformer):
        raise StepError(f"cannot step through a {type(model).__name__}: the steps read the hook points of "
                        "vit_demo's VisionTransformer")
    x = x[None] if x.ndim == 3 else x
    if x.ndim != 4 or x.shape[0] != 1:
        raise StepError(f"step_through walks one picture: give x as [1, 3, H, W] or [3, H, W], not {tuple(x.shape)}")
    t = check_temperature(temperature)
    chosen, layer, head = check_choice(model, x, patch, layer, head)
    param = next(model.parameters())
    w = where(model, layer, head)
    rec = record(model, x.to(param.device), w)
    row, col = chosen if chosen is not None else V.default_patch(rec)
    lay = rec.out.layout
    c = V.Choice(row, col, lay.num_prefix + row * lay.grid[1] + col, layer, head, t)
    values = collect(model, rec, w, c)
    own = {k: values[k] for k in ("attention", "head_output")}
    if "attention_parts" in values:
        own["attention_parts"] = values["attention_parts"]
    if t != 1.0:
        values.update(V.at_temperature(values, t))
    facts = facts_of(model, rec, w, c, labels, name, chosen is None)
    pic = np.asarray(picture.convert("RGB")) if isinstance(picture, Image.Image) else \
        display_picture(x[0]) if picture is None else np.asarray(picture)
    return Walk(step_texts(facts, values), values, facts, pic, own)


def collect(model: VisionTransformer, rec: Any, w: Any, c: V.Choice) -> dict[str, np.ndarray]:
    """Every value of the walk, in the order of the forward (the T = 1 attention: the model's)."""
    values = V.embedding_values(model, rec, c)
    values.update(V.projection_parameters(model))
    values.update(V.position_values(model, rec, c))
    values.update(V.attention_values(model, rec, w, c))
    if "lambda" in values:  # the two maps' parts at T = 1 (the capture keeps their difference)
        values["attention_parts"] = V.at_temperature(values, 1.0)["attention_parts"]
    values.update(V.block_values(rec, c))
    values.update(V.readout_values(model, rec))
    values.update(V.lens_values(model, rec))
    return values
