"""Input and predictions (the top of the page): the upload, the examples, what the model sees,
the top-k predictions and their k, and the JSON ``/predict`` endpoint for scripts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ..common import VIEW_SIZE, display_label, friendly, open_upload, png
from ..context import Context, Section
from ..exports import export_row, save, wire_export, wrap
from ..server.guard import whole
from ..session import Session, Upload

# ----------------------------------------------------------------------------- views


def predictions(a: Analysis, k: int = 5) -> dict[str, float]:
    """``{label: probability}`` for gr.Label, most likely first (duplicate names get their index)."""
    if not a.logits.numel():
        return {}
    return {display_label(a, t["index"]): t["prob"] for t in a.topk(int(k))}


def predictions_json(a: Analysis, k: int = 5) -> list[dict[str, Any]]:
    """The same top-k as the CLI's ``predict --json``: ``[{"index", "label", "prob"}]``."""
    return a.topk(int(k)) if a.logits.numel() else []


def input_caption(up: Upload, lm: LoadedModel) -> str:
    dc = lm.input_config(up.picture.size)
    h, w = dc.input_size
    if lm.model.cfg.naflex:
        p = lm.model.cfg.patch_size
        budget = (lm.data_config.input_size[0] // p) * (lm.data_config.input_size[1] // p)
        return (f"**What the model sees**: {w}×{h} px, your whole {up.size[0]}×{up.size[1]} px image with its aspect "
                f"ratio kept. A NaFlex model reads any grid of patches: the picture is scaled to the most "
                f"{p}-px patches that fit its budget of {budget} ({h // p}×{w // p} = {(h // p) * (w // p)}), each "
                f"side rounded up to whole patches, nothing cropped. Then: scale to [0, 1], normalise with the "
                f"model's mean and std.")
    return (f"**What the model sees**: {w}×{h} px, cut from your {up.size[0]}×{up.size[1]} px image. "
            f"Steps: {dc.describe()}.")


def input_picture(a: Analysis) -> Image.Image:
    """The model-input picture, enlarged without smoothing so the pixels stay honest (to about :data:`VIEW_SIZE`)."""
    pic = a.picture
    s = max(1, VIEW_SIZE // max(pic.size))
    return pic.resize((pic.width * s, pic.height * s), Image.Resampling.NEAREST) if s > 1 else pic


def export_input(a: Analysis, up: Upload, lm: LoadedModel) -> Path:
    dc = lm.input_config(up.picture.size)
    h, w = dc.input_size
    fig = viz.input_figure(up.picture, a.picture, f"Your image · {up.size[0]}×{up.size[1]} px",
                           f"What the model sees · {w}×{h} px", wrap(dc.describe(), 110))
    return save(fig, f"{Path(up.name).stem}-input")


def export_predictions(a: Analysis, up: Upload, k: int) -> Path:
    fig = viz.topk_figure(a.topk(int(k)), title=f"Top-{int(k)} predictions · {a.model_name}")
    return save(fig, f"{Path(up.name).stem}-top{int(k)}")


# ----------------------------------------------------------------------------- the section


class InputSection(Section):
    """The upload, the model-input picture and the predictions (above the tabs)."""

    def layout(self, ctx: Context) -> None:
        examples = ctx.examples
        with gr.Row(equal_height=False, elem_id="input-row"):
            with gr.Column(scale=5, min_width=300, elem_id="upload-col"):
                ctx.image = gr.Image(label="Your image", type="filepath", sources=["upload", "webcam", "clipboard"], height=340,
                                     elem_id="upload", placeholder="Drop a photo here, or click an example below")
                self.gallery = gr.Gallery([(str(e.path), e.caption) for e in examples], label="Examples (click one)",
                                          columns=3, rows=2, height=330, allow_preview=False, object_fit="cover",
                                          elem_id="examples", visible=bool(examples), buttons=[])
            with gr.Column(scale=4, min_width=260, elem_id="model-input-col"):
                self.model_input = gr.Image(label="What the model sees (after preprocessing)", interactive=False,
                                            format="png", height=340, elem_id="model-input", buttons=["fullscreen"])
                self.input_md = gr.Markdown(elem_classes="caption", elem_id="input-caption")
                self.input_btn, self.input_file = export_row()
            with gr.Column(scale=4, min_width=260, elem_id="predictions-col"):
                self.topk = gr.Label(label="Predictions", num_top_classes=10, elem_id="predictions")  # shows the k sent
                ctx.k = gr.Slider(1, 10, value=5, step=1, label="How many classes (top-k)", elem_id="topk-k")
                self.topk_btn, self.topk_file = export_row()
        self.show_inputs = [ctx.k]
        self.views = [self.model_input, self.input_md, self.topk]
        self.exports = [self.input_btn, self.topk_btn]

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a, k = sess.analysis, vals[self.show_inputs[0]]
        return {self.model_input: png(input_picture(a)), self.input_md: input_caption(sess.upload, lm),
                self.topk: predictions(a, k) if a.logits.numel() else None}

    def wire(self, ctx: Context) -> None:
        reg, state, examples = ctx.reg, ctx.state, ctx.examples

        @friendly
        def on_k(k, sess):
            sess = ctx.session(sess)
            if not sess.ready or not sess.analysis.logits.numel():
                return gr.skip()
            return {self.topk: predictions(sess.analysis, k)}

        @friendly
        def on_predict(image: Any, model: str | None = None, k: float = 5):
            """JSON top-k for one image, as ``python -m vit_demo predict --json`` gives it."""
            k = whole(5 if k is None else k, "k", 1, 10)
            key = model or ctx.default_key
            reg.spec(key)  # an unknown model is refused before the image is read
            up = open_upload(image, ctx.files, ctx.cfg.limits)
            a = reg.analyze(key, up.picture)
            if not a.logits.numel():
                raise gr.Error(f"{a.model_name} has no classifier: it has no predictions.", print_exception=False)
            return {"image": up.name, "model": a.model_name, "topk": predictions_json(a, min(k, a.logits.numel())),
                    "notes": up.notes}

        def on_example(evt: gr.SelectData):
            i = evt.index if isinstance(evt.index, int) else None
            return str(examples[i].path) if i is not None and 0 <= i < len(examples) else gr.skip()

        ctx.k.input(on_k, [ctx.k, state], [self.topk], api_visibility="private", trigger_mode="always_last",
                    show_progress="hidden")
        self.gallery.select(on_example, None, [ctx.image], api_visibility="private", show_progress="hidden")
        # hidden: the JSON endpoint for scripts (gradio_client), /predict (created after the tabs)
        predict_btn = gr.Button(visible=False)
        predict_json = gr.JSON(visible=False)
        predict_btn.click(on_predict, [ctx.image, ctx.model_dd, ctx.k], [predict_json], api_name="predict",
                          preprocess=False, **ctx.heavy)
        wire_export(ctx, self.input_btn, self.input_file, [],
                    lambda s: export_input(s.analysis, s.upload, ctx.model(s)))
        wire_export(ctx, self.topk_btn, self.topk_file, [ctx.k],
                    lambda s, k: export_predictions(s.analysis, s.upload, k))
