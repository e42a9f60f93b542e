"""A ready-made slide deck: from photos to a talk on how a ViT sees (PowerPoint or PDF).

One idea a slide, in the order a talk takes, for every image:

1. the image and the prediction;            5. attention rollout;
2. patches and the token sequence;          6. class-specific relevance (Chefer relevance
3. the heads of the last layer;                and gated LRP, the most faithful single pass);
4. [class] attention across the layers;     7. how faithful the maps are on this image
                                               (deletion / insertion curves, plain words);

then a "Step inside" section about the photo (:mod:`~vit_demo.present.inside`): one of its patches
walked through the model, four slides of the step-through's pictures with this photo's numbers;

then, once per deck: a comparison of the images (several images only; each map on its own
scale unless ``shared_scale``), the atlas of the model's most important heads (when an atlas,
:mod:`vit_demo.evaluate.atlas`, is given), the check against timm (verdict and numbers) and a closing slide
on the model (config, parameters, the weights by file name: no folder of this computer appears
in a slide or a note). Every slide has a title, a full-resolution rendered figure and speaker
notes of two to four sentences that name the paper the figure comes from.

Layers and heads are counted from 1 on the slides ("layer 12 of 12").

:func:`build_slides` computes everything and returns plain :class:`~vit_demo.present.slides.Slide`
records, reporting "slide 3 of 9" (:mod:`vit_demo.progress`) as it goes;
:mod:`vit_demo.present.slides` lays them out as PowerPoint (python-pptx, 16:9, editable, one
PowerPoint section per image) or PDF (the same layout, for people without PowerPoint). The
``deck`` command is :mod:`vit_demo.cli.deck`.

Speed (one image, 2 cores): only the maps a slide shows or scores are computed
(:data:`SCORED`: 6 methods, not the registry's 9 single-pass ones), every figure is drawn
once (:func:`vit_demo.viz.render_png`), and the PDF embeds the pictures at 150 dpi.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image, ImageDraw

from .. import methods, viz
from ..analysis import Analysis, analyze, class_maps
from ..checkpoints.verify import DEFAULT_TOL, compare_one, timm_twin, verdict
from ..evaluate.curves import RANDOM_SEEDS, auc_table, method_curves
from ..evaluate.faithfulness import method_maps
from ..methods.attention import cls_attention, head_maps, many_readers, reader
from ..methods.rollout import rollout
from ..progress import part
from ..viz.charts import faithfulness_figure, model_card_figure, shorten, timm_check_figure
from ..viz.export import render_png
from ..viz.panels import MAX_PANELS, Panel, images_figure
from . import inside
from .atlas_report import Crops
from .slides import Slide

PER_IMAGE = 7 + inside.SLIDES  # slides of each image: its own section, then its "Step inside" section
SCORED = ("attention", "rollout", "grad-rollout", "chefer", "lrp", "lrp-gated")  # on the faithfulness slide
SHOWN = ("chefer", "lrp-gated")  # the relevance slide's maps
# the expected cost of each slide, for the progress bar: one image's seven, then comparison, timm, model
IMAGE_COSTS = (1, 2, 2, 3, 2, 3, 9, *inside.COSTS)
COMPARISON_COST, TIMM_COST, MODEL_COST, ATLAS_COST = 2, 3, 1, 1
ATLAS_HEADS, ATLAS_CROPS = 4, 6  # the atlas slide: the most important heads, each with its best patches

PAPERS = {
    "vit": "Dosovitskiy et al., 'An Image is Worth 16x16 Words' (ICLR 2021)",
    "deit": "Touvron et al., 'Training data-efficient image transformers' (ICML 2021)",
    "rollout": "Abnar & Zuidema, 'Quantifying Attention Flow in Transformers' (ACL 2020)",
    "chefer": "Chefer, Gur & Wolf, 'Transformer Interpretability Beyond Attention Visualization' (CVPR 2021)",
    "chefer2": "Chefer, Gur & Wolf, 'Generic Attention-model Explainability' (ICCV 2021)",
    "lrp": "Ali et al., 'XAI for Transformers: Better Explanations through Conservative Propagation' (ICML 2022)",
    "rise": "Petsiuk et al., 'RISE' (BMVC 2018)",
    "michel": "Michel, Levy & Neubig, 'Are Sixteen Heads Really Better than One?' (NeurIPS 2019)",
    "vaswani": inside.VASWANI, "lens": inside.LENS,
}


# ----------------------------------------------------------------------------- numbers for one image


def faithfulness_scores(model, x: torch.Tensor, target: int, maps: dict[str, Any] | None = None,
                        seeds: Sequence[int] = RANDOM_SEEDS) -> dict[str, dict[str, Any]]:
    """Deletion / insertion AUC (Petsiuk et al. 2018) of each method on ONE input ``x`` [1, 3, h, w],
    tracking the probability of ``target``, with the protocol of :mod:`vit_demo.evaluate.curves`.

    ``maps``: ``{method: [gh, gw] map}`` already computed (default: the single-pass methods,
    :func:`vit_demo.methods.single_pass`, computed here; the slow ones only when passed in);
    ``random``: the mean over random patch orders, one per seed, drawn as
    :func:`vit_demo.evaluate.faithfulness.evaluate` draws them. All orders go through the model
    in one batch, the clean and the blank input (the curves' ends) once.
    """
    if not seeds:
        raise ValueError("the random baseline needs at least one seed")
    if maps is None:
        names = methods.single_pass()
        maps = dict(zip(names, (m[0] for m in method_maps(model, x, torch.tensor([int(target)]), names))))
    saliency = [torch.as_tensor(np.asarray(m), dtype=torch.float32)[None] for m in maps.values()]
    t = torch.tensor([int(target)], device=x.device)
    d, i = method_curves(model, x, saliency, t, [torch.Generator().manual_seed(s) for s in seeds])
    return auc_table(list(maps), d[0].double().cpu(), i[0].double().cpu())


# ----------------------------------------------------------------------------- pictures for slides


def display_name(stem: str) -> str:
    """A file stem as a speaker would say it: ``n02123045_tabby`` -> ``tabby``, ``my_cat`` -> ``my cat``."""
    parts = stem.split("_", 1)
    if len(parts) == 2 and len(parts[0]) == 9 and parts[0][0] == "n" and parts[0][1:].isdigit():
        stem = parts[1]
    return stem.replace("_", " ").strip() or "image"


def _render(fig: Figure, width_px: int) -> Image.Image:
    """``fig`` as a picture ``width_px`` wide, margin trimmed, its PNG bytes kept for the
    PowerPoint file (fast zlib: decks hold many large pictures)."""
    return render_png(fig, width_px, compress_level=2)


def _narrow(fig: Figure, width_in: float) -> Figure:
    """The same figure laid out narrower, so its text reads larger on a slide."""
    fig.set_size_inches(width_in, fig.get_figheight())
    return fig


def _big_picture(picture: Image.Image, width_px: int) -> Image.Image:
    """The model-input picture enlarged for a slide (it is only 224 px)."""
    s = max(1, width_px // (2 * picture.width))
    return picture.convert("RGB").resize((picture.width * s, picture.height * s), Image.Resampling.LANCZOS)


# ----------------------------------------------------------------------------- slides


def _pct(p: float) -> str:
    return f"{p * 100:.1f}%"


def _title(name: str) -> str:
    return methods.get(name).title if name in methods.names() else name


def prediction_slide(analysis: Analysis, lm, name: str, width_px: int) -> Slide:
    """The picture the model sees and its top five classes (titled by the answer, not the file)."""
    top, pic = analysis.topk(5), analysis.picture
    return Slide(
        f"What the model sees: “{shorten(top[0]['label'], 40)}”",
        [_big_picture(pic, width_px), _render(_narrow(viz.topk_figure(top, title=None), 6.0), width_px // 2)],
        f"This is the picture the model actually sees: resized and centre-cropped to {pic.width}x{pic.height}. "
        f"{lm.name} predicts '{top[0]['label']}' with {_pct(top[0]['prob'])}; the bars show its top five classes. "
        f"The model is a Vision Transformer ({PAPERS['vit']})"
        + (f", here trained as in {PAPERS['deit']}." if _is_deit(lm) else "."),
        f"Image: {name}", f"Image: {name}  ·  predicted: {top[0]['label']} ({_pct(top[0]['prob'])})",
        {"predictions": top, "x": analysis.x}, columns=[0.45, 0.55],
    )


def tokens_slide(analysis: Analysis, name: str, width_px: int) -> Slide:
    """The patch grid and the token sequence."""
    p, layout = analysis.patch_size, analysis.layout
    gh, gw = layout.grid
    return Slide(
        "From pixels to tokens",
        [_render(viz.patch_grid_figure(analysis.picture, p, layout.names(), title=" "), width_px)],
        f"The image is cut into {p}x{p}-pixel patches, a {gh}x{gw} grid of {gh * gw} patches, read left to right and "
        f"top to bottom. Each patch becomes one token; {readout_sentence(analysis)} This is the core idea of {PAPERS['vit']}: "
        "an image is a sequence of words.",
        f"Image: {name}", f"{gh * gw} patches + {layout.num_prefix} extra token(s) = {gh * gw + layout.num_prefix} "
                          f"tokens; {reader(layout)} {'give' if many_readers(layout) else 'collects'} the answer",
    )


def readout_sentence(analysis: Analysis) -> str:
    """Where the answer is read, for the tokens slide: the [class] token, an attention pool, or the patches' mean."""
    if analysis.layout.probe is not None:
        return ("no [class] token: an attention-pool head, a learned query, reads the final tokens, and the classifier "
                "reads what it gathers.")
    if analysis.layout.cls_index is None:
        return ("no [class] token here: the classifier reads the mean of the patch tokens' final states, so every patch "
                "speaks for itself.")
    return ("a learned [class] token goes first: it gathers what the other tokens say, and its final state is all the "
            "classifier reads.")


def heads_slide(analysis: Analysis, name: str, width_px: int, cmap: str) -> Slide:
    """The [class] attention of every head of the last layer."""
    L, H, layout = analysis.depth, analysis.num_heads, analysis.layout
    heads = head_maps(analysis.attentions, layout, L - 1)[0]
    return Slide(
        f"The {H} heads of the last layer",
        [_render(viz.heads_figure(analysis.picture, heads, cmap=cmap, layer=L - 1), width_px)],
        f"Each attention head of layer {L} of {L} looks at the image its own way: here is where {reader(layout)} "
        f"look{'' if many_readers(layout) else 's'}, "
        f"one panel per head, each scaled to its own range. Heads specialise, some on the object, some on the "
        f"background, as observed in {PAPERS['vit']}.",
        f"Image: {name}", f"Where {reader(layout)} look{'' if many_readers(layout) else 's'}, layer {L} of {L}, "
                          "head by head (bright = more attention)",
    )


def top_share(attention: torch.Tensor) -> float:
    """The share of one map's attention on its top tenth of the patches (0.1: spread evenly)."""
    flat = attention.flatten().float().clamp_min(0)
    k = max(1, round(flat.numel() / 10))
    return float(flat.topk(k).values.sum() / flat.sum().clamp_min(1e-12))


def spread_sentence(maps: list[torch.Tensor]) -> str:
    """What these maps (first layer to last) show about where attention gathers, read off them."""
    first, last = top_share(maps[0]), top_share(maps[-1])
    said = (f"The top tenth of the patches holds {first:.0%} of the attention in layer 1 and {last:.0%} in layer "
            f"{len(maps)}")
    if last > first + 0.1:
        return said + ": the later layers concentrate on a few patches."
    if first > last + 0.1:
        return said + ": here the first layers are the more concentrated."
    return said + ": in this picture the layers spread their attention alike."


def layers_slide(analysis: Analysis, name: str, width_px: int, cmap: str) -> Slide:
    """The [class] attention of every layer, heads averaged."""
    L, layout = analysis.depth, analysis.layout
    per_layer = {f"layer {i + 1}": cls_attention(analysis.attentions, layout, i)[0] for i in range(L)}
    return Slide(
        "Attention across the layers",
        [_render(viz.compare_figure(analysis.picture, per_layer, cmap=cmap, show_input=False, max_cols=min(6, L)), width_px)],
        f"The attention of {reader(layout)}, averaged over heads, in every layer from the first to the last. "
        f"{spread_sentence(list(per_layer.values()))} Raw attention of one layer ignores how information "
        f"mixes across layers, which is why rollout was proposed ({PAPERS['rollout']}).",
        f"Image: {name}", f"Where {reader(layout)} look{'' if many_readers(layout) else 's'}, layer 1 to layer {L} "
                          "(mean of the heads, each map its own scale)",
    )


def rollout_slide(analysis: Analysis, name: str, width_px: int, cmap: str, roll: torch.Tensor) -> Slide:
    """Attention rollout through all the layers."""
    who = reader(analysis.layout)
    return Slide(
        "Attention rollout",
        [_render(viz.heatmap_figure(analysis.picture, roll, cmap=cmap, label=f"rollout: share of the input of {who}",
                                    show_input=True), width_px)],
        f"Rollout multiplies the attention of all {analysis.depth} layers, with the skip connection added as an identity, to "
        f"follow how much each input patch flows into {who} ({PAPERS['rollout']}). It is class-agnostic: "
        "it shows where the model looks, not why it chose this class.",
        f"Image: {name}", "Where information flows from, all layers together; it does not say which class it supports",
    )


def relevance_slide(analysis: Analysis, lm, name: str, cls: int, width_px: int, cmap: str, maps: dict[str, Any]) -> Slide:
    """Class-specific relevance for ``cls``: Chefer relevance and gated LRP beside the picture."""
    cls_name = lm.labels[cls]
    explained = f"'{cls_name}' ({_pct(float(analysis.probs[cls]))})"
    shown = {_title(n): maps[n] for n in SHOWN}
    fig = viz.compare_figure(analysis.picture, shown, cmap=cmap, show_input=True)
    return Slide(
        f"Why “{shorten(cls_name, 28)}”? Where the evidence is",
        [_render(fig, width_px)],
        f"Relevance follows the class score back to the patches, so it explains {explained} and no other class. Chefer "
        f"relevance weights each head's attention by the gradient of the class score, block by block ({PAPERS['chefer2']}; "
        f"{PAPERS['chefer']}); gated LRP keeps the patches whose pixels carry the score (CP-LRP, {PAPERS['lrp']}) where "
        "that class-relevant attention flows from. Bright patches pushed the score up; dark ones did not.",
        f"Image: {name}", f"Bright = patches that made the model say {explained}; the maps explain this class only",
    )


def faithfulness_slide(analysis: Analysis, lm, name: str, cls: int, width_px: int, scores: dict[str, dict[str, Any]]) -> Slide:
    """Every scored map's deletion / insertion curves on this image, and what they mean in words."""
    cls_name = lm.labels[cls]
    names = [n for n in scores if n != "random"]
    best = min(names, key=lambda n: scores[n]["deletion_auc"])
    gh = analysis.layout.grid[0]
    k = max(1, gh // 2)  # the curve's point with about half of the patches hidden
    d, r = scores[best]["deletion_curve"], scores["random"]["deletion_curve"]
    hidden = f"{k / gh * 100:.0f}%"
    b, rnd = scores[best], scores["random"]
    fig = faithfulness_figure(scores, {n: _title(n) for n in names}, highlight=SHOWN)
    return Slide(
        "Can we trust the maps? Hide what they point at",
        [_render(fig, width_px)],
        f"A map is faithful when hiding the patches it ranks highest makes the model lose the class fast, and showing them "
        f"first brings it back fast ({PAPERS['rise']}). On this image {_title(best)} does best: hiding its top {hidden} "
        f"of the patches drops '{cls_name}' from {_pct(d[0])} to {_pct(d[k])}, against {_pct(r[k])} for as many patches "
        f"hidden at random. The areas under the curves are {b['deletion_auc']:.3f} for deletion (random "
        f"{rnd['deletion_auc']:.3f}; lower is better) and {b['insertion_auc']:.3f} for insertion (random "
        f"{rnd['insertion_auc']:.3f}; higher is better).",
        f"Image: {name}", f"Hide the {hidden} of the patches {_title(best)} ranks highest: '{shorten(cls_name, 24)}' "
                          f"falls from {_pct(d[0])} to {_pct(d[k])}; hide {hidden} at random: {_pct(r[k])}",
        {"faithfulness": scores, "target": cls, "best": best},
    )


def iter_image_slides(lm, image: Image.Image, name: str, target: int | None = None, width_px: int = 2400,
                      cmap: str = "inferno", seeds: Sequence[int] = RANDOM_SEEDS, analysis: Analysis | None = None,
                      step: dict | None = None) -> Iterator[Slide]:
    """The slides of one image, one at a time (the work of each is done when it is asked for, so
    that progress can follow it): its section's seven, then its "Step inside" section's four
    (``step``: the patch, layer, head of :func:`~vit_demo.present.inside.inside_slides`). The
    faithfulness slide's meta holds the image's :class:`~vit_demo.viz.panels.Panel` (for the
    comparison slide) under ``"panel"``. ``analysis``: the image's analysis by ``lm`` if the
    caller has it (the app: its cached maps are reused), else it is made here."""
    a = analysis if analysis is not None else analyze(lm, image)
    cls = a.top1 if target is None else int(target)
    roll = rollout(a.attentions, a.layout)[0]
    yield prediction_slide(a, lm, name, width_px)
    yield tokens_slide(a, name, width_px)
    yield heads_slide(a, name, width_px, cmap)
    yield layers_slide(a, name, width_px, cmap)
    yield rollout_slide(a, name, width_px, cmap, roll)
    scored = [n for n in SCORED if n in methods.names(slow=False)]
    maps = class_maps(a, lm, cls, [n for n in scored if methods.get(n).class_specific])
    yield relevance_slide(a, lm, name, cls, width_px, cmap, maps)
    last = cls_attention(a.attentions, a.layout, a.depth - 1)[0]
    known = {"attention": last, "rollout": roll, **maps}
    scores = faithfulness_scores(lm.model, a.x, cls, {n: known[n] for n in scored}, seeds)
    slide = faithfulness_slide(a, lm, name, cls, width_px, scores)
    slide.meta["panel"] = Panel(a.picture, maps["chefer"], a.topk(1), lm.name, cls)
    yield slide
    yield from inside.inside_slides(lm, a, name, width_px, step)


def comparison_slide(panels: Sequence[Panel], names: Sequence[str], width_px: int, cmap: str,
                     shared_scale: bool = False) -> Slide:
    """Relevance of up to four images side by side: each map on its own scale (one hot spot
    would darken every other map), or on ONE scale with ``shared_scale``; the slide says which."""
    fig = images_figure(panels[:MAX_PANELS], names[:MAX_PANELS], None, "relevance", cmap, show_inputs=False,
                        shared_scale=shared_scale)
    more = f" (the first {MAX_PANELS} of {len(panels)})" if len(panels) > MAX_PANELS else ""
    scale = ("on one colour scale, so a brighter spot means more relevance" if shared_scale else
             "each map on its own scale, so every image shows where its own evidence is (brightness is not comparable "
             "across images)")
    return Slide(
        "The images side by side", [_render(fig, width_px)],
        f"The same method for every image{more}: class-specific relevance ({PAPERS['chefer2']}), {scale}. Under each "
        "map is the model's prediction. Compare where the evidence sits: on the object, on context, or spread out.",
        "Comparison", "Relevance for the class explained in each section, " +
                      ("one colour scale for all" if shared_scale else "each map scaled to its own range"),
    )


def atlas_rows_picture(rows: Sequence[tuple[str, str, list[Image.Image]]], width_px: int) -> Image.Image:
    """One row per head: its name and sentence on the left, its best patches (crops) on the right."""
    tile = max(24, int(width_px * 0.58) // ATLAS_CROPS - width_px // 160)
    gap, row_h = width_px // 160, tile + width_px // 60
    img = Image.new("RGB", (width_px, row_h * len(rows)), "white")
    draw = ImageDraw.Draw(img)
    big, small = viz.text_font(max(10, width_px // 60), bold=True), viz.text_font(max(9, width_px // 75))
    for i, (name, sentence, crops) in enumerate(rows):
        y = i * row_h
        draw.text((0, y + tile // 8), name, fill="#222222", font=big)
        for j, line in enumerate(shorten_lines(sentence, 40, 3)):
            draw.text((0, y + tile // 8 + width_px // 45 + j * width_px // 62), line, fill="#555555", font=small)
        x = width_px - ATLAS_CROPS * (tile + gap)
        for c in crops[:ATLAS_CROPS]:
            img.paste(c.convert("RGB").resize((tile, tile), Image.Resampling.NEAREST), (x, y))
            x += tile + gap
    return img


def shorten_lines(text: str, width: int, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of about ``width`` characters (the last one cut with "…")."""
    out = textwrap.wrap(text, width)
    return out[: lines - 1] + [shorten(" ".join(out[lines - 1 :]), width)] if len(out) > lines else out


def atlas_slide(lm, atlas: dict[str, Any], width_px: int) -> Slide:
    """The atlas's most important heads (:func:`vit_demo.evaluate.atlas.atlas`'s result for ``lm``):
    each one's sentence, the fall of the true class's logit when it is removed, its best patches
    over the folder as crops with the patch outlined (pictures that cannot be read are left out)."""
    heads = sorted(atlas["heads"], key=lambda h: -h["importance"])[:ATLAS_HEADS]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        crops = Crops(Path(tmp), lm.data_config, lm.model.cfg.patch_size)
        for h in heads:
            rels = [crops(t["path"], t["row"], t["col"]) for t in h["top"][:ATLAS_CROPS]]
            pics = [Image.open(Path(tmp) / r).convert("RGB") for r in rels if r is not None]
            rows.append((f"Layer {h['layer']}, head {h['head']}  ·  logit {-h['importance']:+.2f}", h["summary"], pics))
    n, depth = atlas["images"], atlas.get("layers", lm.model.cfg.depth)
    said = "; ".join(f"layer {h['layer']} head {h['head']} {h['summary']}" for h in heads[:2])
    return Slide(
        "The heads that matter most",
        [atlas_rows_picture(rows, width_px)],
        f"Over {n} pictures, each of the {len(atlas['heads'])} heads of {lm.name} was removed in turn (its output replaced "
        f"by its mean over the pictures, as in {PAPERS['michel']}), and the true class's logit fell most for these "
        f"{len(heads)}. Beside each, the patches its [class] row weights most, one per picture, outlined: {said}. "
        "Most heads can go with little loss; a few carry the decision.",
        "The model", f"The {len(heads)} of {len(atlas['heads'])} heads ({depth} layers) whose removal costs the most, "
                     f"over {n} pictures; beside each, where it looks",
        {"heads": [(h["layer"], h["head"]) for h in heads]},
    )


def timm_slide(lm, xs: Sequence[torch.Tensor], names: Sequence[str], weights: str | None, width_px: int,
               reference: Any = None) -> Slide:
    """The check against timm (``reference``: timm's model on the same weights, built here when None),
    like with like: both models in float32, whatever precision the rest of the deck ran the model in
    (a bf16 model against timm's fp32 would differ by bf16's rounding, not by a bug); the title, the
    subtitle and the notes say so."""
    tm = reference if reference is not None else timm_twin(lm, weights)
    checks = [compare_one(lm.model, tm, x, repeats=1, precision="fp32") for x in xs]
    worst = max(checks, key=lambda c: c["max_abs_logit_diff"])
    sentence = verdict(worst, DEFAULT_TOL)
    ok = sentence.startswith("Identical")
    attn = max(max(c["layer_attn_max_diff"]) for c in checks)
    arch = lm.timm_name or "VisionTransformer, built from the stored config,"
    rest = (f" (the other slides ran {lm.name} in {lm.precision}, for speed: its rounding is no part of this check)"
            if lm.precision != "fp32" else "")
    return Slide(
        "Checked against timm, both in fp32: " + ("identical" if ok else "MISMATCH"),
        [_render(timm_check_figure(checks, names, DEFAULT_TOL), width_px)],
        f"Everything in this talk comes from a Vision Transformer written from scratch. To trust it, we run timm's "
        f"reference {arch} on the same weights and the same {len(xs)} image(s), both models in float32{rest}: the "
        f"largest logit difference is {worst['max_abs_logit_diff']:.1e} and the largest attention difference "
        f"{attn:.1e}, against a tolerance of {DEFAULT_TOL:g}. {sentence} (architecture: {PAPERS['vit']})",
        "The model", sentence, {"checks": checks, "passed": ok, "precision": "fp32", "verdict": sentence},
    )


def closing_slide(lm, width_px: int) -> Slide:
    """The model's facts; the weights named by their file name, never a folder of this computer."""
    cfg = lm.model.cfg
    params = lm.model.num_params
    source = lm.public_source
    rows = [
        ("model", lm.name),
        ("architecture", f"ViT: {cfg.depth} layers, {cfg.num_heads} heads, width {cfg.embed_dim}"),
        ("patches", f"{cfg.patch_size}x{cfg.patch_size} px on a {cfg.img_size[0]}x{cfg.img_size[1]} input"),
        ("tokens", f"{cfg.grid_size[0] * cfg.grid_size[1]} patches + {cfg.num_prefix_tokens} prefix"),
        ("MLP width", f"{int(cfg.embed_dim * cfg.mlp_ratio)}"),
        ("parameters", f"{params:,} ({params / 1e6:.1f} M)"),
        ("classes", f"{cfg.num_classes:,}"),
        ("weights", shorten(source, 60)),
        ("reference", f"timm {lm.timm_name}" if lm.timm_name else "none"),
    ]
    return Slide(
        "The model", [_render(model_card_figure(rows), width_px)],
        f"{lm.name} has {params / 1e6:.1f} million parameters in {cfg.depth} transformer blocks of {cfg.num_heads} heads. "
        f"The code follows {PAPERS['vit']} line by line; the weights come from {source}. "
        + (f"The DeiT recipe ({PAPERS['deit']}) is what lets a model this small learn from ImageNet alone." if _is_deit(lm)
           else f"Its {cfg.num_classes:,}-way classifier reads {readout_of(cfg)}."),
        "The model", f"{params / 1e6:.1f} M parameters  ·  {cfg.depth} layers x {cfg.num_heads} heads",
        {"rows": rows},
    )


def readout_of(cfg: Any) -> str:
    """What a model's classifier reads, from its config (the model card has no analysis at hand)."""
    if cfg.global_pool == "map":
        return "what its attention-pool head gathers from the final tokens"
    if cfg.class_token and cfg.global_pool == "token":
        return "the final state of the [class] token"
    pool = {"avg": "mean", "max": "maximum", "avgmax": "mean and maximum"}.get(cfg.global_pool, "pooled features")
    return f"the {pool} of the final patch tokens"


def _is_deit(lm) -> bool:
    return "deit" in f"{lm.timm_name or ''} {lm.name}".lower()


def _weights_file(lm, weights: str | None) -> str | None:
    if weights:
        return str(weights)
    return lm.source[5:] if lm.source.startswith("file ") else None


def slide_costs(images: int, atlas: bool = False) -> list[int]:
    """Each slide's expected share of the work, in deck order (for the progress bar)."""
    return [*IMAGE_COSTS * images, *([COMPARISON_COST] if images > 1 else []), *([ATLAS_COST] if atlas else []),
            TIMM_COST, MODEL_COST]


class SlideProgress:
    """The deck's progress bar: slide k's part of it is in proportion to its expected cost, and
    labelled "slide k of n"; the work inside a slide (forward passes) moves within its part."""

    def __init__(self, images: int, atlas: bool = False) -> None:
        costs = slide_costs(images, atlas)
        self.n, self.k = len(costs), 0
        self.bounds = np.concatenate([[0.0], np.cumsum(costs) / sum(costs)])

    @contextmanager
    def slide(self) -> Iterator[None]:
        k = self.k
        self.k += 1
        with part(float(self.bounds[k]), float(self.bounds[k + 1]), f"slide {k + 1} of {self.n}"):
            yield


def build_slides(lm, images: Sequence[Image.Image], names: Sequence[str], target: int | None = None,
                 weights: str | None = None, width_px: int = 2400, cmap: str = "inferno",
                 seeds: Sequence[int] = RANDOM_SEEDS, shared_scale: bool = False, reference: Any = None,
                 analyses: Sequence[Analysis | None] | None = None, atlas: dict[str, Any] | None = None,
                 step: dict | None = None) -> list[Slide]:
    """Every slide of the deck, in talk order (see the module docstring), reporting "slide k of
    n" to :func:`vit_demo.progress.reporting`. ``width_px``: width of the rendered figures;
    ``seeds``: one random patch order per seed for the faithfulness baseline; ``shared_scale``:
    the comparison slide's maps on one colour scale; ``reference``: timm's model on the same
    weights, if the caller has it (else it is built from ``weights``); ``analyses``: each image's
    analysis by ``lm``, where the caller has it; ``atlas``: an atlas of ``lm``
    (:func:`vit_demo.evaluate.atlas.atlas`), for the slide of its most important heads; ``step``: the
    "Step inside" walk's ``patch`` (row, col), ``layer``, ``head`` (default: the readout's patch, the
    last layer, head 0)."""
    if not images:
        raise ValueError("a deck needs at least one image")
    viz.check_cmap(cmap)
    bar = SlideProgress(len(images), atlas is not None)
    slides: list[Slide] = []
    for img, name, a in zip(images, names, analyses or [None] * len(images)):
        todo = iter_image_slides(lm, img, name, target, width_px, cmap, seeds, a, step)
        for _ in range(PER_IMAGE):
            with bar.slide():
                slides.append(next(todo))
    panels = [s.meta.pop("panel") for s in slides if "panel" in s.meta]  # each image's relevance
    if len(images) > 1:
        with bar.slide():
            slides.append(comparison_slide(panels, list(names), width_px, cmap, shared_scale))
    if atlas is not None:
        with bar.slide():
            slides.append(atlas_slide(lm, atlas, width_px))
    xs = [s.meta.pop("x") for s in slides if "x" in s.meta]  # each image's model input
    with bar.slide():
        slides.append(timm_slide(lm, xs, names, _weights_file(lm, weights), width_px, reference))
    with bar.slide():
        slides.append(closing_slide(lm, width_px))
    return slides
