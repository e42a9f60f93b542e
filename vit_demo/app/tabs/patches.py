"""The Patches tab: the model input cut into numbered patches (click one to make it the query
patch) and the token sequence the transformer reads."""

from __future__ import annotations

import math
from pathlib import Path

import gradio as gr
from PIL import Image

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ..common import jpeg, png
from ..context import Context, Section
from ..exports import export_row, save, wire_export
from ..session import Session, Upload

SEQ_WIDTH = 900  # px: the sequence picture in the tab

# ----------------------------------------------------------------------------- views


def patch_caption(a: Analysis, lm: LoadedModel) -> str:
    gh, gw = a.layout.grid
    n = gh * gw
    names = a.layout.names()
    prefix = " ".join(f"`{t}`" for t in names)
    seq = f"{prefix} + {n} patches = **{len(names) + n} tokens**" if names else f"{n} patches = **{n} tokens**"
    why = (" The **[class] token** is an extra token with no piece of the picture: through attention it gathers what "
           "the patches say, and the model reads its answer from it alone." if a.layout.cls_index is not None else "")
    return (f"**{a.patch_size}×{a.patch_size}-px patches → a {gh}×{gw} grid = {n} patches**, numbered in the "
            f"order the transformer reads them (left to right, top to bottom). Each patch becomes one "
            f"{lm.model.cfg.embed_dim}-number vector; the sequence is {seq}.{why}{naflex_note(a, lm)}"
            f"{window_note(a)} Click a patch to make it the query in the attention explorer.")


def naflex_note(a: Analysis, lm: LoadedModel) -> str:
    """For a NaFlex model: why the grid has the picture's shape."""
    if not lm.model.cfg.naflex:
        return ""
    gh, gw = a.layout.grid
    budget = (lm.data_config.input_size[0] // a.patch_size) * (lm.data_config.input_size[1] // a.patch_size)
    return (f" **NaFlex** reads any grid of patches: the picture keeps its aspect ratio (nothing cropped), scaled "
            f"to the most patches within its budget of {budget}, so this picture is {gh} rows × {gw} columns.")


def window_note(a: Analysis) -> str:
    """For a model with windowed attention (SAM's encoder): the windows in words."""
    if not a.window:
        return ""
    w = a.window
    wh, ww = -(-a.layout.grid[0] // w), -(-a.layout.grid[1] // w)
    glob = [str(i + 1) for i, s in enumerate(a.windows) if not s]
    where = (f"layers {', '.join(glob)} attend" if len(glob) > 1 else f"layer {glob[0]} attends" if glob
             else "no layer attends")
    return (f" **Windowed attention**: in most layers a patch attends only to the patches of its own {w}×{w} "
            f"window (the green lines: {wh}×{ww} windows, the last row and column cut by the edge); {where} "
            f"over the whole grid.")


def patch_picture(a: Analysis, highlight: int | None = None, numbers: bool = True) -> Image.Image:
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=numbers, highlight=highlight, window=a.window)


def patch_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`patch_picture` without drawing it."""
    scale = max(1, math.ceil(32 / a.patch_size))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def sequence_picture(
    a: Analysis, highlight: int | None = None, width: int = 1120, embed_dim: int | None = None
) -> Image.Image:
    """The flattened sequence the transformer reads for this analysis (fast: PIL), drawn by
    :func:`vit_demo.viz.previews.sequence_image`."""
    return viz.sequence_image(a.picture, a.patch_size, a.layout.names(), highlight, width, embed_dim)


def export_patches(a: Analysis, up: Upload, highlight: int | None) -> Path:
    fig = viz.patch_grid_figure(a.picture, a.patch_size, a.layout.names(), highlight=highlight)
    return save(fig, f"{Path(up.name).stem}-patches")


# ----------------------------------------------------------------------------- the section


class PatchesTab(Section):
    name, title = "patches", "Patches"

    def layout(self, ctx: Context) -> None:
        with gr.Row(equal_height=False):
            self.patch_img = gr.Image(label="Patch grid (click a patch)", show_label=False, interactive=False,
                                      format="png", height=460, elem_id="patch-grid", buttons=["fullscreen"], scale=2)
            with gr.Column(scale=3):
                self.patch_md = gr.Markdown("*Upload an image to see it cut into patches.*")
                self.seq_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="sequence",
                                        buttons=["fullscreen"], container=False)
                self.btn, self.file = export_row()
        self.views = [self.patch_img, self.patch_md, self.seq_img]
        self.exports = [self.btn]
        self.query_outputs = [self.patch_img, self.seq_img]
        ctx.click_targets.append((self.patch_img, lambda a, _head: patch_picture_size(a)))

    def _pictures(self, sess: Session, lm: LoadedModel, query: int | None) -> dict:
        a = sess.analysis
        # the grid over the photo as JPEG (quality 92): 3 ms and ~60 KB, where PNG took 25 ms and ~400 KB
        return {self.patch_img: jpeg(patch_picture(a, query)),
                self.seq_img: png(sequence_picture(a, query, SEQ_WIDTH, lm.model.cfg.embed_dim))}

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        return {**self._pictures(sess, lm, sess.query), self.patch_md: patch_caption(sess.analysis, lm)}

    def show_query(self, sess: Session, lm: LoadedModel, query: int) -> dict:
        return self._pictures(sess, lm, query)

    def wire(self, ctx: Context) -> None:
        wire_export(ctx, self.btn, self.file, [], lambda s: export_patches(s.analysis, s.upload, s.query))
