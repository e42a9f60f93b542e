"""The app's page, assembled from its sections: :func:`build` lays out the model picker, the input
and predictions, the display controls and the tabs, then lets the upload flow and each section
wire its events. Nothing is computed or drawn here."""

from __future__ import annotations

import gradio as gr

from . import flow
from .context import AppConfig, Context, Section
from .examples import all_examples
from .limits import fair_queue
from .page import INTRO, launch_kwargs, wire_presentation_mode
from .registry import ModelRegistry
from .sections.display import DisplayControls
from .sections.inputs import InputSection
from .sections.models import ModelPicker
from .tabs.attention import AttentionTab
from .tabs.compare import CompareTab
from .tabs.diagnostics import DiagnosticsTab
from .tabs.patches import PatchesTab
from .tabs.present import PresentTab
from .tabs.relevance import RelevanceTab

TABS: tuple[type[Section], ...] = (PatchesTab, AttentionTab, RelevanceTab, DiagnosticsTab, CompareTab, PresentTab)
"""The tabs, in page order: adding a tab is its module under ``tabs/`` and one entry here."""

__all__ = ["AppConfig", "build", "launch_kwargs"]


def build(cfg: AppConfig) -> tuple[gr.Blocks, ModelRegistry]:
    """The app's Blocks and its model registry (models load lazily; nothing touches the network)."""
    lim = cfg.limits
    reg = ModelRegistry(cfg.weights, cfg.model, device=cfg.device, allow_paths=not cfg.exposed,
                        allow_uploads=lim.allow_checkpoint_upload, models_bytes=lim.models_bytes,
                        cache_bytes=lim.cache_bytes)
    ctx = Context(cfg, reg, reg.default_key(), all_examples(cfg.examples),
                  heavy={"concurrency_id": "model", "concurrency_limit": cfg.concurrency})
    picker, inputs, display = ModelPicker(), InputSection(), DisplayControls()
    tabs: list[Section] = [tab() for tab in TABS]
    ctx.sections = [inputs, *tabs]  # the order of /analyze's outputs

    with gr.Blocks(title="vit_demo · how a Vision Transformer sees", analytics_enabled=False,
                   delete_cache=(1800, 3600)) as demo:
        ctx.demo = demo
        ctx.state = gr.State(None, time_to_live=6 * 3600)
        with gr.Column(elem_id="page"):  # presentation mode lays these out in two columns (page.CSS)
            with gr.Row(elem_id="title-row", equal_height=True):
                gr.Markdown(INTRO, elem_id="title", scale=5)
                present_mode = gr.Checkbox(False, label="Presentation mode", elem_id="present-mode", scale=1,
                                           min_width=190, container=False,
                                           info="for a projector: the image, the prediction and the map on one screen")
            for part in (picker, inputs, display):
                part.layout(ctx)
            with gr.Tabs(elem_id="tabs", overflow_behavior="wrap"):  # a phone shows every tab, in two rows
                for tab in tabs:
                    with gr.Tab(tab.title, id=tab.name) as tab.gr_tab:
                        tab.layout(ctx)
        wire_presentation_mode(demo, present_mode)
        flow.wire(ctx)
        for part in (picker, display, *ctx.sections):
            part.wire(ctx)

    # Every queued event, API calls included, waits in one queue of at most max_queue requests;
    # api_open=False closes the REST routes (/gradio_api/run/NAME) that would skip it, and
    # fair_queue caps one client's share, so that a flood is turned away while others get in.
    demo.queue(max_size=cfg.max_queue, default_concurrency_limit=4, api_open=False)
    fair_queue(demo, lim.per_client_queue, lim.per_host_queue)
    demo.limits = lim  # launch_kwargs(demo): the upload cap
    demo.example_paths = [str(e.path) for e in ctx.examples]  # launch(allowed_paths=...) serves exactly these files
    return demo, reg
