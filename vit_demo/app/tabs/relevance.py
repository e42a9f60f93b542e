"""The "Rollout & relevance" tab: raw attention, attention rollout (head fusion, discard,
start layer), and the class-specific maps (gradient rollout, Chefer relevance) for a class
picked from the top-k, side by side; below them the relevance methods for the same class
(CP-LRP, AttnLRP, CP-LRP gated by gradient rollout, GradCAM) and, on request only, the
perturbation methods (RISE, causal LRP). The class-specific maps need one backward pass each per
class: they follow the first render (:meth:`MethodsTab.follow_up`). The perturbation methods
(hundreds of forward passes) run only when their button is pressed, with a progress bar; never on
a slider move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np

from ... import methods, viz
from ...analysis import Analysis, class_maps, on_demand_map
from ...checkpoints.load import LoadedModel
from ...methods.attention import cls_attention
from ...methods.rollout import rollout
from ..common import friendly, jpeg
from ..context import Context, Section
from ..exports import export_row, save, slug, wire_export
from ..motion import AnimationRow, animation_files
from ..session import Session, Upload

FUSIONS = ("mean", "max", "min")
TOP_ROW = ("grad-rollout", "chefer")  # class-specific maps beside raw attention and rollout; the rest below


def tile_title(name: str, label: str) -> str:
    """A map's tile title: the method's title and the class it explains."""
    return f"{methods.get(name).title}\nfor “{label}”"

# ----------------------------------------------------------------------------- views


def class_choices(a: Analysis, k: int = 5) -> list[tuple[str, int]]:
    """(menu text, class index) for the top-k classes, for the class-specific maps."""
    top = a.topk(max(5, int(k)))
    return [(f"{i + 1}. {t['label']} ({t['prob'] * 100:.1f}%)", t["index"]) for i, t in enumerate(top)]


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
    start_layer = int(np.clip(int(start_layer), 0, a.depth - 1))
    out = {
        "Raw attention\nlast layer, mean of heads":
        cls_attention(a.attentions, a.layout, a.depth - 1)[0].numpy(),
        f"Attention rollout\n{fusion} fusion" + (f", discard {float(discard):.0%}" if float(discard) > 0 else "")
        + (f", from layer {start_layer}" if start_layer else ""):
        rollout(a.attentions, a.layout, fusion, float(discard), start_layer)[0].numpy(),
    }
    if lm is not None and a.logits.numel():
        cls = a.top1 if cls is None else int(cls)
        cm = class_maps(a, lm, cls)
        label = a.labels[cls]
        out.update({tile_title(name, label): cm[name] for name in TOP_ROW})
    return out


def pending_titles(a: Analysis, cls: int | None) -> list[str]:
    """Titles of the class-specific maps not computed yet (placeholders in the first render)."""
    if not a.logits.numel() or has_class_maps(a, cls):
        return []
    label = a.labels[a.top1 if cls is None else int(cls)]
    return [tile_title(name, label) for name in TOP_ROW]


def relevance_names() -> list[str]:
    """The relevance row: every class-specific method not in the top row, in the registry's
    order (the slow ones last, shown once they have been run)."""
    return [n for n in methods.names(class_specific=True) if n not in TOP_ROW]


def on_demand_names() -> list[str]:
    """The slow methods of the relevance row: one button each."""
    return [n for n in relevance_names() if methods.get(n).slow]


def relevance_maps(a: Analysis, lm: LoadedModel | None, cls: int | None) -> dict[str, np.ndarray]:
    """The relevance row: LRP, AttnLRP, gated LRP, GradCAM for the class (computed with the
    other class-specific maps when ``lm`` is given), and RISE only if it has been run."""
    if lm is None or not a.logits.numel():
        return {}
    cls = a.top1 if cls is None else int(cls)
    cm, label = class_maps(a, lm, cls), a.labels[cls]
    return {tile_title(name, label): cm[name] for name in relevance_names() if name in cm}


def relevance_pending(a: Analysis, cls: int | None) -> list[str]:
    if not a.logits.numel() or has_class_maps(a, cls):
        return []
    label = a.labels[a.top1 if cls is None else int(cls)]
    return [tile_title(name, label) for name in relevance_names() if not methods.get(name).slow]


def has_class_maps(a: Analysis, cls: int | None) -> bool:
    return a.logits.numel() > 0 and (a.top1 if cls is None else int(cls)) in a.class_maps


def methods_caption(a: Analysis, fusion: str, discard: float, start_layer: int, cls: int | None) -> str:
    parts = [
        "**Raw attention**: the [class] token's attention at the last layer, heads averaged.",
        f"**Attention rollout** (Abnar & Zuidema 2020): attention multiplied through the layers {int(start_layer)}–"
        f"{a.depth - 1} with the skip connections, heads fused by *{fusion}*"
        + (f", lowest {float(discard) * 100:.0f}% of each layer's attention discarded." if float(discard) > 0 else "."),
    ]
    if a.logits.numel():
        label = a.labels[a.top1 if cls is None else int(cls)]
        parts.append(f"**Gradient rollout** and **Chefer relevance** (Chefer, Gur & Wolf 2021) explain the class "
                     f"*{label}*: heads weighted by how much that class's score depends on them (one backward pass).")
        parts.append(relevance_caption())
    else:
        parts.append("This model has no classifier, so there are no class-specific maps.")
    return " ".join(parts)


def relevance_caption() -> str:
    """The relevance row in words: each method's title and paper, the slow ones on request."""
    def cite(names: list[str]) -> str:
        return "; ".join(f"**{methods.get(n).title}** ({methods.get(n).cite})" for n in names)

    now = [n for n in relevance_names() if n not in on_demand_names()]
    text = f"Below, for the same class: {cite(now)}."
    if on_demand_names():
        text += f" On request (hundreds of forward passes each): {cite(on_demand_names())}."
    return text


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


class RelevanceTab(Section):
    name, title = "methods", "Rollout & relevance"

    def layout(self, ctx: Context) -> None:
        with gr.Row():
            self.fusion = gr.Radio(list(FUSIONS), value="mean", label="Rollout: head fusion", scale=2)
            self.discard = gr.Slider(0, 0.95, value=0.0, step=0.05, label="Rollout: discard the lowest", scale=2)
            self.start = gr.Slider(0, 11, value=0, step=1, label="Rollout: start layer", scale=2)
            self.cls_dd = gr.Dropdown([], label="Explain the class (gradient rollout, Chefer)", scale=2,
                                      elem_id="explain-class")
        self.methods_img = gr.Image(label="The methods side by side", interactive=False, format="png", height=360,
                                    elem_id="methods", buttons=["fullscreen"])
        self.relevance_img = gr.Image(label="Relevance for the same class", interactive=False, format="png",
                                      height=360, elem_id="relevance", buttons=["fullscreen"])
        with gr.Row():
            self.on_demand_btns = {name: gr.Button(f"Run {methods.get(name).title} ({methods.get(name).cite})", size="sm",
                                                   elem_id=f"run-{name}") for name in on_demand_names()}
        self.methods_md = gr.Markdown(elem_classes="caption")
        self.btn, self.file = export_row()
        self.motion = AnimationRow()
        self.motion.layout("methods")
        # what a redraw reads, in order: the method's settings, then the display controls
        self.inputs = [self.fusion, self.discard, self.start, self.cls_dd, ctx.cmap, ctx.alpha, ctx.smooth]
        self.show_inputs = [ctx.k, self.fusion, self.discard, self.start, ctx.cmap, ctx.alpha, ctx.smooth]
        self.views = [self.methods_img, self.relevance_img, self.methods_md]
        self.controls = [self.start, self.cls_dd]
        self.files = [self.file, *self.motion.outputs]
        self.redisplay_inputs = self.inputs
        self.redisplay_outputs = [self.methods_img, self.relevance_img, self.methods_md]
        self._reg = ctx.reg

    def picture(self, sess: Session, fu, di, st, cl, cm, al, sm, compute: bool) -> dict:
        """The tiles and their caption. ``compute``: run the backward pass for the class-specific
        maps if they are not cached; otherwise they show as grey placeholders."""
        a = sess.analysis
        cls = chosen_class(a, cl)
        lm = self._reg.get(sess.model_key) if (compute or has_class_maps(a, cls)) else None
        maps = method_maps(a, lm, fu, di, st, cls)
        pending = [] if lm is not None else pending_titles(a, cls)
        rel = relevance_maps(a, lm, cls)
        rel_pending = [] if lm is not None else relevance_pending(a, cls)
        return {self.methods_img: jpeg(viz.tiles_image(a.picture, maps, cm, al, sm, pending=pending)),
                self.relevance_img: jpeg(viz.tiles_image(a.picture, rel, cm, al, sm, pending=rel_pending))
                if rel or rel_pending else None,
                self.methods_md: methods_caption(a, fu, di, st, cls)}

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a = sess.analysis
        k, fu, di, st, cm, al, sm = (vals[c] for c in self.show_inputs)
        choices = class_choices(a, k)
        return {
            self.start: gr.update(maximum=a.depth - 1, value=min(int(st), a.depth - 1)),
            self.cls_dd: gr.update(choices=choices, value=choices[0][1] if choices else None,
                                   interactive=bool(choices)),
            **self.picture(sess, fu, di, min(int(st), a.depth - 1), None, cm, al, sm, False),
        }

    def redisplay(self, sess: Session, vals: dict) -> dict:
        return self.picture(sess, *(vals[c] for c in self.inputs), False)

    def follow_up(self, dep: Any, ctx: Context) -> Any:
        @friendly
        def on_class_maps(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if not sess.ready or not sess.analysis.logits.numel():
                return gr.skip()
            if sess.open_tab != self.name:  # closed: the backward pass now, the picture when it is opened
                fu, di, st, cl = rest[:4]
                a = sess.analysis
                method_maps(a, self._reg.get(sess.model_key), fu, di, st, chosen_class(a, cl))
                return gr.skip()
            return self.picture(sess, *rest, True)

        return dep.success(on_class_maps, [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private",
                           show_progress="minimal", preprocess=False, **ctx.heavy)

    def wire(self, ctx: Context) -> None:
        @friendly
        def on_methods(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            return self.picture(sess, *rest, True)

        def on_demand(name: str):
            @friendly
            def run(*args, progress=gr.Progress()):  # noqa: B008 - how Gradio hands a handler its progress bar
                *rest, sess = args
                sess = ctx.session(sess)
                if not sess.ready or not sess.analysis.logits.numel():
                    return gr.skip()
                a = sess.analysis
                desc = methods.get(name).title
                on_demand_map(a, ctx.model(sess), name, chosen_class(a, rest[3]), progress=lambda f: progress(f, desc=desc))
                return self.picture(sess, *rest, True)

            return run

        for name, btn in self.on_demand_btns.items():
            btn.click(on_demand(name), [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private",
                      preprocess=False, **ctx.slow)
        gr.on([self.fusion.input, self.discard.input, self.start.input, self.cls_dd.input], on_methods,
              [*self.inputs, ctx.state], self.redisplay_outputs, api_visibility="private", trigger_mode="always_last",
              show_progress="minimal", preprocess=False, **ctx.heavy)
        self.motion.wire(ctx, [self.cls_dd, ctx.cmap, ctx.alpha], lambda s, lm, cl, cm, al: animation_files(
            s.analysis, lm, s.upload.name, ("rollout", "relevance") if s.analysis.logits.numel() else ("rollout",),
            None, chosen_class(s.analysis, cl), cm, al))
        wire_export(ctx, self.btn, self.file, self.inputs,
                    lambda s, fu, di, st, cl, cm, al, sm: export_methods(s.analysis, ctx.model(s), s.upload, fu, di, st,
                                                                         chosen_class(s.analysis, cl), cm, al, sm))
