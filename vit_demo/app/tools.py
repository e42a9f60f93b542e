"""The app as tools for agents (``app.py --mcp``): Gradio's MCP server at ``/gradio_api/mcp/``.

Each tool is an event of its own on hidden components, added only with ``--mcp``: ``predict``
(top-k), ``explain`` (a class-specific map as a PNG), ``attention`` (a layer and head's map, or
the rollout), ``verify`` (timm's model on the same picture) and ``steps`` (the picture walked
through the model, step by step: one step's picture and the numbers). Gradio makes a tool of every
named event and reads the tool's description and its parameters' from the function's
docstring; :func:`mcp_lifespan` keeps the tool list to these five (the page's own events, which
read a session's state, are not tools) and decides what a picture given as a URL may do.

They are queued events like the page's: an MCP call reaches the app through Gradio's own client
over HTTP, so it passes the gate, the door of the queue (its values and files checked, the
caps per client), the model lane and the upload limits like any other request, and its work runs
under the slow lane's time limit. Exposed, one caller (address) has at most
:func:`calls_per_caller` calls in progress (one with the default two jobs at a time in the
lane: one caller never holds the whole lane), the next refused at once
(:class:`vit_demo.app.server.middleware.CallerCap`): the tools' "one slow job per client". A picture
comes as a base64 data URL (an http(s) URL on a local app only, fetched within the upload limit
from a public host: never on an exposed app, where a URL is refused before anything is fetched).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import gradio as gr

from .. import methods, viz
from ..inside import STEPS
from ..methods.attention import cls_attention
from ..methods.rollout import rollout as rollout_map
from .common import friendly, open_upload, png
from .context import Context
from .sections.inputs import predictions_json
from .server.fetch import fetch_picture
from .server.guard import InputError, clip, whole
from .server.lanes import time_limited
from .server.limits import Limits
from .server.middleware import LOOPBACK_SECRET, SECRET_HEADER, CallerCap
from .tabs.compare import compare_with_timm
from .tabs.inside import steps_json, walk_request

TOOLS = ("predict", "explain", "attention", "verify", "steps")  # the MCP tools, by function name
EVENTS = tuple(f"tool_{t}" for t in TOOLS)  # their events' api names (the queue takes them by index too)
METHODS = ("chefer", "attnlrp", "lrp", "lrp-gated", "grad-rollout", "gradcam", "integrated-gradients")
URL_REFUSED = ("A picture given as a URL is not fetched by this app (it is open to the public): send the "
               "picture itself as a base64 data URL (data:image/jpeg;base64,...).")
LOOPBACK_TIMEOUT_S = 120.0  # the app's own MCP client: an upload or a join to this app (the queue waits after)
MAP_SIDE = 448  # px: the longer side of a map sent back
ECHO_MAX = 200  # characters of an MCP error about a value (Gradio's repeat the whole value)
STEP_NUMBERS = 1000  # the steps tool's values: those of at most this many numbers (the others are named)


class Tools:
    """The five tools of one app: each a method of its own, whose name, parameters and docstring
    Gradio makes the MCP tool's name, schema and description (keep the text: it is what an agent reads)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def analysis(self, image: Any, model: str | None) -> tuple[Any, Any, Any]:
        """(the upload, the model, the analysis) for a tool's picture; an unknown model is refused
        before the picture is read."""
        key = model or self.ctx.default_key
        self.ctx.reg.spec(key)
        up = open_upload(image, self.ctx.files, self.ctx.cfg.limits)
        return up, self.ctx.reg.get(key), self.ctx.reg.analyze(key, up.picture)

    def predict(self, image: Any, k: float = 5, model: str = "") -> dict:
        """What the Vision Transformer sees in a picture: its top-k ImageNet classes with their probabilities,
        as the command line's `predict --json` gives them. The picture is resized and center-cropped to the
        model's input (224 x 224 px for the default DeiT-Tiny); the answer names the model and any notes about
        the picture (an animated GIF's first frame, for instance).

        Args:
            image: the picture, as a base64 data URL (data:image/jpeg;base64,...); JPEG, PNG, WebP, GIF or BMP.
            k: how many classes to list, 1 to 10 (default 5).
            model: the model to use, as the app's model menu names it; empty for the app's default model.
        """
        k = whole(5 if k is None else k, "k", 1, 10)
        up, _lm, a = self.analysis(image, model)
        classifier(a)
        return {"image": up.name, "model": a.model_name, "topk": predictions_json(a, min(k, a.logits.numel())),
                "notes": up.notes}

    def explain(self, image: Any, method: str = "chefer", class_index: float = -1, model: str = "") -> tuple[str, dict]:
        """Where in the picture the evidence for one class lies: a class-specific relevance map drawn over the
        picture, returned as a PNG image, and which class and method it shows. Bright means the patch raised
        that class's score. The methods: chefer (Chefer et al. 2021, gradient-weighted attention relevance,
        the default), attnlrp and lrp and lrp-gated (layer-wise relevance propagation), grad-rollout, gradcam,
        integrated-gradients.

        Args:
            image: the picture, as a base64 data URL (data:image/jpeg;base64,...).
            method: one of chefer, attnlrp, lrp, lrp-gated, grad-rollout, gradcam, integrated-gradients.
            class_index: the ImageNet class index to explain (0 to 999 for ImageNet models); -1 for the model's top-1 class.
            model: the model to use, as the app's model menu names it; empty for the app's default model.
        """
        try:
            method = methods.find(str(method or "chefer"), METHODS)  # any case: "Chefer" is chefer
        except ValueError:
            raise InputError(f"method must be one of {', '.join(METHODS)}"
                             f"{methods.did_you_mean(clip(str(method), 40), METHODS)}.") from None
        up, lm, a = self.analysis(image, model)
        classifier(a)
        n = a.logits.numel()
        cls = whole(-1 if class_index is None else class_index, "class_index", -1, n - 1)
        cls = a.top1 if cls == -1 else cls
        from ..analysis import class_maps

        heat = class_maps(a, lm, cls, names=[method])[method]
        picture = viz.overlay_image(a.picture, heat, size=MAP_SIDE)
        return png(picture), {"image": up.name, "model": a.model_name, "method": method, "class_index": cls,
                              "class": a.labels[cls] if cls < len(a.labels) else str(cls),
                              "prob": round(float(a.probs[cls]), 4)}

    def attention(self, image: Any, layer: float = 0, head: float = 0, rollout: bool = False,
                  model: str = "") -> tuple[str, dict]:
        """Where the [class] token looks: the attention of the [class] token to every patch of the picture at
        one layer and one head (or the mean of the heads), or attention rollout (the attention carried through
        all layers, Abnar & Zuidema 2020), drawn over the picture and returned as a PNG image. Attention is
        not an explanation of a class: use explain for that.

        Args:
            image: the picture, as a base64 data URL (data:image/jpeg;base64,...).
            layer: the layer, counted from 1 (1 to 12 for DeiT-Tiny); 0 for the last layer. Ignored with rollout.
            head: the head, counted from 1 (1 to 3 for DeiT-Tiny); 0 for the mean of the layer's heads.
            rollout: true for attention rollout through all the layers instead of one layer's map.
            model: the model to use, as the app's model menu names it; empty for the app's default model.
        """
        up, _lm, a = self.analysis(image, model)
        L = whole(0 if layer is None else layer, "layer", 0, a.depth) or a.depth
        h = whole(0 if head is None else head, "head", 0, a.num_heads)
        if rollout:
            heat, what = rollout_map(a.attentions, a.layout)[0], "rollout through all layers"
        else:
            heat = cls_attention(a.attentions, a.layout, L - 1, None if h == 0 else h - 1)[0]
            what = f"layer {L} of {a.depth}, " + (f"head {h} of {a.num_heads}" if h else "mean of the heads")
        picture = viz.overlay_image(a.picture, heat.numpy(), size=MAP_SIDE)
        return png(picture), {"image": up.name, "model": a.model_name, "map": what}

    def verify(self, image: Any, model: str = "") -> dict:
        """Check the from-scratch Vision Transformer against timm's own implementation running the same
        weights on this picture, both in fp32 (like with like, whatever precision the app runs the model in;
        `precision` and `compared` say so): the verdict in one sentence, the largest difference of the logits
        and of every layer's attention, whether the top-5 classes agree, and both models' top-5. Where the app
        runs the model in bf16 and its own top class differs from fp32's (a near-tie), `precision_note` says
        so. Builds timm's model the first time (a few seconds).

        Args:
            image: the picture, as a base64 data URL (data:image/jpeg;base64,...).
            model: the model to use, as the app's model menu names it; empty for the app's default model.
        """
        key = model or self.ctx.default_key
        _up, lm, a = self.analysis(image, model)
        classifier(a)
        c = compare_with_timm(a, lm, self.ctx.reg.timm_twin(key), 5)
        keys = ("verdict", "identical", "precision", "compared", "max_abs_logit_diff", "topk_agree",
                "layer_attn_max_diff", "scratch_topk", "timm_topk", "scratch_probs", "timm_probs", "app_precision",
                "app_topk", "app_probs", "precision_note")
        return {"model": a.model_name, **{k: _plain(c[k]) for k in keys if k in c}}

    def steps(self, image: Any, row: float = -1, col: float = -1, layer: float = 0, head: float = 0,
              temperature: float = 1.0, step: str = "softmax", model: str = "") -> tuple[str, dict]:
        """Walk one patch of a picture through the Vision Transformer, step by step, every number the
        model's own (read off its forward pass): the patch's pixels and their 768 numbers, the projection
        to a token, its position, the query of one head meeting every key (score = q . k / sqrt(d)), the
        softmax, the weighted sum of the values, the MLP, the residual stream, the logit lens and the logits.
        Returns one step's picture as a PNG image, and JSON: every step's title and sentence (with this
        picture's numbers) and the values of at most 1000 numbers each by name (attention, scores, query,
        head_output, residual_norms, mlp_hidden, logits, ...; the larger ones, such as keys and lens, are
        named under left_out with their shapes).

        Args:
            image: the picture, as a base64 data URL (data:image/jpeg;base64,...).
            row: the patch's row, from 0 (0 to 13 for DeiT-Tiny); -1 and col -1: the patch the readout attends to most.
            col: the patch's column, from 0 (0 to 13 for DeiT-Tiny); -1 and row -1: the model's choice.
            layer: the block whose attention to step into, counted from 0 (0 to 11 for DeiT-Tiny); -1 for the last.
            head: the attention head, counted from 0 (0 to 2 for DeiT-Tiny).
            temperature: the softmax temperature, 1 for the model's own attention (0.1 to 10; others are a what-if).
            step: the step whose picture comes back: patches, pixels, projection, position, qkv, scores, softmax, ...
            model: the model to use, as the app's model menu names it; empty for the app's default model.
        """
        if step not in STEPS:
            raise InputError(f"step must be one of {', '.join(STEPS)}.")
        r, c = (None, None) if row in (None, -1) and col in (None, -1) else (row, col)
        up, walk = walk_request(self.ctx, image, r, c, layer, head, temperature, model or None)
        return png(walk.render(step)), steps_json(walk, up.name, STEP_NUMBERS)


def classifier(a: Any) -> None:
    """Refuse a model without a classifier (a tool that needs predictions)."""
    if not a.logits.numel():
        raise InputError(f"{a.model_name} has no classifier: it has no predictions or class maps.")


def make_tools(ctx: Context) -> dict[str, Callable]:
    """The five tool functions for this app, by name (their names and docstrings are the MCP tools')."""
    tools = Tools(ctx)
    return {name: friendly(getattr(tools, name)) for name in TOOLS}


def _plain(v: Any) -> Any:
    """A comparison's value as JSON (numbers, lists of numbers)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def wire(ctx: Context) -> None:
    """The tools' events, on hidden components (call inside the page's Blocks, with ``--mcp``)."""
    fns = make_tools(ctx)
    with gr.Group(visible=False):
        image = gr.Image(type="filepath", label="image")
        k, cls, layer, head, row, col = (gr.Number(v, precision=0, label=n) for v, n in
                                         ((5, "k"), (-1, "class_index"), (0, "layer"), (0, "head"), (-1, "row"),
                                          (-1, "col")))
        temperature = gr.Number(1.0, label="temperature")
        model = gr.Textbox("", label="model")
        method = gr.Dropdown(list(METHODS), value="chefer", label="method")
        step = gr.Dropdown(list(STEPS), value="softmax", label="step")
        rollout = gr.Checkbox(False, label="rollout")
        out_json, out_map = gr.JSON(), gr.Image(type="filepath", format="png")
        button = gr.Button()
    events = {"predict": ([image, k, model], [out_json]), "explain": ([image, method, cls, model], [out_map, out_json]),
              "attention": ([image, layer, head, rollout, model], [out_map, out_json]),
              "verify": ([image, model], [out_json]),
              "steps": ([image, row, col, layer, head, temperature, step, model], [out_map, out_json])}
    seconds = ctx.cfg.limits.job_seconds  # the slow lane's time limit (explain's integrated gradients checks it)
    for name, (inputs, outputs) in events.items():
        button.click(time_limited(fns[name], seconds), inputs, outputs, api_name=EVENTS[TOOLS.index(name)], preprocess=False,
                     **ctx.heavy)


def caller_cap(limits: Limits) -> CallerCap | None:
    """Exposed: the count of each caller's tool calls in progress (at most :func:`calls_per_caller`),
    which the MCP client (:func:`with_secret`) and the gate both read; None on a local app."""
    return CallerCap(calls_per_caller(limits.concurrency)) if limits.exposed else None


def mcp_lifespan(demo: gr.Blocks, limits: Limits, cap: CallerCap | None = None):
    """A FastAPI lifespan that, once Gradio has made its MCP server, keeps its tools to
    :data:`TOOLS` and puts the URL rule (:func:`url_rule`) in front of its conversion of pictures:
    exposed, a picture given as an http(s) URL is refused (an MCP error) before anything is
    fetched; local, it is fetched from a public host within the upload limit
    (:func:`vit_demo.app.server.fetch.fetch_picture`). ``cap``: each caller's calls counted
    (:func:`caller_cap`; the gate reads the same count, :attr:`vit_demo.app.server.settings.ServerSettings.mcp_calls`)."""
    fetch = None if limits.exposed else functools.partial(fetch_picture, max_bytes=limits.max_upload_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        server = demo.mcp_server_obj  # Gradio's, made at launch
        if server is not None:
            server.tool_to_endpoint = {t: e for t, e in server.tool_to_endpoint.items()
                                       if t.removeprefix(server.tool_prefix) in TOOLS}
            server.convert_strings_to_filedata = url_rule(server.convert_strings_to_filedata, fetch)
            server._execute_tool_without_progress = every_output  # Gradio's, fixed
            server._get_or_create_client = with_secret(server._get_or_create_client, cap)
            low = server.mcp_server  # the MCP library's server: every tool error's text goes through it
            low._make_error_result = short_errors(low._make_error_result, hide_urls=limits.exposed)
        yield

    return lifespan


def short_errors(make_error: Callable[[str], Any], hide_urls: bool = True) -> Callable[[str], Any]:
    """The MCP library's error result with its text made :func:`plain_error` (the library's
    "Input validation error" repeats the whole value: a 100 KB ``k`` came back as 100,167 bytes)."""

    def short(message: str) -> Any:
        return make_error(plain_error(message, hide_urls))

    return short


def plain_error(message: Any, hide_urls: bool = True) -> str:
    """An MCP error's text as a caller may read it: (``hide_urls``, an exposed app) no web address
    (Gradio's client's HTTP errors name this app's internal join URL), at most :data:`ECHO_MAX`
    characters."""
    text = not_one_of(str(message))
    if hide_urls and re.search(r"\b[a-z][a-z0-9+.-]*://", text, re.IGNORECASE):
        status = re.search(r"\b([45]\d\d) [A-Z]", text)
        text = (f"The app refused this call{f' (HTTP {status.group(1)})' if status else ''}: one of its values does "
                "not fit its parameter (too long, or not a plain value).")
    return clip(text, ECHO_MAX)


NOT_ONE_OF = re.compile(r"Input validation error: '(?P<value>.*)' is not one of \[(?P<allowed>[^\]]*)\]", re.DOTALL)


def not_one_of(text: str) -> str:
    """The MCP library's refusal of a value outside a parameter's list ("'Chefer' is not one of
    ['chefer', ...]", checked before the tool runs) with the names it may mean first: "did you
    mean 'chefer'?" (a method name in another case, or misspelt), then the allowed ones."""
    m = NOT_ONE_OF.fullmatch(text.strip())
    if m is None:
        return text
    allowed = re.findall(r"'([^']*)'", m["allowed"])
    return (f"Input validation error: {clip(m['value'], 40)!r} is not allowed"
            f"{methods.did_you_mean(clip(m['value'], 40), allowed)}; one of {', '.join(allowed)}.")


def calls_per_caller(concurrency: int) -> int:
    """Tool calls one caller (address) may have in progress on an exposed app: fewer than the
    jobs the model lane runs at once (``--concurrency``), so that another caller always finds one
    free; one at least. (With 2 of 2, a caller that called again and again kept both running,
    and every other caller waited for one of them to end: p50 2.6 s for a predict.)"""
    return max(1, concurrency - 1)


def with_secret(make_client: Callable, cap: CallerCap | None = None) -> Callable:
    """Gradio's MCP client of this app, made once (Gradio made one per call until the first was
    stored: concurrent first calls each fetched the app's config, and timed out on a busy
    machine), its requests marked as the app's own (:data:`vit_demo.app.server.middleware.LOOPBACK_SECRET`:
    the gate charges the picture once, to the MCP caller, and the queue sees the caller's
    address), waiting up to :data:`LOOPBACK_TIMEOUT_S` (httpx's default, 5 s, failed tool calls
    on a busy machine), its calls within ``cap`` when given."""
    lock, made = threading.Lock(), []

    def make() -> Any:
        with lock:
            if not made:
                client = make_client()
                client.headers[SECRET_HEADER] = LOOPBACK_SECRET
                client.httpx_kwargs.setdefault("timeout", LOOPBACK_TIMEOUT_S)
                if cap is not None:
                    client.submit = cap.wrap(client.submit)
                made.append(client)
            return made[0]

    return make


async def every_output(job: Any) -> list[Any]:
    """A finished job's outputs, one per output component (Gradio 6.31 passes a tool's several
    outputs on as one text: the map of explain and attention would not come back as an image),
    the JSON ones as JSON text (not Python's repr). Awaited without a thread: Gradio waited for
    every call in a thread of the pool that also runs the app's handlers (anyio's 40), so that
    calls waiting in the queue took the threads their own work needed."""
    result = await asyncio.wrap_future(job.future)
    outputs = list(result) if isinstance(result, tuple) else [result]
    return [json.dumps(o) if isinstance(o, dict) and "meta" not in o else o for o in outputs]


def url_rule(convert: Callable, fetch: Callable[[str], str] | None) -> Callable:
    """``convert`` (Gradio's strings -> file payloads) with every http(s) picture refused (no
    ``fetch``: an exposed app) or replaced by ``fetch(url)``'s data URL first."""

    def swap(node: Any, path: list, positions: list) -> Any:
        if isinstance(node, dict):
            return {k: swap(v, [*path, k], positions) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v, [*path, i], positions) for i, v in enumerate(node)]
        if isinstance(node, str) and path in positions and node[:8].lower().startswith(("http://", "https://")):
            if fetch is None:
                raise ValueError(URL_REFUSED)
            return fetch(node)
        return node

    def checked(value: Any, positions: list) -> Any:
        try:
            return convert(swap(value, [], positions), positions)
        except ValueError as e:  # Gradio's message repeats the whole value (a path, megabytes of base64)
            raise ValueError(clip(e, ECHO_MAX)) from None

    return checked
