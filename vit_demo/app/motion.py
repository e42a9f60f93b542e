"""Attention in motion, in the app: a button that renders the current image's maps through the
layers (:mod:`vit_demo.present.animate`), the GIF playing in the page, and the GIF and an H.264 MP4 to
download. The Attention tab animates the raw attention, the Rollout & relevance tab the rollout
and the relevance; each lays out an :class:`AnimationRow` and wires it with what to animate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from ..analysis import Analysis
from ..checkpoints.load import LoadedModel
from ..present import animate
from .common import friendly
from .context import Context
from .exports import export_dir, slug, within_budget
from .session import Session

ANIMATE = "▶ Animate through the layers (GIF + MP4)"


def present_dir() -> Path:
    """A new folder for one animation or deck (inside the export folder, within its budget)."""
    return export_dir()


def animation_files(a: Analysis, lm: LoadedModel, name: str, clips: Sequence[str], head: int | None = None,
                    target: int | None = None, cmap: str = "inferno", alpha: float = 0.6) -> tuple[Path, Path]:
    """The GIF (960 px) and the MP4 (1280 px) of ``clips`` for the analysed image."""
    made, info = animate.layer_clips(lm.model, a.x, clips, head, target, lm.labels)
    caption = f"{name}  ·  {lm.name}" + (f"  ·  predicted: {a.labels[a.top1]} ({float(a.probs[a.top1]) * 100:.1f}%)"
                                         if a.logits.numel() else "")
    stem = present_dir() / slug(f"{Path(name).stem}-{'-'.join(clips)}-{a.key[:8]}")
    gif = animate.write_gif(animate.render(a.picture, made, caption, cmap, alpha, animate.DEFAULT_WIDTH["gif"]),
                            stem.with_suffix(".gif"))
    mp4 = animate.write_mp4(animate.render(a.picture, made, caption, cmap, alpha, animate.DEFAULT_WIDTH["mp4"]),
                            stem.with_suffix(".mp4"))
    within_budget()
    return gif, mp4


class AnimationRow:
    """The button, the GIF in the page and the two files, hidden until the button is used (the
    tab puts :attr:`outputs` in its ``files``, which every new analysis hides)."""

    def layout(self, prefix: str) -> None:
        with gr.Row(elem_classes="export-row"):
            self.btn = gr.Button(ANIMATE, size="sm", scale=0, min_width=300, elem_id=f"{prefix}-animate")
        self.gif = gr.Image(visible=False, show_label=False, interactive=False, elem_id=f"{prefix}-animation",
                            buttons=["fullscreen"])
        self.files = gr.File(visible=False, show_label=False, file_count="multiple",
                             elem_id=f"{prefix}-animation-files")

    def wire(self, ctx: Context, inputs: list[Any], make: Callable[..., tuple[Path, Path]]) -> None:
        """On a click: ``make(session, model, *values of inputs)`` -> (GIF, MP4)."""

        @friendly
        def on_animate(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            gif, mp4 = make(sess, ctx.model(sess), *rest)
            return {self.gif: gr.update(value=str(gif), visible=True),
                    self.files: gr.update(value=[str(gif), str(mp4)], visible=True)}

        self.btn.click(on_animate, [*inputs, ctx.state], [self.gif, self.files], api_visibility="private",
                       show_progress="minimal", preprocess=False, **ctx.slow)

    @property
    def outputs(self) -> list[Any]:
        """What the owning tab lists in its ``files``: hidden again for every new analysis."""
        return [self.gif, self.files]


def session_name(sess: Session) -> str:
    return sess.upload.name if sess.upload is not None else "image"
