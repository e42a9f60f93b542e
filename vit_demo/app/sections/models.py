"""The model picker above the tabs: the model menu and its one-line description, "Use your own
checkpoint" (a path or an upload), the status area, and the no-checkpoint notice. A new pick
or checkpoint analyses the current image again (:attr:`Context.reanalyze`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import gradio as gr

from ...checkpoints.load import DEFAULT_CHECKPOINT, LoadedModel, weights_dir
from ...precision import BF16_FIDELITY, BF16_HOW, BF16_SPEED
from ..common import friendly, note, payload_path
from ..context import Context, Section
from ..registry import ModelError, ModelSpec
from ..server.guard import Refused
from ..server.limits import CHECKPOINT_MAX_MB
from ..session import Session

MENU_SESSIONS = 4096  # browser sessions whose last menu is remembered (the oldest forgotten first)

CHECKPOINT_TYPES = [".safetensors", ".pth", ".pt", ".bin", ".npz"]
CHECKPOINTS_OFF = ("Loading your own checkpoint is **off** on this app: it is reachable from other computers "
                   "(`--share` or `--host`). Whoever runs it can turn uploads on with `--allow-checkpoint-upload`.")


def model_summary(lm: LoadedModel) -> str:
    """One line a presenter can read out."""
    cfg = lm.model.cfg
    gh, gw = cfg.grid_size
    prefix = ", ".join(lm.model.layout((gh, gw)).names()) or "no prefix tokens"
    head = f"{cfg.num_classes} classes" if cfg.num_classes else "no classifier (features only)"
    warn = "  **Random weights**: the machinery is real, the predictions are noise." if lm.random_weights else ""
    source = f"`{Path(lm.source[5:]).name}`" if lm.source.startswith("file ") else lm.source
    variants = f" Variants: {', '.join(cfg.variants())}." if cfg.variants() else ""
    stem = " (a convolutional stem makes them: timm, which has none, is compared from the tokens on)" if cfg.conv_stem else ""
    return (f"**{lm.name}**: {cfg.depth} layers × {cfg.num_heads} heads, width {cfg.embed_dim}, "
            f"{lm.model.num_params / 1e6:.1f} M parameters, {cfg.patch_size}-px patches{stem}, tokens: {prefix}; "
            f"{head}.{variants} Weights: {source}. {precision_line(lm)}{warn}")


def precision_line(lm: LoadedModel) -> str:
    """What the model runs in and why; in bf16 what that does, and the measured gain and cost only
    where they were measured on this model (the speed-up on its architecture, the fidelity on the
    shipped DeiT-Tiny): a trained model is never told DeiT-Tiny's figures."""
    if lm.precision != "bf16":
        return f"Runs in {lm.precision_note}."
    speed = BF16_SPEED.get((lm.timm_name or "").split(".")[0])  # by architecture: any weights of it run as fast
    said = [f" Measured on this architecture: {speed:g} times as fast as fp32 on this project's CPU." if speed else ""]
    if lm.shipped:
        said.append(f" Measured on these weights: {BF16_FIDELITY}.")
    else:
        said.append(" What bf16 changes in this model's predictions was not measured here: the Compare tab shows "
                    "a picture's prediction in fp32 beside this one.")
    return f"Runs in **{lm.precision_note}**: {BF16_HOW}." + "".join(said)


def no_checkpoint_message() -> str:
    return (f"**No checkpoint found** (the default `{DEFAULT_CHECKPOINT.name}` that ships with vit_demo is missing: "
            "restore it with `git checkout -- weights/`; looked in "
            f"`{weights_dir().name}/` and `$VIT_DEMO_WEIGHTS` too), so predictions need one: see `weights/README.md`, "
            "start with `python app.py --weights FILE`, or load a file under *Use your own checkpoint*. "
            "Meanwhile the model below has **random weights**: every step is real, the predictions are noise.")


class ModelPicker(Section):
    """The model menu, the checkpoint loader and the status line."""

    def layout(self, ctx: Context) -> None:
        reg, cfg = ctx.reg, ctx.cfg
        self.no_weights = gr.Markdown("> " + no_checkpoint_message(), elem_id="no-weights",
                                      visible=not reg.has_checkpoint)
        with gr.Row(equal_height=True, elem_id="model-row"):
            ctx.model_dd = gr.Dropdown(reg.choices(), value=ctx.default_key, label="Model", scale=2, elem_id="model")
            ctx.model_md = gr.Markdown("*The model is loading; its description appears here.*", elem_id="model-info")
        self.ckpt_path = self.ckpt_file = self.ckpt_arch = self.ckpt_btn = None
        if cfg.exposed and not cfg.limits.allow_checkpoint_upload:  # neither a path nor an upload
            with gr.Accordion("Use your own checkpoint", open=False, elem_id="checkpoint"):
                gr.Markdown(CHECKPOINTS_OFF)
        else:
            self._checkpoint_loader(ctx)
        ctx.status = gr.Markdown("", elem_id="status")

    def _checkpoint_loader(self, ctx: Context) -> None:
        cfg = ctx.cfg
        with gr.Accordion("Use your own checkpoint", open=False, elem_id="checkpoint"):
            gr.Markdown("A timm `state_dict` (`.safetensors`, `.pth`/`.bin`, `.npz`), a file saved by "
                        "`python -m vit_demo port`, or (as a path) a Hugging Face transformers ViT/DeiT folder. "
                        "Files are read as weights only (safetensors, or "
                        "`torch.load(weights_only=True)`): a pickle that would run code is refused.")
            with gr.Row():
                self.ckpt_path = gr.Textbox(label="Path on this computer", visible=not cfg.exposed, scale=3,
                                            placeholder="weights/deit_small_patch16_224.safetensors")
                self.ckpt_file = gr.File(label=f"…or upload one (up to {CHECKPOINT_MAX_MB // 1024} GB)",
                                         file_types=CHECKPOINT_TYPES, elem_id="checkpoint-file",
                                         type="filepath", height=150, scale=2, min_width=220)
                self.ckpt_arch = gr.Textbox(label="Architecture (timm name), if the file name does not say it",
                                            placeholder="deit_small_patch16_224", scale=2)
            self.ckpt_btn = gr.Button("Load checkpoint", variant="secondary")

    def wire(self, ctx: Context) -> None:
        self.wire_menu(ctx)
        if self.ckpt_btn is not None:  # the loader is there (not an exposed app without uploads)
            self.wire_loader(ctx)

    def wire_menu(self, ctx: Context) -> None:
        """A pick from the model menu (downloading a hub model once: on an exposed app, only with
        ``--allow-downloads``, in the slow lane, one at a time and within ``--downloads-mb``), the
        model's description on page load, and the menu brought up to date with ``weights/`` on page
        load and on focus."""
        reg, state, model_dd, model_md, status = ctx.reg, ctx.state, ctx.model_dd, ctx.model_md, ctx.status

        @friendly
        def on_model(key: str, sess: Session | None, progress=gr.Progress(track_tqdm=True)):  # noqa: B008 (gradio's way)
            sess = ctx.session(sess)
            now = time.monotonic()
            if sess.last_pick and sess.last_pick[0] == key and now - sess.last_pick[1] < 2.0:
                return gr.skip()  # the menu reports one pick twice
            sess.last_pick = (key, now)
            try:
                if reg.needs_download(key):  # the download's own tqdm bar drives the indicator from here on
                    progress(0, desc=f"Downloading {reg.spec(key).name} from the hub (once: it is kept in weights/)")
                lm = reg.download(key)
            except ModelError as e:
                gr.Warning(str(e), duration=15)
                back = sess.model_key if sess.model_key and reg.is_loaded(sess.model_key) else ctx.default_key
                return {state: sess, model_dd: gr.update(value=back),
                        status: note("Could not load that model.", str(e))}
            sess.model_key = key
            return {state: sess, model_md: model_summary(lm), status: ""}

        # an exposed app that may download (--allow-downloads): a pick runs in the slow lane, where downloads happen
        lane = ctx.slow if reg.downloads is not None else ctx.heavy
        ctx.reanalyze(model_dd.input(on_model, [model_dd, state], [state, model_dd, model_md, status],
                                     api_visibility="private", **lane).then)

        def on_page_load():  # describe the model at once when the warm-up has loaded it (never waits)
            return model_summary(reg.get(ctx.default_key)) if reg.is_loaded(ctx.default_key) else gr.skip()

        ctx.demo.load(on_page_load, None, [model_md], api_visibility="private", show_progress="hidden", queue=False)

        shown: OrderedDict[str, tuple] = OrderedDict()  # browser session -> the menu it was last sent
        built = tuple(reg.choices())  # the menu every page starts with

        def on_menu(sess: Session | None, request: gr.Request):
            """The menu follows weights/: a checkpoint trained meanwhile joins it. Sent only when the
            list changed: a new list re-draws the open menu under the user's pointer."""
            reg.refresh()
            now = tuple(reg.choices(sess.extra_models if sess is not None else ()))
            who = getattr(request, "session_hash", None) or ""
            if shown.get(who, built) == now:
                return gr.skip()
            shown[who] = now
            shown.move_to_end(who)
            while len(shown) > MENU_SESSIONS:
                shown.popitem(last=False)
            return gr.update(choices=list(now))

        for event in (ctx.demo.load, model_dd.focus):  # on page load, and each time the menu is opened
            event(on_menu, [state], [model_dd], api_visibility="private", show_progress="hidden", queue=False)

    def wire_loader(self, ctx: Context) -> None:
        """"Use your own checkpoint": the button (a typed path, else the uploaded file) and an upload."""
        reg, state, model_dd, model_md, status = ctx.reg, ctx.state, ctx.model_dd, ctx.model_md, ctx.status
        no_weights = self.no_weights

        def refused(sess: Session, why: str) -> dict:
            """A checkpoint that cannot be used: one line in the status area (and a toast); the
            menu and the model in use stay as they were (an exception here put red "Error"
            pills over the menu)."""
            gr.Warning(why, duration=15)
            return {state: sess, status: note("Could not load that checkpoint.", why)}

        @friendly
        def on_checkpoint(path_text, upload, arch, sess):
            """The button: the typed path when there is one, else the uploaded file."""
            sess = ctx.session(sess)
            try:
                if path_text and str(path_text).strip():
                    spec = reg.add_checkpoint(path_text, arch)
                elif upload:
                    spec = reg.add_checkpoint(uploaded_file(upload), arch, uploaded=True)
                else:
                    return refused(sess, "give a checkpoint path or upload a file first")
                return _use_checkpoint(sess, spec)
            except ModelError as e:
                return refused(sess, str(e))

        @friendly
        def on_checkpoint_upload(upload, arch, sess):
            sess = ctx.session(sess)
            if not upload:
                return gr.skip()
            try:
                return _use_checkpoint(sess, reg.add_checkpoint(uploaded_file(upload), arch, uploaded=True))
            except ModelError as e:
                return refused(sess, str(e))

        def uploaded_file(upload) -> str:
            """The uploaded checkpoint's path, if it is a file this server stored for an upload."""
            path, _ = payload_path(upload)
            try:
                return ctx.files.check(path) if ctx.files is not None else path
            except Refused as e:
                raise gr.Error(str(e), print_exception=False) from None

        def _use_checkpoint(sess: Session, spec: ModelSpec) -> dict:
            if spec.key not in sess.extra_models and reg.is_private(spec.key):
                sess.extra_models.append(spec.key)
            sess.model_key = spec.key
            lm = reg.get(spec.key)
            gr.Info(f"Loaded {lm.name}")
            return {state: sess, model_dd: gr.update(choices=reg.choices(sess.extra_models), value=spec.key),
                    model_md: model_summary(lm), status: "", no_weights: gr.update(visible=False)}

        ckpt_outputs = [state, model_dd, model_md, status, no_weights]
        for dep in (self.ckpt_btn.click(on_checkpoint, [self.ckpt_path, self.ckpt_file, self.ckpt_arch, state],
                                        ckpt_outputs, api_visibility="private", **ctx.heavy),
                    self.ckpt_file.upload(on_checkpoint_upload, [self.ckpt_file, self.ckpt_arch, state],  # at once
                                          ckpt_outputs, api_visibility="private", **ctx.heavy)):
            ctx.reanalyze(dep.success)
