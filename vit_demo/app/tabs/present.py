"""The "For presentations" tab: a ready-made slide deck for the current image (PowerPoint and
PDF, :mod:`vit_demo.present.deck`), up to four images side by side with one method, and the current
image under two models (:mod:`vit_demo.present.side_by_side`); the maps compared each on its own
colour scale or on one shared scale (a visible choice). Every button shows its progress and can
be cancelled (:mod:`vit_demo.app.jobs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from ... import methods, viz
from ...images import ImageError
from ...present import deck
from ...present.side_by_side import MAX_IMAGES, compare_images, compare_models
from ...present.slides import write_pdf, write_pptx
from ...progress import part
from ..common import open_upload, png
from ..context import Context, Section
from ..exports import slug, within_budget
from ..jobs import LongAction
from ..motion import present_dir
from ..registry import ModelError
from ..session import Session

DECK_WIDTH = 2400  # px: the figures on the slides
PREVIEW_WIDTH = 1600  # px: the side-by-side figures shown in the page


def method_choices() -> list[tuple[str, str]]:
    """(menu text, name) of every registered method; the slow ones say so."""
    return [(methods.get(m).title + (" (slow: hundreds of forward passes)" if methods.get(m).slow else ""), m)
            for m in methods.names()]


SCALES = [("each image its own scale (shows where each image's evidence is)", "own"),
          ("one shared scale (brightness comparable; one hot spot can darken the rest)", "shared")]


def deck_files(sess: Session, ctx: Context) -> tuple[Path, Path]:
    """The deck of the current image as .pptx and .pdf (one build, two layouts), reporting
    "slide 3 of 9" as it goes (:class:`~vit_demo.app.jobs.LongAction` shows it)."""
    a, lm = sess.analysis, ctx.model(sess)
    if not a.logits.numel():
        raise gr.Error(f"{lm.name} has no classifier: a deck needs predictions.", print_exception=False)
    spec = ctx.reg.spec(sess.model_key)
    name = deck.display_name(Path(sess.upload.name).stem)
    with part(0.0, 0.03, "timm's model, for the check"):
        try:
            reference = ctx.reg.timm_twin(sess.model_key)
        except ModelError:
            reference = None  # the deck's timm slide builds it (and says what is wrong) itself
    with part(0.03, 0.9, ""):
        slides = deck.build_slides(lm, [sess.upload.picture], [name], weights=str(spec.path) if spec.path else None,
                                   width_px=DECK_WIDTH, reference=reference, analyses=[a], step=sess.step_choice())
    stem = present_dir() / slug(f"{Path(sess.upload.name).stem}-deck-{a.key[:8]}")
    with part(0.9, 0.93, "writing the PowerPoint file"):
        pptx = write_pptx(slides, stem.with_suffix(".pptx"))
    with part(0.93, 1.0, "writing the PDF"):
        pdf = write_pdf(slides, stem.with_suffix(".pdf"))
    within_budget()
    return pptx, pdf


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
                    "across layers, rollout, relevance, how faithful it is, the check against timm, the model), "
                    "speaker notes on every slide. PowerPoint (editable) and PDF, from one click (15-20 s on 2 CPU cores).",
                    elem_classes="caption")
        self.deck = LongAction("⬇ Slide deck for this image (PowerPoint + PDF)", "make-deck", variant="primary",
                                min_width=340)
        self.deck.layout()
        self.deck_files = gr.File(visible=False, show_label=False, file_count="multiple", elem_id="deck-files")
        gr.Markdown("### Side by side: up to four images\nThe current image first, then up to three more; the same "
                    "method for all, each with its prediction.")
        self.scale = gr.Radio(SCALES, value="own", label="Colour scale of the maps compared below", elem_id="scale")
        with gr.Row(equal_height=True):
            self.more = gr.File(label=f"Up to {MAX_IMAGES - 1} more images", file_count="multiple",
                                file_types=["image"], type="filepath", height=110, elem_id="more-images", scale=3)
            self.method = gr.Dropdown(method_choices(), value="chefer", label="Method", elem_id="sbs-method", scale=2)
        self.sbs = LongAction("Compare the images", "compare-images")
        self.sbs.layout()
        self.sbs_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="side-by-side",
                                height=560, buttons=["download", "fullscreen"], visible=False)
        gr.Markdown("### Two models, one image\nThe current image under the model above and a second one, "
                    "same method.")
        self.other = gr.Dropdown(ctx.reg.choices(), value=None, label="Second model", elem_id="second-model")
        self.mm = LongAction("Compare the models", "compare-models")
        self.mm.layout()
        self.mm_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="two-models",
                               height=560, buttons=["download", "fullscreen"], visible=False)
        self.files = [self.deck_files, self.sbs_img, self.mm_img]  # made on demand; hidden for a new analysis

    def wire(self, ctx: Context) -> None:
        def ready(sess: Session | None) -> Session:
            sess = ctx.session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            return sess

        def on_deck(sess):
            pptx, pdf = deck_files(ready(sess), ctx)
            return {self.deck_files: gr.update(value=[str(pptx), str(pdf)], visible=True)}

        def on_images(files, method, cmap, alpha, scale, sess):
            sess = ready(sess)
            try:
                more = extra_images(files, ctx)
            except ImageError as e:
                raise gr.Error(str(e), print_exception=False) from None
            names = [deck.display_name(Path(sess.upload.name).stem)] + [n for n, _ in more]
            with part(0.0, 0.8, "maps"):
                fig = compare_images(ctx.model(sess), [sess.upload.picture] + [p for _, p in more], names, method,
                                     cmap=cmap, alpha=alpha, shared_scale=scale == "shared")
            with part(0.8, 1.0, "drawing"):
                return {self.sbs_img: gr.update(value=png(viz.figure_to_image(fig, PREVIEW_WIDTH)), visible=True)}

        def on_models(key, method, cmap, alpha, scale, sess):
            sess = ready(sess)
            if not key:
                raise gr.Error("Pick a second model first.", print_exception=False)
            with part(0.0, 0.3, "loading the second model"):
                other = ctx.reg.get(key)
            with part(0.3, 0.8, "maps"):
                fig = compare_models([ctx.model(sess), other], sess.upload.picture, method, cmap=cmap, alpha=alpha,
                                     shared_scale=scale == "shared")
            with part(0.8, 1.0, "drawing"):
                return {self.mm_img: gr.update(value=png(viz.figure_to_image(fig, PREVIEW_WIDTH)), visible=True)}

        self.deck.wire(ctx, on_deck, [ctx.state], [self.deck_files])
        self.sbs.wire(ctx, on_images, [self.more, self.method, ctx.cmap, ctx.alpha, self.scale, ctx.state],
                      [self.sbs_img])
        self.mm.wire(ctx, on_models, [self.other, self.method, ctx.cmap, ctx.alpha, self.scale, ctx.state],
                     [self.mm_img])
