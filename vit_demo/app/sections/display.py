"""The display controls every map shares (colormap, overlay opacity, smoothing), between the
predictions and the tabs. A change redraws every section that has a :meth:`Section.redisplay`."""

from __future__ import annotations

import gradio as gr

from ...checkpoints.load import LoadedModel
from ..common import check_look, friendly
from ..context import Context, Section, union, values
from ..page import NARROW_JS
from ..session import Session

COLORMAPS = ("inferno", "magma", "viridis", "plasma", "turbo", "jet", "gray")


class DisplayControls(Section):
    """Colormap, opacity and smoothing: ``ctx.cmap``, ``ctx.alpha``, ``ctx.smooth``."""

    def layout(self, ctx: Context) -> None:
        with gr.Row(elem_id="display"):
            ctx.cmap = gr.Dropdown(list(COLORMAPS), value="inferno", label="Colormap", scale=1)
            ctx.alpha = gr.Slider(0, 1, value=0.6, step=0.05, label="Overlay opacity", scale=2)
            ctx.smooth = gr.Checkbox(True, label="Smooth (bilinear) maps", scale=1)
        # the screen's width, told by the page at load (NARROW_JS): a phone gets tiles in two columns
        self.narrow = gr.Checkbox(False, visible=False, elem_id="narrow-screen")
        self.show_inputs = [self.narrow]  # an upload reads it too: it may race the page's first event

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        """Nothing to draw: the upload tells the session the screen's width (tiles for a phone)."""
        sess.narrow = bool(vals.get(self.narrow, sess.narrow))
        return {}

    def wire(self, ctx: Context) -> None:
        def on_narrow(narrow, sess):
            sess = ctx.session(sess)
            sess.narrow = bool(narrow)
            return sess

        ctx.demo.load(None, None, [self.narrow], js=NARROW_JS, api_visibility="private", show_progress="hidden")
        self.narrow.change(on_narrow, [self.narrow, ctx.state], [ctx.state], api_visibility="private",
                           show_progress="hidden", queue=False)
        self.wire_redisplay(ctx)

    def wire_redisplay(self, ctx: Context) -> None:
        sections = [s for s in ctx.sections if s.redisplay_outputs]
        inputs = union(s.redisplay_inputs for s in sections)

        @friendly
        def on_display(*args):
            *rest, sess = args
            vals = values(inputs, rest)
            check_look(vals[ctx.cmap], vals[ctx.alpha])
            sess = ctx.session(sess)
            if not sess.ready:
                return gr.skip()
            out: dict = {}
            for s in sections:
                out.update(s.redisplay(sess, vals))
            return out

        gr.on([ctx.cmap.input, ctx.alpha.input, ctx.smooth.input], on_display, [*inputs, ctx.state],
              union(s.redisplay_outputs for s in sections), api_visibility="private", trigger_mode="always_last",
              show_progress="hidden", preprocess=False)
