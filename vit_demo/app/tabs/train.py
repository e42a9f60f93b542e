"""The "Train" tab: train a small ViT from scratch in the page and watch it learn. A built-in set
(the handwritten digits, the shapes) or a zip of class folders, a budget of minutes, a Train and a
Cancel button; while it trains, the loss and accuracy every epoch with the ETA, and every few
epochs what the model sees on one validation picture per class (the rollout and the last layer's
mean attention, each layer's mean attention distance), the snapshots side by side. At the end: the
validation accuracy beside logistic regression on the pixels, the model on this session's model
menu (every other tab explains it), the checkpoint and the snapshots as GIF and MP4.

``/train`` is the same run for scripts (``dataset``, ``minutes``, ``zip`` -> ``train --json``'s
summary and the files). The work and its rules (one training on the server, the limits, nothing
left behind) are :mod:`vit_demo.app.trainer`'s; this module lays out and wires.
"""

from __future__ import annotations

import time
from typing import Any

import gradio as gr

from ..common import friendly, png
from ..context import Context, Section
from ..jobs import LongAction
from ..server.lanes import time_limited
from ..session import Session
from ..trainer import (
    DATASETS,
    KEEP_S,
    MIN_MINUTES,
    TRAIN_OFF,
    Progress,
    Trained,
    dataset_choices,
    forget,
    get_ready,
    run_to_end,
    time_limit_s,
    train_steps,
)

CURVES_S = 2.0  # the live curves are drawn again at most this often (seconds)
STOPPED = "Stopped: the run and its files are gone, and nothing joined the model menu."
OPEN_IN = "attention"  # the tab "Explain it" opens (by name: a tab does not import another)
INTRO = ("Train a small Vision Transformer **from scratch, here, on this computer's CPU** and watch it learn: the loss "
         "and the accuracy every epoch, and every few epochs **what it looks at** on one validation picture per class. "
         "Untrained, its attention is spread evenly over the picture; as it learns, it gathers on the digit or the "
         "shape. At the end it joins the **model menu** above (for this session), so every other tab explains it.")


def result_text(run: Trained) -> str:
    """The end of a run in words: its accuracy beside the pixel baseline's, the time, the menu."""
    s = run.summary
    best, base = s.get("best_val_accuracy"), s.get("baseline_accuracy")
    lines = [f"**Best validation accuracy {best:.1%}** (epoch {s['best_epoch']} of {s['epochs']}, on {s['val_images']} "
             f"pictures) · logistic regression on the raw pixels, same split: **{base:.1%}** · "
             f"{s['seconds']:.0f} s of a {s['budget_seconds']:.0f}-s budget" if best is not None and base is not None
             else f"Trained for {s['epochs']} epochs in {s['seconds']:.0f} s (no validation pictures)"]
    if s.get("fit_note"):
        lines.append(s["fit_note"])
    lines.append(f"The model is on the **model menu** above as *{s['data']} · trained here*; "
                 "**Explain this model** opens a validation picture with it in the Attention tab.")
    lines += [f"*{n}*" for n in s.get("notes", [])[:3]]
    return "\n\n".join(lines)


class TrainTab(Section):
    name, title = "train", "Train"

    def layout(self, ctx: Context) -> None:
        top = ctx.cfg.limits.train_minutes
        self.runs = gr.State([], time_to_live=KEEP_S, delete_callback=lambda runs: forget(ctx.reg, runs))
        self.on = top > 0
        if not self.on:
            gr.Markdown(f"**{TRAIN_OFF}**", elem_id="train-off")
        else:
            self.controls_layout(top)
            self.live_layout()
        self.api_layout()

    def controls_layout(self, top: float) -> None:
        gr.Markdown(INTRO, elem_classes="caption")
        with gr.Row(equal_height=True):
            self.dataset = gr.Radio(dataset_choices(), value="digits", label="Data", elem_id="train-data", scale=3)
            self.zip = gr.File(label="A zip: one folder of pictures per class", file_types=[".zip"], type="filepath",
                               visible=False, height=110, elem_id="train-zip", scale=2)
            short = top <= 1  # a host's cap of a minute or less: the slider goes down to MIN_MINUTES
            self.minutes = gr.Slider(MIN_MINUTES if short else 1.0, top, value=min(2.0, top), step=0.05 if short else 0.5,
                                     label="Time budget (minutes)", elem_id="train-minutes", scale=2)
        self.action = LongAction("▶ Train", "train-run", variant="primary", waiting="waiting for the training's turn",
                                 min_width=200, seconds=time_limit_s(top) + 60, room=False)
        self.action.layout()
        self.status = gr.Markdown(elem_id="train-status")

    def live_layout(self) -> None:
        with gr.Column(visible=False, elem_id="train-board") as self.board:  # shown when a run starts
            self.board_layout()
        self.result = gr.Markdown(elem_id="train-result")
        self.explain = gr.Button("Explain this model in the other tabs", visible=False, elem_id="train-explain",
                                 variant="primary")
        self.downloads = gr.File(label="The checkpoint, the snapshots as GIF and MP4, the filmstrip", visible=False,
                                 file_count="multiple", elem_id="train-files")

    def board_layout(self) -> None:
        """What a run shows as it goes: the curves, the filmstrip and the frames."""
        self.curves = gr.Image(show_label=False, interactive=False, format="png", elem_id="train-curves", height=300,
                               buttons=["download", "fullscreen"])
        gr.Markdown("**Where it looks**: the rollout on one validation picture per class (a row each), every few "
                    "epochs (a column each), on one colour scale: dim and even is attention spread over the whole "
                    "picture, bright is where it gathers.", elem_classes="caption")
        self.strip = gr.Image(show_label=False, interactive=False, format="png", elem_id="train-filmstrip",
                              buttons=["download", "fullscreen"])
        self.frames = gr.Gallery(label="Each snapshot (the newest shown; the others below it): rollout, the last "
                                       "layer's heads, each layer's mean attention distance", columns=6, height=640,
                                 preview=True, object_fit="contain", elem_id="train-snapshots", buttons=["fullscreen"])

    def api_layout(self) -> None:
        """``/train``'s components (hidden): its parameters, and what it returns."""
        self.api_dataset = gr.Dropdown(list(DATASETS), value="digits", label="dataset", visible=False)
        self.api_minutes = gr.Number(2, label="minutes", visible=False)
        self.api_zip = gr.File(file_types=[".zip"], type="filepath", label="zip", visible=False)  # (the door names them)
        self.api_summary = gr.JSON(visible=False)
        self.api_files = gr.File(file_count="multiple", visible=False)

    # ------------------------------------------------------------------------- events

    def live(self, prog: Progress, shown: list[Any]) -> dict:
        """The page's update for a run's progress: the findings line; the curves when an epoch ended (at
        most every :data:`CURVES_S`: matplotlib draws them in this process); the filmstrip and the
        frames when a snapshot came; the board of them shown with the first, the curves with theirs (no
        empty panels before)."""
        out: dict = {self.status: prog.status()}
        epochs, frames, drawn_at, _ = shown
        if len(prog.history) > epochs and time.monotonic() - drawn_at > CURVES_S and (img := prog.curves()) is not None:
            out[self.curves] = gr.update(value=png(img), visible=True)
            shown[0], shown[2] = len(prog.history), time.monotonic()
        if len(prog.frames) > frames and (strip := prog.strip()) is not None:
            shown[1] = len(prog.frames)
            out.update({self.strip: png(strip), self.frames: gr.update(value=list(prog.frames),
                                                                          selected_index=len(prog.frames) - 1)})
        if (self.curves in out or self.strip in out) and not shown[3]:
            out[self.board], shown[3] = gr.update(visible=True), True
        return out

    def wire(self, ctx: Context) -> None:
        self.wire_api(ctx)
        if not self.on:
            return

        def on_train(dataset, minutes, zip_file, runs, sess):
            sess = ctx.session(sess)
            steps = train_steps(ctx, dataset, minutes, zip_file if dataset == "zip" else None)
            shown: list[Any] = [0, 0, 0.0, False]  # epochs drawn, frames shown, when the curves were drawn, board shown
            prog = None
            yield {self.result: "", self.explain: gr.update(visible=False), self.downloads: gr.update(visible=False),
                   self.curves: gr.update(value=None, visible=False), self.strip: None, self.frames: None,
                   self.board: gr.update(visible=False), self.status: ""}
            while True:
                try:
                    prog = next(steps)
                except StopIteration as stop:
                    run = stop.value
                    break
                yield self.live(prog, shown)
            curves = prog.curves() if prog is not None else None
            return {**self.finished(ctx, run, runs, sess), self.board: gr.update(visible=True),
                    self.curves: gr.update(value=png(curves) if curves is not None else None, visible=curves is not None)}

        def on_dataset(dataset):
            return gr.update(visible=dataset == "zip")

        def on_explain(runs, sess):
            """The model picked (menu, session) and the Attention tab opened; the picture follows
            (:func:`picture`): set in one update, the picture's analysis read the menu's old value."""
            if not runs:
                return gr.skip()
            run, sess = runs[-1], ctx.session(sess)
            sess.open_tab, sess.model_key = OPEN_IN, run.key
            return {ctx.state: sess, ctx.model_dd: gr.update(choices=ctx.reg.choices(sess.extra_models), value=run.key),
                    ctx.tabs: gr.Tabs(selected=OPEN_IN)}

        def picture(runs):
            return runs[-1].pictures[0] if runs else gr.skip()

        outputs = [self.board, self.status, self.curves, self.strip, self.frames, self.result, self.explain, self.downloads,
                   self.runs, ctx.state, ctx.model_dd]
        self.action.wire(ctx, on_train, [self.dataset, self.minutes, self.zip, self.runs, ctx.state], outputs,
                         lane=ctx.training)
        # after a Cancel, no epoch count or accuracy of the stopped run stays on screen under "Stopped.",
        # nor its board (the last snapshot's "epoch 2 of 6", the curves of a run whose files are gone)
        self.action.stopped.then(lambda: (STOPPED, gr.update(visible=False)), None, [self.status, self.board],
                                 api_visibility="private", queue=False, show_progress="hidden")
        self.gr_tab.select(get_ready, None, None, api_visibility="private", queue=False, show_progress="hidden")
        self.dataset.change(on_dataset, [self.dataset], [self.zip], api_visibility="private", queue=False,
                            show_progress="hidden")
        self.explain.click(friendly(on_explain), [self.runs, ctx.state], [ctx.state, ctx.model_dd, ctx.tabs],
                           api_visibility="private", show_progress="hidden").then(
            picture, [self.runs], [ctx.image], api_visibility="private", show_progress="hidden")

    def finished(self, ctx: Context, run: Trained, runs: Any, sess: Session) -> dict:
        """The page at the end of a run: the result, the files, the model on the menu."""
        if run.key not in sess.extra_models:
            sess.extra_models.append(run.key)
        return {self.result: result_text(run), self.explain: gr.update(visible=True),
                self.downloads: gr.update(value=[run.checkpoint, run.gif, run.mp4, run.filmstrip], visible=True),
                self.runs: [*(runs or []), run], ctx.state: sess,
                ctx.model_dd: gr.update(choices=ctx.reg.choices(sess.extra_models)),
                self.status: f"Done: **{run.summary['epochs']} epochs** in {run.summary['seconds']:.0f} s."}

    def wire_api(self, ctx: Context) -> None:
        """``/train``: one run to its end, without a page."""
        limit = time_limit_s(max(ctx.cfg.limits.train_minutes, 0.05)) + 60

        @friendly
        def train(dataset: str = "digits", minutes: float = 2, zip: str | None = None, runs: Any = None):  # noqa: A002
            """Train a small ViT from scratch on `dataset` ("digits", "shapes" or "zip": then `zip` is a zip of class
            folders) for `minutes`; returns the summary `train --json` gives (with the snapshots) and the files: the
            checkpoint, the snapshots as GIF and MP4, the filmstrip and every frame."""
            run = run_to_end(train_steps(ctx, dataset, minutes, zip))
            return {self.api_summary: run.summary, self.api_files: run.files, self.runs: [*(runs or []), run]}

        gr.Button(visible=False).click(time_limited(train, limit), [self.api_dataset, self.api_minutes, self.api_zip,
                                                                     self.runs],
                                       [self.api_summary, self.api_files, self.runs], api_name="train",
                                       **ctx.training)
