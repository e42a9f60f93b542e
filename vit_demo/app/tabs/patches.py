"""The Patches tab: the model input cut into numbered patches (click one to make it the query
patch) and the token sequence the transformer reads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, ImageDraw

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
    return (f"**{a.patch_size}×{a.patch_size}-px patches → a {gh}×{gw} grid = {n} patches**, numbered in the "
            f"order the transformer reads them (left to right, top to bottom). Each patch becomes one "
            f"{lm.model.cfg.embed_dim}-number vector; the sequence is {seq}. Click a patch to make it the query "
            f"in the attention explorer.")


def patch_picture(a: Analysis, highlight: int | None = None, numbers: bool = True) -> Image.Image:
    return viz.patch_grid_image(a.picture, a.patch_size, numbers=numbers, highlight=highlight)


def patch_picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`patch_picture` without drawing it."""
    scale = max(1, math.ceil(32 / a.patch_size))
    gh, gw = a.layout.grid
    return gw * a.patch_size * scale, gh * a.patch_size * scale


def sequence_picture(
    a: Analysis, highlight: int | None = None, width: int = 1120, embed_dim: int | None = None
) -> Image.Image:
    """The flattened sequence the transformer reads (fast: PIL): the prefix tokens, then the
    patches left to right, top to bottom (the first ones, an ellipsis, the last ones, and the
    ``highlight`` patch wherever it sits), each with its patch number above and its position in
    the sequence below."""
    P, n, p = a.layout.num_prefix, a.layout.num_patches, a.patch_size
    names = a.layout.names()
    pic = np.asarray(a.picture)
    gw = a.layout.grid[1]
    box, gap = 56, 10
    slots_fit = max(6, (width - 110) // (box + gap))
    tail = 3
    first = max(2, slots_fit - P - tail - 1 - (2 if highlight is not None else 0))
    shown: list[int | None] = list(range(min(first, n)))
    if highlight is not None and first <= highlight < n - tail:
        if highlight > first:
            shown.append(None)
        shown.append(highlight)
    if n > len([s for s in shown if s is not None]):
        if shown[-1] is not None and shown[-1] + 1 < n - tail:
            shown.append(None)
        shown += [i for i in range(max(n - tail, (shown[-1] or 0) + 1), n)]
    slots: list[tuple[str, Any]] = [("prefix", t) for t in names]
    slots += [("patch", i) if i is not None else ("dots", None) for i in shown]

    title_font, small, tiny = viz.text_font(17, bold=True), viz.text_font(13), viz.text_font(12, bold=True)
    height = 250
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    total = len(slots) * (box + gap) - gap
    x0 = max(80, (width - total) // 2)
    y_box = 86
    head = f"{' + '.join(names)} + {n} patches = {P + n} tokens" if names else f"{n} patches = {n} tokens"
    draw.text((width / 2, 20), f"The sequence the transformer reads: {head}", font=title_font, fill=(34, 34, 34),
              anchor="mm")
    draw.text((x0 - 8, y_box - 14), "patch", font=small, fill=(102, 102, 102), anchor="rm")
    draw.text((x0 - 8, y_box + box + 16), "position", font=small, fill=(102, 102, 102), anchor="rm")
    for k, (kind, val) in enumerate(slots):
        x = x0 + k * (box + gap)
        if kind == "prefix":
            colour = viz.token_color(val)
            draw.rounded_rectangle((x, y_box, x + box, y_box + box), radius=8, fill=colour)
            draw.text((x + box / 2, y_box + box / 2), val, font=tiny, fill="white", anchor="mm")
            pos = k
        elif kind == "patch":
            r, c = divmod(val, gw)
            cut = pic[r * p:(r + 1) * p, c * p:(c + 1) * p]
            thumb = Image.fromarray(cut).resize((box, box), Image.Resampling.NEAREST)
            img.paste(thumb, (x, y_box))
            hl = val == highlight
            draw.rectangle((x - 1, y_box - 1, x + box, y_box + box), outline=(0, 229, 255) if hl else (136, 136, 136),
                           width=3 if hl else 1)
            draw.text((x + box / 2, y_box - 14), str(val), font=small, fill=(34, 34, 34), anchor="mm")
            pos = P + val
        else:
            draw.text((x + box / 2, y_box + box / 2), "…", font=title_font, fill=(102, 102, 102), anchor="mm")
            continue
        draw.rounded_rectangle((x + 8, y_box + box + 6, x + box - 8, y_box + box + 26), radius=6, fill=(155, 143, 184))
        draw.text((x + box / 2, y_box + box + 16), str(pos), font=tiny, fill="white", anchor="mm")
    dim = f"a {embed_dim}-number vector" if embed_dim else "one vector"
    lines = [
        f"Each {p}×{p}×3-pixel patch is flattened and projected to {dim}; "
        + (f"{' and '.join(names)} {'are learned vectors' if len(names) > 1 else 'is a learned vector'} "
           "of the same size." if names else "there are no extra tokens."),
        "A learned position embedding is added to every token: the model is told where each patch came from.",
    ]
    for i, line in enumerate(lines):
        draw.text((width / 2, 192 + i * 22), line, font=small, fill=(102, 102, 102), anchor="mm")
    return img


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
        self.files = [self.file]
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
