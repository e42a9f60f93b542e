"""The "Step inside" tab: the photo walked through the ViT, step by step (:mod:`vit_demo.inside`), every
number the model's own. The 13 steps in the order of the forward pass, each a picture with its number,
its title, its sentence (the equation in plain text, this photo's numbers) and a "PNG for slides"
button: the patch grid with the chosen patch (a click on any patch chooses another: the query patch
every tab shares, :mod:`vit_demo.app.query`), its pixels and numbers, the projection, the position,
one head's query meeting every key, the softmax with a **temperature** slider (at 1 the model's own;
elsewhere the caption says it no longer is), the weighted sum, the MLP, the residual stream, the
readout, the logit lens and the logits. Layer and head count from 1, as on the other tabs.

**Guided mode** (for a lecture) shows one step at a time, large, with Back and Next (or the arrow
keys): in the browser only, no server call (:data:`GUIDED_JS`, the page's CSS).

A walk is one forward pass with hooks (about 0.15 s of CPU for DeiT-Tiny, its 13 pictures included);
walks are kept by (model, photo, patch, layer, head) in a small byte-bounded cache (:data:`WALKS`), so
that the temperature slider re-takes the softmax without a forward pass; a redraw sends only the
pictures and sentences that changed. Also the public ``/steps`` endpoint, ``(image, row, col, layer,
head, temperature)``, indices from 0 as in the Python API: the values as JSON beside the pictures
(the MCP tool ``steps`` walks the same way: :func:`walk_request`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import torch
from PIL import Image

from ...analysis import Analysis
from ...budget import ByteLRU
from ...checkpoints.load import LoadedModel
from ...inside import STEPS, TEMPERATURE_RANGE, StepError, Walk, clamp_temperature, step_through
from ...inside.walk import check_choice, is_int
from ...viz.steps import patches_grid_size
from ..common import friendly, open_upload, png
from ..context import Context, Section
from ..exports import EXPORT_WIDTH, export_dir, export_row, slug, wire_export, within_budget
from ..query import wire_query_click
from ..server.guard import InputError
from ..session import Session, Upload

WALKS_BYTES = 48 << 20  # the walks kept (about 1.5 MB a DeiT-Tiny walk, 6 MB a ViT-B/16 one)
SOFTMAX_STEPS = ("softmax", "weighted_sum")  # the pictures a temperature changes
INTRO = ("**Step inside**: one patch of your photo walked through the model, step by step, every number read off "
         "the model's own forward pass. **Click a patch** in step 1 to follow another; choose the layer and the "
         "head of the attention to step into. **Guided mode** shows one step at a time, large, for a lecture.")
MARKDOWN = re.compile(r"([\\`*_{}\[\]<>#|~$])")  # what Markdown would read as markup in a step's sentence

# ----------------------------------------------------------------------------- guided mode (in the browser)

# Installed by the tick box (once): window.vitDemoInside.go(d) shows step k + d alone (a style sheet of
# its own hides the others), says which, and fits its picture to the screen under what the step shows
# above it (in presentation mode the page does not scroll: from the top; else from the Back/Next row,
# scrolled to the top). The arrow keys (and a presenter's clicker: Page Up / Down) step too.
GUIDED_JS = """(on) => {
  document.body.classList.toggle('inside-guided', !!on);
  if (!window.vitDemoInside) {
    const n = STEP_COUNT, sheet = (id) => {
      let s = document.getElementById(id);
      if (!s) { s = document.createElement('style'); s.id = id; document.head.appendChild(s); }
      return s;
    };
    const fit = () => {
      const k = window.vitDemoInside.k, nav = document.getElementById('inside-nav');
      const step = document.getElementById(`inside-step-${k}`), img = step && step.querySelector('.inside-pic img');
      if (!img || !nav || !document.body.classList.contains('inside-guided')) return;
      const top = (e) => e.getBoundingClientRect().top + window.scrollY;
      const present = document.body.classList.contains('present-mode');
      const room = Math.max(160, Math.floor(window.innerHeight - (top(img) - (present ? 0 : top(nav))) - (present ? 12 : 64)));
      sheet('inside-fit-style').textContent =
        `body.inside-guided #inside-step-${k} .inside-pic img {max-height: ${room}px !important;}`;
    };
    const go = (d) => {
      const me = window.vitDemoInside, k = Math.min(n, Math.max(1, me.k + d));
      me.k = k;
      sheet('inside-guided-style').textContent =
        `body.inside-guided .inside-step:not(#inside-step-${k}) {display: none !important;}`;
      const w = document.getElementById('inside-where');
      if (w) w.textContent = `Step ${k} of ${n}`;
      const nav = document.getElementById('inside-nav');
      if (nav && !document.body.classList.contains('present-mode')) nav.scrollIntoView({block: 'start'});
      requestAnimationFrame(fit);
    };
    window.vitDemoInside = {k: 1, go: go, fit: fit};
    document.addEventListener('keydown', (ev) => {
      const t = ev.target, typing = t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
      if (!document.body.classList.contains('inside-guided') || typing || ev.altKey || ev.ctrlKey || ev.metaKey) return;
      const d = {ArrowRight: 1, PageDown: 1, ArrowLeft: -1, PageUp: -1}[ev.key];
      if (d) { go(d); ev.preventDefault(); }
    });
    document.addEventListener('load', (ev) => { if (ev.target.closest && ev.target.closest('.inside-step')) fit(); }, true);
    window.addEventListener('resize', fit);
  }
  if (on) window.vitDemoInside.go(0);
}""".replace("STEP_COUNT", str(len(STEPS)))


def step_js(d: int) -> str:
    """Back (-1) or Next (1), in the browser."""
    return f"() => {{ if (window.vitDemoInside) window.vitDemoInside.go({d}); }}"


WHERE = f'<div id="inside-where" class="inside-where">Step 1 of {len(STEPS)}</div>'

# ----------------------------------------------------------------------------- the walks


def walk_nbytes(walk: Walk) -> int:
    arrays = [*walk.values.values(), *walk.own.values(), walk.picture]
    return sum(np.asarray(a).nbytes for a in arrays)


WALKS: ByteLRU[tuple, Walk] = ByteLRU(WALKS_BYTES, walk_nbytes)
"""Walks at temperature 1 by (model, its weights, photo, patch, layer, head): a slider's move or a
redraw reads one again instead of running the model."""


def walk_of(lm: LoadedModel, a: Analysis, patch: Any, layer: int, head: int, temperature: float = 1.0) -> Walk:
    """The walk of ``a``'s photo through ``lm`` (one forward pass with hooks, or the cache), the
    softmax at ``temperature``; ``patch``: (row, col), an index, or None (the readout's)."""
    patch = tuple(patch) if isinstance(patch, (list, tuple)) else patch
    key = (lm.name, lm.source, a.key, patch, layer, head)
    walk = WALKS.get(key)
    if walk is None:
        walk = step_through(lm.model, a.x, patch, layer, head, 1.0, a.picture, lm.labels, lm.name)
        WALKS.put(key, walk)
    return walk if temperature == 1.0 else walk.with_temperature(temperature)


def whole_index(value: Any, name: str) -> int:
    """A request's index as an int (5 and 5.0 are 5), or StepError in one line."""
    if is_int(value):
        return int(value)
    try:
        f = float(value)
        if isinstance(value, bool) or f != int(f):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise StepError(f"{name} {str(value)[:40]!r}: give a whole number (counted from 0)") from None
    return int(f)


def request_choice(lm: LoadedModel, row: Any, col: Any, layer: Any, head: Any, temperature: Any
                   ) -> tuple[tuple[int, int] | None, int, int, float]:
    """The patch (None: the readout's), layer, head (from 0) and temperature (clamped to
    TEMPERATURE_RANGE) of an API request, or StepError naming the allowed range: checked against
    the model's input before anything runs (a NaFlex model's grid is the picture's: checked again by the walk)."""
    t = clamp_temperature(temperature)
    if row is None and col is None:
        patch = None
    elif row is None or col is None:
        raise StepError("give both row and col (from 0), or neither: the patch the readout attends to most")
    else:
        patch = (whole_index(row, "row"), whole_index(col, "col"))
    layer, head = whole_index(layer, "layer"), whole_index(head, "head")
    size = lm.data_config.input_size[-2:]
    check_choice(lm.model, torch.empty((1, 3, *size), device="meta"), None if lm.model.cfg.naflex else patch,
                 layer, head)
    return patch, layer, head, t


def walk_request(ctx: Context, image: Any, row: Any, col: Any, layer: Any, head: Any, temperature: Any,
                 model: str | None = None) -> tuple[Upload, Walk]:
    """A request's picture walked through ``model`` (None: the app's default): the choice is checked
    first (a bad one is one line, :class:`InputError`, and nothing runs), then the picture is read
    within the app's limits and analysed (the app's cache), then walked."""
    key = model or ctx.default_key
    ctx.reg.spec(key)  # an unknown model is refused before anything is read
    lm = ctx.reg.get(key)
    try:
        patch, layer, head, t = request_choice(lm, row, col, layer, head, temperature)
        up = open_upload(image, ctx.files, ctx.cfg.limits)
        return up, walk_of(lm, ctx.reg.analyze(key, up.picture), patch, layer, head, t)
    except StepError as e:
        raise InputError(str(e)) from None


def steps_json(walk: Walk, image: str, max_numbers: int | None = None) -> dict[str, Any]:
    """The walk as JSON (:meth:`Walk.to_json`) under the picture's name; ``max_numbers``: the values of
    at most that many numbers only, the others named with their shapes under ``left_out``."""
    out = {"image": image, **walk.to_json()}
    if max_numbers is not None:
        big = {k: list(np.shape(walk.values[k])) for k in out["values"] if np.size(walk.values[k]) > max_numbers}
        out["values"] = {k: v for k, v in out["values"].items() if k not in big}
        out["left_out"] = big
    return out


# ----------------------------------------------------------------------------- the page's words


def plain(text: str) -> str:
    """A step's sentence as Markdown shows it as written (``attention_i`` is no italics)."""
    return MARKDOWN.sub(r"\\\1", text)


def step_markdown(i: int, walk: Walk) -> str:
    """Step ``i`` (from 1): its number, its title and its sentence; the softmax away from T = 1 says
    in bold that it is no longer the model's."""
    step = walk.steps[i - 1]
    head = f"### {i}. {plain(step.title)}"
    note = ""
    if step.name == "softmax" and walk.temperature != 1.0:
        note = (f"\n\n**At T = {walk.temperature:g} these weights are NOT the model's attention**: a what-if. "
                "Set T back to 1 for the model's own.")
    elif not step.exists:
        note = "\n\n*This model has no such step: the sentence says what it does instead.*"
    return f"{head}\n\n{plain(step.text)}{note}"


def info_markdown(walk: Walk) -> str:
    f = walk.facts
    why = ", the one the model's readout attends to most in the last layer" if f.chosen_by_model else ""
    return (f"Following **{f.patch_name}** (token {f.token} of {f.n_patches + len(f.prefix)}{why}) into **layer "
            f"{f.layer + 1} of {f.depth}, head {f.head + 1} of {f.heads}**. Click a patch in step 1 (or in the "
            f"Patches or Attention tab) to follow another.")


def layer_label(depth: int | None) -> str:
    return "Layer (1 = first)" if depth is None else f"Layer (1 = first, {depth} = last)"


def page_choice(layer: Any, head: Any, temperature: Any, depth: int, heads: int) -> tuple[int, int, float]:
    """The sliders' layer and head (counted from 1, as the page shows them) as indices from 0, and
    the temperature clamped to its range; StepError in one line naming the allowed range."""
    if not (is_whole(layer) and 1 <= float(layer) <= depth):
        raise StepError(f"layer {str(layer)[:20]}: this model has layers 1..{depth} (counted from 1)")
    if not (is_whole(head) and 1 <= float(head) <= heads):
        raise StepError(f"head {str(head)[:20]}: this model has heads 1..{heads} in each layer (counted from 1)")
    return int(float(layer)) - 1, int(float(head)) - 1, clamp_temperature(temperature)


def is_whole(v: Any) -> bool:
    try:
        return not isinstance(v, bool) and float(v) == int(float(v))
    except (TypeError, ValueError, OverflowError):
        return False


def fitted(v: Any, top: int, default: int) -> int:
    """A slider's value within 1..top (a new model may have fewer layers), ``default`` when it is none."""
    return min(max(int(float(v)), 1), top) if is_whole(v) else default


def query_patch(sess: Session, a: Analysis) -> int | None:
    """The query patch every tab shares, when it lies in this analysis's grid (None: the readout's)."""
    q = sess.query
    return q if q is not None and 0 <= q < a.layout.num_patches else None


def digest(img: Image.Image) -> str:
    return hashlib.blake2b(img.tobytes(), digest_size=16).hexdigest() + f"{img.size}"


def export_step(walk: Walk, name: str, up: Upload, cmap: str) -> Path:
    """Step ``name``'s picture at slide size (:data:`~vit_demo.app.exports.EXPORT_WIDTH` px wide) as a PNG."""
    img = walk.render(name, EXPORT_WIDTH / 960, cmap)
    if img.width != EXPORT_WIDTH:
        img = img.resize((EXPORT_WIDTH, round(img.height * EXPORT_WIDTH / img.width)), Image.Resampling.LANCZOS)
    f = walk.facts
    out = export_dir() / (slug(f"{Path(up.name).stem}-step-{STEPS.index(name) + 1:02d}-{name}-patch-{f.row}-{f.col}-"
                               f"layer{f.layer + 1}-head{f.head + 1}") + ".png")
    img.save(out, "PNG", compress_level=3)
    within_budget()
    return out


# ----------------------------------------------------------------------------- the section


class InsideTab(Section):
    name, title = "inside", "Step inside"

    def layout(self, ctx: Context) -> None:
        gr.Markdown(INTRO, elem_classes="caption", elem_id="inside-intro")
        with gr.Row(equal_height=True, elem_id="inside-controls"):
            self.layer = gr.Slider(1, 12, value=12, step=1, label=layer_label(None), elem_id="inside-layer", scale=3,
                                   min_width=200)
            self.head = gr.Slider(1, 3, value=1, step=1, label="Head", elem_id="inside-head", scale=2, min_width=130)
            self.guided = gr.Checkbox(False, label="Guided mode", info="one step at a time, large: for a lecture",
                                      elem_id="inside-guided", scale=2, min_width=150)
            with gr.Column(elem_id="inside-nav", scale=3, min_width=340), gr.Row(elem_id="inside-nav-row"):
                self.back = gr.Button("◀ Back", elem_id="inside-back", scale=1, min_width=80)
                gr.HTML(WHERE, elem_id="inside-where-box", padding=False, min_width=130)
                self.next = gr.Button("Next ▶", elem_id="inside-next", variant="primary", scale=1, min_width=80)
        self.info = gr.Markdown(elem_id="inside-info", elem_classes="caption")
        self.texts, self.pics, self.buttons, self.saved = {}, {}, {}, {}
        for i, name in enumerate(STEPS, 1):
            with gr.Column(elem_id=f"inside-step-{i}", elem_classes="inside-step"):
                self.layout_step(name)
        self.show_inputs = [self.layer, self.head, self.temperature, ctx.cmap]
        self.views = [self.info, *self.texts.values(), *self.pics.values()]
        self.controls = [self.layer, self.head]
        self.exports = list(self.buttons.values())
        self.redisplay_inputs = self.query_inputs = list(self.show_inputs)
        self.redisplay_outputs = self.query_outputs = list(self.views)

    def layout_step(self, name: str) -> None:
        """One step: its words, (the softmax: the temperature slider), its picture, its export button."""
        self.texts[name] = gr.Markdown(elem_id=f"inside-{name}-text", elem_classes="inside-text")
        if name == "softmax":
            lo, hi = TEMPERATURE_RANGE
            self.temperature = gr.Slider(lo, hi, value=1.0, step=0.05, elem_id="inside-temperature",
                                         label=f"Temperature T ({lo:g} to {hi:g}; 1 = the model's own softmax)")
        self.pics[name] = gr.Image(show_label=False, interactive=False, format="png", elem_id=f"inside-{name}",
                                   elem_classes="inside-pic", buttons=["fullscreen"], container=False)
        self.buttons[name], self.saved[name] = export_row(f"inside-{name}-file")

    # ------------------------------------------------------------------------- drawing

    def draw(self, sess: Session, lm: LoadedModel, choice: tuple[int, int, float], cmap: str,
             names: tuple[str, ...] = STEPS, full: bool = True) -> dict:
        """The walk for ``choice`` (layer, head, temperature): its sentences and the pictures of
        ``names``; unless ``full``, only what differs from what the page shows (the session knows)."""
        a = sess.analysis
        layer, head, t = choice
        walk = walk_of(lm, a, query_patch(sess, a), layer, head, t)
        shown = sess.inside.get("shown") or {}
        if full or shown.get("view") != sess.view_key:
            shown = {}
        shown = {**shown, "view": sess.view_key}
        out: dict = {self.info: info_markdown(walk)}
        for i, name in enumerate(STEPS, 1):
            text = step_markdown(i, walk)
            if shown.get(f"text:{name}") != text:
                out[self.texts[name]] = shown[f"text:{name}"] = text
            if name in names:
                img = walk.render(name, cmap=cmap)
                if shown.get(f"pic:{name}") != (sig := digest(img)):
                    out[self.pics[name]], shown[f"pic:{name}"] = png(img), sig
        sess.inside = {"model": sess.model_key, "layer": layer, "head": head, "shown": shown}
        return out

    def redraw(self, sess: Session, lm: LoadedModel, vals: dict, names: tuple[str, ...] = STEPS) -> dict:
        """Only what changed, for the controls' values ``vals``; a bad value: one line, nothing computed."""
        a = sess.analysis
        layer, head, t, cmap = (vals[c] for c in self.show_inputs)
        try:
            choice = page_choice(layer, head, t, a.depth, a.num_heads)
        except StepError as e:
            return {self.info: f"**{plain(str(e))}**: nothing was computed."}
        return self.draw(sess, lm, choice, cmap, names, full=False)

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        a = sess.analysis
        layer, head, t, cmap = (vals[c] for c in self.show_inputs)
        depth, heads = a.depth, a.num_heads
        layer, head = fitted(layer, depth, depth), fitted(head, heads, 1)
        try:
            t = clamp_temperature(t)
        except StepError:
            t = 1.0
        out = self.draw(sess, lm, (layer - 1, head - 1, t), cmap)
        return {**out, self.layer: gr.update(maximum=depth, value=layer, label=layer_label(depth)),
                self.head: gr.update(maximum=heads, value=head)}

    def stale(self, sess: Session) -> dict:
        """The tab is closed: nothing drawn now; it draws when opened (flow's tab handler)."""
        sess.drawn.pop(self.name, None)
        return {}

    def show_query(self, sess: Session, lm: LoadedModel, query: int, vals: dict) -> dict:
        return self.redraw(sess, lm, vals) if sess.open_tab == self.name else self.stale(sess)

    def redisplay(self, sess: Session, vals: dict) -> dict:
        return self.redraw(sess, self.lm(sess), vals) if sess.open_tab == self.name else self.stale(sess)

    def lm(self, sess: Session) -> LoadedModel:
        return self.ctx.model(sess)

    def warm_up(self, ctx: Context) -> None:
        """Every renderer once (the first draws load fonts and colour maps): the first click is quick."""
        lm = ctx.reg.get(ctx.default_key)
        size = lm.data_config.input_size[-2:]
        x = torch.zeros((1, 3, *size))
        walk = step_through(lm.model, x, None, -1, 0, 1.0, None, lm.labels, lm.name)
        for name in STEPS:
            walk.render(name)

    # ------------------------------------------------------------------------- events

    def wire(self, ctx: Context) -> None:
        self.ctx = ctx

        @friendly
        def on_choice(*args):
            *vals, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            return self.redraw(sess, ctx.model(sess), dict(zip(self.show_inputs, vals)))

        @friendly
        def on_temperature(*args):
            *vals, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            return self.redraw(sess, ctx.model(sess), dict(zip(self.show_inputs, vals)), SOFTMAX_STEPS)

        gr.on([self.layer.input, self.head.input], on_choice, [*self.show_inputs, ctx.state], self.views,
              api_visibility="private", trigger_mode="always_last", show_progress="hidden", preprocess=False)
        self.temperature.input(on_temperature, [*self.show_inputs, ctx.state], self.views, api_visibility="private",
                               trigger_mode="always_last", show_progress="hidden", preprocess=False)
        wire_query_click(ctx, self.pics["patches"], lambda a, _vals: patches_grid_size(a.layout.grid))
        self.guided.change(None, [self.guided], None, js=GUIDED_JS, api_visibility="private", show_progress="hidden")
        self.back.click(None, None, None, js=step_js(-1), api_visibility="private",
                        show_progress="hidden")
        self.next.click(None, None, None, js=step_js(1), api_visibility="private",
                        show_progress="hidden")
        for name in STEPS:
            wire_export(ctx, self.buttons[name], self.saved[name], self.show_inputs[:3] + [ctx.cmap],
                        lambda s, layer, head, t, cmap, name=name: self.export(s, name, layer, head, t, cmap))
        self.wire_api(ctx)

    def export(self, sess: Session, name: str, layer: Any, head: Any, t: Any, cmap: str) -> Path:
        a, lm = sess.analysis, self.ctx.model(sess)
        try:
            layer, head, t = page_choice(layer, head, t, a.depth, a.num_heads)
        except StepError as e:
            raise gr.Error(str(e), print_exception=False) from None
        return export_step(walk_of(lm, a, query_patch(sess, a), layer, head, t), name, sess.upload, cmap)

    def wire_api(self, ctx: Context) -> None:
        """The public ``/steps``: its parameters on hidden components (not the page's controls)."""
        with gr.Group(visible=False):
            row, col = gr.Number(None, precision=0, label="row"), gr.Number(None, precision=0, label="col")
            layer, head = gr.Number(0, precision=0, label="layer"), gr.Number(0, precision=0, label="head")
            temperature = gr.Number(1.0, label="temperature")
            answer, pictures = gr.JSON(), gr.Gallery(format="png")
            button = gr.Button()

        @friendly
        def on_steps(image: Any, row: float | None = None, col: float | None = None, layer: float = 0, head: float = 0,
                     temperature: float = 1.0, sess: Any = None) -> tuple[dict, list]:
            """One picture walked through the model, step by step: ``row`` and ``col`` of the patch to
            follow (from 0; both None: the one the readout attends to most in the last layer), ``layer``
            and ``head`` from 0 (layer -1: the last), the softmax ``temperature`` (1: the model's own;
            clamped to 0.1..10). Returns the walk as JSON (the steps' titles and texts, every value as
            lists) and the 13 pictures."""
            sess = ctx.session(sess)
            up, walk = walk_request(ctx, image, row, col, layer, head, temperature, sess.model_key)
            pics = [(png(walk.render(s.name)), f"{i}. {s.title}") for i, s in enumerate(walk.steps, 1)]
            return steps_json(walk, up.name), pics

        button.click(on_steps, [ctx.image, row, col, layer, head, temperature, ctx.state], [answer, pictures],
                     api_name="steps", preprocess=False, **ctx.heavy)
