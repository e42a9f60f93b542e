"""The "For presentations" tab: a ready-made slide deck for the current image (PowerPoint and
PDF, :mod:`vit_demo.present.deck`), up to four images side by side with one method on one colour scale,
and the current image under two models (:mod:`vit_demo.present.side_by_side`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from ... import methods, viz
from ...images import ImageError
from ...present import deck
from ...present.side_by_side import MAX_IMAGES, compare_images, compare_models
from ...present.slides import write_pdf, write_pptx
from ..common import friendly, open_upload, png
from ..context import Context, Section
from ..exports import slug, within_budget
from ..motion import present_dir
from ..registry import ModelError
from ..session import Session

DECK_WIDTH = 2400  # px: the figures on the slides
PREVIEW_WIDTH = 1600  # px: the side-by-side figures shown in the page


def method_choices() -> list[tuple[str, str]]:
    """(menu text, name) of every registered method; the slow ones say so."""
    return [(methods.get(m).title + (" (slow: hundreds of forward passes)" if methods.get(m).slow else ""), m)
            for m in methods.names()]


def deck_files(sess: Session, ctx: Context) -> tuple[Path, Path]:
    """The deck of the current image as .pptx and .pdf (one build, two layouts)."""
    a, lm = sess.analysis, ctx.model(sess)
    if not a.logits.numel():
        raise gr.Error(f"{lm.name} has no classifier: a deck needs predictions.", print_exception=False)
    spec = ctx.reg.spec(sess.model_key)
    name = deck.display_name(Path(sess.upload.name).stem)
    slides = deck.build_slides(lm, [sess.upload.picture], [name], weights=str(spec.path) if spec.path else None,
                               width_px=DECK_WIDTH)
    stem = present_dir() / slug(f"{Path(sess.upload.name).stem}-deck-{a.key[:8]}")
    out = write_pptx(slides, stem.with_suffix(".pptx")), write_pdf(slides, stem.with_suffix(".pdf"))
    within_budget()
    return out


def extra_images(files: Any, ctx: Context) -> list[tuple[str, Any]]:
    """(name, picture) of the extra uploaded images, at most MAX_IMAGES - 1, each checked (only
    files this server stored for an upload, within the app's limits)."""
    out = []
    for f in (files or [])[: MAX_IMAGES - 1]:
        up = open_upload(f if isinstance(f, (str, dict)) else getattr(f, "name", None), ctx.files, ctx.cfg.limits)
        out.append((deck.display_name(Path(up.name).stem), up.picture))
    return out


class PresentTab(Section):
    name, title = "present", "For presentations"

    def layout(self, ctx: Context) -> None:
        gr.Markdown("A **slide deck** for this image: 16:9, one idea a slide (prediction, patches, heads, attention "
                    "across layers, rollout, relevance with its faithfulness, the check against timm, the model), "
                    "speaker notes on every slide. PowerPoint (editable) and PDF.", elem_classes="caption")
        self.deck_btn = gr.Button("⬇ Slide deck for this image (PowerPoint + PDF)", variant="primary",
                                  elem_id="make-deck")
        self.deck_files = gr.File(visible=False, show_label=False, file_count="multiple", elem_id="deck-files")
        gr.Markdown("### Side by side: up to four images\nThe current image first, then up to three more; the same "
                    "method and ONE colour scale for all, each with its prediction.")
        with gr.Row(equal_height=True):
            self.more = gr.File(label=f"Up to {MAX_IMAGES - 1} more images", file_count="multiple",
                                file_types=["image"], type="filepath", height=110, elem_id="more-images", scale=3)
            self.method = gr.Dropdown(method_choices(), value="chefer", label="Method", elem_id="sbs-method", scale=2)
            self.sbs_btn = gr.Button("Compare the images", elem_id="compare-images", scale=1)
        self.sbs_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="side-by-side",
                                height=560, buttons=["download", "fullscreen"], visible=False)
        gr.Markdown("### Two models, one image\nThe current image under the model above and a second one, "
                    "same method and colour scale.")
        with gr.Row(equal_height=True):
            self.other = gr.Dropdown(ctx.reg.choices(), value=None, label="Second model", elem_id="second-model",
                                     scale=3)
            self.mm_btn = gr.Button("Compare the models", elem_id="compare-models", scale=1)
        self.mm_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="two-models",
                               height=560, buttons=["download", "fullscreen"], visible=False)
        self.files = [self.deck_files, self.sbs_img, self.mm_img]  # made on demand; hidden for a new analysis

    def wire(self, ctx: Context) -> None:
        def ready(sess: Session | None) -> Session:
            sess = ctx.session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            return sess

        @friendly
        def on_deck(sess):
            pptx, pdf = deck_files(ready(sess), ctx)
            return gr.update(value=[str(pptx), str(pdf)], visible=True)

        @friendly
        def on_images(files, method, cmap, alpha, sess):
            sess = ready(sess)
            try:
                more = extra_images(files, ctx)
            except ImageError as e:
                raise gr.Error(str(e), print_exception=False) from None
            names = [deck.display_name(Path(sess.upload.name).stem)] + [n for n, _ in more]
            fig = compare_images(ctx.model(sess), [sess.upload.picture] + [p for _, p in more], names, method,
                                 cmap=cmap, alpha=alpha)
            return gr.update(value=png(viz.figure_to_image(fig, PREVIEW_WIDTH)), visible=True)

        @friendly
        def on_models(key, method, cmap, alpha, sess):
            sess = ready(sess)
            if not key:
                raise gr.Error("Pick a second model first.", print_exception=False)
            try:
                other = ctx.reg.get(key)
            except ModelError as e:
                raise gr.Error(str(e), print_exception=False) from None
            fig = compare_models([ctx.model(sess), other], sess.upload.picture, method, cmap=cmap, alpha=alpha)
            return gr.update(value=png(viz.figure_to_image(fig, PREVIEW_WIDTH)), visible=True)

        self.deck_btn.click(on_deck, [ctx.state], [self.deck_files], api_visibility="private",
                            show_progress="minimal", **ctx.slow)
        self.sbs_btn.click(on_images, [self.more, self.method, ctx.cmap, ctx.alpha, ctx.state], [self.sbs_img],
                           api_visibility="private", show_progress="minimal", **ctx.slow)
        self.mm_btn.click(on_models, [self.other, self.method, ctx.cmap, ctx.alpha, ctx.state], [self.mm_img],
                          api_visibility="private", show_progress="minimal", **ctx.slow)
