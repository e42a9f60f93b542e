"""The deck's "Step inside" section about one photo: four slides that walk one of its patches through
the model (:mod:`vit_demo.inside`: one forward pass, every number the model's own), each with the
step pictures of :mod:`vit_demo.viz.steps` and speaker notes quoting this photo's numbers.

1. a patch becomes a token (the patch grid, the projection);
2. one query meets every key (the scores, the softmax);
3. the weighted sum, and the residual stream through the layers;
4. the answer forms layer by layer (the logit lens, the logits).

By default the walk follows the patch the readout attends to most in the last layer, into the last
layer's first head (``inside=`` of :func:`inside_slides` chooses another patch, layer or head).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..analysis import Analysis
from ..inside import Walk, step_through
from .slides import Slide

SLIDES = 4  # the section's slides for each photo
COSTS = (1, 1, 1, 1)  # their share of the deck's progress bar (one forward pass, then pictures)
DEFAULT = {"patch": None, "layer": -1, "head": 0}
VASWANI = "Vaswani et al., 'Attention Is All You Need' (NeurIPS 2017)"
VIT = "Dosovitskiy et al., 'An Image is Worth 16x16 Words' (ICLR 2021)"
LENS = "nostalgebraist, 'interpreting GPT: the logit lens' (LessWrong, 2020)"


def pictures(walk: Walk, names: tuple[str, ...], width_px: int) -> list[Any]:
    """The steps' pictures for a slide ``width_px`` wide, side by side (about 960 px each at scale 1)."""
    scale = max(1.0, width_px / (960 * len(names)))
    return [walk.render(n, scale) for n in names]


def inside_slides(lm: Any, analysis: Analysis, name: str, width_px: int = 2400, inside: dict | None = None
                  ) -> Iterator[Slide]:
    """The section's slides for one analysed photo, one at a time (the walk runs before the first)."""
    choice = {**DEFAULT, **(inside or {})}
    walk = step_through(lm.model, analysis.x, choice["patch"], choice["layer"], choice["head"],
                        choice.get("temperature", 1.0), analysis.picture, lm.labels, lm.name)
    f, v = walk.facts, walk.values
    section = f"Step inside: {name}"
    where = f"Image: {name}  ·  {f.patch_name}, {f.where}"
    C, K = v["projection_weight"].shape
    why = ", the one its readout attends to most in the last layer" if f.chosen_by_model else ""
    yield Slide("Step inside: a patch becomes a token", pictures(walk, ("patches", "projection"), width_px),
                f"We follow one patch of {name} through the model: {f.patch_name}{why}. Its {f.patch_size}x"
                f"{f.patch_size} pixels in three colours are {K} numbers, and one learned matrix turns them into a "
                f"token of {C}: embedding = W . patch_vector + b. Every number shown is the model's own, as in {VIT}.",
                section, where)
    yield scores_slide(walk, section, where, width_px)
    norms = v["residual_norms"]
    yield Slide("Step inside: a weighted sum, added to the stream", pictures(walk, ("weighted_sum", "residual"), width_px),
                f"The head's output is the attention-weighted sum of the values, o = sum_i a_i v_i: "
                f"{v['head_output'].size} numbers. Every block adds its heads' and its MLP's outputs to the token, the "
                f"residual stream of {VASWANI}; its length goes from {norms[0]:.2f} after the embedding to "
                f"{norms[-1]:.2f} after layer {f.depth}.", section, where)
    if "lens" in v:
        yield lens_slide(walk, section, where, width_px)


def scores_slide(walk: Walk, section: str, where: str, width_px: int) -> Slide:
    """The query against every key, and the softmax: the attention row the Attention tab draws."""
    f, v = walk.facts, walk.values
    a, keys = np.asarray(v["attention"]), v["key_tokens"]
    best = int(np.argmax(a))
    D = v["query"].shape[-1]
    return Slide("Step inside: one query meets every key", pictures(walk, ("scores", "softmax"), width_px),
                 f"In {f.where}, the patch's query is compared with every key: score = q . k / sqrt({D}). The softmax "
                 f"turns the scores into weights that sum to 1, the attention of {VASWANI}. Here "
                 f"{f.token_name(int(keys[best]))} gets the most, {a[best] * 100:.1f}%.", section, where)


def lens_slide(walk: Walk, section: str, where: str, width_px: int) -> Slide:
    """The logit lens and the logits: the answer forming layer by layer."""
    f, v = walk.facts, walk.values
    final = int(np.argmax(v["logits"]))
    tops = np.asarray(v["lens"]).argmax(-1)
    first = next((i for i in range(len(tops)) if (tops[i:] == final).all()), len(tops) - 1)
    return Slide("Step inside: the answer forms layer by layer", pictures(walk, ("lens", "logits"), width_px),
                 f"Reading the readout after every layer through the final norm and the head (the logit lens of {LENS}) "
                 f"shows when the answer forms: '{f.labels[final]}' leads from layer {first + 1} of {f.depth} on. The "
                 f"last row of the lens is the model's logits: {v['probabilities'][final] * 100:.1f}% for "
                 f"'{f.labels[final]}'.", section, where)
