"""The Attention tab: the attention explorer. Pick a layer, a head (or all heads, or every
layer and head) and whose attention to show: the [class] token's, or a query patch's (click a
picture of the input, here or in the Patches tab). Also the public ``/attention`` endpoint.

Layers and heads are counted from 1 on the page ("layer 12 of 12"): the layer slider, and so the
``/attention`` endpoint's ``layer``, run from 1 to the model's depth (the version before counted
from 0). The head menu's values stay the index ("0" is head 1), as its labels say."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import torch
from PIL import Image

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...methods.attention import cls_attention, head_maps, query_attention
from ..common import VIEW_SIZE, check_look, friendly, jpeg, png
from ..context import Context, Section
from ..exports import export_row, save, slug, wire_export
from ..motion import AnimationRow, animation_files
from ..query import wire_query_click
from ..session import Session, Upload

CLASS_TOKEN = "[class] token"
PATCH_QUERY = "a patch (click the picture)"
HEAD_ALL, HEAD_MEAN, HEAD_LAYERS = "all", "mean", "layers"

# ----------------------------------------------------------------------------- views


def query_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`query_picture` without drawing it."""
    scale = max(1, round(VIEW_SIZE / max(a.picture.size)))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def head_choices(num_heads: int) -> list[tuple[str, str]]:
    """(menu text, value): heads are shown counted from 1; the value is the index (from 0)."""
    return ([("all heads (grid)", HEAD_ALL), ("mean of the heads", HEAD_MEAN)]
            + [(f"head {h + 1}", str(h)) for h in range(num_heads)]
            + [("every layer × every head", HEAD_LAYERS)])


def layer_index(value: Any, depth: int) -> tuple[int, str]:
    """The slider's layer (counted from 1, as the page shows it) as an index from 0, and a note
    when the value had to be changed (an API call with a layer the model does not have)."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        return depth - 1, f"Layer {value!r} is not a number: showing layer {depth} of {depth}. "
    if not 1 <= v <= depth:
        shown = min(max(v, 1), depth)
        return shown - 1, f"There is no layer {v} (this model has layers 1 to {depth}): showing layer {shown}. "
    return v - 1, ""


def layer_label(depth: int | None) -> str:
    """The layer slider's label: its ends named for the model shown (none before the first analysis)."""
    return "Layer (1 = first)" if depth is None else f"Layer (1 = first, {depth} = last)"


def one_head(head: Any) -> int | None:
    """The head menu's value as one head's index, or None (all heads, their mean, every layer)."""
    h = _head(head)
    return h if isinstance(h, int) else None


def _head(head: str | int | None) -> str | int:
    if head in (None, "", HEAD_MEAN):
        return HEAD_MEAN
    if head in (HEAD_ALL, HEAD_LAYERS):
        return head
    try:
        return int(head)
    except (TypeError, ValueError):
        return HEAD_ALL


def _query_label(a: Analysis, query: int | None) -> str:
    if query is None:
        if a.layout.probe is not None:  # an attention-pool head predicts: its query, through this layer
            return "the attention pool's query (its attention over the tokens, carried through this layer)"
        if a.layout.cls_index is None:
            return "every patch (mean; this model has no [class] token)"
        return "the [class] token"
    r, c = divmod(query, a.layout.grid[1])
    return f"patch {query} (row {r + 1}, column {c + 1})"


def model_query(a: Analysis | None) -> str:
    """What the maps read when no patch is the query: the [class] token, the attention pool's
    query, or, for a model without either, the mean of the patch queries."""
    if a is not None and a.layout.probe is not None:
        return "the attention pool's query"
    if a is not None and a.layout.cls_index is None:
        return "the mean of the patch queries (no [class] token)"
    return "the [class] token"


def query_choices(a: Analysis | None) -> list[tuple[str, str]]:
    """The query menu, (label, value): the first entry's value stays ``CLASS_TOKEN`` (the API's
    word for "the model's own query"), its label says what that is for this model."""
    label = model_query(a)
    return [(CLASS_TOKEN if label == "the [class] token" else label, CLASS_TOKEN), (PATCH_QUERY, PATCH_QUERY)]


def prefix_share(a: Analysis, layer: int, head: str | int, query: int | None) -> float | None:
    """The fraction of the query's attention that goes to the prefix tokens (not on the map)."""
    P = a.layout.num_prefix
    if not P:
        return None
    att = a.attentions[layer][0]  # [H, N, N]
    if query is not None:
        rows = att[:, P + query]
    elif a.layout.probe is not None:  # the attention pool's query, carried through this layer
        rows = a.layout.probe[0].to(att.dtype) @ att
    else:
        rows = att[:, a.layout.cls_index] if a.layout.cls_index is not None else att[:, P:].mean(1)
    share = rows[:, :P].sum(-1)  # [H]
    return float(share.mean() if not isinstance(head, int) else share[head])


def attention_maps(a: Analysis, layer: int, head: str | int, query: int | None) -> torch.Tensor:
    """[gh, gw], [H, gh, gw] or [L, H, gh, gw] maps for the explorer's settings."""
    head = _head(head)
    if head == HEAD_LAYERS:
        return head_maps(a.attentions, a.layout, None, query)[0]
    if head == HEAD_ALL:
        return head_maps(a.attentions, a.layout, layer, query)[0]
    h = None if head == HEAD_MEAN else head
    if query is None:
        return cls_attention(a.attentions, a.layout, layer, h)[0]
    return query_attention(a.attentions, a.layout, layer, query, h)[0]


def attention_view(
    a: Analysis,
    layer: int,
    head: str | int | None = HEAD_ALL,
    query: int | None = None,
    cmap: str = "inferno",
    alpha: float = 0.6,
    smooth: bool = True,
) -> tuple[Image.Image, str]:
    """The explorer's picture (with its colour bar) and a caption that says what it shows and
    what you may conclude. ``layer``, a head given as an int: indices from 0; the caption
    counts from 1 ("layer 12 of 12")."""
    layer = int(np.clip(int(layer), 0, a.depth - 1))
    head = _head(head)
    if isinstance(head, int) and not 0 <= head < a.num_heads:
        head = HEAD_ALL
    if query is not None and not 0 <= query < a.layout.num_patches:
        query = None
    maps = attention_maps(a, layer, head, query)
    who = _query_label(a, query)
    where = f"layer {layer + 1} of {a.depth}"
    window = a.windows[layer] if a.windows and head != HEAD_LAYERS else 0
    if head == HEAD_LAYERS:
        tile = 96 if a.num_heads > 6 else 112
        pic = viz.heads_image(a.picture, maps, cmap, alpha, smooth, tile=tile, mark=query)
        what = f"Where {who} looks in **every layer (L1 = first) and every head (H1 ...)**"
    elif head == HEAD_ALL:
        H = a.num_heads
        cols = H if H <= 6 else math.ceil(H / math.ceil(H / 6))
        tile = int(min(300, max(120, 880 // cols)))
        base = viz.draw_windows(a.picture.copy(), a.layout.grid, window) if window else a.picture
        pic = viz.heads_image(base, maps, cmap, alpha, smooth, tile=tile, layer=layer, mark=query)
        what = f"Where {who} looks in **{where}**, each of the {H} heads"
    else:
        pic = viz.overlay_image(a.picture, maps, cmap, alpha, smooth, size=VIEW_SIZE, mark=query)
        if window:
            viz.draw_windows(pic, a.layout.grid, window)
        which = "the mean of the heads" if head == HEAD_MEAN else f"head {head + 1} of {a.num_heads}"
        what = f"Where {who} looks in **{where}**, {which}"
    share = prefix_share(a, layer, head if head != HEAD_LAYERS else HEAD_MEAN, query) if head != HEAD_LAYERS else None
    extra = ""
    if share is not None:
        names = "/".join(a.layout.names())
        extra = f" {share * 100:.0f}% of its attention goes to {names}, which has no place on the picture."
    caption = (f"{what}. Bright patches are the ones it takes the most information from: attention shows where the "
               f"model looks, not why it gives its answer.{extra}{windows_caption(a, layer, head, query)}")
    return viz.with_colorbar(pic, cmap), caption


def windows_caption(a: Analysis, layer: int, head: str | int, query: int | None) -> str:
    """For windowed attention (SAM's encoder): what this layer's windows mean for the map."""
    if not a.windows:
        return ""
    w = a.window
    if head == HEAD_LAYERS:
        glob = ", ".join(f"L{i + 1}" for i, s in enumerate(a.windows) if not s) or "none"
        return (f" Most layers attend within {w}×{w}-patch windows, so their maps are windows side by side; the "
                f"global layers: {glob}.")
    if not a.windows[layer]:
        return f" Layer {layer + 1} is one of the global layers: every patch may attend to the whole grid."
    if query is None:
        return (f" Layer {layer + 1} attends **within {w}×{w}-patch windows** (the green lines): no patch looks "
                f"outside its own window, so this mean over every patch's attention is one map per window, side by "
                f"side. Click a patch to see its window alone.")
    return (f" Layer {layer + 1} attends **within {w}×{w}-patch windows** (the green lines): patch {query} can "
            f"only look inside its own window; everything outside it is zero.")


def query_picture(a: Analysis, query: int | None) -> Image.Image:
    """The model input with its patch grid and the query patch outlined: the click target."""
    scale = max(1, round(VIEW_SIZE / max(a.picture.size)))
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=False, highlight=query, scale=scale, window=a.window)


def export_attention(a: Analysis, up: Upload, layer: int, head: str | int | None, query: int | None,
                     cmap: str, alpha: float, smooth: bool) -> Path:
    """The explorer's view as a slide figure; ``layer``: the index (from 0)."""
    head = _head(head)
    layer = int(np.clip(int(layer), 0, a.depth - 1))
    maps = attention_maps(a, layer, head, query)
    short = "pool query" if a.layout.probe is not None else "[class]" if a.layout.cls_index is not None else "mean of patches"
    who = short if query is None else f"patch {query}"
    where = f"layer {layer + 1} of {a.depth}"
    if head == HEAD_LAYERS:
        fig = viz.heads_figure(a.picture, maps, cmap, alpha, smooth, title=f"Attention of {who}, every layer and head",
                               mark=query)
        name = f"{Path(up.name).stem}-attention-all-layers-{slug(who)}"
    elif head == HEAD_ALL:
        fig = viz.heads_figure(a.picture, maps, cmap, alpha, smooth, title=f"Attention of {who} · {where}",
                               layer=layer, mark=query)
        name = f"{Path(up.name).stem}-attention-layer{layer + 1}-heads-{slug(who)}"
    else:
        which = "mean of heads" if head == HEAD_MEAN else f"head {head + 1}"
        fig = viz.heatmap_figure(a.picture, maps, cmap, alpha, smooth, show_input=True, mark=query,
                                 title=f"Attention of {who} · {where}, {which}")
        name = f"{Path(up.name).stem}-attention-layer{layer + 1}-{slug(which)}-{slug(who)}"
    return save(fig, name)


def query_and_note(a: Analysis | None, mode: str, patch: Any) -> tuple[int | None, str]:
    """The query patch the controls ask for, and a note when the asked-for patch does not exist
    (then the [class] token is shown, and the caption says so instead of silently ignoring it)."""
    if mode != PATCH_QUERY or patch is None:
        return None, ""
    try:
        q = int(patch)
    except (TypeError, ValueError):
        return None, f"Patch {patch!r} is not a number: showing {model_query(a)}. "
    if a is not None and not 0 <= q < a.layout.num_patches:
        return None, (f"There is no patch {q} (patches are numbered 0 to {a.layout.num_patches - 1}): "
                      f"showing {model_query(a)}. ")
    return q, ""


# ----------------------------------------------------------------------------- the section


class AttentionTab(Section):
    name, title = "attention", "Attention"

    def layout(self, ctx: Context) -> None:
        with gr.Row(equal_height=True):
            self.layer = gr.Slider(1, 12, value=12, step=1, label=layer_label(None), elem_id="layer", scale=3,
                                   min_width=220)
            self.head = gr.Dropdown(head_choices(3), value=HEAD_ALL, label="Head", elem_id="head", scale=2)
            self.qmode = gr.Radio([CLASS_TOKEN, PATCH_QUERY], value=CLASS_TOKEN, label="Query: whose attention?",
                                  elem_id="query-mode", scale=3)
            self.qpatch = gr.Number(value=0, precision=0, minimum=0, label="Query patch", elem_id="query-patch",
                                    scale=1, min_width=110)
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=260):
                gr.Markdown("**Click a patch** to see where it looks (also on a single-head map):",
                            elem_classes="caption")
                self.query_img = gr.Image(label="Click a patch to make it the query", show_label=False,
                                          interactive=False, format="png", height=330, elem_id="query-picker",
                                          buttons=[])
            with gr.Column(scale=5):
                self.att_img = gr.Image(label="Attention", show_label=False, interactive=False, format="png",
                                        elem_id="attention", buttons=["fullscreen"])
                self.att_md = gr.Markdown(elem_classes="caption", elem_id="attention-caption")
                self.btn, self.file = export_row("attention-file")
                self.motion = AnimationRow()
                self.motion.layout("attention")
        # the explorer's settings (read by name: a new control joins the lists, /attention's parameters stay)
        self.show_inputs = [self.layer, self.head, self.qmode, self.qpatch, ctx.cmap, ctx.alpha, ctx.smooth]
        self.views = [self.query_img, self.att_img, self.att_md]
        self.controls = [self.layer, self.head, self.qmode, self.qpatch]
        self.files = [*self.motion.outputs]
        self.exports = [self.btn]
        self.redisplay_inputs = list(self.show_inputs)
        self.redisplay_outputs = [self.att_img, self.att_md, self.query_img]
        self.query_inputs = [self.layer, self.head, ctx.cmap, ctx.alpha, ctx.smooth]
        self.query_outputs = [self.qmode, self.qpatch, self.att_img, self.att_md, self.query_img]

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a = sess.analysis
        layer, head, _, _, cmap, alpha, smooth = (vals[c] for c in self.redisplay_inputs)
        layer = layer_index(layer, a.depth)[0] if layer is not None else a.depth - 1
        heads = dict((v, lab) for lab, v in head_choices(a.num_heads))
        head = head if head in heads else HEAD_ALL
        q = sess.query
        att, caption = attention_view(a, layer, head, q, cmap, alpha, smooth)
        return {
            self.query_img: png(query_picture(a, q)),
            self.att_img: jpeg(att),
            self.att_md: caption,
            self.layer: gr.update(maximum=a.depth, value=layer + 1, label=layer_label(a.depth)),
            self.head: gr.update(choices=head_choices(a.num_heads), value=head),
            self.qmode: gr.update(choices=query_choices(a), value=PATCH_QUERY if q is not None else CLASS_TOKEN),
            self.qpatch: gr.update(maximum=a.layout.num_patches - 1, value=q if q is not None else 0),
        }

    def redisplay(self, sess: Session, vals: dict) -> dict:
        """The explorer's picture for its settings; the picker too when the query changed."""
        layer, head, mode, patch, cmap, alpha, smooth = (vals[c] for c in self.redisplay_inputs)
        q, q_note = query_and_note(sess.analysis, mode, patch)
        layer, layer_note = layer_index(layer, sess.analysis.depth)
        pic, caption = attention_view(sess.analysis, layer, head, q, cmap, alpha, smooth)
        note = (layer_note + q_note).strip()
        out = {self.att_img: jpeg(pic), self.att_md: (f"**{note}** " if note else "") + caption}
        if q != sess.query:  # the picker outlines the query: redraw it only when that changes
            sess.query = q
            out[self.query_img] = png(query_picture(sess.analysis, q))
        return out

    def show_query(self, sess: Session, lm: LoadedModel, query: int, vals: dict) -> dict:
        """A new query patch (a click here or in another tab): the explorer shows where it looks."""
        a = sess.analysis
        layer, head, cmap, alpha, smooth = (vals[c] for c in self.query_inputs)
        pic, caption = attention_view(a, layer_index(layer, a.depth)[0], head, query, cmap, alpha, smooth)
        return {self.qmode: PATCH_QUERY, self.qpatch: query, self.att_img: jpeg(pic), self.att_md: caption,
                self.query_img: png(query_picture(a, query))}

    def wire(self, ctx: Context) -> None:
        # /attention's parameters, by name and in this order, whatever else the tab shows
        api = [self.layer, self.head, self.qmode, self.qpatch, ctx.cmap, ctx.alpha, ctx.smooth]

        @friendly
        def on_attention(layer: float, head: str, query: str, patch: float, cmap: str, alpha: float, smooth: bool,
                         sess: Any = None):
            """The explorer's picture, its caption and the query picker for these settings: ``layer``
            from 1, ``head`` the menu's value ("all", "mean", "layers" or a head's index from 0),
            ``query`` whose attention ("[class] token" or "a patch (click the picture)"), ``patch``
            the query patch's number."""
            check_look(cmap, alpha)
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            return self.redisplay(sess, dict(zip(api, (layer, head, query, patch, cmap, alpha, smooth))))

        gr.on([self.layer.input, self.head.input, self.qmode.input, self.qpatch.input], on_attention,
              [*api, ctx.state], [self.att_img, self.att_md, self.query_img], api_name="attention",
              trigger_mode="always_last", show_progress="hidden", preprocess=False)
        # a click on the picker, or on a single-head map, makes the patch under it the query
        wire_query_click(ctx, self.query_img, lambda a, _vals: query_picture_size(a))
        wire_query_click(ctx, self.att_img, lambda a, vals: single_map_size(a, vals[self.head]))
        self.motion.wire(ctx, [self.head, ctx.cmap, ctx.alpha], lambda s, lm, head, cmap, alpha: animation_files(
            s.analysis, lm, s.upload.name, ("attention",), one_head(head), None, cmap, alpha))
        wire_export(ctx, self.btn, self.file, [self.layer, self.head, ctx.cmap, ctx.alpha, ctx.smooth],
                    lambda s, layer, head, cmap, alpha, smooth: export_attention(
                        s.analysis, s.upload, layer_index(layer, s.analysis.depth)[0], head, s.query, cmap, alpha, smooth))


def single_map_size(a: Analysis, head: Any) -> tuple[int, int] | None:
    """Size of the explorer's picture when it is one map of the input (None for the head grids)."""
    if head in (HEAD_ALL, HEAD_LAYERS):
        return None
    return VIEW_SIZE, VIEW_SIZE * a.picture.height // a.picture.width
