"""The "Model diagnostics" tab: mean attention distance per head (of this image) and the
position-embedding similarity (of the model), as in the ViT paper's Fig. 7. Both are
matplotlib figures, slower to draw: the distance chart is drawn lazily, when the tab is open,
right after the upload's first pictures; the position-embedding chart once per model (the default
one's at start) and sent as soon as the tab opens."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, ImageDraw

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...methods.attention import grid_structure, mean_attention_distance, pos_embed_similarity
from ..common import friendly, png
from ..context import Context, Section
from ..exports import export_row, save, wire_export
from ..session import Session, Upload

DIAGNOSTICS_CAPTION = (
    "**Mean attention distance** (ViT paper, Dosovitskiy et al. 2021, Fig. 7 right): for each head, how far in pixels "
    "a patch looks on average, weighted by its attention; like a CNN's receptive field. **Position-embedding "
    "similarity** (Fig. 7 centre): each small map shows how similar one patch's position embedding is to all the "
    "others'. Under each chart, what this model's chart shows, read off its numbers."
)
LOCAL = 0.5  # a head looks locally: its patches look less than half as far as attention spread evenly would
FAR = 0.85  # ... far: at least 85 % as far (the ViT paper's late layers sit about there)
EVEN = 0.05  # every head within 5 % of the even spread: attention spread evenly everywhere (an untrained model)
TREND = 0.15  # the late layers' mean this much (of the even spread) farther or nearer than the early layers'
GRID, TRACE = 0.4, 0.15  # rank correlation of similarity with closeness: a learned 2-D grid, a weak trace of one
NEAR = 0.2  # neighbours this much more alike than far pairs, in each direction, for a grid
LINES = 0.1  # the same row / column this much more alike than the other pairs: rows and columns show

# ----------------------------------------------------------------------------- views


def distances(a: Analysis) -> tuple[np.ndarray, float]:
    """This image's mean attention distance [L, H] in pixels, and that of attention spread evenly over the grid."""
    d = mean_attention_distance(a.attentions, a.layout, a.patch_size)[0].numpy()
    return d, viz.uniform_attention_distance(a.layout.grid, a.patch_size)


def distance_figure(a: Analysis):
    d, ref = distances(a)
    return viz.distance_figure(d, title=f"Mean attention distance · {a.model_name}", reference=ref)


def distance_picture(a: Analysis, width: int = 1100) -> Image.Image:
    return viz.figure_to_image(distance_figure(a), width)


def layers(first: int, last: int) -> str:
    """"layer 3" or "layers 1-4" (counting from 1)."""
    return f"layer {first}" if first == last else f"layers {first}–{last}"


def distance_caption(d: np.ndarray, even: float, windowed: bool = False) -> str:
    """What the distance chart of ``d`` [L, H] (pixels; ``even``: attention spread evenly) shows, from
    its numbers: local and far heads in the first and the last third of the layers, and whether
    attention reaches farther with depth. Says so plainly when every head sits at the even spread."""
    rel, (L, _) = d / even, d.shape
    lead = f"**This image**: the dashed line, {even:.0f} px, is where a head would sit if it spread its attention evenly."
    if np.abs(rel - 1).max() <= EVEN:
        return (f"{lead} **Every head of every layer sits on it** ({px(d)}): this model spreads its attention evenly "
                "over the picture, no head looks locally, and depth changes nothing (an untrained model looks like this).")
    k = max(1, L // 3)
    early, late = rel[:k], rel[L - k:]
    if rel.min() >= FAR:
        return (f"{lead} **No head of any layer looks locally**: every one sits at {rel.min():.0%} of that distance or "
                f"farther ({px(d)}), so this model has not learned to look at neighbouring patches. {trend(early, late)}")
    n_local, n_far = int((early < LOCAL).sum()), int((early >= FAR).sum())
    if n_local:
        first = (f"In {layers(1, k)}, {n_local} of {early.size} heads look locally (under half that distance, the "
                 f"nearest {d[:k].min():.0f} px)")
    else:
        first = f"In {layers(1, k)}, no head looks locally (the nearest at {d[:k].min():.0f} px)"
    first += f" and {n_far} far (at {FAR:.0%} of it or more)" if n_far else " and none far"
    if L - k < k:  # one layer: nothing to compare
        return f"{lead} {first}."
    late_far, late_local = int((late >= FAR).sum()), int((late < LOCAL).sum())
    second = (f"in {layers(L - k + 1, L)}, " + ("every head looks far" if late_far == late.size
                                                 else f"{late_far} of {late.size} look far")
              + (f", {late_local} locally" if late_local else "") + f" ({px(d[L - k:])})")
    window = " The windowed layers cannot look beyond their windows." if windowed else ""
    return f"{lead} {first}; {second}. {trend(early, late)}{window}"


def px(d: np.ndarray) -> str:
    """The range of distances ``d`` in pixels: "20–117 px", or "17 px" when they round alike."""
    lo, hi = f"{d.min():.0f}", f"{d.max():.0f}"
    return f"{lo} px" if lo == hi else f"{lo}–{hi} px"


def trend(early: np.ndarray, late: np.ndarray) -> str:
    """Whether attention reaches farther with depth: the late layers' heads against the early ones'
    (their distances as shares of the even spread's)."""
    change = float(late.mean() - early.mean())
    if change >= TREND:
        return "Attention reaches farther with depth, as the ViT paper found."
    if change <= -TREND:
        return "Attention reaches less far in the late layers than in the early ones, the opposite of the ViT paper."
    return (f"Attention reaches about as far in the late layers as in the early ones ({late.mean():.0%} and "
            f"{early.mean():.0%} of the even spread, on average).")


def pos_embed_figure(lm: LoadedModel):
    sim = pos_embed_similarity(lm.model).cpu()
    what = "Position-embedding" if lm.model.pos_embed is not None else "Rotary position-code"  # RoPE without one
    return viz.pos_embed_figure(sim, title=f"{what} similarity · {lm.name}")


def pos_embed_picture(lm: LoadedModel, width: int = 1100) -> Image.Image:
    """The model's position-embedding similarity figure (depends on the model only), or, for a
    model whose positions are only relative biases (BEiT, the relpos ViT), a note saying so."""
    try:
        return viz.figure_to_image(pos_embed_figure(lm), width)
    except ValueError as e:  # no per-patch position code to compare: say so in the picture's place
        img = Image.new("RGB", (width, width // 4), "white")
        text = textwrap.fill(f"{lm.name}: {e}.", width=70)
        ImageDraw.Draw(img).multiline_text((width // 20, width // 20), text, fill="#333333", font=viz.text_font(width // 40))
        return img


def pos_caption(lm: LoadedModel) -> str:
    """What the position-embedding chart of ``lm`` shows, from its numbers (:func:`grid_structure`):
    a learned 2-D grid, rows or columns alone, a weak trace, or no structure at all, said plainly."""
    try:
        g = grid_structure(pos_embed_similarity(lm.model).cpu())
    except ValueError:
        return ("**This model**: its positions are relative biases inside the attention, so there is no per-patch "
                "position embedding to compare (the picture says so).")
    nums = (f"neighbours {g['across']:.2f} across and {g['down']:.2f} down, pairs half the grid apart {g['far']:.2f}; "
            f"rank correlation of similarity with closeness {g['rank_corr']:.2f}")
    lines = g["same_row"] - g["other"] >= LINES and g["same_col"] - g["other"] >= LINES
    grid = (g["rank_corr"] >= GRID and min(g["across"], g["down"]) - g["far"] >= NEAR)
    if lm.model.pos_embed is None:  # rotary codes: computed from each patch's row and column, not learned
        return (f"**This model**: its rotary position codes are computed from each patch's row and column, so the 2-D "
                f"grid is built in, not learned ({nums}).")
    if grid:
        rows = (f" Patches in the same row or column are alike too ({g['same_row']:.2f} and {g['same_col']:.2f}, "
                f"against {g['other']:.2f} for the others)." if lines else "")
        return (f"**This model learned the 2-D grid** from 1-D positions: each patch's embedding is most like its "
                f"neighbours' and less and less like farther ones' ({nums}).{rows}")
    one_way = max(g["across"], g["down"]) - g["far"] >= NEAR
    if one_way:
        along = "its row (the reading order)" if g["across"] > g["down"] else "its column"
        return (f"**This model learned the order along {along} only**, not the 2-D grid: {nums}.")
    if g["rank_corr"] >= TRACE:
        return f"**A weak trace of the 2-D grid**: nearby patches' embeddings are only slightly more alike ({nums})."
    return (f"**No 2-D grid**: a patch's position embedding is no more like its neighbours' than like far patches' "
            f"({nums}). The model has not learned where patches sit in these embeddings (an untrained model's look "
            "like this).")


def export_distance(a: Analysis, up: Upload) -> Path:
    return save(distance_figure(a), f"{Path(up.name).stem}-attention-distance")


def export_pos_embed(lm: LoadedModel) -> Path:
    return save(pos_embed_figure(lm), f"{lm.name}-position-embeddings")


# ----------------------------------------------------------------------------- the section


class DiagnosticsTab(Section):
    name, title = "diagnostics", "Model diagnostics"

    def layout(self, ctx: Context) -> None:
        gr.Markdown(DIAGNOSTICS_CAPTION, elem_classes="caption")
        with gr.Row(equal_height=False):
            with gr.Column():
                self.dist_img = gr.Image(label="Mean attention distance (this image)", show_label=False,
                                         interactive=False, format="png", elem_id="distance", buttons=["fullscreen"])
                self.dist_md = gr.Markdown(elem_classes="caption", elem_id="distance-caption")
                self.dist_btn, self.dist_file = export_row()
            with gr.Column():
                self.pos_img = gr.Image(label="Position-embedding similarity (the model)", show_label=False,
                                        interactive=False, format="png", elem_id="pos-embed", buttons=["fullscreen"])
                self.pos_md = gr.Markdown(elem_classes="caption", elem_id="pos-embed-caption")
                self.pos_btn, self.pos_file = export_row()
        self.views = [self.dist_img, self.dist_md]
        self.exports = [self.dist_btn, self.pos_btn]
        self.lazy_outputs = [self.dist_img, self.dist_md, self.pos_img, self.pos_md]
        self._reg = ctx.reg

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        return {self.dist_img: None, self.dist_md: ""}  # drawn when the tab is open

    def lazy(self, sess: Session) -> dict:
        a = sess.analysis
        d, even = distances(a)
        return {self.dist_img: png(viz.figure_to_image(viz.distance_figure(
                    d, title=f"Mean attention distance · {a.model_name}", reference=even), 1100)),
                self.dist_md: distance_caption(d, even, bool(a.windows)), **self.model_view(sess)}

    def model_view(self, sess: Session) -> dict:
        """The position-embedding chart of the session's model and its caption (drawn once per model, at
        start for the default one: :meth:`warm_up`), unless the page shows them already."""
        key = sess.model_key or self._reg.default_key()
        if sess.model_views.get("pos-embed") == key:
            return {}
        sess.model_views["pos-embed"] = key
        return {self.pos_img: png(self._reg.model_picture(key, "pos-embed", pos_embed_picture)),
                self.pos_md: self._reg.model_picture(key, "pos-embed-caption", pos_caption)}

    def warm_up(self, ctx: Context) -> None:
        """The default model's position-embedding chart and caption, made once at start (not of the photo)."""
        ctx.reg.model_picture(ctx.default_key, "pos-embed", pos_embed_picture)
        ctx.reg.model_picture(ctx.default_key, "pos-embed-caption", pos_caption)

    def on_open(self, dep: Any, ctx: Context) -> Any:
        """The position-embedding chart as soon as the tab opens, photo or not (it shows the model only)."""
        @friendly
        def on_model_view(sess):
            sess = ctx.session(sess)
            return self.model_view(sess) or gr.skip()

        return dep.then(on_model_view, [ctx.state], [self.pos_img, self.pos_md], api_visibility="private",
                        show_progress="hidden", preprocess=False)

    def wire(self, ctx: Context) -> None:
        wire_export(ctx, self.dist_btn, self.dist_file, [], lambda s: export_distance(s.analysis, s.upload))
        wire_export(ctx, self.pos_btn, self.pos_file, [], lambda s: export_pos_embed(ctx.model(s)))
