"""``Model.steps``'s result: one picture walked through the ViT, step by step (:mod:`vit_demo.inside`).

- :class:`Steps`: the walk's steps in the order of the forward pass (iterate, index by position or
  name), their numbers (``values``: numpy arrays by name), what was chosen (patch, token, layer, head,
  temperature); :meth:`Steps.with_temperature` re-takes the softmax without a forward pass;
- :class:`StepView`: one step, its title, its text and its picture.

Both draw themselves in Jupyter (``_repr_png_``, ``_repr_html_``), give a matplotlib figure and
save it (:class:`~.drawable.Drawable`).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from ..inside import Walk
from ..viz.strips import Pen, label_image, stack, wrapped
from .drawable import Drawable, img_tag, picture_figure


def headed(title: str, text: str, picture: Image.Image) -> Image.Image:
    """A step's picture under its title and text (the inline picture of a notebook)."""
    pen = Pen()
    width = max(picture.width, pen(900))
    lines = [label_image(title, pen, 17, bold=True, width=width)]
    lines += [label_image(line, pen, 13, colour=(85, 85, 85), width=width) for line in wrapped(text, pen.font(13), width)]
    return stack([stack(lines, gap=pen(2)), picture], gap=pen(10))


@dataclass(frozen=True, eq=False)
class StepView(Drawable):
    """One step of a walk: ``name`` (vit_demo.inside.STEPS), ``title``, ``text`` (its equation in plain
    text), ``exists`` (False: the model has no such step, and the text says what it does instead)."""

    name: str
    title: str
    text: str
    exists: bool
    walk: Walk = field(repr=False)

    def picture(self, scale: float = 1.0) -> Image.Image:
        """The step's picture alone (the app's; ``scale`` 2 for a slide)."""
        return self.walk.render(self.name, scale)

    def render(self) -> Image.Image:
        return headed(self.title, self.text, self.picture())

    def figure(self) -> Figure:
        return picture_figure(self.picture(2.0), self.title)

    def html_details(self) -> str:
        return f"<p>{html.escape(self.text)}</p>"

    def _repr_html_(self) -> str:
        return f"<h4>{html.escape(self.title)}</h4><p>{html.escape(self.text)}</p>{img_tag(self.picture())}"


@dataclass(frozen=True, eq=False)
class Steps(Drawable):
    """One picture's walk through the model: the steps in order and every number they show."""

    image: str
    model: str
    walk: Walk = field(repr=False)

    @property
    def steps(self) -> tuple[StepView, ...]:
        return tuple(StepView(s.name, s.title, s.text, s.exists, self.walk) for s in self.walk.steps)

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Every step's numbers by name (docs/step-inside.md lists them): ``image``, ``pixels``,
        ``patch_vector``, ``embedding``, ``position``, ``query``, ``keys``, ``values``, ``scores``,
        ``attention``, ``head_output``, ``residual_norms``, ``mlp_hidden``, ``lens``, ``logits``..."""
        return self.walk.values

    @property
    def patch(self) -> tuple[int, int]:
        return self.walk.patch

    @property
    def token(self) -> int:
        """The patch's index in the token sequence (prefix tokens first)."""
        return self.walk.token

    @property
    def layer(self) -> int:
        return self.walk.layer

    @property
    def head(self) -> int:
        return self.walk.head

    @property
    def temperature(self) -> float:
        return self.walk.temperature

    def __len__(self) -> int:
        return len(self.walk.steps)

    def __iter__(self) -> Iterator[StepView]:
        return iter(self.steps)

    def __getitem__(self, key: int | str) -> StepView:
        if isinstance(key, str):
            self.walk.step(key)  # KeyError naming the steps
            return next(s for s in self.steps if s.name == key)
        return self.steps[key]

    def with_temperature(self, temperature: float) -> Steps:
        """The same walk with the softmax at ``temperature`` (no forward pass; 1: the model's own)."""
        return Steps(image=self.image, model=self.model, walk=self.walk.with_temperature(temperature))

    def to_json(self, parameters: bool = False) -> dict[str, Any]:
        """The steps and the values as plain JSON (the projection's weights only with ``parameters``)."""
        return {"image": self.image, **self.walk.to_json(parameters)}

    def render(self) -> Image.Image:
        """Every step under its title and text, one under the other."""
        return stack([s.render() for s in self.steps], gap=28)

    def figure(self) -> Figure:
        return picture_figure(self.render(), f"{self.image}: step inside {self.model}")

    def _repr_html_(self) -> str:
        head = (f"<p><b>{html.escape(self.image)}</b> through {html.escape(self.model)}: patch {self.patch}, layer "
                f"{self.layer + 1}, head {self.head + 1}, temperature {self.temperature:g}</p>")
        return head + "<hr>".join(s._repr_html_() for s in self.steps)
