"""The Gradio app: layout and event wiring only.

Everything the app computes or draws lives in :mod:`vit_demo.appcore` (plain Python, no
Gradio), which works from a cached :class:`~vit_demo.analysis.Analysis`: the model runs once
per image (and once more per class for the class-specific maps); every slider, head, query,
colormap or opacity change is a cheap re-render.

Per-user data lives in a ``gr.State`` (:class:`~vit_demo.appcore.Session`); the only shared
things are the loaded models and the bounded analysis cache in the
:class:`~vit_demo.appcore.ModelRegistry`.

Named API endpoints (``gradio_client``): ``/predict`` (image, model, k -> JSON top-k),
``/analyze`` (the upload event), ``/attention`` (the explorer's re-render) and ``/compare``.
"""

from __future__ import annotations

import functools
import html
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import gradio as gr  # noqa: E402

from . import appcore as ac  # noqa: E402
from .examples import all_examples  # noqa: E402
from .images import ImageError  # noqa: E402

log = logging.getLogger("vit_demo.app")

MAX_UPLOAD = "1gb"  # checkpoints can be big; images are limited to 64 MiB by vit_demo.images
TIMING = os.environ.get("VIT_DEMO_TIMING", "") not in ("", "0")  # log each handler's time to stderr
CHECKPOINT_TYPES = [".safetensors", ".pth", ".pt", ".bin", ".npz"]
EXPORT = "⬇ PNG for slides (2400 px)"
SEQ_WIDTH = 900

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


@dataclass
class AppConfig:
    """What ``app.py`` passes in from the command line."""

    weights: list[str] = field(default_factory=list)
    model: str | None = None
    examples: list[str] = field(default_factory=list)
    device: str = "cpu"
    exposed: bool = False  # bound to a non-loopback address or shared: no server-side paths from the UI
    max_queue: int = 32
    concurrency: int = 2


def theme() -> gr.themes.Theme:
    """System fonts only: nothing is fetched from a font CDN (the app works offline)."""
    return gr.themes.Default(
        primary_hue="indigo",
        neutral_hue="slate",
        font=("ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Helvetica", "Arial", "sans-serif"),
        font_mono=("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"),
    )


def note(title: str, text: str, kind: str = "warn") -> str:
    """A coloured notice for the status area (the text is escaped: it may hold a file name)."""
    return f'<div class="note {kind}"><b>{html.escape(title)}</b> {html.escape(text)}</div>'


def verdict_html(c: dict) -> str:
    kind, word = ("ok", "PASS") if c["identical"] else ("bad", "FAIL")
    head, _, text = c["verdict"].partition(":")
    return (f'<div class="verdict {kind}"><span class="badge">{word}</span> <b>{html.escape(head)}</b>: '
            f"{html.escape(text.strip())}</div>")


def _friendly(fn):
    """Turn unexpected exceptions into one readable line in the UI (the traceback goes to the log)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (ImageError, ac.ModelError) as e:
            raise gr.Error(str(e), print_exception=False) from e
        except Exception as e:
            log.error("%s failed:\n%s", fn.__name__, traceback.format_exc())
            raise gr.Error(f"Something went wrong ({type(e).__name__}: {str(e)[:300]}). The app is still running; "
                           "try again or pick another image.", print_exception=False) from e
        finally:
            if TIMING:
                print(f"[timing] {fn.__name__}: {1000 * (time.perf_counter() - t0):.0f} ms", file=sys.stderr, flush=True)

    return wrapper


def jpeg(img) -> str:
    """Photos and heat maps go to the browser as JPEG files (2 ms; PIL's PNG takes 100+ ms)."""
    return ac.save_view(img, "jpeg")


def png(img) -> str:
    """Pictures with text and thin lines: PNG, fastest compression."""
    return ac.save_view(img, "png")


def _payload_path(payload: Any) -> tuple[str | None, str | None]:
    """(path on the server, the user's file name) from an image component's raw value."""
    if payload is None:
        return None, None
    if isinstance(payload, str):
        return payload, Path(payload).name
    if isinstance(payload, dict):
        path = payload.get("path")
        return path, payload.get("orig_name") or (Path(path).name if path else None)
    path = getattr(payload, "path", None)
    return path, getattr(payload, "orig_name", None) or (Path(path).name if path else None)


def build(cfg: AppConfig) -> tuple[gr.Blocks, ac.ModelRegistry]:
    """The app's Blocks and its model registry (models load lazily; nothing touches the network)."""
    reg = ac.ModelRegistry(cfg.weights, cfg.model, device=cfg.device, allow_paths=not cfg.exposed)
    default_key = reg.default_key()
    examples = all_examples(cfg.examples)

    with gr.Blocks(title="vit_demo · how a Vision Transformer sees", analytics_enabled=False,
                   delete_cache=(1800, 3600)) as demo:
        state = gr.State(None, time_to_live=6 * 3600)

        gr.Markdown(INTRO, elem_id="title")
        no_weights = gr.Markdown("> " + ac.no_checkpoint_message(), elem_id="no-weights",
                                 visible=not reg.has_checkpoint)
        with gr.Row(equal_height=True):
            model_dd = gr.Dropdown(reg.choices(), value=default_key, label="Model", scale=2, elem_id="model")
            model_md = gr.Markdown("*The model is loading; its description appears here.*", elem_id="model-info")
        with gr.Accordion("Use your own checkpoint", open=False, elem_id="checkpoint"):
            gr.Markdown("A timm `state_dict` (`.safetensors`, `.pth`/`.bin`, `.npz`) or a file saved by "
                        "`python -m vit_demo port`. Files are read as weights only (safetensors, or "
                        "`torch.load(weights_only=True)`): a pickle that would run code is refused.")
            with gr.Row():
                ckpt_path = gr.Textbox(label="Path on this computer", visible=not cfg.exposed, scale=3,
                                       placeholder="weights/deit_small_patch16_224.safetensors")
                ckpt_file = gr.File(label="…or upload (up to 1 GB)", file_types=CHECKPOINT_TYPES, type="filepath",
                                    height=110, scale=2)
                ckpt_arch = gr.Textbox(label="Architecture (timm name), if the file name does not say it",
                                       placeholder="deit_small_patch16_224", scale=2)
            ckpt_btn = gr.Button("Load checkpoint", variant="secondary")
        status = gr.Markdown("", elem_id="status")

        # ---------------------------------------------------------------- 1. input and predictions
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=300):
                image = gr.Image(label="Your image", type="filepath", sources=["upload", "clipboard"], height=340,
                                 elem_id="upload", placeholder="Drop a photo here, or click an example below")
                gallery = gr.Gallery([(str(e.path), e.caption) for e in examples], label="Examples (click one)",
                                     columns=3, rows=2, height=250, allow_preview=False, object_fit="cover",
                                     elem_id="examples", visible=bool(examples), buttons=[])
            with gr.Column(scale=4, min_width=260):
                model_input = gr.Image(label="What the model sees (after preprocessing)", interactive=False,
                                       format="png", height=340, elem_id="model-input", buttons=["fullscreen"])
                input_md = gr.Markdown(elem_classes="caption", elem_id="input-caption")
                with gr.Row(elem_classes="export-row"):
                    input_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                    input_file = gr.File(visible=False, show_label=False, height=60)
            with gr.Column(scale=4, min_width=260):
                topk = gr.Label(label="Predictions", num_top_classes=10, elem_id="predictions")  # shows the k sent
                k_slider = gr.Slider(1, 10, value=5, step=1, label="How many classes (top-k)")
                with gr.Row(elem_classes="export-row"):
                    topk_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                    topk_file = gr.File(visible=False, show_label=False, height=60)

        with gr.Row(elem_id="display"):
            cmap = gr.Dropdown(list(ac.COLORMAPS), value="inferno", label="Colormap", scale=1)
            alpha = gr.Slider(0, 1, value=0.6, step=0.05, label="Overlay opacity", scale=2)
            smooth = gr.Checkbox(True, label="Smooth (bilinear) maps", scale=1)

        with gr.Tabs(elem_id="tabs"):
            # ------------------------------------------------------------ 2. patches
            with gr.Tab("Patches", id="patches") as tab_patches:
                with gr.Row(equal_height=False):
                    patch_img = gr.Image(label="Patch grid (click a patch)", show_label=False, interactive=False,
                                         format="png", height=460, elem_id="patch-grid", buttons=["fullscreen"],
                                         scale=2)
                    with gr.Column(scale=3):
                        patch_md = gr.Markdown("*Upload an image to see it cut into patches.*")
                        seq_img = gr.Image(show_label=False, interactive=False, format="png", elem_id="sequence",
                                           buttons=["fullscreen"], container=False)
                        with gr.Row(elem_classes="export-row"):
                            patches_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                            patches_file = gr.File(visible=False, show_label=False, height=60)

            # ------------------------------------------------------------ 4. attention explorer
            with gr.Tab("Attention", id="attention") as tab_attention:
                with gr.Row(equal_height=True):
                    layer = gr.Slider(0, 11, value=11, step=1, label="Layer (0 = first)", elem_id="layer", scale=3)
                    head = gr.Dropdown(ac.head_choices(3), value=ac.HEAD_ALL, label="Head", elem_id="head", scale=2)
                    qmode = gr.Radio([ac.CLASS_TOKEN, ac.PATCH_QUERY], value=ac.CLASS_TOKEN,
                                     label="Query: whose attention?", elem_id="query-mode", scale=3)
                    qpatch = gr.Number(value=0, precision=0, minimum=0, label="Query patch", elem_id="query-patch",
                                       scale=1, min_width=110)
                with gr.Row(equal_height=False):
                    with gr.Column(scale=2, min_width=260):
                        gr.Markdown("**Click a patch** to see where it looks (also on a single-head map):",
                                    elem_classes="caption")
                        query_img = gr.Image(label="Click a patch to make it the query", show_label=False,
                                             interactive=False, format="png", height=330, elem_id="query-picker",
                                             buttons=[])
                    with gr.Column(scale=5):
                        att_img = gr.Image(label="Attention", show_label=False, interactive=False, format="png",
                                           elem_id="attention", buttons=["fullscreen"])
                        att_md = gr.Markdown(elem_classes="caption", elem_id="attention-caption")
                        with gr.Row(elem_classes="export-row"):
                            att_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                            att_file = gr.File(visible=False, show_label=False, height=60, elem_id="attention-file")

            # ------------------------------------------------------------ 5. rollout and relevance
            with gr.Tab("Rollout & relevance", id="methods") as tab_methods:
                with gr.Row():
                    fusion = gr.Radio(list(ac.FUSIONS), value="mean", label="Rollout: head fusion", scale=2)
                    discard = gr.Slider(0, 0.95, value=0.0, step=0.05, label="Rollout: discard the lowest", scale=2)
                    start = gr.Slider(0, 11, value=0, step=1, label="Rollout: start layer", scale=2)
                    cls_dd = gr.Dropdown([], label="Explain the class (gradient rollout, Chefer)", scale=2,
                                         elem_id="explain-class")
                methods_img = gr.Image(label="The methods side by side", interactive=False, format="png", height=360,
                                       elem_id="methods", buttons=["fullscreen"])
                methods_md = gr.Markdown(elem_classes="caption")
                with gr.Row(elem_classes="export-row"):
                    methods_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                    methods_file = gr.File(visible=False, show_label=False, height=60)

            # ------------------------------------------------------------ 6. diagnostics
            with gr.Tab("Model diagnostics", id="diagnostics") as tab_diag:
                gr.Markdown(ac.DIAGNOSTICS_CAPTION, elem_classes="caption")
                with gr.Row(equal_height=False):
                    with gr.Column():
                        dist_img = gr.Image(label="Mean attention distance (this image)", show_label=False,
                                            interactive=False, format="png", elem_id="distance", buttons=["fullscreen"])
                        with gr.Row(elem_classes="export-row"):
                            dist_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                            dist_file = gr.File(visible=False, show_label=False, height=60)
                    with gr.Column():
                        pos_img = gr.Image(label="Position-embedding similarity (the model)", show_label=False,
                                           interactive=False, format="png", elem_id="pos-embed", buttons=["fullscreen"])
                        with gr.Row(elem_classes="export-row"):
                            pos_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                            pos_file = gr.File(visible=False, show_label=False, height=60)

            # ------------------------------------------------------------ 7. timm comparison
            with gr.Tab("Compare with timm", id="timm") as tab_timm:
                gr.Markdown("timm's own model, loaded with **the same weights file** (timm reads the file itself, so a "
                            "porting bug would show), runs on **the same input tensor**. Both top-k lists, the largest "
                            "differences, and each model's time.", elem_classes="caption")
                timm_btn = gr.Button("Run timm on this image", variant="primary", elem_id="run-timm")
                verdict_md = gr.Markdown(elem_id="verdict")
                with gr.Row():
                    ours_lbl = gr.Label(label="Scratch ViT (vit_demo)", elem_id="ours")
                    timm_lbl = gr.Label(label="timm", elem_id="theirs")
                timm_md = gr.Markdown(elem_id="timm-table")
                with gr.Row(elem_classes="export-row"):
                    timm_export_btn = gr.Button(EXPORT, size="sm", scale=0, min_width=200)
                    timm_file = gr.File(visible=False, show_label=False, height=60, elem_id="timm-file")

        # hidden: the JSON endpoint for scripts (gradio_client), /predict
        predict_btn = gr.Button(visible=False)
        predict_json = gr.JSON(visible=False)

        # ================================================================ handlers
        view_inputs = [layer, head, qmode, qpatch, cmap, alpha, smooth]
        method_inputs = [fusion, discard, start, cls_dd, cmap, alpha, smooth]
        files = [input_file, topk_file, patches_file, att_file, methods_file, dist_file, pos_file, timm_file]
        clear_outputs = [model_input, input_md, topk, patch_img, patch_md, seq_img, query_img, att_img, att_md,
                         methods_img, methods_md, dist_img, verdict_md, ours_lbl, timm_lbl, timm_md]

        def session(sess: ac.Session | None) -> ac.Session:
            return sess if isinstance(sess, ac.Session) else ac.Session(model_key=default_key)

        def _query(sess: ac.Session, qm: str, qp: Any) -> int | None:
            if qm != ac.PATCH_QUERY or qp is None:
                return None
            a = sess.analysis
            try:
                q = int(qp)
            except (TypeError, ValueError):
                return None
            return q if a is None or 0 <= q < a.layout.num_patches else None

        def _cls(sess: ac.Session, cls_value: Any) -> int | None:
            a = sess.analysis
            if cls_value in (None, "") or a is None or not a.logits.numel():
                return None
            try:
                c = int(cls_value)
            except (TypeError, ValueError):
                return None
            # only a class the menu offers for THIS image: a value left over from the previous
            # image (events racing an upload) falls back to the top-1 class
            return c if c in {t["index"] for t in a.topk(10)} else None

        def _methods_picture(sess, fu, di, st, cl, cm, al, sm, compute: bool):
            a = sess.analysis
            cls = _cls(sess, cl)
            lm = reg.get(sess.model_key) if (compute or ac.has_class_maps(a, cls)) else None
            maps = ac.method_maps(a, lm, fu, di, st, cls)
            pending = [] if lm is not None else ac.pending_titles(a, cls)
            return ac.tiles_image(a.picture, maps, cm, al, sm, pending=pending), ac.methods_caption(a, fu, di, st, cls)

        @_friendly
        def on_model(key: str, sess: ac.Session | None):
            sess = session(sess)
            now = time.monotonic()
            if sess.last_pick and sess.last_pick[0] == key and now - sess.last_pick[1] < 2.0:
                return gr.skip()  # the menu reports one pick twice
            sess.last_pick = (key, now)
            try:
                lm = reg.get(key)
            except ac.ModelError as e:
                gr.Warning(str(e), duration=15)
                back = sess.model_key if sess.model_key and reg.is_loaded(sess.model_key) else default_key
                return {state: sess, model_dd: gr.update(value=back),
                        status: note("Could not load that model.", str(e))}
            sess.model_key = key
            return {state: sess, model_md: ac.model_summary(lm), status: ""}

        @_friendly
        def on_image(payload, key, k, ly, hd, qm, qp, cm, al, sm, fu, di, st, sess):
            sess = session(sess)
            path, name = _payload_path(payload)
            key = key or sess.model_key or default_key
            if path is not None and sess.shown == (path, key):
                return gr.skip()  # the browser sends one upload's change event twice: run it once
            sess.shown = (path, key)
            cleared = {c: None for c in clear_outputs} | {f: gr.update(value=None, visible=False) for f in files}
            if path is None:
                sess.upload = sess.analysis = None
                sess.rendered = {}
                return {state: sess, status: "", **cleared}
            try:
                up = ac.open_image(path)
            except ImageError as e:
                gr.Warning(str(e), duration=15)
                sess.upload = sess.analysis = None
                sess.rendered = {}
                return {state: sess, status: note("Cannot use this image.", str(e)), **cleared}
            up.name = name or up.name
            for n in up.notes:
                gr.Info(n)
            try:
                lm = reg.get(key)
            except ac.ModelError as e:
                gr.Warning(str(e), duration=15)
                sess.shown = None
                return {state: sess, status: note("Could not load that model.", str(e))}
            a = reg.analyze(key, up.picture)
            same_grid = sess.analysis is not None and sess.analysis.layout.grid == a.layout.grid
            sess.model_key, sess.upload, sess.analysis = key, up, a
            sess.rendered, sess.comparison = {}, None
            if not same_grid:
                sess.query = None
            ly = min(int(ly), a.depth - 1) if ly is not None else a.depth - 1
            heads = dict((v, lab) for lab, v in ac.head_choices(a.num_heads))
            hd = hd if hd in heads else ac.HEAD_ALL
            q = sess.query
            att, att_caption = ac.attention_view(a, ly, hd, q, cm, al, sm)
            cls_choices = ac.class_choices(a, k)
            meth, meth_caption = _methods_picture(sess, fu, di, min(int(st), a.depth - 1), None, cm, al, sm, False)
            notes = note("Note:", "; ".join(up.notes) + ".", "info") if up.notes else ""
            if lm.random_weights:
                notes += note("Random weights:", "every step below is real, but the predictions are noise. "
                              "Load a checkpoint for meaningful ones (see weights/README.md).", "info")
            elif not a.logits.numel():
                notes += note("No classifier:", f"{lm.name} outputs features only, so there are no predictions "
                              "and no class-specific maps.", "info")
            return {
                state: sess,
                model_md: ac.model_summary(lm),
                status: notes,
                model_input: png(ac.input_picture(a)),
                input_md: ac.input_caption(a, up, lm),
                topk: ac.predictions(a, k) if a.logits.numel() else None,
                patch_img: png(ac.patch_picture(a, q)),
                patch_md: ac.patch_caption(a, lm),
                seq_img: png(ac.sequence_picture(a, q, SEQ_WIDTH, lm.model.cfg.embed_dim)),
                query_img: png(ac.query_picture(a, q)),
                att_img: jpeg(att),
                att_md: att_caption,
                layer: gr.update(maximum=a.depth - 1, value=ly),
                head: gr.update(choices=ac.head_choices(a.num_heads), value=hd),
                qmode: gr.update(value=ac.PATCH_QUERY if q is not None else ac.CLASS_TOKEN),
                qpatch: gr.update(maximum=a.layout.num_patches - 1, value=q if q is not None else 0),
                start: gr.update(maximum=a.depth - 1, value=min(int(st), a.depth - 1)),
                cls_dd: gr.update(choices=cls_choices, value=cls_choices[0][1] if cls_choices else None,
                                  interactive=bool(cls_choices)),
                methods_img: jpeg(meth),
                methods_md: meth_caption,
                dist_img: None,
                verdict_md: "*Press the button to run timm's model on this image.*",
                ours_lbl: None,
                timm_lbl: None,
                timm_md: "",
                **{f: gr.update(value=None, visible=False) for f in files},
            }

        @_friendly
        def on_class_maps(fu, di, st, cl, cm, al, sm, sess):
            sess = session(sess)
            if not sess.ready or not sess.analysis.logits.numel():
                return gr.skip()
            pic, caption = _methods_picture(sess, fu, di, st, cl, cm, al, sm, True)
            return {methods_img: jpeg(pic), methods_md: caption}

        def _lazy(sess: ac.Session, tab: str) -> dict:
            """Draw the slower (matplotlib) pictures of ``tab`` once per analysis, when it is open."""
            out: dict = {}
            if not sess.ready or sess.rendered.get(tab) == sess.view_key:
                return out
            a = sess.analysis
            if tab == "diagnostics":
                out[dist_img] = png(ac.distance_picture(a))
                out[pos_img] = png(reg.pos_embed_picture(sess.model_key))
            else:
                return out
            sess.rendered[tab] = sess.view_key
            return out

        @_friendly
        def on_lazy(sess):
            sess = session(sess)
            out = _lazy(sess, sess.open_tab)
            return out or gr.skip()

        def tab_handler(name: str):
            @_friendly
            def on_tab(sess):
                sess = session(sess)
                sess.open_tab = name
                return {state: sess, **_lazy(sess, name)}

            return on_tab

        @_friendly
        def on_attention(ly, hd, qm, qp, cm, al, sm, sess):
            sess = session(sess)
            if not sess.ready:
                return gr.skip()
            q = _query(sess, qm, qp)
            pic, caption = ac.attention_view(sess.analysis, ly, hd, q, cm, al, sm)
            out = {att_img: jpeg(pic), att_md: caption}
            if q != sess.query:  # the picker outlines the query: redraw it only when that changes
                sess.query = q
                out[query_img] = png(ac.query_picture(sess.analysis, q))
            return out

        def _clicked(sess: ac.Session, evt: gr.SelectData, size: tuple[int, int]) -> int | None:
            if not sess.ready or not isinstance(evt.index, (list, tuple)) or len(evt.index) != 2:
                return None
            return ac.click_to_patch(sess.analysis, float(evt.index[0]), float(evt.index[1]), size)

        def click_handler(kind: str):
            @_friendly
            def on_click(ly, hd, cm, al, sm, sess, evt: gr.SelectData):
                sess = session(sess)
                if not sess.ready:
                    return gr.skip()
                a = sess.analysis
                if kind == "attention":  # only the single-map views are a picture of the input
                    if hd in (ac.HEAD_ALL, ac.HEAD_LAYERS):
                        return gr.skip()
                    size = (ac.VIEW_SIZE, ac.VIEW_SIZE * a.picture.height // a.picture.width)
                elif kind == "patches":
                    size = ac.patch_picture_size(a)
                else:
                    size = ac.query_picture_size(a)
                q = _clicked(sess, evt, size)
                if q is None:
                    return gr.skip()
                sess.query = q
                pic, caption = ac.attention_view(a, ly, hd, q, cm, al, sm)
                dim = reg.get(sess.model_key).model.cfg.embed_dim
                return {state: sess, qmode: ac.PATCH_QUERY, qpatch: q, att_img: jpeg(pic), att_md: caption,
                        query_img: png(ac.query_picture(a, q)), patch_img: png(ac.patch_picture(a, q)),
                        seq_img: png(ac.sequence_picture(a, q, SEQ_WIDTH, dim))}

            return on_click

        @_friendly
        def on_methods(fu, di, st, cl, cm, al, sm, sess):
            sess = session(sess)
            if not sess.ready:
                return gr.skip()
            pic, caption = _methods_picture(sess, fu, di, st, cl, cm, al, sm, True)
            return {methods_img: jpeg(pic), methods_md: caption}

        @_friendly
        def on_display(ly, hd, qm, qp, cm, al, sm, fu, di, st, cl, sess):
            sess = session(sess)
            if not sess.ready:
                return gr.skip()
            out = on_attention(ly, hd, qm, qp, cm, al, sm, sess)
            pic, caption = _methods_picture(sess, fu, di, st, cl, cm, al, sm, False)
            out.update({methods_img: jpeg(pic), methods_md: caption})
            return out

        @_friendly
        def on_k(k, sess):
            sess = session(sess)
            if not sess.ready or not sess.analysis.logits.numel():
                return gr.skip()
            return {topk: ac.predictions(sess.analysis, k)}

        @_friendly
        def on_compare(k, sess):
            sess = session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            a = sess.analysis
            lm = reg.get(sess.model_key)
            if not a.logits.numel():
                raise gr.Error(f"{lm.name} has no classifier: no predictions to compare.", print_exception=False)
            tm = reg.timm_twin(sess.model_key)
            c = ac.compare_with_timm(a, lm, tm, max(5, int(k)))
            sess.comparison = c
            ours, theirs = ac.compare_labels(a, c)
            return {state: sess, verdict_md: verdict_html(c), ours_lbl: ours, timm_lbl: theirs,
                    timm_md: ac.compare_markdown(c)}

        @_friendly
        def on_predict(payload, key, k):
            """JSON top-k for one image, as ``python -m vit_demo predict --json`` gives it."""
            path, name = _payload_path(payload)
            up = ac.open_image(path)
            key = key or default_key
            a = reg.analyze(key, up.picture)
            if not a.logits.numel():
                raise gr.Error(f"{a.model_name} has no classifier: it has no predictions.", print_exception=False)
            return {"image": name or up.name, "model": a.model_name, "topk": ac.predictions_json(a, int(k or 5)),
                    "notes": up.notes}

        @_friendly
        def on_checkpoint(path_text, upload, arch, sess):
            """The button: the typed path when there is one, else the uploaded file."""
            sess = session(sess)
            if path_text and str(path_text).strip():
                spec = reg.add_checkpoint(path_text, arch)
            elif upload:
                spec = reg.add_checkpoint(upload, arch, uploaded=True)
            else:
                raise gr.Error("Give a checkpoint path or upload a file first.", print_exception=False)
            return _use_checkpoint(sess, spec)

        @_friendly
        def on_checkpoint_upload(upload, arch, sess):
            sess = session(sess)
            if not upload:
                return gr.skip()
            return _use_checkpoint(sess, reg.add_checkpoint(upload, arch, uploaded=True))

        def _use_checkpoint(sess: ac.Session, spec: ac.ModelSpec) -> dict:
            if spec.key not in sess.extra_models and reg.is_private(spec.key):
                sess.extra_models.append(spec.key)
            sess.model_key = spec.key
            lm = reg.get(spec.key)
            gr.Info(f"Loaded {lm.name}")
            return {state: sess, model_dd: gr.update(choices=reg.choices(sess.extra_models), value=spec.key),
                    model_md: ac.model_summary(lm), status: "", no_weights: gr.update(visible=False)}

        def export(fn):
            @_friendly
            def on_export(*args):
                *rest, sess = args
                sess = session(sess)
                if not sess.ready:
                    raise gr.Error("Upload an image first.", print_exception=False)
                return gr.update(value=str(fn(sess, *rest)), visible=True)

            return on_export

        # ================================================================ wiring
        analyze_inputs = [image, model_dd, k_slider, *view_inputs, fusion, discard, start, state]
        analyze_outputs = [state, model_md, status, *clear_outputs, layer, head, qmode, qpatch, start, cls_dd, *files]
        heavy = {"concurrency_id": "model", "concurrency_limit": cfg.concurrency}
        # Events that only redraw take the components' raw values (preprocess=False): the menus
        # (heads, classes) change with every image and model, and an event racing an upload may
        # carry a value from the previous one; the handlers check every value themselves.

        def analyze_chain(dep):
            return (dep.success(on_class_maps, [*method_inputs, state], [methods_img, methods_md],
                                api_visibility="private", show_progress="minimal", preprocess=False, **heavy)
                    .then(on_lazy, [state], [dist_img, pos_img], api_visibility="private",
                          show_progress="minimal"))

        analyze_chain(image.change(on_image, analyze_inputs, analyze_outputs, api_name="analyze",
                                   trigger_mode="always_last", preprocess=False, **heavy))
        def on_image_again(payload, _key, *rest):
            """After a model pick: the image again with the session's model (the menu's value may
            still be the pick that failed)."""
            sess = rest[-1]
            return on_image(payload, session(sess).model_key, *rest)

        analyze_chain(model_dd.input(on_model, [model_dd, state], [state, model_dd, model_md, status],
                                     api_visibility="private", **heavy)
                      .then(on_image_again, analyze_inputs, analyze_outputs, api_visibility="private",
                            preprocess=False, **heavy))
        ckpt_outputs = [state, model_dd, model_md, status, no_weights]
        for dep in (ckpt_btn.click(on_checkpoint, [ckpt_path, ckpt_file, ckpt_arch, state], ckpt_outputs,
                                   api_visibility="private", **heavy),
                    ckpt_file.upload(on_checkpoint_upload, [ckpt_file, ckpt_arch, state], ckpt_outputs,  # at once
                                     api_visibility="private", **heavy)):
            analyze_chain(dep.success(on_image_again, analyze_inputs, analyze_outputs, api_visibility="private",
                                      preprocess=False, **heavy))

        att_outputs = [att_img, att_md, query_img]
        gr.on([layer.input, head.input, qmode.input, qpatch.input], on_attention, [*view_inputs, state], att_outputs,
              api_name="attention", trigger_mode="always_last", show_progress="hidden", preprocess=False)
        gr.on([cmap.input, alpha.input, smooth.input], on_display,
              [*view_inputs, fusion, discard, start, cls_dd, state], [*att_outputs, methods_img, methods_md],
              api_visibility="private", trigger_mode="always_last", show_progress="hidden", preprocess=False)
        click_inputs = [layer, head, cmap, alpha, smooth, state]
        click_outputs = [state, qmode, qpatch, *att_outputs, patch_img, seq_img]
        for target, kind in ((query_img, "picker"), (att_img, "attention"), (patch_img, "patches")):
            target.select(click_handler(kind), click_inputs, click_outputs, api_visibility="private",
                          trigger_mode="always_last", show_progress="hidden", preprocess=False)
        gr.on([fusion.input, discard.input, start.input, cls_dd.input], on_methods, [*method_inputs, state],
              [methods_img, methods_md], api_visibility="private", trigger_mode="always_last", show_progress="minimal",
              preprocess=False, **heavy)
        k_slider.input(on_k, [k_slider, state], [topk], api_visibility="private", trigger_mode="always_last",
                       show_progress="hidden")
        for tab, name in ((tab_patches, "patches"), (tab_attention, "attention"), (tab_methods, "methods"),
                          (tab_diag, "diagnostics"), (tab_timm, "timm")):
            tab.select(tab_handler(name), [state], [state, dist_img, pos_img], api_visibility="private",
                       show_progress="minimal")
        timm_btn.click(on_compare, [k_slider, state], [state, verdict_md, ours_lbl, timm_lbl, timm_md],
                       api_name="compare", **heavy)

        def on_example(evt: gr.SelectData):
            i = evt.index if isinstance(evt.index, int) else None
            return str(examples[i].path) if i is not None and 0 <= i < len(examples) else gr.skip()

        gallery.select(on_example, None, [image], api_visibility="private", show_progress="hidden")
        predict_btn.click(on_predict, [image, model_dd, k_slider], [predict_json], api_name="predict",
                          preprocess=False, **heavy)

        # exports: a slide-ready PNG (2400 px wide), made on demand
        def _lm(s):
            return reg.get(s.model_key)

        exports = [
            (input_btn, input_file, [], lambda s: ac.export_input(s.analysis, s.upload, _lm(s))),
            (topk_btn, topk_file, [k_slider], lambda s, k: ac.export_predictions(s.analysis, s.upload, k)),
            (patches_btn, patches_file, [], lambda s: ac.export_patches(s.analysis, s.upload, s.query)),
            (att_btn, att_file, [layer, head, cmap, alpha, smooth],
             lambda s, ly, hd, cm, al, sm: ac.export_attention(s.analysis, s.upload, ly, hd, s.query, cm, al, sm)),
            (methods_btn, methods_file, method_inputs,
             lambda s, fu, di, st, cl, cm, al, sm: ac.export_methods(s.analysis, _lm(s), s.upload, fu, di, st,
                                                                     _cls(s, cl), cm, al, sm)),
            (dist_btn, dist_file, [], lambda s: ac.export_distance(s.analysis, s.upload)),
            (pos_btn, pos_file, [], lambda s: ac.export_pos_embed(_lm(s))),
            (timm_export_btn, timm_file, [], lambda s: ac.export_compare(s.analysis, s.upload, _need_comparison(s))),
        ]
        for btn, out, extra, fn in exports:
            btn.click(export(fn), [*extra, state], [out], api_visibility="private", show_progress="minimal",
                      preprocess=False)

        def on_page_load():  # describe the model at once when the warm-up has loaded it (never waits)
            return ac.model_summary(reg.get(default_key)) if reg.is_loaded(default_key) else gr.skip()

        demo.load(on_page_load, None, [model_md], api_visibility="private", show_progress="hidden", queue=False)

    demo.queue(max_size=cfg.max_queue, default_concurrency_limit=4)
    demo.example_paths = [str(e.path) for e in examples]  # launch(allowed_paths=...) serves exactly these files
    return demo, reg


def _need_comparison(sess: ac.Session) -> dict:
    if not sess.comparison:
        raise gr.Error("Run timm on this image first.", print_exception=False)
    return sess.comparison


def launch_kwargs(demo: gr.Blocks | None = None) -> dict[str, Any]:
    """The parts of ``launch()`` that shape the page and keep it offline."""
    return dict(theme=theme(), css=CSS, max_file_size=MAX_UPLOAD, footer_links=["api"], run_history=False,
                mcp_server=False, ssr_mode=False, show_error=True,
                allowed_paths=list(getattr(demo, "example_paths", [])))
