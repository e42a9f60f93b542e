"""Attention in motion, in the app: a button that renders the current image's maps through the
layers (:mod:`vit_demo.present.animate`), the GIF playing in the page, and the GIF and an H.264 MP4 to
download, with a progress bar ("GIF · frame 12 of 45") and a cancel button while it is made. The
Attention tab animates the raw attention, the Rollout & relevance tab the rollout and the
relevance; each lays out an :class:`AnimationRow` and wires it with what to animate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from ..analysis import Analysis
from ..checkpoints.load import LoadedModel
from ..present import animate
from ..progress import part
from .context import Context
from .exports import export_dir, slug, within_budget
from .jobs import LongAction

ANIMATE = "▶ Animate through the layers (GIF + MP4)"


def present_dir() -> Path:
    """A new folder for one animation or deck (inside the export folder, within its budget)."""
    return export_dir()


def animation_files(a: Analysis, lm: LoadedModel, name: str, clips: Sequence[str], head: int | None = None,
                    target: int | None = None, cmap: str = "inferno", alpha: float = 0.6) -> tuple[Path, Path]:
    """The GIF (960 px) and the MP4 (1280 px) of ``clips`` for the analysed image."""
    with part(0.0, 0.1, "maps through the layers"):
        made, info = animate.layer_clips(lm.model, a.x, clips, head, target, lm.labels)
    caption = f"{name}  ·  {lm.name}" + (f"  ·  predicted: {a.labels[a.top1]} ({float(a.probs[a.top1]) * 100:.1f}%)"
                                         if a.logits.numel() else "")
    stem = present_dir() / slug(f"{Path(name).stem}-{'-'.join(clips)}-{a.key[:8]}")
    with part(0.1, 0.4, "GIF"):
        anim = animate.render(a.picture, made, caption, cmap, alpha, animate.DEFAULT_WIDTH["gif"])
    with part(0.4, 0.5, "writing the GIF"):
        gif = animate.write_gif(anim, stem.with_suffix(".gif"))
    with part(0.5, 0.85, "MP4"):
        anim = animate.render(a.picture, made, caption, cmap, alpha, animate.DEFAULT_WIDTH["mp4"])
    with part(0.85, 1.0, "writing the MP4"):
        mp4 = animate.write_mp4(anim, stem.with_suffix(".mp4"))
    within_budget()
    return gif, mp4


class AnimationRow:
    """The button (with its progress bar and cancel button), the GIF in the page and the two files,
    hidden until the button is used (the tab puts :attr:`outputs` in its ``files``, which every
    new analysis hides)."""

    def layout(self, prefix: str) -> None:
        self.action = LongAction(ANIMATE, f"{prefix}-animate", size="sm", min_width=300)
        self.action.layout()
        self.btn = self.action.btn
        self.gif = gr.Image(visible=False, show_label=False, interactive=False, elem_id=f"{prefix}-animation",
                            buttons=["fullscreen"])
        self.files = gr.File(visible=False, show_label=False, file_count="multiple",
                             elem_id=f"{prefix}-animation-files")

    def wire(self, ctx: Context, inputs: list[Any], make: Callable[..., tuple[Path, Path]]) -> None:
        """On a click: ``make(session, model, *values of inputs)`` -> (GIF, MP4)."""

        def on_animate(*args):
            *rest, sess = args
            sess = ctx.session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            gif, mp4 = make(sess, ctx.model(sess), *rest)
            return {self.gif: gr.update(value=str(gif), visible=True),
                    self.files: gr.update(value=[str(gif), str(mp4)], visible=True)}

        self.action.wire(ctx, on_animate, [*inputs, ctx.state], [self.gif, self.files])

    @property
    def outputs(self) -> list[Any]:
        """What the owning tab lists in its ``files``: hidden again for every new analysis."""
        return [self.gif, self.files]
