"""The one event that spans every section: a new image (or model) is analysed once, then the parts
of the page above the tabs and the open tab show it (:meth:`Section.show`), slower work follows
(:meth:`Section.follow_up`), and the open tab draws its lazy pictures (:meth:`Section.lazy`).
A closed tab is cleared, and shows the analysis when it is opened: an upload draws and sends
only what can be seen (measured: half of the upload's server time went into pictures of closed
tabs).

The upload event is the public ``/analyze`` endpoint: its inputs are the image, the model
and every section's ``show_inputs``; its outputs the model description, the status, then every
section's ``views``, ``controls`` and ``files``, in the order of the sections (a closed tab's
views are None: an API client's session has the Patches tab open).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..images import ImageError
from .common import friendly, note, payload_path
from .context import Context, Section, union, values
from .registry import ModelError
from .sections.models import model_summary
from .session import Session, open_image


def wire(ctx: Context) -> None:
    """Attach the upload event, its follow-ups, the tab selections and ``ctx.reanalyze``."""
    sections, state = ctx.sections, ctx.state
    show_inputs = union(s.show_inputs for s in sections)
    views = [c for s in sections for c in s.views]
    files = [c for s in sections for c in s.files]
    lazy_outputs = union(s.lazy_outputs for s in sections)
    inputs = [ctx.image, ctx.model_dd, *show_inputs, state]
    outputs = [state, ctx.model_md, ctx.status, *views, *(c for s in sections for c in s.controls), *files]
    by_name = {s.name: s for s in sections if s.name}

    def clear(sess: Session) -> dict:
        sess.upload = sess.analysis = None
        sess.rendered = {}
        return {c: None for c in views} | {f: gr.update(value=None, visible=False) for f in files}

    @friendly
    def on_image(payload, key, *rest):
        *args, sess = rest
        sess = ctx.session(sess)
        path, name = payload_path(payload)
        key = key or sess.model_key or ctx.default_key
        if path is not None and sess.shown == (path, key):
            return gr.skip()  # the browser sends one upload's change event twice: run it once
        sess.shown = (path, key)
        if path is None:
            return {state: sess, ctx.status: "", **clear(sess)}
        try:
            up = open_image(path, max_bytes=ctx.cfg.limits.max_upload_bytes)
        except ImageError as e:
            gr.Warning(str(e), duration=15)
            return {state: sess, ctx.status: note("Cannot use this image.", str(e)), **clear(sess)}
        up.name = name or up.name
        for n in up.notes:
            gr.Info(n)
        try:
            lm = ctx.reg.get(key)
        except ModelError as e:
            gr.Warning(str(e), duration=15)
            sess.shown = None
            return {state: sess, ctx.status: note("Could not load that model.", str(e))}
        a = ctx.reg.analyze(key, up.picture)
        old = sess.peek()  # the previous analysis, if still cached (an evicted one is not computed again)
        same_grid = old is not None and old.layout.grid == a.layout.grid
        sess.model_key, sess.upload, sess.analysis = key, up, a
        sess.rendered, sess.comparison = {}, None
        if not same_grid:
            sess.query = None
        notes = note("Note:", "; ".join(up.notes) + ".", "info") if up.notes else ""
        if lm.random_weights:
            notes += note("Random weights:", "every step below is real, but the predictions are noise. "
                          "Load a checkpoint for meaningful ones (see weights/README.md).", "info")
        elif not a.logits.numel():
            notes += note("No classifier:", f"{lm.name} outputs features only, so there are no predictions "
                          "and no class-specific maps.", "info")
        out: dict = {state: sess, ctx.model_md: model_summary(lm), ctx.status: notes}
        vals = values(show_inputs, args)
        sess.drawn = {}
        for s in sections:
            if s.gr_tab is not None and s.name != sess.open_tab:  # closed: drawn when opened (on_tab)
                out.update({c: None for c in s.views})
                continue
            out.update(s.show(sess, lm, vals))
            sess.drawn[s.name] = sess.view_key
        out.update({f: gr.update(value=None, visible=False) for f in files})
        return out

    def on_image_again(payload, _key, *rest):
        """After a model pick: the image again with the session's model (the menu's value may
        still be the pick that failed)."""
        return on_image(payload, ctx.session(rest[-1]).model_key, *rest)

    def draw_lazy(sess: Session, section: Section | None) -> dict:
        """The open tab's slower pictures, once per analysis."""
        if section is None or not sess.ready or sess.rendered.get(section.name) == sess.view_key:
            return {}
        out = section.lazy(sess)
        if out:
            sess.rendered[section.name] = sess.view_key
        return out

    @friendly
    def on_lazy(sess):
        sess = ctx.session(sess)
        return draw_lazy(sess, by_name.get(sess.open_tab)) or gr.skip()

    def tab_handler(section: Section):
        @friendly
        def on_tab(sess, *args):
            sess = ctx.session(sess)
            sess.open_tab = section.name
            out = {state: sess}
            if sess.ready and sess.drawn.get(section.name) != sess.view_key:  # closed at the upload
                out.update(section.show(sess, ctx.model(sess), values(section.show_inputs, args)))
                sess.drawn[section.name] = sess.view_key
            return {**out, **draw_lazy(sess, section)}

        return on_tab

    def chain(dep: Any) -> Any:
        for s in sections:
            dep = s.follow_up(dep, ctx)
        return dep.then(on_lazy, [state], lazy_outputs, api_visibility="private", show_progress="minimal")

    def reanalyze(step) -> Any:
        return chain(step(on_image_again, inputs, outputs, api_visibility="private", preprocess=False, **ctx.heavy))

    ctx.reanalyze = reanalyze
    chain(ctx.image.change(on_image, inputs, outputs, api_name="analyze", trigger_mode="always_last",
                           preprocess=False, **ctx.heavy))
    for s in sections:
        if s.gr_tab is not None:
            s.gr_tab.select(tab_handler(s), [state, *s.show_inputs],
                         union([[state], s.views, s.controls, s.lazy_outputs]), api_visibility="private",
                         show_progress="minimal", preprocess=False)
