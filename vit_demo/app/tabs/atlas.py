"""The "Atlas" tab: what each head and each learned concept of the model looks for over a folder
of pictures (:mod:`vit_demo.evaluate.atlas`). Pick a layer and a head, or a concept: its best
patches over the folder (crops, the patch outlined) and what it does, in one sentence and in
numbers. Click a patch of the current upload: which concepts it is made of (its tokens coded
with the atlas's NMF dictionary, :mod:`vit_demo.evaluate.atlas_codes`), and where the chosen
concept is on the whole picture.

The atlases themselves are :mod:`vit_demo.app.atlas_store`'s: the atlas of a checkpoint's model
over the app's example photos, kept on disk and computed once in the background (app.py's warm-up,
or the tab's first opening), so that from then on the tab opens at once; and the atlases built here
from pictures or a zip (here, or those of the Whole folder tab) in the slow lane, with a progress
bar and a cancel button, within the folder jobs' limits (:func:`vit_demo.app.uploads.received`).
"Slide" writes the atlas's most important heads as a slide (:func:`vit_demo.present.deck.atlas_slide`),
PowerPoint and PDF. This module is the tab's page only.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from ... import viz
from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...present.atlas_report import accuracy_change, turned_text
from ...present.deck import atlas_slide
from ...present.slides import write_pdf, write_pptx
from ...progress import check, part
from ..atlas_store import REPORT_ZIP, Atlas, AtlasStore, ExampleAtlases, build_atlas, public_report
from ..common import VIEW_SIZE, friendly, jpeg, png
from ..context import Context, Section
from ..exports import slug, within_budget
from ..jobs import LongAction
from ..motion import present_dir
from ..registry import ModelError, ModelRegistry
from ..session import Session
from ..uploads import picture_loader, received, unreadable

SLIDE_WIDTH = 2400  # px


# ----------------------------------------------------------------------------- views


def pick(value: Any, allowed: Any, default: int) -> int:
    """A menu's value as an int when it is one of ``allowed``, else ``default``."""
    try:
        return int(value) if int(value) in allowed else default
    except (TypeError, ValueError):
        return default


def layer_choices(at: Atlas) -> list[tuple[str, int]]:
    return [(f"layer {i}", i) for i in range(1, at.result["layers"] + 1)]


def head_choices(at: Atlas, layer: int) -> list[tuple[str, int]]:
    """Heads from 1, each with its rank by importance."""
    rank = {(h["layer"], h["head"]): i + 1 for i, h in enumerate(sorted(at.result["heads"], key=lambda h: -h["importance"]))}
    n = len(rank)
    return [(f"head {h} (#{rank[layer, h]} of {n})", h) for h in range(1, at.result["heads_per_layer"] + 1)]


def concept_choices(at: Atlas) -> list[tuple[str, int]]:
    return [(f"concept {c['id']}" + (" ⚠" if c["suspicious"] else ""), c["id"]) for c in at.result["concepts"]]


def tiles(at: Atlas, top: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for t in top:
        img = at.crop(t)
        if img is not None:
            name = re.sub(r"^\d+_", "", Path(t["path"]).name)  # without the number a copied picture was given
            out.append((png(img), f"{name} ({t['row']}, {t['col']})"))
    return out


def head_text(at: Atlas, h: dict[str, Any]) -> str:
    heads = sorted(at.result["heads"], key=lambda x: -x["importance"])
    rank = next(i for i, x in enumerate(heads) if x is h) + 1
    acc = accuracy_change(h["accuracy_drop"])
    patch = at.crops.patch
    return (f"**Layer {h['layer']}, head {h['head']}** {h['summary']}.  \nRemoved (its output replaced by its mean): "
            f"the true class's logit {-h['importance']:+.3f}{acc}; **#{rank} of {len(heads)}** by importance.  \n"
            f"Mean distance {h['mean_distance']:.0f} px ({h['mean_distance'] / patch:.1f} patches) · entropy "
            f"{h['entropy']:.2f} · on [class] {h['class_share']:.0%} · on other prefix tokens {h['prefix_share']:.0%} · "
            f"positional {h['positional']:.2f}")


def concept_text(c: dict[str, Any]) -> str:
    imp = sorted(c["importance"].items(), key=lambda kv: -kv[1])[:5]
    best = ", ".join(f"{k} {v:+.2f}" for k, v in imp)
    off = f", {c['off_object_share']:.0%} off the object" if c.get("off_object_share") is not None else ""
    flag = ("  \n⚠ **Possible Clever-Hans feature**: among the top concepts of " + ", ".join(c["top_for"])
            + ", and it lives at one place near the edge or off the object." if c["suspicious"] else "")
    return (f"**Concept {c['id']}** (the tokens after layer {c['layer']}) matters most for: {best} (the larger of the "
            f"class's logit's fall on its pictures when the concept is removed, and its rise on the other classes' "
            f"pictures when the concept's own patches are stamped on them).{turned_text(c, least=0.1)}  \nIts best patches: "
            f"{c['one_place_share']:.0%} at one "
            f"place (row {c['place']['row']}, column {c['place']['col']}), {c['border_share']:.0%} on the border{off}."
            + flag)


def summary_text(at: Atlas, current_key: str | None, reg: ModelRegistry) -> str:
    r, f = at.result, at.result["findings"]
    heads = "; ".join(f"layer {h['layer']} head {h['head']} ({h['summary'].split(' (')[0]})" for h in f["top_heads"][:3])
    flagged = ", ".join(str(k["id"]) for k in f["suspicious_concepts"])
    fa = r["faithfulness"]
    lines = [f"**Atlas of {r['model']}** over {at.source}: {r['layers']} layers × {r['heads_per_layer']} heads, "
             f"{len(r['concepts'])} concepts of layer {r['concept_layer']} (NMF reconstruction error "
             f"{r['reconstruction_error']:.2f}).",
             f"**Most important heads:** {heads}.",
             f"**Concepts:** removing each class's top {fa['concepts_removed']} lowers its logit by {fa['top_fall']:.2f}, "
             f"{fa['concepts_removed']} random ones by {fa['random_fall']:.2f}."
             + (f" ⚠ **Flagged as possible Clever-Hans features:** concept {flagged}." if flagged else "")]
    if current_key is not None and current_key != at.model_key:
        lines.append(f"*This atlas is of {reg.spec(at.model_key).label.split('  ·')[0]}, not the model picked above: "
                     "your picture's patches are coded only with the model of its atlas.*")
    return "  \n".join(lines)


def picture_size(a: Analysis) -> tuple[int, int]:
    """(width, height) of :func:`upload_picture`: its longer side :data:`VIEW_SIZE`."""
    s = VIEW_SIZE / max(a.picture.size)
    return max(1, round(a.picture.width * s)), max(1, round(a.picture.height * s))


def upload_picture(a: Analysis, codes: np.ndarray | None, concept: int, query: int | None, cmap: str, alpha: float
                   ) -> Image.Image:
    """The upload with the concept's presence (its code per patch) over it; the clicked patch outlined."""
    if codes is None:
        return a.picture.convert("RGB").resize(picture_size(a), Image.Resampling.BICUBIC)
    img = viz.overlay_image(a.picture, codes[..., concept - 1], cmap, alpha, smooth=False, size=VIEW_SIZE,
                            vmin=0.0, mark=query)
    return viz.with_colorbar(img, cmap, f"concept {concept}'s code in each patch, from 0 to this picture's most",
                             "none", "most")


def patch_text(at: Atlas, codes: np.ndarray, query: int, grid: tuple[int, int]) -> str:
    """Which concepts the patch ``query`` is made of (shares of its code), and whose top concepts they are."""
    w = codes.reshape(-1, codes.shape[-1])[query]
    total = float(w.sum())
    r, c = divmod(query, grid[1])
    if total <= 0:
        return f"**Patch row {r}, column {c}**: none of the atlas's concepts is in it."
    order = [int(k) for k in np.argsort(-w, kind="stable") if w[k] > 0.05 * total][:4]
    parts = []
    for k in order:
        con = at.result["concepts"][k]
        whose = f" (a top concept of {', '.join(con['top_for'][:3])})" if con["top_for"] else ""
        parts.append(f"concept {k + 1} **{w[k] / total:.0%}**{whose}")
    return f"**Patch row {r}, column {c}** is made of: " + "; ".join(parts) + "."


# ----------------------------------------------------------------------------- the section


class AtlasTab(Section):
    name, title = "atlas", "Atlas"

    def layout(self, ctx: Context) -> None:
        gr.Markdown("What each **head** and each learned **concept** of the model looks for, over a folder of pictures "
                    "(an atlas): its best patches (outlined), what it does in one sentence, and how much the prediction "
                    "loses without it. Click a patch of your picture to see which concepts it is made of.",
                    elem_classes="caption")
        self.summary = gr.Markdown(elem_id="atlas-summary")
        with gr.Row(equal_height=False):
            with gr.Column(min_width=300):
                with gr.Row():
                    self.layer = gr.Dropdown([], label="Layer", elem_id="atlas-layer", min_width=120)
                    self.head = gr.Dropdown([], label="Head", elem_id="atlas-head", min_width=150)
                self.head_md = gr.Markdown(elem_id="atlas-head-text", elem_classes="caption")
                self.head_gallery = gr.Gallery(label="Where this head looks: its best patch in each picture", columns=4,
                                               rows=2, height=340, allow_preview=False, object_fit="contain",
                                               elem_id="atlas-head-gallery", buttons=[], elem_classes="tiles")
            with gr.Column(min_width=300):
                # a value from the start: the upload event reads it, and an API input without one is required
                self.concept = gr.Dropdown([("concept 1", 1)], value=1, label="Concept", elem_id="atlas-concept")
                self.concept_md = gr.Markdown(elem_id="atlas-concept-text", elem_classes="caption")
                self.concept_gallery = gr.Gallery(label="Where this concept is strongest: one patch per picture",
                                                  columns=4, rows=2, height=340, allow_preview=False, object_fit="contain",
                                                  elem_id="atlas-concept-gallery", buttons=[], elem_classes="tiles")
        with gr.Row(equal_height=False):
            self.picture = gr.Image(label="Your picture: the concept above over it (click a patch)", interactive=False,
                                    format="png", height=VIEW_SIZE, elem_id="atlas-picture", buttons=[])
            with gr.Column():
                self.patch_md = gr.Markdown("*Upload a picture, then click one of its patches.*", elem_id="atlas-patch")
                self.slide = LongAction("⬇ Slide: the most important heads (PowerPoint + PDF)", "atlas-slide",
                                        min_width=300)
                self.slide.layout()
                self.slide_files = gr.File(visible=False, show_label=False, file_count="multiple",
                                           elem_id="atlas-slide-files")
        with gr.Accordion("Build an atlas of your own pictures", open=False, elem_id="atlas-build-box"):
            gr.Markdown("Pictures or a zip (a zip's sub-folders are the classes), the same limits as the Whole folder "
                        "tab; none here: the pictures chosen in the Whole folder tab; none there either: the example "
                        "photos with the model picked above. A few minutes for a hundred pictures.",
                        elem_classes="caption")
            self.uploads = gr.File(label="Pictures or a zip", file_count="multiple", file_types=["image", ".zip"],
                                   type="filepath", height=110, elem_id="atlas-files")
            self.build = LongAction("Build the atlas", "atlas-build", variant="primary")
            self.build.layout()
            self.report = gr.File(label="Its report (HTML, opens offline)", visible=False, elem_id="atlas-report")
        self.atlas_id = gr.State(None)  # a built atlas's id in self.store; None: the model's atlas of the examples
        self.show_inputs = [self.atlas_id, self.concept, ctx.cmap, ctx.alpha]
        self.views = [self.picture, self.patch_md]
        self.store = AtlasStore()  # the atlases built here, and uploads coded with an atlas
        self.examples = ExampleAtlases(ctx.reg, [e.path for e in ctx.examples])
        self.ctx = ctx

    # -- which atlas, and the upload coded with it

    def current(self, ctx: Context, sess: Session, atlas_id: Any) -> Atlas | str:
        """The atlas this session looks at: the one it built, else the kept atlas of the examples
        for its model, else for the default model (computed in the background if need be: only
        the default model's is computed unasked), or a sentence saying why there is none (yet)."""
        if atlas_id in self.store:
            return self.store[atlas_id]
        for key in dict.fromkeys([sess.model_key or ctx.default_key, ctx.default_key]):
            try:
                at = self.examples.cached(key) if self.examples.folder(key) is not None else None
            except (ModelError, OSError, ValueError):
                at = None
            if at is not None:
                return at
        try:
            default = self.examples.folder(ctx.default_key) is not None
        except (ModelError, OSError, ValueError):
            default = False
        if not default:
            return "*No atlas for this model yet: build one below (from your pictures, or the example photos).*"
        self.examples.background(ctx.default_key)
        doing = self.examples.progress.get(ctx.default_key, "starting")
        return (f"*The atlas of the example photos is being computed once for the default model ({doing}); it is "
                "kept on disk, so the tab opens at once from then on. Open the tab again in a minute.*")

    def codes(self, ctx: Context, sess: Session, at: Atlas) -> np.ndarray | None:
        """The upload's patches coded with the atlas's concepts (None: no upload, or another model)."""
        a = sess.analysis if sess.ready else None
        if a is None or sess.model_key != at.model_key:
            return None
        return self.store.codes(ctx.model(sess), a, at)

    # -- what the tab shows

    def atlas_views(self, ctx: Context, sess: Session, at: Atlas | str, layer: Any = None, head: Any = None,
                    concept: Any = None) -> dict:
        if isinstance(at, str):
            return {self.summary: at, self.head_gallery: None, self.concept_gallery: None, self.head_md: "",
                    self.concept_md: ""}
        top = at.result["findings"]["top_heads"][0]
        layer = pick(layer, range(1, at.result["layers"] + 1), top["layer"])
        head = pick(head, range(1, at.result["heads_per_layer"] + 1), top["head"])
        concept = pick(concept, [c["id"] for c in at.result["concepts"]], 1)
        h, c = at.head(layer, head), at.result["concepts"][concept - 1]
        return {self.summary: summary_text(at, sess.model_key, ctx.reg),
                self.layer: gr.update(choices=layer_choices(at), value=layer),
                self.head: gr.update(choices=head_choices(at, layer), value=head),
                self.concept: gr.update(choices=concept_choices(at), value=concept),
                self.head_md: head_text(at, h), self.head_gallery: tiles(at, h["top"]),
                self.concept_md: concept_text(c), self.concept_gallery: tiles(at, c["top"])}

    def picture_views(self, ctx: Context, sess: Session, at: Atlas | str, concept: Any, cmap: str, alpha: float,
                      query: int | None = None) -> dict:
        if isinstance(at, str) or not sess.ready:
            return {self.picture: None, self.patch_md: "*Upload a picture, then click one of its patches.*"}
        concept = pick(concept, [c["id"] for c in at.result["concepts"]], 1)
        codes, a = self.codes(ctx, sess, at), sess.analysis
        text = ("*Click a patch: which concepts is it made of?*" if codes is None or query is None
                else patch_text(at, codes, query, a.layout.grid))
        if codes is None:
            text = "*Your picture's patches can be coded with an atlas of the model picked above only.*"
        return {self.picture: jpeg(upload_picture(a, codes, concept, query, cmap or "inferno",
                                                  0.6 if alpha is None else float(alpha))),
                self.patch_md: text}

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        atlas_id, concept, cmap, alpha = (vals.get(c) for c in self.show_inputs)
        return self.picture_views(self.ctx, sess, self.current(self.ctx, sess, atlas_id), concept, cmap, alpha)

    def warm_up(self, ctx: Context) -> None:
        """The default model's atlas of the examples, computed in the background if it is not kept (at start)."""
        self.examples.background(ctx.default_key)

    # -- events

    def wire(self, ctx: Context) -> None:
        self.ctx = ctx
        atlas_outputs = [self.summary, self.layer, self.head, self.concept, self.head_md, self.head_gallery,
                         self.concept_md, self.concept_gallery]
        pic_outputs = [self.picture, self.patch_md]

        @friendly
        def on_pick(sess, atlas_id, layer, head, concept, cmap, alpha):
            sess = ctx.session(sess)
            at = self.current(ctx, sess, atlas_id)
            return {**self.atlas_views(ctx, sess, at, layer, head, concept),
                    **self.picture_views(ctx, sess, at, concept, cmap, alpha)}

        @friendly
        def on_click(sess, atlas_id, layer, head, concept, cmap, alpha, evt: gr.SelectData):
            sess = ctx.session(sess)
            at = self.current(ctx, sess, atlas_id)
            if isinstance(at, str) or not sess.ready or not isinstance(evt.index, (list, tuple)) or len(evt.index) != 2:
                return gr.skip()
            a = sess.analysis
            size = picture_size(a)
            if not float(evt.index[1]) < size[1]:  # the colour bar under the picture
                return gr.skip()
            q = viz.patch_index_at(float(evt.index[0]), float(evt.index[1]), size, a.layout.grid)
            codes = self.codes(ctx, sess, at)
            if codes is not None:  # the patch's main concept becomes the one shown
                concept = int(np.argmax(codes.reshape(-1, codes.shape[-1])[q])) + 1
            return {**self.atlas_views(ctx, sess, at, layer, head, concept),
                    **self.picture_views(ctx, sess, at, concept, cmap, alpha, q)}

        inputs = [ctx.state, self.atlas_id, self.layer, self.head, self.concept, ctx.cmap, ctx.alpha]
        self.gr_tab.select(on_pick, inputs, atlas_outputs + pic_outputs, api_visibility="private",
                           show_progress="minimal")
        gr.on([self.layer.input, self.head.input, self.concept.input], on_pick, inputs, atlas_outputs + pic_outputs,
              api_visibility="private", show_progress="hidden", trigger_mode="always_last")
        self.picture.select(on_click, inputs, atlas_outputs + pic_outputs, api_visibility="private",
                            show_progress="hidden", trigger_mode="always_last", **ctx.heavy)
        self.wire_build(ctx, inputs, atlas_outputs + pic_outputs)
        self.slide.wire(ctx, lambda sess, atlas_id: self.slide_files_for(ctx, sess, atlas_id), [ctx.state, self.atlas_id],
                        [self.slide_files])

    def wire_build(self, ctx: Context, inputs: list[Any], outputs: list[Any]) -> None:
        theirs = [ctx.folder_files] if ctx.folder_files is not None else []  # the Whole folder tab's pictures

        def on_build(files, *rest):
            *their_files, sess, atlas_id, layer, head, concept, cmap, alpha = rest
            sess = ctx.session(sess)
            at, atlas_id = self.build_from(ctx, sess, files or (their_files[0] if their_files else None))
            report = gr.update(visible=False) if atlas_id is None else gr.update(
                value=str(at.crops.out.parent / REPORT_ZIP), visible=True)
            return {self.atlas_id: atlas_id, self.report: report, **self.atlas_views(ctx, sess, at),
                    **self.picture_views(ctx, sess, at, None, cmap, alpha)}

        self.build.wire(ctx, on_build, [self.uploads, *theirs, *inputs], [self.atlas_id, self.report, *outputs])

    def build_from(self, ctx: Context, sess: Session, files: list[Any] | None) -> tuple[Atlas, str | None]:
        """A new atlas of the uploaded pictures (the folder jobs' path and limits), or of the example
        photos with the session's model when there are none; (it, its id in the store or None)."""
        key = sess.model_key or ctx.default_key
        if not files:
            return self.examples.compute(key), None
        with received(ctx, files) as (out, pics, notes):
            lm = ctx.model(sess)
            try:
                at = build_atlas(lm, pics, out, key, "", picture_loader(ctx.cfg.limits), isolated=True)
            except ValueError as e:
                raise unreadable(e, pics, notes) from e
            at.source = f"your {at.result['images']} pictures" + (f" ({notes[-1]})" if notes else "")
            check()
            public_report(at, out)  # the downloaded report names no server path
        within_budget()
        return at, self.store.add(at)

    def slide_files_for(self, ctx: Context, sess: Any, atlas_id: Any) -> dict:
        sess = ctx.session(sess)
        at = self.current(ctx, sess, atlas_id)
        if isinstance(at, str):
            raise gr.Error("No atlas yet: wait for the example photos' atlas, or build one.", print_exception=False)
        with part(0.0, 0.8, "the most important heads"):
            slide = atlas_slide(ctx.reg.get(at.model_key), at.result, SLIDE_WIDTH)
        stem = present_dir() / slug(f"atlas-{at.result['model']}-{secrets.token_hex(4)}")
        with part(0.8, 1.0, "writing PowerPoint and PDF"):
            files = [str(write_pptx([slide], stem.with_suffix(".pptx"))), str(write_pdf([slide], stem.with_suffix(".pdf")))]
        within_budget()
        return {self.slide_files: gr.update(value=files, visible=True)}
