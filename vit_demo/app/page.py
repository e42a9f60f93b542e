"""The page's look and launch settings: theme (system fonts only), CSS, the introduction, and
the parts of ``launch()`` that keep the app offline."""

from __future__ import annotations

from typing import Any

import gradio as gr

from .server.limits import Limits
from .server.settings import ServerSettings

CSS = """
.gradio-container {max-width: 1400px !important; margin: auto;}
#page, #page > *, #title {min-width: 0;}
#title h1 {margin-bottom: 0.1em;}
#title-row {align-items: flex-start;}
#present-mode {align-self: center; white-space: nowrap;}
#present-mode .info-text {white-space: normal;}
/* a model menu's long name ends in "…" before the menu's arrow (it ran under it) */
#page input[role=combobox] {text-overflow: ellipsis; padding-right: 26px !important;}
#status:empty {display: none;}
#status .prose {font-size: 1.0em;}
.caption {color: var(--body-text-color-subdued); font-size: 0.95em;}
.caption details {margin-top: 0.3em; font-size: 0.92em;}
.caption summary {cursor: pointer; color: var(--body-text-color-subdued);}
.note {padding: 0.6em 0.9em; border-radius: 8px; margin: 0.2em 0;}
.note.warn {background: #fff4e5; border-left: 5px solid #e67e22;}
.note.info {background: #eaf2fb; border-left: 5px solid #2e86de;}
.verdict {padding: 0.8em 1em; border-radius: 8px; font-size: 1.1em;}
.verdict.ok {background: #e9f7ef; border-left: 6px solid #27ae60;}
.verdict.bad {background: #fdecea; border-left: 6px solid #c0392b;}
.verdict .badge {display: inline-block; padding: 0.1em 0.6em; border-radius: 6px; color: white; font-weight: 700;
                 letter-spacing: 0.05em; margin-right: 0.4em;}
.verdict.ok .badge {background: #27ae60;}
.verdict.bad .badge {background: #c0392b;}
.export-row, .job-row {align-items: center; gap: 8px;}
/* a long action's progress, right under its button */
.job-progress:empty, .job-progress:has(> :empty) {display: none;}
.job-bar {position: relative; height: 1.9em; border-radius: 6px; background: var(--neutral-100, #eef0f4);
          border: 1px solid var(--border-color-primary); overflow: hidden; margin: 2px 0 6px;}
.job-fill {position: absolute; top: 0; bottom: 0; left: 0; background: var(--primary-200, #c7d2fe); transition: width 0.25s;}
.job-text {position: relative; padding: 0 0.7em; line-height: 1.9em; font-size: 0.92em; color: var(--body-text-color);
           font-variant-numeric: tabular-nums; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; display: block;}
/* a gallery of small tiles (elem_classes="tiles"): its columns shrink to fit a phone (Gradio's are at least 100 px) */
.tiles .grid-container {grid-template-columns: repeat(var(--grid-cols), minmax(0, 1fr)) !important;}
/* ... and its first row starts under the gallery's label, which covered the top of it */
.tiles .grid-wrap {padding-top: 2.2em !important;}
/* the Train tab's filmstrip starts under its download and full-screen buttons (they covered its last column) */
#train-filmstrip .image-frame {padding-top: 30px;}
/* toasts at the bottom: at the top they covered the model's description */
.toast-wrap {top: auto !important; bottom: var(--size-4) !important;}

/* presentation mode (the checkbox, or ?present=1 in the address): for a projector at 1280x720,
   the image and the prediction in a narrow column on the left, the open tab (controls and map)
   on the right, both on one screen; the intro, the examples and the export buttons step aside */
body.present-mode .gradio-container {max-width: none !important; padding: 4px 12px !important;}
body.present-mode #page {display: grid !important; grid-template-columns: minmax(270px, 24%) minmax(0, 1fr);
                         column-gap: 16px; row-gap: 6px; align-items: start; grid-auto-flow: row dense;}
body.present-mode #page > * {grid-column: 1; margin: 0 !important;}
body.present-mode #page > #tabs {grid-column: 2; grid-row: 1 / span 12;}
body.present-mode #title p, body.present-mode #model-info, body.present-mode #checkpoint, body.present-mode #examples,
body.present-mode #model-input-col, body.present-mode #no-weights, body.present-mode #input-row .export-row,
body.present-mode #topk-k, body.present-mode footer {display: none !important;}
body.present-mode #title h1 {font-size: 1.05em; margin: 0;}
body.present-mode #title-row {flex-direction: column; gap: 2px;}
body.present-mode #present-mode {align-self: flex-start;}
body.present-mode #input-row, body.present-mode #display {flex-direction: column; gap: 6px; flex-wrap: nowrap;}
body.present-mode #input-row > .column {min-width: 0 !important; width: 100%;}
body.present-mode #upload {height: 150px !important;}
body.present-mode #upload .image-container, body.present-mode #upload .upload-container {height: 150px !important;}
body.present-mode #upload img {max-height: 120px; object-fit: contain;}
body.present-mode #predictions h2 {font-size: 1.3em; padding: 2px 0; margin: 0;}
body.present-mode #predictions {padding: 6px !important;}
body.present-mode #predictions .confidence-set {padding: 1px 0 !important; font-size: 0.9em;}
body.present-mode #display .block {padding: 4px 8px !important;}
body.present-mode #tabs img {max-height: calc(100vh - 250px); object-fit: contain;}
body.present-mode #tabs .block:has(> .image-container), body.present-mode #tabs .image-container {height: auto !important;}
body.present-mode #tabs .caption {font-size: 0.85em;}
/* the Live tab: a small camera and its controls beside the live picture, all on one screen */
#live-camera video, #live-camera img {max-height: 240px; object-fit: contain;}
#live-camera-note-box:has(#live-camera-note[hidden]) {display: none !important;}
body.present-mode #live-intro {display: none !important;}
body.present-mode #live-camera video, body.present-mode #live-camera img {max-height: 170px;}
body.present-mode #live-camera, body.present-mode #live-camera .image-container {height: auto !important;}
body.present-mode #live-controls .block {padding-top: 4px !important; padding-bottom: 4px !important;}
/* the Step inside tab: the steps one under the other, each picture at most its own size; guided mode
   (body.inside-guided, tabs/inside.py) shows one step at a time, large, with Back and Next. (Gradio
   repeats every rule under its container's classes, which outweigh body.x: those carry !important) */
.inside-step {border-top: 1px solid var(--border-color-primary); padding-top: 6px;}
.inside-step .inside-text h3 {margin: 0.2em 0 0.3em;}
.inside-pic img {max-width: 100%; width: auto; height: auto; object-fit: contain;}
.inside-pic, .inside-pic .image-container {height: auto !important;}
#inside-patches img {cursor: crosshair;}
.inside-where {font-size: 1.1em; font-weight: 600; text-align: center; padding: 0.35em 0; white-space: nowrap;}
body.inside-guided #inside-guided .info-text {display: none !important;}
body:not(.inside-guided) #inside-nav {display: none !important;}
body.inside-guided #inside-nav {justify-content: center !important;}
#inside-nav-row {flex-wrap: nowrap !important; align-items: center !important;}
#inside-nav-row > button {flex: 0 0 auto !important; min-width: 5.5em !important; padding: 0.5em 0.6em !important;}
#inside-nav-row > #inside-where-box {flex: 1 1 auto !important; min-width: 0 !important;}
body.inside-guided #inside-intro {display: none !important;}
body.inside-guided .inside-step {border-top: none !important;}
body.inside-guided .inside-text h3 {font-size: 1.6em !important;}
body.inside-guided .inside-text p {font-size: 1.2em !important; line-height: 1.4 !important;}
body.inside-guided .inside-pic img {width: 100% !important; max-height: calc(100vh - 330px) !important;}
body.present-mode.inside-guided #inside-info, body.present-mode.inside-guided .inside-step .export-row {display: none !important;}
body.present-mode.inside-guided #inside-controls .block {padding-top: 2px !important; padding-bottom: 2px !important;}
body.present-mode.inside-guided .inside-text h3 {font-size: 1.35em !important;}
body.present-mode.inside-guided .inside-text p {font-size: 1.05em !important; line-height: 1.3 !important;
                                                margin: 0.2em 0 !important;}
body.present-mode.inside-guided .inside-pic img {max-height: calc(100vh - 340px) !important;}
"""

# Rules for small screens go into the page's <head> as they are: Gradio rewrites the rules of ``css``
# inside @media to match only within the page's content, and these are for the page's frame too.
HEAD = """<style>
/* phones: nothing wider than the screen, every tab reachable (the tabs wrap: build.py) */
@media (max-width: 640px) {
  .gradio-container {padding-left: 6px !important; padding-right: 6px !important;}
  .gradio-container .main.app {padding-left: 2px !important; padding-right: 2px !important; max-width: 100vw;
                               min-width: 0; overflow-x: clip;}
  #title h1 {font-size: 1.45em;}
  #title p {font-size: 0.95em;}
  #present-mode {display: none !important;}
  #page .row > .column, #page .row > .block, #page .row > .form, #page .row .form > .block {min-width: 100% !important;}
  /* the tabs in two rows, not three */
  #tabs button[role=tab] {padding: 4px 3px !important; font-size: 0.74em !important;}
  /* the maps side by side come in two columns (Session.narrow): as tall as they need, as wide as the screen */
  #methods, #relevance, #methods .image-container, #relevance .image-container {height: auto !important;}
  #methods img, #relevance img {width: 100%; height: auto; object-fit: contain;}
}
</style>"""

# On page load: whether the screen is a phone's (HEAD's phone rules start at the same width).
NARROW_JS = "() => window.matchMedia('(max-width: 640px)').matches"
# Runs in the browser when the checkbox changes: the page's layout follows (page.CSS).
PRESENT_JS = "(on) => { document.body.classList.toggle('present-mode', !!on); }"
# On page load: ?present=1 in the address starts in presentation mode (a bookmark for the lecture hall).
PRESENT_FROM_URL_JS = "() => new URLSearchParams(window.location.search).has('present')"

INTRO = """# How a Vision Transformer sees your image
A ViT written from scratch in PyTorch, checked number for number against [timm](https://github.com/huggingface/pytorch-image-models).
Drop in a photo (or click an example): the image is cut into patches, the patches become a sequence of tokens, and
attention decides which tokens each token listens to. Everything below is computed **once per image**; moving a
slider only redraws."""


def wire_presentation_mode(demo: gr.Blocks, toggle: gr.Checkbox) -> None:
    """The presentation-mode checkbox switches the page's layout in the browser (no server call);
    ``?present=1`` in the address turns it on at load."""
    toggle.change(None, [toggle], None, js=PRESENT_JS, api_visibility="private", show_progress="hidden")
    demo.load(None, None, [toggle], js=PRESENT_FROM_URL_JS, api_visibility="private", show_progress="hidden")


def theme() -> gr.themes.Theme:
    """System fonts only: nothing is fetched from a font CDN (the app works offline)."""
    return gr.themes.Default(
        primary_hue="indigo",
        neutral_hue="slate",
        font=("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Helvetica", "Arial", "sans-serif"),
        font_mono=("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"),
    )


def launch_kwargs(server: ServerSettings | None = None) -> dict[str, Any]:
    """The parts of ``launch()`` that shape the page, keep it offline and put the gate
    (:class:`vit_demo.app.server.middleware.Gate`) in front of every route, for the app's
    ``server`` settings (:attr:`vit_demo.app.build.App.server`; None: the defaults).
    ``show_error=False``: the app's own messages (``gr.Error``) are shown; the text of any other
    exception (a framework's, which may hold server paths or repeat a request) stays in the server's log."""
    server = server or ServerSettings()
    limits = server.limits
    kwargs = app_kwargs(limits, server.mcp_calls, server.sessions, server.streams)
    if server.mcp:  # Gradio's MCP server, its tools and the URL rule set once it is made
        kwargs["lifespan"] = server.mcp_lifespan
    return dict(theme=theme(), css=CSS, head=HEAD, max_file_size=limits.max_file_size, footer_links=["api"],
                run_history=False, mcp_server=server.mcp, ssr_mode=False, show_error=False, app_kwargs=kwargs,
                state_session_capacity=SESSION_CAPACITY, allowed_paths=list(server.example_paths))


OPENAPI_ROUTE = "/gradio_api/openapi.json"  # Gradio's own schema of the API: closed on an exposed app unless --openapi
EXPOSED_CLOSED = ("/monitoring", "/gradio_api/dev/reload")  # every client's event counts; the reload watcher's stream
SESSION_CAPACITY = 1000  # sessions whose state Gradio keeps (their gr.State values; its copy of the page: lean.py)


def app_kwargs(limits: Limits, mcp_calls: Any = None, sessions: Any = None, streams: Any = None) -> dict[str, Any]:
    """Gradio's FastAPI app: the gate as its middleware (inside it the door of the Live tab's
    frames, when ``streams``, and, exposed, the path mask), request errors that repeat nothing, and
    no FastAPI schema (Gradio already leaves out /docs and /redoc; its own /gradio_api/info stays),
    nor, exposed, Gradio's (:data:`OPENAPI_ROUTE`, unless ``--openapi``), its monitoring and its
    reload watcher (:data:`EXPOSED_CLOSED`); ``sessions``: the count of new sessions
    (:class:`vit_demo.app.server.lanes.SessionDoor`)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from gradio.utils import get_upload_folder
    from starlette.middleware import Middleware

    from .server.masking import PathMask
    from .server.middleware import CLOSED_ROUTES, Gate, UploadBudget
    from .server.streams import STREAM_ROUTE, StreamDoor

    budget = None
    if limits.upload_budget_bytes is not None:  # every client keeps one file of the largest size, whatever the total
        budget = UploadBudget(limits.upload_budget_bytes, total=20 * limits.upload_budget_bytes,
                              reserve=limits.max_file_size)
    closed = CLOSED_ROUTES + EXPOSED_CLOSED if limits.exposed else CLOSED_ROUTES
    closed += (OPENAPI_ROUTE,) if limits.exposed and not limits.openapi else ()

    async def invalid(_request: Any, _exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "The request does not fit this route (missing or malformed fields)."},
                            status_code=422)

    mcp_body = limits.max_upload_bytes * 4 // 3 + (64 << 10)  # a picture as a base64 data URL, and the JSON-RPC
    if streams is not None:  # the live frames' route: opened by the gate, kept for live streams by their door
        closed = tuple(c for c in closed if c != STREAM_ROUTE)
    middleware = [Middleware(Gate, allowed_hosts=limits.answers_to, budget=budget, mcp_body=mcp_body,
                             calls=mcp_calls, closed=closed, sessions=sessions)]
    if streams is not None:
        middleware.append(Middleware(StreamDoor, live=streams))
    if limits.exposed:  # inside the gate: no server path, nor Gradio's exact release, in what the app sends
        middleware.append(Middleware(PathMask, folder=get_upload_folder(), release=gr.__version__))
    return {"middleware": middleware,
            "exception_handlers": {RequestValidationError: invalid},
            "openapi_url": None}  # FastAPI's own schema (/openapi.json): routes and models the page never uses
