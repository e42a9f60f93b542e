"""The page's look and launch settings: theme (system fonts only), CSS, the introduction, and
the parts of ``launch()`` that keep the app offline."""

from __future__ import annotations

from typing import Any

import gradio as gr

CSS = """
.gradio-container {max-width: 1400px !important; margin: auto;}
#title h1 {margin-bottom: 0.1em;}
#status:empty {display: none;}
#status .prose {font-size: 1.0em;}
.caption {color: var(--body-text-color-subdued); font-size: 0.95em;}
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
.export-row {align-items: center;}
"""

INTRO = """# How a Vision Transformer sees your image
A ViT written from scratch in PyTorch, checked number for number against [timm](https://github.com/huggingface/pytorch-image-models).
Drop in a photo (or click an example): the image is cut into patches, the patches become a sequence of tokens, and
attention decides which tokens each token listens to. Everything below is computed **once per image**; moving a
slider only redraws."""


def theme() -> gr.themes.Theme:
    """System fonts only: nothing is fetched from a font CDN (the app works offline)."""
    return gr.themes.Default(
        primary_hue="indigo",
        neutral_hue="slate",
        font=("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Helvetica", "Arial", "sans-serif"),
        font_mono=("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"),
    )


def launch_kwargs(demo: gr.Blocks | None = None) -> dict[str, Any]:
    """The parts of ``launch()`` that shape the page, keep it offline and put the gate
    (:class:`vit_demo.app.middleware.Gate`) in front of every route. ``show_error=False``: the
    app's own messages (``gr.Error``) are shown; the text of any other exception (a framework's,
    which may hold server paths or repeat a request) stays in the server's log."""
    from .limits import Limits

    limits = getattr(demo, "limits", None) or Limits()
    return dict(theme=theme(), css=CSS, max_file_size=limits.max_file_size, footer_links=["api"], run_history=False,
                mcp_server=False, ssr_mode=False, show_error=False, app_kwargs=app_kwargs(limits),
                state_session_capacity=SESSION_CAPACITY, allowed_paths=list(getattr(demo, "example_paths", [])))


SESSION_CAPACITY = 1000  # sessions whose state Gradio keeps: 220 KB each here (its default, 10000, is 2 GB)


def app_kwargs(limits: Any) -> dict[str, Any]:
    """Gradio's FastAPI app: the gate as its middleware, and request errors that repeat nothing."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.middleware import Middleware

    from .middleware import Gate, UploadBudget

    budget = None
    if limits.upload_budget_bytes is not None:
        budget = UploadBudget(limits.upload_budget_bytes, total=20 * limits.upload_budget_bytes)

    async def invalid(_request: Any, _exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "The request does not fit this route (missing or malformed fields)."},
                            status_code=422)

    return {"middleware": [Middleware(Gate, allowed_hosts=limits.answers_to, budget=budget)],
            "exception_handlers": {RequestValidationError: invalid}}
