"""The "Rollout & relevance" tab: raw attention, attention rollout (head fusion, discard,
start layer), and the class-specific maps (gradient rollout, Chefer relevance) for a class
picked from the top-k, side by side; below them the relevance methods for the same class
(CP-LRP, AttnLRP, CP-LRP gated by gradient rollout, probed and amortised LRP, GradCAM, Integrated
Gradients with a note on its weakness) and, on request only, the
perturbation methods (RISE, causal LRP). The class-specific maps need backward passes: they start in
the background as soon as the browser has an upload's first pictures, whichever tab is open, and the
tab draws them as they come, the top row first (:meth:`RelevanceTab.follow_up`). The perturbation methods
(hundreds of forward passes) run only when their button is pressed, with a progress bar; never on
a slider move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from ... import methods, viz
from ...analysis import Analysis, class_maps, maps_so_far, on_demand_map, start_class_maps
from ...checkpoints.load import LoadedModel, is_shipped
from ...methods.attention import cls_attention, many_readers, reader
from ...methods.rollout import rollout
from ...progress import part
from ..common import friendly, jpeg
from ..context import Context, Section
from ..exports import export_row, save, slug, wire_export
from ..jobs import LongAction
from ..motion import AnimationRow, animation_files
from ..session import NARROW_COLUMNS, Session, Upload

FUSIONS = ("mean", "max", "min")
COMPUTING = "⏳ *Computing the class-specific maps: they appear here in a moment.*"
TOP_ROW = ("grad-rollout", "chefer")  # class-specific maps beside raw attention and rollout; the rest below
IG_NOTE = ("**Integrated Gradients** is a weak baseline on this ViT: hiding the patches it ranks first lowers the "
           "class probability less than for any other class-specific map (deletion score 0.325 on 100 ImageNet "
           "photos, where a random order scores 0.390 and gated LRP 0.141; lower is better). Most of the weakness "
           "is its black starting image: on 8 other photos its SRG was 0.03 and its SaCo 0.04 (a random map: "
           "-0.01 and 0.11); from the mean colour 0.11 and 0.32, still far below gated LRP (0.38 and 0.77 "
           "on 100 held-out photos). "
           "Details: docs/faithfulness.md.")
# the same paragraph for any other model: what is true of the method, no figure measured on another model
IG_NOTE_UNMEASURED = ("**Integrated Gradients** adds up the class score's gradient along a straight path from a black "
                      "picture to this one (16 steps), so its map depends on that black starting picture. How faithful "
                      "it is on this model was not measured here: `python -m vit_demo faithfulness --weights FILE "
                      "--images DIR --methods integrated-gradients,lrp-gated` measures it on your pictures.")


def tile_title(name: str, label: str) -> str:
    """A map's tile title: the method's title and the class it explains."""
    return f"{methods.get(name).title}\nfor “{label}”"

# ----------------------------------------------------------------------------- views


def class_choices(a: Analysis, k: int = 5) -> list[tuple[str, int]]:
    """(menu text, class index) for the top-k classes, for the class-specific maps."""
    top = a.topk(max(5, int(k)))
    return [(f"{i + 1}. {t['label']} ({t['prob'] * 100:.1f}%)", t["index"]) for i, t in enumerate(top)]


def attention_tiles(a: Analysis, fusion: str = "mean", discard: float = 0.0, start_layer: int = 0
                    ) -> dict[str, np.ndarray]:
    """The class-agnostic tiles (raw attention, rollout with its settings; ``start_layer`` from 0)."""
    start_layer = int(np.clip(int(start_layer), 0, a.depth - 1))
    return {
        f"Raw attention\nlayer {a.depth} of {a.depth}, mean of heads":
        cls_attention(a.attentions, a.layout, a.depth - 1)[0].numpy(),
        f"Attention rollout\n{fusion} fusion" + (f", discard {float(discard):.0%}" if float(discard) > 0 else "")
        + (f", from layer {start_layer + 1}" if start_layer else ""):
        rollout(a.attentions, a.layout, fusion, float(discard), start_layer)[0].numpy(),
    }


def class_tiles(a: Analysis, by_method: dict[str, np.ndarray], names: list[str] | tuple[str, ...], cls: int
                ) -> tuple[dict[str, np.ndarray], list[str]]:
    """The tiles of the methods ``names`` for class ``cls``: (title -> map, of those in ``by_method``;
    the titles of the others, still being computed)."""
    label = a.labels[cls]
    return ({tile_title(n, label): by_method[n] for n in names if n in by_method},
            [tile_title(n, label) for n in names if n not in by_method])


def method_maps(
    a: Analysis,
    lm: LoadedModel | None,
    fusion: str = "mean",
    discard: float = 0.0,
    start_layer: int = 0,
    cls: int | None = None,
) -> dict[str, np.ndarray]:
    """Every method's map for the side-by-side view. The class-specific maps (one backward
    pass per class, cached on the analysis) only when ``lm`` is given and the class is known."""
    out = attention_tiles(a, fusion, discard, start_layer)
    if lm is not None and a.logits.numel():
        cls = a.top1 if cls is None else int(cls)
        out.update(class_tiles(a, class_maps(a, lm, cls), TOP_ROW, cls)[0])
    return out


def pending_titles(a: Analysis, cls: int | None) -> list[str]:
    """Titles of the class-specific maps of the top row not made yet (placeholders in the first render)."""
    if not a.logits.numel():
        return []
    cls = a.top1 if cls is None else int(cls)
    return class_tiles(a, maps_so_far(a, cls), TOP_ROW, cls)[1]


def relevance_names() -> list[str]:
    """The relevance row: every class-specific method not in the top row, in the registry's
    order (the slow ones last, shown once they have been run)."""
    return [n for n in methods.names(class_specific=True) if n not in TOP_ROW]


def on_demand_names() -> list[str]:
    """The slow methods of the relevance row: one button each."""
    return [n for n in relevance_names() if methods.get(n).slow]


def row_names(by_method: dict[str, np.ndarray]) -> list[str]:
    """The relevance row's methods: the single-pass ones, and the slow ones that have been run."""
    return [n for n in relevance_names() if not methods.get(n).slow or n in by_method]


def relevance_maps(a: Analysis, lm: LoadedModel | None, cls: int | None) -> dict[str, np.ndarray]:
    """The relevance row: LRP, AttnLRP, gated LRP, GradCAM for the class (computed with the
    other class-specific maps when ``lm`` is given), and RISE only if it has been run."""
    if lm is None or not a.logits.numel():
        return {}
    cls = a.top1 if cls is None else int(cls)
    by_method = class_maps(a, lm, cls)
    return class_tiles(a, by_method, row_names(by_method), cls)[0]


def relevance_pending(a: Analysis, cls: int | None) -> list[str]:
    """Titles of the relevance row's maps not made yet."""
    if not a.logits.numel():
        return []
    cls = a.top1 if cls is None else int(cls)
    by_method = maps_so_far(a, cls)
    return class_tiles(a, by_method, row_names(by_method), cls)[1]


def methods_caption(a: Analysis, fusion: str, discard: float, start_layer: int, cls: int | None,
                    measured: bool = False) -> str:
    """What each map lets you conclude, one sentence each; the methods' papers in a details line.
    ``start_layer``: the index (from 0). ``measured``: the model is the one the project's faithfulness
    figures were measured on (the shipped DeiT-Tiny, :func:`~vit_demo.checkpoints.load.is_shipped`):
    only then are they quoted."""
    parts = [
        f"**Raw attention**: where {reader(a.layout, long=True)} look{'' if many_readers(a.layout) else 's'} "
        f"in layer {a.depth} of {a.depth}. It shows where the model looks, not why.",
        f"**Attention rollout**: {rollout_sentence(a.layout)} It is the same for every class, so it cannot say which "
        "answer the evidence supports.",
    ]
    if a.logits.numel():
        label = a.labels[a.top1 if cls is None else int(cls)]
        parts.append(f"**Gradient rollout** and **Chefer relevance**: the patches that raised the score of *{label}*. "
                     "You may conclude that these patches mattered for this class, and only for it.")
        parts.append(f"**Below**, the same question for *{label}* answered by other methods; " + (
            "on 1000 ImageNet photos the gated LRP map was the most faithful single pass and causal LRP the most "
            "faithful of all (on request: hundreds of forward passes, about 20 s)." if measured else
            "the slow ones (causal LRP, RISE) on request: hundreds of forward passes each."))
        parts.append(IG_NOTE if measured else IG_NOTE_UNMEASURED)
    else:
        parts.append(no_class_note())
    return "\n\n".join(parts) + "\n\n" + methods_details(fusion, discard, start_layer, a.depth)


def rollout_sentence(layout: Any) -> str:
    """What the rollout map shows, in one sentence that reads right for whoever the model answers from."""
    if many_readers(layout):  # no [class] token, no attention pool: the rows of every patch, averaged
        return ("which patches the patch tokens draw their information from, through all the layers (averaged over "
                "the patch tokens: this model has no [class] token and answers from their mean).")
    return f"which patches the information reaching {reader(layout)} comes from, through all the layers."


def no_class_note() -> str:
    """Why a model without a classifier (SAM's encoder, DINO, SigLIP's image tower) is offered no
    class-specific method, each named."""
    titles = ", ".join(methods.get(n).title for n in methods.names(class_specific=True))
    return (f"**This model predicts no classes** (it has no classifier: it outputs features). **Not offered: "
            f"{titles}**: each follows the score of one class back to the patches, and there is no class score to "
            "follow. The maps above (attention, rollout) need no class.")


def methods_details(fusion: str, discard: float, start_layer: int, depth: int) -> str:
    """The papers and settings behind the maps, folded away (a details line)."""
    cites = "; ".join(f"{methods.get(n).title}: {methods.get(n).cite}" for n in methods.names() if n != "attention")
    rollout_settings = (f"heads fused by {fusion}, layers {int(start_layer) + 1}–{depth}"
                        + (f", the lowest {float(discard) * 100:.0f}% of each layer's attention discarded"
                           if float(discard) > 0 else ""))
    return (f"<details><summary>Methods, papers and settings</summary>{cites}. Rollout here: {rollout_settings}. "
            "Every map is scaled to its own range (low to high), so compare where maps are bright, not how "
            "bright.</details>")


def export_relevance(a: Analysis, lm: LoadedModel, up: Upload, cls: int | None, cmap: str, alpha: float,
                     smooth: bool) -> Path:
    """The relevance row (every map computed for the class, the slow ones once they have run)."""
    maps = relevance_maps(a, lm, cls)
    if not maps:
        raise gr.Error("This model has no classifier, so there are no relevance maps.", print_exception=False)
    label = a.labels[a.top1 if cls is None else int(cls)]
    fig = viz.compare_figure(a.picture, maps, cmap, alpha, smooth, title=f"Relevance for “{label}”", max_cols=4)
    return save(fig, f"{Path(up.name).stem}-relevance-{slug(label)}")


def export_methods(a: Analysis, lm: LoadedModel, up: Upload, fusion: str, discard: float, start_layer: int,
                   cls: int | None, cmap: str, alpha: float, smooth: bool) -> Path:
    maps = method_maps(a, lm, fusion, discard, start_layer, cls)
    label = a.labels[a.top1 if cls is None else int(cls)] if a.logits.numel() else ""
    title = f"Where the model looks · {label}" if label else "Where the model looks"
    fig = viz.compare_figure(a.picture, maps, cmap, alpha, smooth, title=title)
    return save(fig, f"{Path(up.name).stem}-methods-{slug(label)}")


def chosen_class(a: Analysis | None, value: Any) -> int | None:
    """The class picked in the menu, if the menu offers it for THIS image: a value left over
    from the previous image (events racing an upload) falls back to the top-1 class (None)."""
    if value in (None, "") or a is None or not a.logits.numel():
        return None
    try:
        c = int(value)
    except (TypeError, ValueError):
        return None
    return c if c in {t["index"] for t in a.topk(10)} else None


# ----------------------------------------------------------------------------- the section


def start_index(value: Any, depth: int) -> int:
    """The rollout's first layer as an index (from 0) from the slider, which counts from 1."""
    try:
        return int(np.clip(int(value) - 1, 0, depth - 1))
    except (TypeError, ValueError):
        return 0


class RelevanceTab(Section):
    name, title = "relevance", "Rollout & relevance"

    def layout(self, ctx: Context) -> None:
        with gr.Row():
            self.fusion = gr.Radio(list(FUSIONS), value="mean", label="Rollout: head fusion", scale=2, min_width=200)
            self.discard = gr.Slider(0, 0.95, value=0.0, step=0.05, label="Rollout: discard the lowest", scale=2,
                                     min_width=200)
            self.start = gr.Slider(1, 12, value=1, step=1, label="Rollout: start at layer (1 = first)", scale=2,
                                   min_width=200, elem_id="start-layer")
            self.cls_dd = gr.Dropdown([], label="Explain the class", scale=2, elem_id="explain-class", min_width=200)
        self.methods_img = gr.Image(label="The methods side by side", show_label=False, interactive=False, format="png",
                                    height=360,
                                    elem_id="methods", buttons=["fullscreen"])
        self.btn, self.file = export_row("methods-file", elem_id="export-methods")
        self.relevance_img = gr.Image(label="Relevance for the same class", show_label=False, interactive=False, format="png",
                                      height=360, elem_id="relevance", buttons=["fullscreen"])
        self.rel_btn, self.rel_file = export_row("relevance-file", label="⬇ PNG for slides: the relevance row",
                                                 elem_id="export-relevance", min_width=300)
        self.on_demand = {}
        with gr.Row(elem_classes="on-demand"):
            for name in on_demand_names():
                with gr.Column(min_width=260):
                    self.on_demand[name] = LongAction(f"Run {methods.get(name).title}", f"run-{name}", size="sm",
                                                      waiting="waiting for the model")
                    self.on_demand[name].layout()
        self.methods_md = gr.Markdown(elem_classes="caption", elem_id="methods-caption")
        self.motion = AnimationRow()
        self.motion.layout("methods")
        # what a redraw reads, in order: the method's settings, then the display controls
        self.inputs = [self.fusion, self.discard, self.start, self.cls_dd, ctx.cmap, ctx.alpha, ctx.smooth]
        self.show_inputs = [ctx.k, self.fusion, self.discard, self.start, ctx.cmap, ctx.alpha, ctx.smooth]
        self.views = [self.methods_img, self.relevance_img, self.methods_md]
        self.controls = [self.start, self.cls_dd]
        self.files = [*self.motion.outputs]
        self.exports = [self.btn, self.rel_btn]
        self.redisplay_inputs = self.inputs
        self.redisplay_outputs = [self.methods_img, self.relevance_img, self.methods_md]
        self._reg = ctx.reg

    def picture(self, sess: Session, fusion: str, discard: float, start: Any, class_value: Any, cmap: str,
                alpha: float, smooth: bool, until: str = "now") -> dict:
        """The tiles (each with its colour bar) and their caption, for the values of :attr:`inputs`;
        ``start``: the slider's layer, from 1; ``class_value``: the class menu's value. ``until``: "now"
        draws the class-specific maps made so far (:func:`~vit_demo.analysis.maps_so_far`), the others as
        grey placeholders; "top" first waits for the top row's, and draws that row only (the relevance
        row is left as it is); "all" waits for every map (computing them if no one is)."""
        a = sess.analysis
        cls = chosen_class(a, class_value)
        maps, rel, pending, rel_pending = attention_tiles(a, fusion, discard, start_index(start, a.depth)), {}, [], []
        if a.logits.numel():
            c = a.top1 if cls is None else cls
            by_method = (class_maps(a, self._reg.get(sess.model_key), c) if until == "all"
                         else maps_so_far(a, c, TOP_ROW if until == "top" else ()))
            top, pending = class_tiles(a, by_method, TOP_ROW, c)
            maps.update(top)
            rel, rel_pending = class_tiles(a, by_method, row_names(by_method), c)
        caption = methods_caption(a, fusion, discard, start_index(start, a.depth), cls,
                                  measured=is_shipped(self._reg.spec(sess.model_key).path))
        cols = NARROW_COLUMNS if sess.narrow else None
        if pending or rel_pending:  # finished when the maps are made (follow_up), and after the tab's opening (on_open)
            sess.placeholders[self.name] = sess.view_key
            caption = f"{COMPUTING}\n\n{caption}"
        elif sess.placeholders.get(self.name) == sess.view_key:
            sess.placeholders.pop(self.name, None)

        def tiles(by_title: dict, waiting: list[str]) -> str:
            return jpeg(viz.with_colorbar(viz.tiles_image(a.picture, by_title, cmap, alpha, smooth, pending=waiting,
                                                          columns=cols), cmap))

        out = {self.methods_img: tiles(maps, pending), self.methods_md: caption}
        if until != "top":
            out[self.relevance_img] = tiles(rel, rel_pending) if rel or rel_pending else None
        return out

    def unfinished(self, sess: Session) -> bool:
        """Whether the tab drew a picture of this analysis with placeholders (maps still being computed)
        that has not been finished yet."""
        return sess.ready and sess.placeholders.get(self.name) == sess.view_key

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a = sess.analysis
        k, fusion, discard, start, cmap, alpha, smooth = (vals[c] for c in self.show_inputs)
        choices = class_choices(a, k)
        start = start_index(start, a.depth) + 1
        return {
            self.start: gr.update(maximum=a.depth, value=start),
            self.cls_dd: gr.update(choices=choices, value=choices[0][1] if choices else None,
                                   interactive=bool(choices)),
            **self.picture(sess, fusion, discard, start, None, cmap, alpha, smooth),
        }

    def redisplay(self, sess: Session, vals: dict) -> dict:
        return self.picture(sess, *(vals[c] for c in self.inputs))

    def start_maps(self, sess: Session, lm: LoadedModel) -> None:
        """The class-specific maps of the top-1 class, in the background from now (vit_demo.analysis)."""
        if sess.ready and sess.analysis.logits.numel():
            start_class_maps(sess.analysis, lm)

    def follow_up(self, dep: Any, ctx: Context) -> Any:
        """The class-specific maps, started in the background as soon as the browser has the upload's
        first pictures (started with them, they slowed the label down: 0.94 s against 0.65 s, load 18),
        and sent as they come while the tab is open: the top row as soon as it is made, then every
        tile. With the tab closed, the event waits for the maps (its end says they are cached) and draws
        nothing. It waits in the :data:`~vit_demo.app.server.lanes.WAITS` lane: waiting holds no place
        of the model lane."""
        @friendly
        def on_class_maps(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            self.start_maps(sess, ctx.model(sess))
            if not sess.ready or not sess.analysis.logits.numel():
                yield gr.skip()
            elif sess.open_tab != self.name:  # closed: the maps now, the picture when it is opened
                class_maps(sess.analysis, ctx.model(sess), chosen_class(sess.analysis, rest[3]))
                yield gr.skip()
            elif not self.unfinished(sess):
                yield gr.skip()
            else:
                yield self.picture(sess, *rest, "top")
                if self.unfinished(sess):
                    yield self.picture(sess, *rest, "all")

        return dep.success(on_class_maps, [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private",
                           show_progress="minimal", preprocess=False, **ctx.waits)

    def on_open(self, dep: Any, ctx: Context) -> Any:
        """Opened while the class-specific maps were being computed: the tab showed placeholders,
        so it waits for the maps (a job makes each class's maps once, however many wait for them:
        :func:`~vit_demo.analysis.class_maps`) and draws them. Opened later, nothing to do."""
        @friendly
        def on_open_finish(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if sess.open_tab != self.name or not self.unfinished(sess) or not sess.analysis.logits.numel():
                return gr.skip()
            return self.picture(sess, *rest, "all")

        return dep.then(on_open_finish, [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private",
                        show_progress="minimal", preprocess=False, **ctx.waits)

    def wire(self, ctx: Context) -> None:
        @friendly
        def on_methods(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            return self.picture(sess, *rest, "all")

        def on_demand(name: str):
            def run(*args):
                *rest, sess = args
                sess = ctx.session(sess)
                if not sess.ready:
                    raise gr.Error("Upload an image first.", print_exception=False)
                a = sess.analysis
                if not a.logits.numel():
                    raise gr.Error("This model has no classifier: there is no class to explain.", print_exception=False)
                with part(0.0, 1.0, methods.get(name).title):
                    on_demand_map(a, ctx.model(sess), name, chosen_class(a, rest[3]))
                return self.picture(sess, *rest, "all")

            return run

        for name, action in self.on_demand.items():
            action.wire(ctx, on_demand(name), [*self.inputs, ctx.state], self.redisplay_outputs, preprocess=False)
        gr.on([self.fusion.input, self.discard.input, self.start.input, self.cls_dd.input], on_methods,
              [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private", trigger_mode="always_last",
              show_progress="minimal", preprocess=False, **ctx.heavy)
        self.motion.wire(ctx, [self.cls_dd, ctx.cmap, ctx.alpha], lambda s, lm, class_value, cmap, alpha: animation_files(
            s.analysis, lm, s.upload.name, ("rollout", "relevance") if s.analysis.logits.numel() else ("rollout",),
            None, chosen_class(s.analysis, class_value), cmap, alpha))
        wire_export(ctx, self.btn, self.file, self.inputs,
                    lambda s, fusion, discard, start, class_value, cmap, alpha, smooth: export_methods(
                        s.analysis, ctx.model(s), s.upload, fusion, discard, start_index(start, s.analysis.depth),
                        chosen_class(s.analysis, class_value), cmap, alpha, smooth))
        wire_export(ctx, self.rel_btn, self.rel_file, [self.cls_dd, ctx.cmap, ctx.alpha, ctx.smooth],
                    lambda s, class_value, cmap, alpha, smooth: export_relevance(
                        s.analysis, ctx.model(s), s.upload, chosen_class(s.analysis, class_value), cmap, alpha, smooth),
                    label="⬇ PNG for slides: the relevance row")
