"""The "Live" tab: a webcam streamed through the model, the chosen map drawn over every frame (rollout
by default; a layer's and a head's raw attention; the amortised LRP map of the top class at the rate
it allows), the top-1 class, its probability and the frames a second shown on the picture, a blend
between the camera and the map, and Freeze, which hands the current frame to the upload above, so
every other tab shows it.

The camera is Gradio's streaming image (``sources=["webcam"], streaming=True``): the page asks the
camera for square frames of :data:`~vit_demo.app.live.FRAME_SIDE` px (what a 224-px model resizes
to) and sends one every :attr:`~vit_demo.app.server.streams.StreamRules.every` seconds; the event
computes the newest one it has (:mod:`vit_demo.app.live`) within the stream rules of
:mod:`vit_demo.app.server.streams` (a frame that waited past half a second is dropped). A frame
arrives by a route that skips the queue's door, so every value of it is checked here, and nothing a
frame carries stops the stream: a bad frame is dropped with a note. A camera the browser refuses,
or does not have, gets one sentence in the tab (:data:`CAMERA_JS`).
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any

import gradio as gr
from gradio.context import LocalContext

from ... import viz
from ...checkpoints.load import LoadedModel
from ...images import ImageError
from ..common import VIEWS_MB, friendly, note
from ..context import Context, Section
from ..live import (
    FRAME_SIDE,
    MAPS,
    ROLLOUT,
    TAIL,
    LiveView,
    frame_bytes,
    frame_file,
    frame_picture,
    look,
    picture_url,
)
from ..registry import ModelError
from ..server.streams import LIVE, LiveStreams
from ..server.workspace import trim, workspace
from ..session import Session

log = logging.getLogger("vit_demo.app")

INTRO = ("**Live**: your camera, through the model, frame after frame. Allow the camera, press **Record**, and hold "
         "something up: the map follows it, the label changes as you turn it. The picture says the top class, its "
         "probability and the frames a second it shows. **Freeze** sends the current frame to the other tabs, to "
         "step inside it.")
CAMERA_NOTE = '<div id="live-camera-note" class="note warn" hidden></div>'
# Gradio's camera button leaves a refused or missing camera as an unhandled promise rejection: one sentence here
AGAIN = "then click the camera box again."
REFUSED = f"The browser refused the camera: allow it for this page (the camera icon in the address bar), {AGAIN}"
MISSING = f"No camera was found: plug one in, or pick another in the browser's settings, {AGAIN}"
BUSY = f"The camera is busy or failed to start (another program may be using it): free it, {AGAIN}"
INSECURE = ("This browser gives a camera only to a page served over https:// or from localhost: open the app at such an "
            "address to use Live.")
CAMERA_WHY = {"NotAllowedError": REFUSED, "SecurityError": REFUSED, "NotFoundError": MISSING,
              "OverconstrainedError": MISSING, "NotReadableError": BUSY, "AbortError": BUSY}
CAMERA_JS = ("""() => {
  const say = (t) => { const e = document.querySelector('#live-camera-note'); if (e) { e.textContent = t; e.hidden = false; } };
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) say(""" + json.dumps(INSECURE) + """);
  if (window.vitDemoCamera) return;
  window.vitDemoCamera = true;
  const why = """ + json.dumps(CAMERA_WHY) + """;
  window.addEventListener('unhandledrejection', (ev) => {
    const name = ev.reason && ev.reason.name;
    if (why[name]) { say(why[name]); ev.preventDefault(); }
  });
  document.addEventListener('click', (ev) => {  // Record / Stop: whether the page streams (read by stopLive)
    if (ev.target.closest && ev.target.closest('#live-camera button.capture-button')) window.vitDemoLive = !window.vitDemoLive;
  }, true);
  document.addEventListener('playing', (ev) => {  // the camera works (after all): the sentence goes
    const e = document.querySelector('#live-camera-note');
    if (e && ev.target.closest && ev.target.closest('#live-camera')) e.hidden = true;
  }, true);
}""")

# Gradio's Record/Stop button toggles the camera's stream; whether it is on is tracked here (after a time limit
# the button says "Record" while the page still streams, and would join the queue again by itself)
STOP = """const cam = document.querySelector('#live-camera'), button = cam && cam.querySelector('button.capture-button');
  const stopLive = () => { if (button && window.vitDemoLive) button.click(); };"""
# the tab left: the stream stops (the camera does not run unseen behind another tab)
LEAVE_JS = """() => { setTimeout(() => {
  """ + STOP + """
  if (cam && cam.offsetParent === null) stopLive();
}, 100); }"""
# a stream ended by its time limit (or stopped): the page's camera stops too; Record starts it again
ENDED_JS = """() => {
  """ + STOP + """
  stopLive();
}"""
# Freeze: the stream stops, and the page says which picture it shows (the end of its data URL)
FREEZE_JS = """(shown, view) => {
  """ + STOP + """
  const im = document.querySelector('#live-view img');
  stopLive();
  return [im && im.src ? im.src.slice(-TAIL) : '', view];
}""".replace("TAIL", str(TAIL))
DEFAULT_BLEND = 0.6
STATE_S = 900  # a stream's state (its last frames) is kept this long after its last frame


def number(value: Any, lo: float, hi: float, default: float) -> float:
    """A control's value from a frame (which skipped the door's checks), within [lo, hi] or ``default``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(v, lo), hi) if v == v else default  # (NaN)


def colormap(name: Any) -> str:
    """The display's colormap from a frame, or inferno when it is none matplotlib knows."""
    try:
        return viz.check_cmap(name) if isinstance(name, str) and len(name) <= 40 else "inferno"
    except ValueError:
        return "inferno"


def map_settings(lm: LoadedModel, kind: Any, layer: Any, head: Any) -> tuple[str, int, int | None]:
    """The map asked for, checked against the model: (kind, layer index from 0, head index or None: the mean)."""
    kind = kind if kind in MAPS else ROLLOUT  # (a model without classes: look() shows the rollout for the class map)
    depth, heads = lm.model.cfg.depth, lm.model.cfg.num_heads
    h = int(number(head, 0, heads, 0))
    return kind, int(number(layer, 1, depth, depth)) - 1, (h - 1 if h else None)


class LiveTab(Section):
    name, title = "live", "Live"

    def layout(self, ctx: Context) -> None:
        self.live: LiveStreams = ctx.streams
        gr.Markdown(INTRO, elem_classes="caption", elem_id="live-intro")
        with gr.Row(equal_height=False, elem_id="live-row"):
            with gr.Column(scale=2, min_width=260, elem_id="live-controls"):
                self.controls_layout()
            with gr.Column(scale=3, min_width=300, elem_id="live-view-col"):
                self.view = gr.Image(label="What the model attends to, live", interactive=False, format="jpeg",
                                     elem_id="live-view", buttons=["fullscreen"], height=520)
                self.note = gr.Markdown(elem_id="live-note")
        self.state = gr.State(None, time_to_live=STATE_S)
        self.controls = [self.layer, self.head]  # re-ranged for the model of each new analysis (show)

    def controls_layout(self) -> None:
        side = {"ideal": FRAME_SIDE}
        self.camera = gr.Image(sources=["webcam"], streaming=True, label="Camera", elem_id="live-camera", height=250,
                               webcam_options=gr.WebcamOptions(mirror=False, constraints={"video": {"width": side,
                                                                                                    "height": side}}))
        gr.HTML(CAMERA_NOTE, elem_id="live-camera-note-box", padding=False)
        self.kind = gr.Dropdown([(label, key) for key, label in MAPS.items()], value=ROLLOUT, label="Map",
                                elem_id="live-map")
        with gr.Row(equal_height=True):
            self.layer = gr.Slider(1, 12, value=12, step=1, label="Layer", elem_id="live-layer", min_width=120,
                                   info="raw attention")
            self.head = gr.Slider(0, 3, value=0, step=1, label="Head", elem_id="live-head", min_width=120,
                                  info="0: their mean")
        with gr.Row(equal_height=True):
            self.blend = gr.Slider(0, 1, value=DEFAULT_BLEND, step=0.05, label="Blend", info="0 camera … 1 map",
                                   elem_id="live-blend", min_width=120, scale=3)
            self.freeze = gr.Button("Freeze", elem_id="live-freeze", min_width=90, scale=1, variant="primary")

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        """The sliders' ends for the session's model (a new analysis may come with another model)."""
        cfg = lm.model.cfg
        return {self.layer: gr.update(maximum=cfg.depth), self.head: gr.update(maximum=cfg.num_heads)}

    # ------------------------------------------------------------------------- events

    def on_frame(self, ctx: Context, frame: Any, kind: Any, layer: Any, head: Any, blend: Any, cmap: Any,
                 view: Any, sess: Any) -> list:
        """One frame: [the picture (or no change), the note, the stream's state]. Never raises: an
        exception would end the stream; a frame that fails is dropped and says why."""
        view = view if isinstance(view, LiveView) else LiveView()
        event_id = LocalContext.event_id.get(None)  # (Gradio's: which stream this is, for its frames' door)
        self.live.running(event_id)
        try:
            url = self.frame_picture(ctx, view, frame, (kind, layer, head, blend, cmap), sess, self.live.age(event_id))
        except (ImageError, ModelError) as e:
            view.dropped += 1
            view.note = note("Frame dropped:", str(e) + ". The stream goes on.")
            url = None
        except Exception as e:  # noqa: BLE001 - the stream goes on; the log has the details
            log.error("a live frame failed:\n%s", "".join(traceback.format_exception(e)))
            view.dropped += 1
            view.note = note("Frame dropped:", "something went wrong with it (the app's log has the details).")
            url = None
        return [{"url": url} if url else gr.skip(), view.note, view]

    def frame_picture(self, ctx: Context, view: LiveView, frame: Any, settings: tuple, sess: Any,
                      waited: float) -> str | None:
        """The picture of one frame as a data URL, or None when it is dropped (late, or sooner
        than the stream's rate)."""
        now = time.monotonic()
        rules = self.live.rules
        if now - view.at < 0.5 / rules.fps:
            return None  # faster than the rate allows (the door lets a small burst in)
        lim = ctx.cfg.limits
        raw = frame_bytes(frame, lim.max_upload_bytes)
        img = frame_picture(raw, lim.max_upload_bytes, lim.max_pixels)
        key = getattr(sess, "model_key", None) if isinstance(sess, Session) else None
        lm = ctx.reg.get(key or ctx.default_key)
        kind, layer, head = map_settings(lm, *settings[:3])
        blend = number(settings[3], 0, 1, DEFAULT_BLEND)
        cmap = colormap(settings[4])
        with self.live.compute(waited + time.monotonic() - now) as turn:
            if not turn:
                view.dropped += 1
                return None
            seen = look(lm, img, kind, layer, head)
        done = time.monotonic()
        url = picture_url(seen, cmap, blend, view.fps(done))
        view.sent(url, raw, done)
        view.note = ""
        return url

    def wire(self, ctx: Context) -> None:
        rules = self.live.rules
        self.camera.stream(lambda *a: self.on_frame(ctx, *a),
                           [self.camera, self.kind, self.layer, self.head, self.blend, ctx.cmap, self.state, ctx.state],
                           [self.view, self.note, self.state], stream_every=rules.every, time_limit=rules.seconds,
                           concurrency_id=LIVE, concurrency_limit=rules.at_once, preprocess=False, postprocess=False,
                           show_progress="hidden", api_visibility="private"
                           ).then(None, None, None, js=ENDED_JS, api_visibility="private", show_progress="hidden")

        @friendly
        def on_freeze(shown, view):
            """The frame whose picture the page shows (it says which: the end of its data URL) to the upload."""
            folder = workspace().views
            path = frame_file(view, folder, shown) if isinstance(view, LiveView) else None
            if path is None:
                return gr.skip(), note("Nothing to freeze yet:", "start the camera (Record) first.", "info")
            trim(folder, VIEWS_MB << 20)  # (the pictures' folder, within its budget as save_view keeps it)
            return path, note("Frozen:", "this frame is now the image above; every other tab shows it.", "info")

        shown = gr.Textbox(visible=False)
        self.freeze.click(on_freeze, [shown, self.state], [ctx.image, self.note], js=FREEZE_JS,
                          api_visibility="private", show_progress="hidden")
        # at load too: a camera refused at once (no prompt) rejects before the tab's select has run its script
        ctx.demo.load(None, None, None, js=CAMERA_JS, api_visibility="private", show_progress="hidden")
        self.gr_tab.select(None, None, None, js=CAMERA_JS, api_visibility="private", show_progress="hidden")
        ctx.tabs.select(None, None, None, js=LEAVE_JS, api_visibility="private", show_progress="hidden")
