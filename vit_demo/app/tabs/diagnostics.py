"""The "Model diagnostics" tab: mean attention distance per head (of this image) and the
position-embedding similarity (of the model), as in the ViT paper's Fig. 7. Both are
matplotlib figures, slower to draw: they are drawn lazily, when the tab is open."""

from __future__ import annotations

import textwrap
from pathlib import Path

import gradio as gr
from PIL import Image, ImageDraw

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...methods.attention import mean_attention_distance, pos_embed_similarity
from ..common import png
from ..context import Context, Section
from ..exports import export_row, save, wire_export
from ..session import Session, Upload

DIAGNOSTICS_CAPTION = (
    "**Mean attention distance** (ViT paper, Dosovitskiy et al. 2021, Fig. 7 right): for each head, how far in pixels "
    "a patch looks on average, weighted by its attention; like a CNN's receptive field. Early layers mix local and "
    "global heads, late layers look far. **Position-embedding similarity** (Fig. 7 centre): each small map shows how "
    "similar one patch's learned position embedding is to all the others; the model learned the 2-D grid from 1-D "
    "positions."
)

# ----------------------------------------------------------------------------- views


def distance_figure(a: Analysis):
    d = mean_attention_distance(a.attentions, a.layout, a.patch_size)[0]
    ref = viz.uniform_attention_distance(a.layout.grid, a.patch_size)
    return viz.distance_figure(d, title=f"Mean attention distance · {a.model_name}", reference=ref)


def distance_picture(a: Analysis, width: int = 1100) -> Image.Image:
    return viz.figure_to_image(distance_figure(a), width)


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
                self.dist_btn, self.dist_file = export_row()
            with gr.Column():
                self.pos_img = gr.Image(label="Position-embedding similarity (the model)", show_label=False,
                                        interactive=False, format="png", elem_id="pos-embed", buttons=["fullscreen"])
                self.pos_btn, self.pos_file = export_row()
        self.views = [self.dist_img]
        self.exports = [self.dist_btn, self.pos_btn]
        self.lazy_outputs = [self.dist_img, self.pos_img]
        self._reg = ctx.reg

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        return {self.dist_img: None}  # drawn when the tab is open

    def lazy(self, sess: Session) -> dict:
        return {self.dist_img: png(distance_picture(sess.analysis)),
                self.pos_img: png(self._reg.model_picture(sess.model_key, "pos-embed", pos_embed_picture))}

    def wire(self, ctx: Context) -> None:
        wire_export(ctx, self.dist_btn, self.dist_file, [], lambda s: export_distance(s.analysis, s.upload))
        wire_export(ctx, self.pos_btn, self.pos_file, [], lambda s: export_pos_embed(ctx.model(s)))
