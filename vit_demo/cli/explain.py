"""``python -m vit_demo explain``: explanation figures and the numbers behind them.

For every image: one figure (PNG at ``--width`` pixels, SVG or PDF) and one JSON file with
the numbers drawn in it (the map(s) as nested lists, the predictions, the class explained and
every setting), both in ``--out``. Files are named ``STEM_METHOD[_TAG].EXT``, where the tag
records the non-default settings (``L5_H2``, ``q45``, ``c207``...) so that runs with other
settings do not overwrite each other.

``--method`` is any registered method (:mod:`vit_demo.methods`; ``attention`` and ``rollout``
take their own settings) or one of the figures that are not maps of one class: the patch grid,
every head, the mean attention distance, the position embeddings, and the animation.

Bad images are reported on stderr, one line each; the others are still explained, and the
exit status is 1 at the end. Bad settings stop before any work with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .. import methods, viz
from ..images import ImageError, find_images, load_image
from ..labels import check_k, topk
from ..methods.attention import (
    captured,
    cls_attention,
    head_maps,
    mean_attention_distance,
    pos_embed_similarity,
    query_attention,
    query_index,
)
from ..methods.rollout import rollout
from ..preprocess import preprocess
from ..present.animate import animate_image
from .common import UserError, add_model_args, add_output, load_from_args, method_arg, parse_class, say_precision

FIGURES = ("patch-grid", "heads", "distance", "pos-embed", "animation")  # figures that are not one map
ANIMATION_FORMATS = ("gif", "mp4")  # --method animation (vit_demo.present.animate); the others write figures


def choices() -> list[str]:
    """What ``--method`` takes: every registered method, then the other figures."""
    return [*methods.names(), *FIGURES]


def class_specific(method: str) -> bool:
    return method in methods.names() and methods.get(method).class_specific


def register(sub: Any) -> None:
    """Add the ``explain`` sub-command to the main parser."""
    p = sub.add_parser(
        "explain",
        help="explanation figures (attention, rollout, Chefer, heads, ...) and their numbers as JSON",
        description="Write one figure and one JSON of the numbers behind it per image into --out.",
    )
    p.add_argument("images", nargs="*", help="image files or folders (not needed for --method pos-embed)")
    add_model_args(p, precision="auto")
    p.add_argument("--method", required=True, choices=choices(), type=method_arg(choices()),
                   metavar="{" + ",".join(choices()) + "}")
    p.add_argument(
        "--layer",
        help="the layer's INDEX, counted from 0 as in PyTorch (negative counts from the end; default the last): "
             "--layer 11 is DeiT-Tiny's last layer, which figures and the app call 'layer 12 of 12'; 'all' with "
             "--method heads: every layer",
    )
    p.add_argument("--head", type=int, help="one head by its INDEX, from 0 (figures say 'head 1' for --head 0; "
                                            "default: the mean over heads)")
    p.add_argument("--query-patch", type=int, help="a patch (row-major index) as the query instead of [class]")
    p.add_argument("--class", dest="target", help="class to explain: index or label (default the top-1 prediction)")
    p.add_argument("--fusion", default="mean", choices=["mean", "max", "min"], help="rollout: how heads combine")
    p.add_argument("--discard", type=float, default=0.0, help="rollout: fraction of lowest attention dropped, [0, 1)")
    p.add_argument("--start-layer", type=int, default=0,
                   help="rollout: the INDEX (from 0) of the first layer multiplied in (figures count from 1)")
    p.add_argument("--cmap", default="inferno", help="any matplotlib colormap (default inferno)")
    p.add_argument("--alpha", type=float, default=0.6, help="heat map opacity over the picture, 0..1")
    p.add_argument("--blocky", action="store_true", help="one flat square per patch instead of smooth upsampling")
    p.add_argument("--format", choices=["png", "svg", "pdf", *ANIMATION_FORMATS],
                   help="png (default), svg or pdf; gif (default) or mp4 for --method animation")
    p.add_argument("--width", type=int, help="PNG width in pixels (default 2400; animations 960 GIF, 1280 MP4)")
    p.add_argument("--separate", action="store_true", help="animation: one file per clip instead of side by side")
    p.add_argument("--topk", type=int, default=5, help="predictions listed in the JSON")
    add_output(p, "--out", "folder", required=True, help="output folder (created if missing)")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- settings


def _layer(args: argparse.Namespace, depth: int, name: str) -> int | str:
    """--layer checked: a layer index (default the last), or "all" for --method heads."""
    if args.layer is None:
        return depth - 1
    if args.layer.strip().lower() == "all":
        if args.method != "heads":
            raise UserError("--layer all is for --method heads")
        return "all"
    try:
        layer = int(args.layer)
    except ValueError:
        raise UserError(f"--layer {args.layer!r}: give a layer number (0..{depth - 1}) or 'all'") from None
    if not -depth <= layer < depth:
        raise UserError(f"--layer {layer} is outside 0..{depth - 1} ({name} has {depth} layers)")
    return layer % depth


def _check_ranges(args: argparse.Namespace, lm, grid: tuple[int, int]) -> None:
    cfg = lm.model.cfg
    gh, gw = grid
    if args.head is not None and not 0 <= args.head < cfg.num_heads:
        raise UserError(f"--head {args.head} is outside 0..{cfg.num_heads - 1} ({lm.name} has {cfg.num_heads} heads)")
    if args.query_patch is not None and not 0 <= args.query_patch < gh * gw:
        raise UserError(f"--query-patch {args.query_patch} is outside the {gh}x{gw} grid (0..{gh * gw - 1})")
    if not 0 <= args.discard < 1:
        raise UserError(f"--discard must be in [0, 1), got {args.discard}")
    if not 0 <= args.start_layer < cfg.depth:
        raise UserError(f"--start-layer {args.start_layer} is outside 0..{cfg.depth - 1}")
    if not 0 <= args.alpha <= 1:
        raise UserError(f"--alpha must be in [0, 1], got {args.alpha}")
    try:
        viz.check_cmap(args.cmap)
    except ValueError as e:
        raise UserError(f"--cmap: {e}") from None


def _output(args: argparse.Namespace) -> tuple[str, int | None]:
    """(format, width) checked against the method: animations are GIF/MP4, figures PNG/SVG/PDF."""
    animation = args.method == "animation"
    fmt = args.format or ("gif" if animation else "png")
    if animation != (fmt in ANIMATION_FORMATS):
        raise UserError(f"--format {fmt} is for {'figures' if animation else '--method animation'}; "
                        f"use {' or '.join(ANIMATION_FORMATS) if animation else 'png, svg or pdf'}")
    width = args.width or (None if animation else 2400)
    if width is not None and width < 200:
        raise UserError(f"--width {width} is too small (at least 200 px; 2000+ for slides)")
    return fmt, width


def _target(args: argparse.Namespace, lm) -> int | None:
    """--class checked, and that a class-specific method has class scores to explain."""
    headless = lm.model.cfg.num_classes == 0
    if args.target is not None and headless:
        raise UserError(f"--class: {lm.name} is headless (no classifier)")
    if class_specific(args.method) and headless:
        raise UserError(f"--method {args.method} needs class scores; {lm.name} is headless (no classifier)")
    return None if args.target is None else parse_class(args.target, lm.labels)


APPLIES = {  # flag -> the methods it applies to (others ignore it, with a note)
    "--query-patch": ("attention", "heads", "patch-grid"),
    "--head": ("attention", "animation"),
    "--layer": ("attention", "heads"),
}


def _note_ignored(args: argparse.Namespace) -> None:
    m = args.method
    ignored = [flag for flag, where in APPLIES.items() if getattr(args, flag[2:].replace("-", "_")) is not None
               and m not in where]
    if args.target is not None and not (class_specific(m) or m == "animation"):
        ignored.insert(0, "--class")
    if m != "rollout" and (args.fusion != "mean" or args.discard or args.start_layer):
        ignored.append("--fusion/--discard/--start-layer")
    if ignored:
        print(f"note: {', '.join(ignored)} do(es) not apply to --method {m}; ignored", file=sys.stderr)


def resolve_settings(args: argparse.Namespace, lm) -> dict[str, Any]:
    """Check every option against the model before any work; UserError on a bad one."""
    cfg, m = lm.model.cfg, args.method
    grid = tuple(s // cfg.patch_size for s in lm.data_config.input_size)
    layer = _layer(args, cfg.depth, lm.name)
    _check_ranges(args, lm, grid)
    fmt, width = _output(args)
    target = _target(args, lm)
    _note_ignored(args)
    return {
        "method": m,
        "layer": layer if m in APPLIES["--layer"] else None,
        "head": args.head if m in APPLIES["--head"] else None,
        "query_patch": args.query_patch if m in APPLIES["--query-patch"] else None,
        "class": target,
        "fusion": args.fusion if m == "rollout" else None,
        "discard": args.discard if m == "rollout" else None,
        "start_layer": args.start_layer if m == "rollout" else None,
        "cmap": args.cmap, "alpha": args.alpha, "smooth": not args.blocky,
        "format": fmt, "width": width,
        "separate": args.separate if m == "animation" else None,
        "topk": check_k(args.topk, cfg.num_classes, "--topk") if cfg.num_classes else args.topk,
        "patch_size": cfg.patch_size, "grid": grid, "depth": cfg.depth,
    }


def _tag(s: dict[str, Any]) -> str:
    """The part of the file name that records the non-default settings."""
    parts = []
    m = s["method"]
    if m == "attention":
        parts.append(f"L{s['layer']}")
        if s["head"] is not None:
            parts.append(f"H{s['head']}")
    elif m == "heads":
        parts.append("all" if s["layer"] == "all" else f"L{s['layer']}")
    if s["query_patch"] is not None:
        parts.append(f"q{s['query_patch']}")
    if m == "rollout":
        if s["fusion"] != "mean":
            parts.append(s["fusion"])
        if s["discard"]:
            parts.append(f"d{s['discard']:g}")
        if s["start_layer"]:
            parts.append(f"s{s['start_layer']}")
    if class_specific(m) and s["class"] is not None:
        parts.append(f"c{s['class']}")
    return "_".join([m, *parts])


# ----------------------------------------------------------------------------- one image


def _record(lm, path: Path, s: dict[str, Any], out, logits: torch.Tensor | None, target: int | None) -> dict[str, Any]:
    """The JSON record's common part: the image, the model, the settings, the predictions and
    the class explained."""
    gh, gw = out.layout.grid
    method = s["method"]
    settings = {k: v for k, v in s.items() if k not in ("patch_size", "grid", "depth", "method") and v is not None}
    # "layer", "head", "start_layer": indices from 0, as the flags take them; "*_number": counted from 1, as figures say
    for key in ("layer", "head", "start_layer"):
        if isinstance(settings.get(key), int):
            settings[f"{key}_number"] = settings[key] + 1
    record: dict[str, Any] = {
        "image": str(path), "model": lm.name, "method": method, "precision": lm.precision,
        "settings": settings,
        "input_size": list(lm.data_config.input_size), "patch_size": s["patch_size"], "grid": [gh, gw],
        "tokens": out.layout.names(),
        "predictions": topk(logits.softmax(-1)[0].cpu(), s["topk"], lm.labels) if logits is not None else [],
    }
    if target is not None:
        record["target"] = {
            "index": target, "label": lm.labels[target], "prob": float(logits.softmax(-1)[0, target]),
            "source": "--class" if class_specific(method) and s["class"] is not None else "top-1 prediction",
        }
    record["class_specific"] = class_specific(method)
    return record


def _map(lm, x: torch.Tensor, out, s: dict[str, Any], target: int | None) -> tuple[torch.Tensor, str, str]:
    """(map [gh, gw], title, colour-bar label) of a registered method."""
    method, qp = s["method"], s["query_patch"]
    if method == "attention":
        if qp is None:
            m = cls_attention(out.attentions, out.layout, s["layer"], s["head"])
            query = ("the attention pool's query" if out.layout.probe is not None else
                     "[class]" if query_index(out.layout) is not None else "mean of the patch queries")
        else:
            m = query_attention(out.attentions, out.layout, s["layer"], qp, s["head"])
            query = f"patch {qp}"
        heads = "mean over heads" if s["head"] is None else f"head {s['head'] + 1}"
        return m[0], f"Attention of {query}, layer {s['layer'] + 1} of {s['depth']}, {heads}", "attention weight"
    if method == "rollout":
        m = rollout(out.attentions, out.layout, s["fusion"], s["discard"], s["start_layer"])
        title = f"{methods.get('rollout').title} ({s['fusion']} of heads"
        title += (f", {s['discard']:.0%} discarded" if s["discard"] else "")
        title += (f", from layer {s['start_layer'] + 1}" if s["start_layer"] else "") + ")"
        return m[0], title, "rollout"
    spec = methods.get(method)
    m = spec(lm.model, x, target)
    what = f" for '{lm.labels[target]}'" if spec.class_specific else ""
    return m[0], f"{spec.label}{what}", "relevance" if spec.class_specific else "value"


def _map_figure(lm, x, pic, out, s, target, caption, record):
    m, title, label = _map(lm, x, out, s, target)
    m = m.detach().float().cpu()
    record.update(map=m.tolist(), map_axes=["row", "col"], map_min=float(m.min()), map_max=float(m.max()),
                  display="colours span the map's own min..max")
    return viz.heatmap_figure(pic, m, title=title, label=label, show_input=True, mark=s["query_patch"],
                              caption=caption, cmap=s["cmap"], alpha=s["alpha"], smooth=s["smooth"])


def _heads_figure(lm, x, pic, out, s, target, caption, record):
    layer, qp = (None if s["layer"] == "all" else s["layer"]), s["query_patch"]
    maps = head_maps(out.attentions, out.layout, layer, qp)[0].detach().float().cpu()
    query = "[class]" if qp is None else f"patch {qp}"
    where = "every layer" if layer is None else f"layer {layer + 1} of {s['depth']}"
    record.update(maps=maps.tolist(), map_axes=(["layer"] if layer is None else []) + ["head", "row", "col"],
                  display="each panel's colours span its own min..max")
    return viz.heads_figure(pic, maps, title=f"Attention of {query} per head, {where}", layer=layer, mark=qp,
                            cmap=s["cmap"], alpha=s["alpha"], smooth=s["smooth"])


def _patch_grid_figure(lm, x, pic, out, s, target, caption, record):
    p, (gh, gw), P = s["patch_size"], out.layout.grid, out.layout.num_prefix
    record["num_tokens"] = P + gh * gw
    record["patches"] = [{"index": i, "row": i // gw, "col": i % gw,
                          "box": [(i % gw) * p, (i // gw) * p, (i % gw + 1) * p, (i // gw + 1) * p], "position": P + i}
                         for i in range(gh * gw)]
    return viz.patch_grid_figure(pic, p, out.layout.names(), highlight=s["query_patch"])


def _distance_figure(lm, x, pic, out, s, target, caption, record):
    p = s["patch_size"]
    d = mean_attention_distance(out.attentions, out.layout, p)[0].detach().float().cpu()
    ref = viz.uniform_attention_distance(out.layout.grid, p)
    record.update(distances_px=d.tolist(), distances_axes=["layer", "head"], uniform_reference_px=ref)
    return viz.distance_figure(d, title=f"Mean attention distance per head  ·  {Path(record['image']).name}",
                               reference=ref)


FIGURE_KINDS: dict[str, Callable[..., Any]] = {"heads": _heads_figure, "patch-grid": _patch_grid_figure,
                                               "distance": _distance_figure}


def explain_one(lm, path: Path, settings: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Any]:
    """Explain one image: write its figure and JSON into ``out_dir``; return the JSON record."""
    x, pic = preprocess(load_image(path), lm.data_config)
    x = x[None].to(lm.device)
    out = captured(lm.model, x)
    logits = out.logits if lm.model.cfg.num_classes > 0 else None
    target = None  # the class explained: --class for a class-specific method, else the top-1 (none when headless)
    if logits is not None:
        chosen = settings["class"] if class_specific(settings["method"]) else None
        target = chosen if chosen is not None else int(logits.argmax(-1)[0])
    record = _record(lm, path, settings, out, logits, target)
    caption = f"{path.name}  ·  {lm.name}"
    if record["predictions"]:
        top = record["predictions"][0]
        caption += f"  ·  predicted: {top['label']} ({top['prob'] * 100:.1f}%)"
    fig = FIGURE_KINDS.get(settings["method"], _map_figure)(lm, x, pic, out, settings, target, caption, record)
    name = f"{stem}_{_tag(settings)}"
    record["figure"] = viz.save_figure(fig, out_dir / f"{name}.{settings['format']}", width_px=settings["width"]).name
    write_json(out_dir / f"{name}.json", record)
    return record


def animate_one(lm, path: Path, settings: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Any]:
    """The attention-through-the-layers animation of one image (vit_demo.present.animate) + its JSON."""
    out = out_dir / f"{stem}_animation.{settings['format']}"
    rec = animate_image(lm, load_image(path), out, settings["format"], separate=settings["separate"],
                        head=settings["head"], target=settings["class"], cmap=settings["cmap"], alpha=settings["alpha"],
                        width=settings["width"])
    rec = {"image": str(path), "model": lm.name, "method": "animation",
           "settings": {k: v for k, v in settings.items()
                        if k not in ("patch_size", "grid", "depth", "method") and v is not None},
           **rec, "files": [Path(f).name for f in rec["files"]]}
    write_json(out_dir / f"{stem}_animation.json", rec)
    return rec


def explain_pos_embed(lm, settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The image-independent position-embedding similarity figure, once per model."""
    sim = pos_embed_similarity(lm.model).detach().float().cpu()
    gh, gw = sim.shape[1:]
    what = "Position embedding" if lm.model.pos_embed is not None else "Rotary position code"  # RoPE without one
    fig = viz.pos_embed_figure(sim, title=f"{what} similarity  ·  {lm.name}")
    stem = safe_stem(lm.name)
    fig_path = viz.save_figure(fig, out_dir / f"{stem}_pos-embed.{settings['format']}", width_px=settings["width"])
    record = {
        "model": lm.name, "method": "pos-embed", "settings": {"format": settings["format"], "width": settings["width"]},
        "grid": [gh, gw], "similarity": sim.tolist(), "similarity_axes": ["patch", "row", "col"],
        "display": "shared colour scale -1..1 (cosine similarity)", "figure": fig_path.name,
    }
    write_json(out_dir / f"{stem}_pos-embed.json", record)
    return record


ROW_KEYS = ("map", "maps", "distances_px", "similarity", "patches", "predictions")  # one row per line
INLINE_KEYS = ("input_size", "grid", "tokens", "map_axes", "distances_axes", "similarity_axes")


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Indented JSON, with big arrays written compactly (one row of a map per line)."""
    keep = {k: (f"@@{k}@@" if k in ROW_KEYS + INLINE_KEYS else v) for k, v in record.items()}
    text = json.dumps(keep, indent=1)
    for k in ROW_KEYS + INLINE_KEYS:
        if k in record:
            v = record[k]
            if k in ROW_KEYS and isinstance(v, list) and v:
                body = "[\n  " + ",\n  ".join(json.dumps(row) for row in v) + "\n ]"
            else:
                body = json.dumps(v)
            text = text.replace(f'"@@{k}@@"', body, 1)
    path.write_text(text + "\n")


def safe_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._") or "model"


def stems(paths: list[Path]) -> list[str]:
    """A distinct output stem per input (``photo``, ``photo-2``, ...) for clashing names."""
    seen: dict[str, int] = {}
    out = []
    for p in paths:
        stem = safe_stem(p.stem) or "image"
        n = seen.get(stem, 0) + 1
        seen[stem] = n
        out.append(stem if n == 1 else f"{stem}-{n}")
    return out


# ----------------------------------------------------------------------------- the command


def _explain_all(lm, paths: list[Path], s: dict[str, Any], out_dir: Path) -> int:
    """Every image in turn (a bad one is reported and skipped); the number that failed."""
    one = animate_one if s["method"] == "animation" else explain_one
    failed = 0
    bar = tqdm(list(zip(paths, stems(paths))), desc="explain", unit="image", disable=len(paths) <= 1, file=sys.stderr)
    for path, stem in bar:
        try:
            rec = one(lm, path, s, out_dir, stem)
        except (ImageError, ValueError) as e:
            failed += 1
            msg = str(e).split("\n")[0]
            msg = msg[len(path.name) + 2 :] if msg.startswith(f"{path.name}: ") else msg
            tqdm.write(f"error: {path}: {msg}", file=sys.stderr)
            continue
        for name in rec.get("files", [rec.get("figure")]):
            tqdm.write(f"wrote {out_dir / Path(name).name}", file=sys.stdout)
    return failed


def run(args: argparse.Namespace) -> int:
    paths = find_images(args.images)
    if args.method != "pos-embed":
        if not args.images:
            raise UserError(f"--method {args.method} needs at least one image")
        if not paths:
            raise UserError("no images found in " + ", ".join(args.images))
    lm = load_from_args(args)
    say_precision(lm)
    s = resolve_settings(args, lm)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.method == "pos-embed":
        if args.images:
            print("note: the position-embedding figure does not depend on the image; written once", file=sys.stderr)
        rec = explain_pos_embed(lm, s, out_dir)
        print(f"wrote {out_dir / rec['figure']}")
        return 0
    failed = _explain_all(lm, paths, s, out_dir)
    if failed:
        print(f"{failed} of {len(paths)} images failed", file=sys.stderr)
    return 1 if failed else 0
