"""The app's page, assembled from its sections: :func:`build` lays out the model picker, the input
and predictions, the display controls and the tabs, then lets the upload flow and each section
wire its events. Nothing is computed or drawn here."""

from __future__ import annotations

import threading
from typing import NamedTuple

import gradio as gr
from gradio.utils import get_upload_folder

from ..budget import release_free_heap
from . import flow, tools
from .context import AppConfig, Context, Section
from .examples import all_examples
from .page import INTRO, launch_kwargs, wire_presentation_mode
from .registry import Downloads, ModelRegistry
from .sections.display import DisplayControls
from .sections.inputs import InputSection
from .sections.models import ModelPicker
from .server.guard import FileGuard, JoinGuard
from .server.lanes import MODEL, SLOW, TRAIN, WAITS, WAITS_AT_ONCE, SessionDoor, guard_queue, limit_slow_jobs
from .server.lean import GradioSessions, lean_sessions
from .server.middleware import CallerCap
from .server.settings import ServerSettings
from .server.spool import spool_uploads
from .server.streams import LiveStreams, stream_rules
from .server.workspace import workspace
from .session import SessionBudget
from .tabs.atlas import AtlasTab
from .tabs.attention import AttentionTab
from .tabs.compare import CompareTab
from .tabs.diagnostics import DiagnosticsTab
from .tabs.folder import FolderTab
from .tabs.inside import InsideTab
from .tabs.live import LiveTab
from .tabs.patches import PatchesTab
from .tabs.present import PresentTab
from .tabs.relevance import RelevanceTab
from .tabs.train import TrainTab

TABS: tuple[type[Section], ...] = (PatchesTab, InsideTab, AttentionTab, RelevanceTab, DiagnosticsTab, CompareTab,
                                   PresentTab, LiveTab, FolderTab, AtlasTab, TrainTab)
"""The tabs, in page order: adding a tab is its module under ``tabs/`` and one entry here."""

__all__ = ["App", "AppConfig", "build", "launch_kwargs"]


class App(NamedTuple):
    """What :func:`build` makes: the page, the shared models, and the settings its server is launched with."""

    demo: gr.Blocks
    reg: ModelRegistry
    server: ServerSettings  # launch_kwargs(server) and app.py's warm-up read it


def model_registry(cfg: AppConfig) -> ModelRegistry:
    """The models the app offers, within its limits (loaded lazily)."""
    lim = cfg.limits
    return ModelRegistry(cfg.weights, cfg.model, device=cfg.device, allow_paths=not cfg.exposed,
                         allow_uploads=lim.allow_checkpoint_upload, models_bytes=lim.models_bytes,
                         cache_bytes=lim.cache_bytes, hub=lim.downloads, precision=cfg.precision,
                         downloads=Downloads(lim.downloads_bytes) if lim.downloads_bytes is not None else None)


def build(cfg: AppConfig) -> App:
    """The app's Blocks, its model registry and its server's settings (models load lazily;
    nothing touches the network)."""
    lim = cfg.limits
    reg = model_registry(cfg)
    examples = all_examples(cfg.examples)
    lean_sessions()  # Gradio's sessions keep no copy of the page (vit_demo.app.server.lean)
    spool_uploads()  # an upload in progress holds no open file; a cut one leaves none (vit_demo.app.server.spool)
    workspace().exports_budget = lim.exports_bytes
    ctx = Context(cfg, reg, reg.default_key(), examples,
                  heavy={"concurrency_id": MODEL, "concurrency_limit": cfg.concurrency},
                  # waiting for maps the background threads make, then drawing them: not a model slot
                  waits={"concurrency_id": WAITS, "concurrency_limit": WAITS_AT_ONCE},
                  slow={"concurrency_id": SLOW, "concurrency_limit": lim.slow_concurrency},
                  # one training runs at a time (the trainer's lock); the second place answers a second one at once
                  training={"concurrency_id": TRAIN, "concurrency_limit": 2},
                  sessions=SessionBudget(lim.sessions_bytes, lim.session_minutes * 60),
                  files=FileGuard([get_upload_folder()], [e.path for e in examples]),
                  streams=LiveStreams(stream_rules(lim.exposed)))
    picker, inputs, display = ModelPicker(), InputSection(), DisplayControls()
    tabs: list[Section] = [tab() for tab in TABS]
    ctx.sections = [inputs, *tabs]  # the order of /analyze's outputs

    with gr.Blocks(title="vit_demo · how a Vision Transformer sees", analytics_enabled=False,
                   delete_cache=(1800, 3600)) as demo:
        ctx.demo = demo
        ctx.state = gr.State(None, time_to_live=max(3600, 2 * 60 * lim.session_minutes))
        with gr.Column(elem_id="page"):  # presentation mode lays these out in two columns (page.CSS)
            with gr.Row(elem_id="title-row", equal_height=True):
                gr.Markdown(INTRO, elem_id="title", scale=5)
                present_mode = gr.Checkbox(False, label="Presentation mode", elem_id="present-mode", scale=1,
                                           min_width=190, container=False,
                                           info="for a projector: the image, the prediction and the map on one screen")
            for part in (picker, inputs, display):
                part.layout(ctx)
            with gr.Tabs(elem_id="tabs", overflow_behavior="wrap") as ctx.tabs:  # a phone shows every tab, in two rows
                for tab in tabs:
                    with gr.Tab(tab.title, id=tab.name) as tab.gr_tab:
                        tab.layout(ctx)
        wire_presentation_mode(demo, present_mode)
        flow.wire(ctx)
        for part in (picker, display, *ctx.sections):
            part.wire(ctx)
        if cfg.mcp:
            tools.wire(ctx)

    # Every queued event, API calls included, waits in one queue of at most max_queue requests;
    # api_open=False closes the REST routes (/gradio_api/run/NAME) that would skip it. The door
    # (vit_demo.app.server.lanes) checks every request's values and files before it joins, keeps each
    # client to one job in the slow lane and caps its share of the queue.
    demo.queue(max_size=cfg.max_queue, default_concurrency_limit=4, api_open=False)
    calls = tools.caller_cap(lim) if cfg.mcp else None  # (the tools' events: the same cap through the queue)
    sessions = SessionDoor(GradioSessions(demo), lim.exposed)  # new sessions: counted by the queue's door and the gate
    guard_queue(demo, lim.per_client_queue, lim.per_host_queue, join_guard(demo, ctx.files, lim.max_upload_bytes),
                lim.exposed, calls, tools.EVENTS if cfg.mcp else (), sessions)
    limit_slow_jobs(demo, lim.job_seconds, reg.slow_job_room)
    sweep_sessions(ctx.sessions, lim.session_minutes * 60)
    return App(demo, reg, server_settings(cfg, ctx, calls, sessions))


def server_settings(cfg: AppConfig, ctx: Context, calls: CallerCap | None = None,
                    sessions: SessionDoor | None = None) -> ServerSettings:
    """The limits, and what only the page knows: the example photos (launch() serves exactly
    these files), the MCP server (``--mcp``, its callers' cap ``calls``), the count of new
    sessions the gate shares with the queue's door, and the sections' warm-up (app.py's thread,
    after the model)."""

    def warm_up() -> None:
        for s in ctx.sections:
            s.warm_up(ctx)

    return ServerSettings(cfg.limits, example_paths=[str(e.path) for e in ctx.examples],
                          mcp_lifespan=tools.mcp_lifespan(ctx.demo, cfg.limits, calls) if cfg.mcp else None,
                          mcp_calls=calls, sessions=sessions, warm_up=warm_up, streams=ctx.streams)


def join_guard(demo: gr.Blocks, files: FileGuard, max_upload_bytes: int = 25 << 20) -> JoinGuard:
    """The checks of a request's values, for this page's components: which take files (one or
    several), which text, which numbers (a slider needs one), which a camera's frames (a data URL
    of at most an upload's size)."""
    blocks = demo.blocks.values()
    frame_ids = [b._id for b in blocks if isinstance(b, gr.Image) and b.streaming]
    file_ids = [b._id for b in blocks if isinstance(b, (gr.Image, gr.File, gr.Gallery, gr.Video, gr.Audio))
                and b._id not in frame_ids]
    text_ids = [b._id for b in blocks if isinstance(b, gr.Textbox)]
    state_ids = [b._id for b in blocks if isinstance(b, gr.State)]
    number_ids = [b._id for b in blocks if isinstance(b, gr.Number)]
    slider_ids = [b._id for b in blocks if isinstance(b, gr.Slider)]
    one_file_ids = [b._id for b in blocks if (isinstance(b, (gr.Image, gr.Video, gr.Audio)) and b._id not in frame_ids)
                    or (isinstance(b, gr.File) and b.file_count == "single")]
    labels = {b._id: str(b.label) for b in blocks if isinstance(getattr(b, "label", None), str) and b.label}
    return JoinGuard(files, file_ids, text_ids, state_ids, number_ids, slider_ids, one_file_ids, labels,
                     frame_ids, max_upload_bytes * 4 // 3 + 64)


def sweep_sessions(sessions: SessionBudget, idle_s: float) -> None:
    """Forget idle sessions' pictures even when no request comes, and give the C heap's free
    pages back to the OS (a daemon thread)."""
    def run() -> None:
        while True:
            stop.wait(max(1.0, min(60.0, idle_s / 4)))
            sessions.sweep()
            release_free_heap()

    stop = threading.Event()
    threading.Thread(target=run, daemon=True, name="session-sweeper").start()
