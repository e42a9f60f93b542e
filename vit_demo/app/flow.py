"""The one event that spans every section: a new image (or model) is analysed once, then the parts
of the page above the tabs and the open tab show it (:meth:`Section.show`), the open tab draws its
lazy pictures (:meth:`Section.lazy`), and slower pictures follow (:meth:`Section.follow_up`).
A closed tab is cleared, and shows the analysis when it is opened: an upload draws and sends
only what can be seen (measured: half of the upload's server time went into pictures of closed
tabs).

The page's upload event reads the image, the model and every section's ``show_inputs``; the
public ``/analyze`` endpoint is its twin with a fixed signature, ``(image, model)``, every
section's settings at their defaults (:meth:`UploadFlow.wire_api`), so that a control added to a
tab moves no API parameter. Both write the model description, the status, then every section's
``views``, ``controls`` and ``files``, then every export button, in the order of the sections (a
closed tab's views are None: an API client's session has the Patches tab open).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..analysis import Analysis
from ..checkpoints.load import LoadedModel
from ..images import ImageError
from .common import friendly, note, open_upload, payload_path
from .context import Context, Section, union, values
from .registry import ModelError
from .sections.models import model_summary
from .session import Session, Upload


def random_or_headless_notes(model: LoadedModel, analysis: Analysis, upload: Upload) -> str:
    """Status notes for a new analysis: the upload's own notes, random weights, no classifier."""
    notes = note("Note:", "; ".join(upload.notes) + ".", "info") if upload.notes else ""
    if model.random_weights:
        notes += note("Random weights:", "every step below is real, but the predictions are noise. "
                      "Load a checkpoint for meaningful ones (see weights/README.md).", "info")
    elif not analysis.logits.numel():
        notes += note("No classifier:", f"{model.name} outputs features only, so there are no predictions "
                      "and no class-specific maps.", "info")
    return notes


class UploadFlow:
    """The upload event and what hangs on it, for the sections of one page (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx, self.sections, self.state = ctx, ctx.sections, ctx.state
        self.show_inputs = union(s.show_inputs for s in self.sections)
        self.views = [c for s in self.sections for c in s.views]
        self.files = [c for s in self.sections for c in s.files]
        self.exports = [c for s in self.sections for c in s.exports]
        self.lazy_outputs = union(s.lazy_outputs for s in self.sections)
        self.inputs = [ctx.image, ctx.model_dd, *self.show_inputs, self.state]
        self.outputs = [self.state, ctx.model_md, ctx.status, *self.views,
                        *(c for s in self.sections for c in s.controls), *self.files, *self.exports]
        self.by_name = {s.name: s for s in self.sections if s.name}

    def hidden_files(self, exports_on: bool = True) -> dict:
        """Files made for the previous image hidden; the export buttons on (or off: no image)."""
        return ({f: gr.update(value=None, visible=False) for f in self.files}
                | {b: gr.update(interactive=exports_on) for b in self.exports})

    def clear(self, sess: Session) -> dict:
        sess.upload = sess.analysis = None
        sess.rendered = {}
        return {c: None for c in self.views} | self.hidden_files(exports_on=False)

    def on_image(self, payload: Any, key: str | None, *rest: Any) -> Any:
        """A new image or model: open the upload, analyse it once, show the open sections."""
        ctx, state = self.ctx, self.state
        *args, sess = rest
        sess = ctx.session(sess)
        path, _ = payload_path(payload)
        key = key or sess.model_key or ctx.default_key
        if path is not None and sess.shown == (path, key):
            return gr.skip()  # the browser sends one upload's change event twice: run it once
        sess.shown = (path, key)
        if path is None:
            return {state: sess, ctx.status: "", **self.clear(sess)}
        try:
            upload = open_upload(payload, ctx.files, ctx.cfg.limits)
        except ImageError as e:
            gr.Warning(str(e), duration=15)
            return {state: sess, ctx.status: note("Cannot use this image.", str(e)), **self.clear(sess)}
        for n in upload.notes:
            gr.Info(n)
        try:
            model = ctx.reg.get(key)
        except ModelError as e:
            gr.Warning(str(e), duration=15)
            sess.shown = None
            return {state: sess, ctx.status: note("Could not load that model.", str(e))}
        return self.show_new(sess, key, model, upload, args)

    def show_new(self, sess: Session, key: str, model: LoadedModel, upload: Upload, args: list[Any]) -> dict:
        """Analyse ``upload`` with ``model`` and show it: the sections above the tabs and the open tab
        draw now, a closed tab is cleared (it draws when opened)."""
        analysis = self.ctx.reg.analyze(key, upload.picture)
        old = sess.peek()  # the previous analysis, if still cached (an evicted one is not computed again)
        same_grid = old is not None and old.layout.grid == analysis.layout.grid
        sess.model_key, sess.upload, sess.analysis = key, upload, analysis
        sess.forgotten = False
        if self.ctx.sessions is not None:
            self.ctx.sessions.touch(sess)  # weighed with its new picture
        sess.rendered, sess.comparison = {}, None
        if not same_grid:
            sess.query = None
        out: dict = {self.state: sess, self.ctx.model_md: model_summary(model),
                     self.ctx.status: random_or_headless_notes(model, analysis, upload)}
        vals = values(self.show_inputs, args)
        sess.drawn = {}
        for s in self.sections:
            if s.gr_tab is not None and s.name != sess.open_tab:  # closed: drawn when opened (on_tab)
                out.update({c: None for c in s.views})
                continue
            out.update(s.show(sess, model, vals))
            sess.drawn[s.name] = sess.view_key
        return out | self.hidden_files()

    def on_image_again(self, payload: Any, _key: Any, *rest: Any) -> Any:
        """After a model pick: the image again with the session's model (the menu's value may
        still be the pick that failed)."""
        return self.on_image(payload, self.ctx.session(rest[-1]).model_key, *rest)

    def draw_lazy(self, sess: Session, section: Section | None) -> dict:
        """The open tab's slower pictures, once per analysis: claimed before they are drawn, so that
        the tab's opening and the upload's follow-up, running at once, do not both draw them."""
        if section is None or not sess.ready or sess.rendered.get(section.name) == sess.view_key:
            return {}
        sess.rendered[section.name] = key = sess.view_key
        try:
            out = section.lazy(sess)
        except BaseException:
            sess.rendered.pop(section.name, None)
            raise
        if not out and sess.rendered.get(section.name) == key:
            sess.rendered.pop(section.name, None)
        return out

    def on_lazy(self, sess: Session | None) -> Any:
        sess = self.ctx.session(sess)
        return self.draw_lazy(sess, self.by_name.get(sess.open_tab)) or gr.skip()

    def tab_handler(self, section: Section):
        """The handler of ``section``'s tab selection: show the analysis if the tab was closed at
        the upload, then its lazy pictures."""
        @friendly
        def on_tab(sess, *args):
            sess = self.ctx.session(sess)
            sess.open_tab = section.name
            out = {self.state: sess}
            if sess.ready and sess.drawn.get(section.name) != sess.view_key:  # closed at the upload
                out.update(section.show(sess, self.ctx.model(sess), values(section.show_inputs, args)))
                sess.drawn[section.name] = sess.view_key
            return {**out, **self.draw_lazy(sess, section)}

        return on_tab

    def chain(self, dep: Any) -> Any:
        """The open tab's lazy pictures and every section's follow-up, all at once after ``dep`` (each
        event chained after another waited for the browser's next request: 0.3-1 s at load 10, and the
        diagnostics' charts waited 4 s for the class maps); returns the lazy pictures' event."""
        for s in self.sections:
            s.follow_up(dep, self.ctx)
        return dep.then(friendly(self.on_lazy), [self.state], self.lazy_outputs, api_visibility="private",
                        show_progress="minimal")

    def wire_api(self) -> None:
        """The public ``/analyze``: ``(image, model)`` -> the upload event's outputs, every
        section's ``show_inputs`` at its initial value (on a hidden button: not the page's event)."""
        defaults = [c.value for c in self.show_inputs]
        on_image = friendly(self.on_image)

        def analyze(image: Any, model: str | None = None, sess: Any = None) -> Any:
            """Analyse ``image`` with ``model`` (the model menu's value; empty: the app's default)."""
            return on_image(image, model, *defaults, sess)

        gr.Button(visible=False).click(analyze, [self.ctx.image, self.ctx.model_dd, self.state], self.outputs,
                                       api_name="analyze", preprocess=False, **self.ctx.heavy)

    def reanalyze(self, step: Any) -> Any:
        return self.chain(step(friendly(self.on_image_again), self.inputs, self.outputs, api_visibility="private",
                               preprocess=False, **self.ctx.heavy))


def wire(ctx: Context) -> None:
    """Attach the upload event and its follow-ups, ``/analyze``, the tab selections and ``ctx.reanalyze``."""
    flow = UploadFlow(ctx)
    ctx.reanalyze = flow.reanalyze
    flow.chain(ctx.image.change(friendly(flow.on_image), flow.inputs, flow.outputs, api_visibility="private",
                                trigger_mode="always_last", preprocess=False, **ctx.heavy))
    flow.wire_api()
    for s in ctx.sections:
        if s.gr_tab is not None:
            s.on_open(s.gr_tab.select(flow.tab_handler(s), [ctx.state, *s.show_inputs],
                                      union([[ctx.state], s.views, s.controls, s.lazy_outputs]),
                                      api_visibility="private", show_progress="minimal", preprocess=False), ctx)
