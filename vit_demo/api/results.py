"""The Python API's results: plain frozen dataclasses of numpy arrays, labels and numbers (easy to
test and to pickle), each drawing itself (:class:`~.drawable.Drawable`).

- :class:`Prediction`: the top-k classes of one picture;
- :class:`Explanation`: one method's map [gh, gw] for one picture and one class;
- :class:`Comparison`: several methods' maps for one picture (and their faithfulness);
- :class:`Attention`: every layer's and head's attention [L, H, N, N], the rollout, the tokens;
- :class:`Results`: one of the above per picture of a list.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from .. import viz
from ..methods.attention import cls_attention, head_maps, query_attention
from ..model import TokenLayout
from ..viz.panels import MAX_PANELS, Panel, images_figure
from .drawable import ALPHA, CMAP, Drawable, beside, img_tag, picture_figure, stacked, table, topk_table

TILE = 300  # px: a map's tile in the inline pictures (the app's relevance row: 260)
MEASURES = ("deletion", "insertion", "srg", "saco")  # vit_demo.evaluate.srg_saco, for one picture


@dataclass(frozen=True, eq=False)
class Prediction(Drawable):
    """The top-k classes of one picture, most likely first (``topk``: as ``predict --json`` lists them)."""

    image: str  # the file's name, or "image 1"...
    model: str
    indices: np.ndarray = field(repr=False)  # [k] class indices
    labels: tuple[str, ...]
    probs: np.ndarray = field(repr=False)  # [k] probabilities
    picture: np.ndarray = field(repr=False)  # [H, W, 3] uint8: what the model saw (resized, cropped)

    @property
    def label(self) -> str:
        return self.labels[0]

    @property
    def prob(self) -> float:
        return float(self.probs[0])

    @property
    def topk(self) -> list[dict[str, Any]]:
        """``[{"index", "label", "prob"}, ...]``: the records of ``python -m vit_demo predict --json``."""
        return [{"index": int(i), "label": lab, "prob": float(p)} for i, lab, p in zip(self.indices, self.labels, self.probs)]

    def input_picture(self) -> Image.Image:
        return Image.fromarray(self.picture)

    def render(self) -> Image.Image:
        """The picture the model saw beside its top-k bars."""
        chart = viz.figure_to_image(self.figure(), 760)
        pic = self.input_picture()
        return beside([pic.resize((round(pic.width * chart.height / pic.height), chart.height)), chart])

    def figure(self) -> Figure:
        """The top-k bars (the deck's and the exports' renderer)."""
        return viz.topk_figure(self.topk, title=f"{self.image}  ·  {self.model}")

    def _repr_html_(self) -> str:
        return (f'<div style="display:flex;gap:1em;align-items:flex-start">{img_tag(self.input_picture())}'
                f"<div>{topk_table(self.topk)}</div></div>")


@dataclass(frozen=True, eq=False)
class Explanation(Drawable):
    """One method's map over the patch grid for one picture (and one class, for a class-specific method)."""

    image: str
    model: str
    method: str  # the registered name ("chefer")
    title: str  # the method's title ("Chefer relevance")
    map: np.ndarray = field(repr=False)  # [gh, gw] float32
    picture: np.ndarray = field(repr=False)  # [H, W, 3] uint8, the model input
    target: int | None  # the class explained (None: a class-agnostic map, or a headless model)
    label: str | None
    prob: float | None  # the model's probability of that class
    predictions: tuple[dict[str, Any], ...] = field(repr=False)  # the top-k, as Prediction.topk
    faithfulness: dict[str, float] | None = None  # {"deletion", "insertion", "srg", "saco"}, when asked for
    value: str = "relevance"  # what the map's numbers are (the colour bar's label)

    @property
    def heading(self) -> str:
        """The tile's title, as the app writes it: the method, and the class it explains."""
        return f"{self.title}\nfor “{self.label}”" if self.label is not None else self.title

    def input_picture(self) -> Image.Image:
        return Image.fromarray(self.picture)

    def render(self) -> Image.Image:
        return viz.with_colorbar(viz.tiles_image(self.picture, {self.heading: self.map}, CMAP, ALPHA, tile=TILE), CMAP)

    def figure(self) -> Figure:
        """The command line's figure (``explain --method``): the input, the map, its colour bar."""
        what = f" for '{self.label}'" if self.label is not None else ""
        caption = f"{self.image}  ·  {self.model}"
        if self.predictions:
            caption += f"  ·  predicted: {self.predictions[0]['label']} ({self.predictions[0]['prob'] * 100:.1f}%)"
        return viz.heatmap_figure(self.picture, self.map, title=f"{self.title}{what}", label=self.value,
                                  show_input=True, caption=caption)

    def html_details(self) -> str:
        rows = faithfulness_rows([self])
        return (topk_table(self.predictions) if self.predictions else "") + (faithfulness_table(rows) if rows else "")


@dataclass(frozen=True, eq=False)
class Comparison(Drawable):
    """Several methods' maps for one picture and one class, side by side as the app shows them."""

    explanations: tuple[Explanation, ...]

    def __getitem__(self, key: int | str) -> Explanation:
        if isinstance(key, str):
            for e in self.explanations:
                if e.method == key:
                    return e
            raise KeyError(f"no map of {key!r} here; these: {', '.join(self.methods)}")
        return self.explanations[key]

    def __len__(self) -> int:
        return len(self.explanations)

    def __iter__(self) -> Iterator[Explanation]:
        return iter(self.explanations)

    @property
    def methods(self) -> list[str]:
        return [e.method for e in self.explanations]

    @property
    def maps(self) -> dict[str, np.ndarray]:
        """``{method: map [gh, gw]}``."""
        return {e.method: e.map for e in self.explanations}

    @property
    def faithfulness(self) -> dict[str, dict[str, float]]:
        """``{method: {"deletion", "insertion", "srg", "saco"}}`` (empty unless asked for)."""
        return {e.method: e.faithfulness for e in self.explanations if e.faithfulness is not None}

    def render(self) -> Image.Image:
        tiles = {e.heading: e.map for e in self.explanations}
        return viz.with_colorbar(viz.tiles_image(self.explanations[0].picture, tiles, CMAP, ALPHA, tile=TILE), CMAP)

    def figure(self) -> Figure:
        """The app's export of a row of maps (``compare_figure``): the input, then each method."""
        first = self.explanations[0]
        title = f"Relevance for “{first.label}”" if first.label is not None else first.image
        return viz.compare_figure(first.picture, {e.title: e.map for e in self.explanations}, CMAP, ALPHA,
                                  title=title, max_cols=4)

    def html_details(self) -> str:
        first, rows = self.explanations[0], faithfulness_rows(self.explanations)
        return (topk_table(first.predictions) if first.predictions else "") + (faithfulness_table(rows) if rows else "")


def faithfulness_rows(explanations: Any) -> list[tuple[Any, ...]]:
    return [(e.method, *(e.faithfulness[m] for m in MEASURES)) for e in explanations if e.faithfulness is not None]


def faithfulness_table(rows: list[tuple[Any, ...]]) -> str:
    return ("<p>Faithfulness on this picture (mean-colour replacement; deletion: lower is better, insertion, SRG "
            "and SaCo: higher is better)</p>" + table(["method", "deletion", "insertion", "SRG", "SaCo"], rows))


@dataclass(frozen=True, eq=False)
class Attention(Drawable):
    """Every layer's and head's attention for one picture, the rollout, and where each token sits."""

    image: str
    model: str
    maps: np.ndarray | tuple[np.ndarray, ...] = field(repr=False)  # [L, H, N, N] (a tuple when layers differ)
    rollout: np.ndarray = field(repr=False)  # [gh, gw]: the app's (mean fusion, nothing discarded, from layer 1)
    grid: tuple[int, int]
    patch_size: int
    tokens: tuple[str, ...]  # the prefix tokens' names, in order ("[class]", ...); the patches follow
    cls_index: int | None
    dist_index: int | None
    reg_indices: tuple[int, ...]
    probe: np.ndarray | None = field(repr=False)  # an attention-pool head's query over the N tokens, else None
    picture: np.ndarray = field(repr=False)
    predictions: tuple[dict[str, Any], ...] = field(repr=False)

    @property
    def depth(self) -> int:
        return len(self.maps)

    @property
    def num_heads(self) -> int:
        return self.maps[0].shape[0]

    def layout(self) -> TokenLayout:
        """The model's :class:`~vit_demo.model.TokenLayout` of this picture."""
        probe = None if self.probe is None else torch.from_numpy(self.probe)[None]
        return TokenLayout(len(self.tokens), self.cls_index, self.dist_index, self.reg_indices, self.grid, probe)

    def layer_index(self, layer: int) -> int:
        """``layer`` counted from 0 (negative: from the end) as an index; IndexError outside the model."""
        if not -self.depth <= layer < self.depth:
            raise IndexError(f"layer {layer}: this model has layers 0..{self.depth - 1} (counted from 0; -1 the last)")
        return layer % self.depth

    def attentions(self) -> list[torch.Tensor]:
        """Per layer [1, H, N, N], as :mod:`vit_demo.methods.attention` takes them."""
        if isinstance(self.maps, np.ndarray):  # one block: the layers are read at once (methods.attention.stacked)
            every = torch.from_numpy(self.maps)
            return [every[i][None] for i in range(len(every))]
        return [torch.from_numpy(m)[None] for m in self.maps]

    def map(self, layer: int = -1, head: int | None = None, query: int | None = None) -> np.ndarray:
        """[gh, gw]: where the model's query (``query``: a patch, row-major from 0) looks in ``layer``
        (from 0; -1 the last), one head (from 0) or the mean of the heads."""
        layer = self.layer_index(layer)
        if head is not None and not 0 <= head < self.num_heads:
            raise IndexError(f"head {head}: this model has heads 0..{self.num_heads - 1} (counted from 0)")
        if query is None:
            return cls_attention(self.attentions(), self.layout(), layer, head)[0].numpy()
        return query_attention(self.attentions(), self.layout(), layer, query, head)[0].numpy()

    def heads(self, layer: int | None = None, query: int | None = None) -> np.ndarray:
        """Every head's map: [H, gh, gw] of ``layer``, or [L, H, gh, gw] of every layer (None)."""
        at = None if layer is None else self.layer_index(layer)
        return head_maps(self.attentions(), self.layout(), at, query)[0].numpy()

    def view(self, layer: int = -1, head: int | None = None, query: int | None = None) -> Explanation:
        """:meth:`map` as a drawable :class:`Explanation` (method "attention")."""
        at = self.layer_index(layer)
        who = f"patch {query}" if query is not None else self.reader()
        heads = "mean of heads" if head is None else f"head {head + 1}"
        return self.explanation("attention", f"Attention of {who}, layer {at + 1} of {self.depth}, {heads}",
                                self.map(layer, head, query), "attention weight")

    def reader(self) -> str:
        """Whose attention the maps read, in the words of ``explain --method attention``."""
        return ("the attention pool's query" if self.probe is not None else "[class]" if self.cls_index is not None
                else "mean of the patch queries")

    def rollout_view(self) -> Explanation:
        """The rollout as a drawable :class:`Explanation` (method "rollout")."""
        return self.explanation("rollout", "Attention rollout (mean of heads)", self.rollout, "rollout")

    def explanation(self, method: str, title: str, m: np.ndarray, value: str) -> Explanation:
        return Explanation(image=self.image, model=self.model, method=method, title=title, map=m, picture=self.picture,
                           target=None, label=None, prob=None, predictions=self.predictions, value=value)

    def render(self) -> Image.Image:
        """The app's first two tiles (raw attention of the last layer, rollout) over every layer's heads."""
        tiles = {f"Raw attention\nlayer {self.depth} of {self.depth}, mean of heads": self.map(-1),
                 "Attention rollout\nmean fusion": self.rollout}
        top = viz.with_colorbar(viz.tiles_image(self.picture, tiles, CMAP, ALPHA, tile=TILE), CMAP)
        try:
            every = viz.heads_image(self.picture, self.heads(), CMAP, ALPHA, tile=96 if self.num_heads > 6 else 112)
        except RuntimeError:  # layers of different shapes: the last layer's heads only
            every = viz.heads_image(self.picture, self.heads(-1), CMAP, ALPHA, layer=self.depth - 1)
        return stacked([top, viz.with_colorbar(every, CMAP)])

    def figure(self) -> Figure:
        """The app's export of "every layer x every head"."""
        return viz.heads_figure(self.picture, self.heads(), CMAP, ALPHA,
                                title=f"Attention of {self.reader()}, every layer and head")

    def html_details(self) -> str:
        return topk_table(self.predictions) if self.predictions else ""


T = TypeVar("T", Prediction, Explanation, Comparison, Attention)


@dataclass(frozen=True, eq=False)
class Results(Drawable, Generic[T]):
    """One result per picture of a list, in order: index it, iterate it, or draw them all."""

    items: tuple[T, ...]

    def __getitem__(self, i: int) -> T:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    @property
    def maps(self) -> np.ndarray:
        """The explanations' maps as one array: [B, gh, gw] (one method) or [B, M, gh, gw] (several)."""
        if all(isinstance(r, Explanation) for r in self.items):
            return np.stack([r.map for r in self.items])
        if all(isinstance(r, Comparison) for r in self.items):
            return np.stack([np.stack(list(r.maps.values())) for r in self.items])
        raise TypeError("only a batch of explanations has maps")

    def render(self) -> Image.Image:
        """Each picture's own rendering: one map a picture side by side (four a row), others one under the other."""
        pictures = [r.render() for r in self.items]
        if all(isinstance(r, Explanation) for r in self.items):
            return stacked([beside(pictures[i:i + MAX_PANELS]) for i in range(0, len(pictures), MAX_PANELS)])
        return stacked(pictures)

    def figure(self) -> Figure:
        """One method on up to four pictures: the side-by-side figure (each picture above its map);
        otherwise the pictures of :meth:`image` in one figure."""
        if all(isinstance(r, Explanation) for r in self.items) and len(self.items) <= MAX_PANELS:
            panels = [Panel(Image.fromarray(r.picture), r.map, list(r.predictions), r.model, r.target) for r in self.items]
            return images_figure(panels, [r.image for r in self.items], title=self.items[0].title,
                                 label=self.items[0].value, cmap=CMAP, alpha=ALPHA)
        return picture_figure(self.render())

    def html_details(self) -> str:
        return "".join(r.html_details() for r in self.items)

    def _repr_html_(self) -> str:
        return "<hr>".join(r._repr_html_() for r in self.items)
