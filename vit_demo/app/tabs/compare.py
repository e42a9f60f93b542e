"""The "Compare with timm" tab: timm's own model, loaded from the same weights file, runs on the
same input tensor, both models in fp32 (like with like, whatever the app runs the model in); both
top-k lists, the largest differences, each model's time, a PASS / FAIL verdict, and where the
prediction above the tabs (bf16) orders the classes otherwise, that. Also the public ``/compare``
endpoint."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr

from ...analysis import Analysis
from ...checkpoints.load import LoadedModel
from ...checkpoints.stem_twin import STEM_SCOPE
from ...viz.charts import layer_diff_figure
from ..common import display_label, friendly
from ..context import Context, Section
from ..exports import export_row, save, wire_export, wrap
from ..session import Session, Upload

RUN_TIMM = "Run timm on this image"

# ----------------------------------------------------------------------------- views


def compare_with_timm(a: Analysis, lm: LoadedModel, tm: Any, k: int = 5) -> dict[str, Any]:
    """Both models on this image (the cached input tensor), with a verdict sentence: both in float32,
    whatever precision the app runs the model in elsewhere (vit_demo.precision), so that "identical"
    means identical to float precision. A model the app runs in bf16: the prediction shown above the
    tabs (``a``'s, made in bf16) beside the fp32 one, and where their top-1 differs (a near-tie
    that bf16's rounding reorders) a sentence that says so (``"precision_note"``)."""
    from ...checkpoints.verify import compare_one, compared_words, verdict

    c = compare_one(lm.model, tm, a.x, k=int(k), repeats=3, precision="fp32")
    c["verdict"] = verdict(c)
    c["identical"] = c["verdict"].startswith("Identical")
    c["compared"] = compared_words("fp32")
    if lm.precision != "fp32":
        top = a.topk(len(c["scratch_topk"]))
        c.update(app_precision=lm.precision, app_topk=[t["index"] for t in top], app_probs=[t["prob"] for t in top])
        c["app_labels"] = [display_label(a, i) for i in c["app_topk"]]
        c["precision_note"] = precision_note(a, c)
    return c


def precision_note(a: Analysis, c: dict[str, Any]) -> str:
    """What to say where the prediction above (in the app's precision) and this check's (fp32) differ:
    their top-1 (a near-tie, said plainly), or only the order below it; "" when they agree."""
    p, (i, j) = c["app_precision"], (c["app_topk"][0], c["scratch_topk"][0])
    if i != j:
        return (f"The prediction above and this check disagree on the top class: in {p} (the app's precision) the "
                f"model ranks {display_label(a, i)} first ({c['app_probs'][0]:.1%}); in fp32, here, it ranks "
                f"{display_label(a, j)} first ({c['scratch_probs'][0]:.1%}). A near-tie that {p}'s rounding "
                "reorders" + (", not a difference from timm: timm agrees with the fp32 column." if c["identical"] else "."))
    if c["app_topk"] != c["scratch_topk"]:
        return (f"The prediction above ({p}) has the same top class as this check (fp32), but orders the classes "
                f"below it differently: near-ties that {p}'s rounding reorders.")
    return ""


def compare_labels(a: Analysis, c: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    ours = {display_label(a, i): p for i, p in zip(c["scratch_topk"], c["scratch_probs"])}
    ref = {display_label(a, i): p for i, p in zip(c["timm_topk"], c["timm_probs"])}
    return ours, ref


def compare_markdown(c: dict[str, Any]) -> str:
    diffs = c["layer_attn_max_diff"]
    rows = " | ".join(f"layer {i + 1}" for i in range(len(diffs)))
    vals = " | ".join(f"{d:.1e}" for d in diffs)
    sep = " | ".join("---" for _ in diffs)
    k = len(c["scratch_topk"])
    st = c.get("stages")
    stage_rows = [
        f"| max \\|token difference\\| (the stem's tokens + position embedding) | {st['tokens']:.2e} |",
        f"| max \\|final-norm difference\\| (every token) | {st['norm']:.2e} |",
        f"| max \\|pooled-feature difference\\| (the head's input) | {st['pooled']:.2e} |",
    ] if st else []
    block_rows = ["", "**Max \\|block output difference\\| per layer** (every token, every channel):", "",
                  f"| {rows} |", f"| {sep} |", "| " + " | ".join(f"{d:.1e}" for d in st["blocks"]) + " |"] if st else []
    return "\n".join([
        *(["**Compared from the tokens on** (the convolutional stem has no timm counterpart): the tokens, every "
           "block's output and attention, the final norm, the pooled features and the logits.", ""] if st else []),
        "| Measure | Scratch vs timm |", "|---|---|",
        f"| precision | {c.get('compared', 'both in fp32')} |",
        *app_rows(c),
        *stage_rows,
        f"| max \\|logit difference\\| | {c['max_abs_logit_diff']:.2e} |",
        f"| max \\|probability difference\\| | {c['max_abs_prob_diff']:.2e} |",
        f"| same top-1 | {'yes' if c['top1_agree'] else '**no**'} |",
        f"| same top-{k}, same order | {'yes' if c['topk_agree'] else '**no**'} |",
        f"| time per image (best of 3) | scratch **{c['scratch_ms']:.1f} ms**, timm **{c['timm_ms']:.1f} ms** |",
        "",
        "**Max \\|attention difference\\| per layer** (every head, every token pair):",
        "",
        f"| {rows} |", f"| {sep} |", f"| {vals} |",
        *block_rows,
    ])


def app_rows(c: dict[str, Any]) -> list[str]:
    """The table's rows for the prediction shown above the tabs when the app runs the model in
    another precision than this check's fp32: its top classes, and whether they agree with fp32's."""
    if "app_precision" not in c:
        return []
    p = c["app_precision"]
    top = ", ".join(f"{html.escape(n)} {q:.1%}" for n, q in zip(c["app_labels"][:3], c["app_probs"][:3]))
    same = ("yes" if c["app_topk"][0] == c["scratch_topk"][0] else
            f"**no: a near-tie that {p}'s rounding reorders** (fp32's top-1 is the scratch column's)")
    return [f"| the prediction above the tabs, in {p} (the app's precision) | {top} |",
            f"| same top-1 in {p} as in fp32 | {same} |"]


def export_compare(a: Analysis, up: Upload, c: dict[str, Any]) -> Path:
    fig = layer_diff_figure(c["layer_attn_max_diff"], f"Scratch ViT vs timm · {a.model_name}", wrap(c["verdict"], 100))
    return save(fig, f"{Path(up.name).stem}-scratch-vs-timm")


def verdict_html(c: dict) -> str:
    """The verdict (both in fp32), then, where the app's own prediction (bf16) differs from fp32's, that."""
    kind, word = ("ok", "PASS") if c["identical"] else ("bad", "FAIL")
    head, _, text = c["verdict"].partition(":")
    note = c.get("precision_note", "")
    return (f'<div class="verdict {kind}"><span class="badge">{word}</span> <b>{html.escape(head)}</b>: '
            f"{html.escape(text.strip())}" + (f'<p class="precision-note"><b>{html.escape(note)}</b></p>' if note else "")
            + "</div>")


def press_note(lm: LoadedModel) -> str:
    """What the tab says before the button is pressed (and, for a convolutional stem, what it will compare)."""
    note = "*Press the button to run timm's model on this image.*"
    if lm.precision != "fp32":  # the check keeps float precision's meaning
        note += f" *Both run in fp32 here (the app runs this model in {lm.precision} elsewhere).*"
    return f"{note} {STEM_SCOPE}" if lm.model.cfg.conv_stem else note


def need_comparison(sess: Session) -> dict:
    if not sess.comparison:
        raise gr.Error("Run timm on this image first.", print_exception=False)
    return sess.comparison


# ----------------------------------------------------------------------------- the section


class CompareTab(Section):
    name, title = "compare", "Compare with timm"

    def layout(self, ctx: Context) -> None:
        gr.Markdown("timm's own model, loaded with **the same weights file** (timm reads the file itself, so a "
                    "porting bug would show), runs on **the same input tensor**, both models **in fp32** (whatever "
                    "precision the app runs the model in elsewhere: like with like). Both top-k lists, the largest "
                    "differences, and each model's time. A model trained here: timm's VisionTransformer built from its stored "
                    "config; with a convolutional stem (which timm does not have), the check starts at the tokens.",
                    elem_classes="caption")
        self.timm_btn = gr.Button(RUN_TIMM, variant="primary", elem_id="run-timm")
        self.verdict_md = gr.Markdown(elem_id="verdict")
        with gr.Row():
            self.ours_lbl = gr.Label(label="Scratch ViT (vit_demo), in fp32", elem_id="ours")
            self.timm_lbl = gr.Label(label="timm, in fp32", elem_id="theirs")
        self.timm_md = gr.Markdown(elem_id="timm-table")
        self.btn, self.file = export_row("timm-file")
        self.views = [self.verdict_md, self.ours_lbl, self.timm_lbl, self.timm_md]
        self.exports = [self.btn]

    def show(self, sess: Session, lm: LoadedModel, vals: dict) -> dict:
        return {self.verdict_md: press_note(lm), self.ours_lbl: None, self.timm_lbl: None, self.timm_md: ""}

    def wire(self, ctx: Context) -> None:
        reg, state = ctx.reg, ctx.state

        @friendly
        def on_compare(k, sess):
            sess = ctx.session(sess)
            if not sess.ready:
                raise gr.Error("Upload an image first.", print_exception=False)
            a = sess.analysis
            lm = reg.get(sess.model_key)
            if not a.logits.numel():
                raise gr.Error(f"{lm.name} has no classifier: no predictions to compare.", print_exception=False)
            tm = reg.timm_twin(sess.model_key)
            c = compare_with_timm(a, lm, tm, max(5, int(k)))
            sess.comparison = c
            ours, theirs = compare_labels(a, c)
            return {state: sess, self.verdict_md: verdict_html(c), self.ours_lbl: ours, self.timm_lbl: theirs,
                    self.timm_md: compare_markdown(c)}

        # the button greys out at once ("Running timm…") and comes back when the verdict is in
        busy = self.timm_btn.click(lambda: gr.update(interactive=False, value="Running timm…"), None, [self.timm_btn],
                                   queue=False, api_visibility="private", show_progress="hidden")
        done = busy.then(on_compare, [ctx.k, state], [state, self.verdict_md, self.ours_lbl, self.timm_lbl, self.timm_md],
                         api_name="compare", show_progress_on=[self.verdict_md], **ctx.heavy)
        done.then(lambda: gr.update(interactive=True, value=RUN_TIMM), None, [self.timm_btn], queue=False,
                  api_visibility="private", show_progress="hidden")
        wire_export(ctx, self.btn, self.file, [],
                    lambda s: export_compare(s.analysis, s.upload, need_comparison(s)))
