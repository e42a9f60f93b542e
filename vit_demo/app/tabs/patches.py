"""The Patches tab: the model input cut into numbered patches (click one to make it the query
patch) and the token sequence the transformer reads."""

from __future__ import annotations

import math
from pathlib import Path

import gradio as gr
from PIL import Image
from torch import nn

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...methods.stem import receptive_field, stem_layers, stem_stages
from ..common import jpeg, png
from ..context import Context, Section
from ..exports import export_row, save, wire_export
from ..query import wire_query_click
from ..session import Session, Upload

SEQ_WIDTH = 900  # px: the sequence picture in the tab
STEM_TILE = 150  # px: one panel of the convolutional stem's picture

# ----------------------------------------------------------------------------- views


def patch_caption(a: Analysis, lm: LoadedModel) -> str:
    gh, gw = a.layout.grid
    n = gh * gw
    names = a.layout.names()
    prefix = " ".join(f"`{t}`" for t in names)
    seq = f"{prefix} + {n} patches = **{len(names) + n} tokens**" if names else f"{n} patches = **{n} tokens**"
    why = (" The **[class] token** is an extra token with no piece of the picture: through attention it gathers what "
           "the patches say, and the model reads its answer from it alone." if a.layout.cls_index is not None else "")
    stem = lm.model.cfg.conv_stem
    return (f"**{a.patch_size}×{a.patch_size}-px {'cells' if stem else 'patches'} → a {gh}×{gw} grid = {n} patches**, "
            f"numbered in the order the transformer reads them (left to right, top to bottom). Each patch becomes one "
            f"{lm.model.cfg.embed_dim}-number vector; the sequence is {seq}.{stem_note(a, lm)}{why}{readout_note(a, lm)}"
            f"{naflex_note(a, lm)}{window_note(a)} Click a patch to make it the query in the attention explorer.")


def stem_stage_words(lm: LoadedModel) -> tuple[int, str]:
    """How many stages the convolutional stem has, and what one stage does."""
    k = sum(isinstance(m, nn.Conv2d) for m in stem_layers(lm.model))
    if lm.model.cfg.stem_pool:  # CCT's tokenizer
        return k, "a 3×3 convolution with BatchNorm and ReLU, then a 3×3 max-pool of stride 2 that halves the picture"
    return k, "a 3×3 convolution of stride 2, which halves the picture, with BatchNorm and ReLU"


def stem_note(a: Analysis, lm: LoadedModel) -> str:
    """For a model whose tokens come from a convolutional stem: what the stem does (empty for the
    plain patch embedding, where each patch is cut out, flattened and projected)."""
    if not lm.model.cfg.conv_stem:
        return ""
    k, stage = stem_stage_words(lm)
    h, w = a.x.shape[-2:]
    sizes = " → ".join(f"{h // 2**i}×{w // 2**i}" for i in range(k + 1))
    chans = ", then ".join(str(m.out_channels) for m in stem_layers(lm.model) if isinstance(m, nn.Conv2d))
    rf, p = receptive_field(lm.model), a.patch_size
    return (f" The vectors come from a **convolutional stem**, not from projecting each patch's own pixels: "
            f"{k} stage{'s' if k > 1 else ''}, each {stage} ({sizes} px; {chans} channels), then a 1×1 convolution "
            f"projects each cell of the grid to its vector. So one token sees {rf}×{rf} pixels of the picture, more "
            f"than its own {p}×{p} cell (neighbouring tokens share pixels).")


def readout_note(a: Analysis, lm: LoadedModel) -> str:
    """For a model without a [class] token: where its answer is read from instead."""
    cfg = lm.model.cfg
    if a.layout.cls_index is not None or not cfg.num_classes:
        return ""
    if cfg.global_pool == "avg":
        return (" There is **no [class] token**: the model reads its answer from the **mean of the patch tokens** "
                "after the last block, and the attention maps that would follow [class] read the mean of the patch "
                "queries' rows instead.")
    if cfg.global_pool == "map":
        return (" There is **no [class] token**: an **attention-pool head** (a learned query) reads the tokens after "
                "the last block.")
    return ""


def sequence_tokenizer(lm: LoadedModel) -> str | None:
    """The sequence picture's words for how a token is made, when it is not a patch flattened and
    projected (a convolutional stem), else None."""
    if not lm.model.cfg.conv_stem:
        return None
    k, _ = stem_stage_words(lm)
    pool = " + max-pool" if lm.model.cfg.stem_pool else ", stride 2"
    return (f"A convolutional stem ({k} × [3×3 conv{pool}], 1×1 conv) makes each token: "
            f"a {lm.model.cfg.embed_dim}-number vector")


def stem_picture(a: Analysis, lm: LoadedModel) -> Image.Image:
    """The picture and what each stage of the convolutional stem makes of it, then the tokens."""
    stages = [(f"{s.name} · {s.map.shape[0]}×{s.map.shape[1]}",
               f"length of {s.channels} numbers" if s.name == "tokens" else f"mean of {s.channels} channels", s.map)
              for s in stem_stages(lm.model, a.x)]
    return viz.stem_image(a.picture, stages, tile=STEM_TILE)


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


def patch_picture(a: Analysis, highlight: int | None = None) -> Image.Image:
    """The model input cut into numbered patches (``highlight`` outlined; SAM's windows drawn)."""
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=True, highlight=highlight, window=a.window)


def patch_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`patch_picture` without drawing it."""
    scale = max(1, math.ceil(32 / a.patch_size))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def sequence_picture(
    a: Analysis, highlight: int | None = None, width: int = 1120, embed_dim: int | None = None,
    tokenizer: str | None = None,
) -> Image.Image:
    """The flattened sequence the transformer reads for this analysis (fast: PIL), drawn by
    :func:`vit_demo.viz.previews.sequence_image` (``tokenizer``: :func:`sequence_tokenizer`)."""
    return viz.sequence_image(a.picture, a.patch_size, a.layout.names(), highlight, width, embed_dim, tokenizer)


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
                self.stem_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="stem",
                                         buttons=["fullscreen"], container=False, visible=False)
                self.btn, self.file = export_row()
        self.views = [self.patch_img, self.patch_md, self.seq_img, self.stem_img]
        self.exports = [self.btn]
        self.query_outputs = [self.patch_img, self.seq_img]

    def _pictures(self, sess: Session, lm: LoadedModel, query: int | None) -> dict:
        a = sess.analysis
        # the grid over the photo as JPEG (quality 92): 3 ms and ~60 KB, where PNG took 25 ms and ~400 KB
        return {self.patch_img: jpeg(patch_picture(a, query)),
                self.seq_img: png(sequence_picture(a, query, SEQ_WIDTH, lm.model.cfg.embed_dim, sequence_tokenizer(lm)))}

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a, stem = sess.analysis, lm.model.cfg.conv_stem
        return {**self._pictures(sess, lm, sess.query), self.patch_md: patch_caption(a, lm),
                self.stem_img: gr.update(value=png(stem_picture(a, lm)) if stem else None, visible=stem)}

    def show_query(self, sess: Session, lm: LoadedModel, query: int, vals: dict) -> dict:
        return self._pictures(sess, lm, query)

    def wire(self, ctx: Context) -> None:
        wire_query_click(ctx, self.patch_img, lambda a, _vals: patch_picture_size(a))  # a click: the query patch
        wire_export(ctx, self.btn, self.file, [], lambda s: export_patches(s.analysis, s.upload, s.query))
