"""``python -m vit_demo explain``: explanation figures and the numbers behind them.

For every image: one figure (PNG at ``--width`` pixels, SVG or PDF) and one JSON file with
the numbers drawn in it (the map(s) as nested lists, the predictions, the class explained and
every setting), both in ``--out``. Files are named ``STEM_METHOD[_TAG].EXT``, where the tag
records the non-default settings (``L5_H2``, ``q45``, ``c207``...) so that runs with other
settings do not overwrite each other.

Bad images are reported on stderr, one line each; the others are still explained, and the
exit status is 1 at the end. Bad settings stop before any work with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

MAP_METHODS = ("lrp", "attnlrp", "gradcam", "rise", "lrp-gated", "lrp-causal")  # one call of explain.METHODS[name] each
METHODS = ("attention", "rollout", "grad-rollout", "chefer", *MAP_METHODS, "patch-grid", "heads", "distance", "pos-embed",
           "animation")
ANIMATION_FORMATS = ("gif", "mp4")  # --method animation (vit_demo.animate); the others write figures
CLASS_SPECIFIC = ("grad-rollout", "chefer", *MAP_METHODS)  # the other methods do not depend on the class
TITLES = {
    "attention": "Raw attention",
    "rollout": "Attention rollout",
    "grad-rollout": "Gradient-weighted attention rollout",
    "chefer": "Relevance (Chefer et al. 2021)",
    "lrp": "CP-LRP (Ali et al. 2022)",
    "attnlrp": "AttnLRP (Achtibat et al. 2024)",
    "gradcam": "GradCAM, last block's norm1",
    "rise": "RISE, 256 masks (Petsiuk et al. 2018)",
    "lrp-gated": "CP-LRP gated by gradient-weighted rollout",
    "lrp-causal": "Causal LRP: gated CP-LRP x perturbation effect, 256 masks",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``explain`` sub-command to the main parser."""
    from .cli import add_model_args

    p = subparsers.add_parser(
        "explain",
        help="explanation figures (attention, rollout, Chefer, heads, ...) and their numbers as JSON",
        description="Write one figure and one JSON of the numbers behind it per image into --out.",
    )
    p.add_argument("images", nargs="*", help="image files or folders (not needed for --method pos-embed)")
    add_model_args(p)
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument(
        "--layer",
        help="layer, from 0 (negative counts from the end; default the last); 'all' with --method heads: every layer",
    )
    p.add_argument("--head", type=int, help="one head, from 0 (default: the mean over heads)")
    p.add_argument("--query-patch", type=int, help="a patch (row-major index) as the query instead of [class]")
    p.add_argument("--class", dest="target", help="class to explain: index or label (default the top-1 prediction)")
    p.add_argument("--fusion", default="mean", choices=["mean", "max", "min"], help="rollout: how heads combine")
    p.add_argument("--discard", type=float, default=0.0, help="rollout: fraction of lowest attention dropped, [0, 1)")
    p.add_argument("--start-layer", type=int, default=0, help="rollout: first layer multiplied in")
    p.add_argument("--cmap", default="inferno", help="any matplotlib colormap (default inferno)")
    p.add_argument("--alpha", type=float, default=0.6, help="heat map opacity over the picture, 0..1")
    p.add_argument("--blocky", action="store_true", help="one flat square per patch instead of smooth upsampling")
    p.add_argument("--format", choices=["png", "svg", "pdf", *ANIMATION_FORMATS],
                   help="png (default), svg or pdf; gif (default) or mp4 for --method animation")
    p.add_argument("--width", type=int, help="PNG width in pixels (default 2400; animations 960 GIF, 1280 MP4)")
    p.add_argument("--separate", action="store_true", help="animation: one file per clip instead of side by side")
    p.add_argument("--topk", type=int, default=5, help="predictions listed in the JSON")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.set_defaults(func=cmd_explain)


# ----------------------------------------------------------------------------- settings


def _resolve_settings(args: argparse.Namespace, lm) -> dict[str, Any]:
    """Check every option against the model before any work; UserError on a bad one."""
    from . import viz
    from .cli import UserError

    cfg = lm.model.cfg
    depth, heads = cfg.depth, cfg.num_heads
    p = cfg.patch_size
    gh, gw = (s // p for s in lm.data_config.input_size)
    method = args.method

    layer: int | str
    if args.layer is None:
        layer = depth - 1
    elif args.layer.strip().lower() == "all":
        if method != "heads":
            raise UserError("--layer all is for --method heads")
        layer = "all"
    else:
        try:
            layer = int(args.layer)
        except ValueError:
            raise UserError(f"--layer {args.layer!r}: give a layer number (0..{depth - 1}) or 'all'") from None
        if not -depth <= layer < depth:
            raise UserError(f"--layer {layer} is outside 0..{depth - 1} ({lm.name} has {depth} layers)")
        layer %= depth
    if args.head is not None and not 0 <= args.head < heads:
        raise UserError(f"--head {args.head} is outside 0..{heads - 1} ({lm.name} has {heads} heads)")
    if args.query_patch is not None and not 0 <= args.query_patch < gh * gw:
        raise UserError(f"--query-patch {args.query_patch} is outside the {gh}x{gw} grid (0..{gh * gw - 1})")
    if not 0 <= args.discard < 1:
        raise UserError(f"--discard must be in [0, 1), got {args.discard}")
    if not 0 <= args.start_layer < depth:
        raise UserError(f"--start-layer {args.start_layer} is outside 0..{depth - 1}")
    if not 0 <= args.alpha <= 1:
        raise UserError(f"--alpha must be in [0, 1], got {args.alpha}")
    animation = method == "animation"
    fmt = args.format or ("gif" if animation else "png")
    if animation != (fmt in ANIMATION_FORMATS):
        raise UserError(f"--format {fmt} is for {'figures' if animation else '--method animation'}; "
                        f"use {' or '.join(ANIMATION_FORMATS) if animation else 'png, svg or pdf'}")
    width = args.width or (None if animation else 2400)
    if width is not None and width < 200:
        raise UserError(f"--width {width} is too small (at least 200 px; 2000+ for slides)")
    try:
        viz.check_cmap(args.cmap)
    except ValueError as e:
        raise UserError(f"--cmap: {e}") from None

    target = None
    if args.target is not None:
        if cfg.num_classes == 0:
            raise UserError(f"--class: {lm.name} is headless (no classifier)")
        target = _parse_class(args.target, lm.labels)
    if method in CLASS_SPECIFIC and cfg.num_classes == 0:
        raise UserError(f"--method {method} needs class scores; {lm.name} is headless (no classifier)")

    ignored = []
    if args.target is not None and method not in (*CLASS_SPECIFIC, "animation"):
        ignored.append("--class")
    if args.query_patch is not None and method not in ("attention", "heads", "patch-grid"):
        ignored.append("--query-patch")
    if args.head is not None and method not in ("attention", "animation"):
        ignored.append("--head")
    if args.layer is not None and method not in ("attention", "heads"):
        ignored.append("--layer")
    if method != "rollout" and (args.fusion != "mean" or args.discard or args.start_layer):
        ignored.append("--fusion/--discard/--start-layer")
    if ignored:
        print(f"note: {', '.join(ignored)} do(es) not apply to --method {method}; ignored", file=sys.stderr)

    return {
        "method": method,
        "layer": layer if method in ("attention", "heads") else None,
        "head": args.head if method in ("attention", "animation") else None,
        "query_patch": args.query_patch if method in ("attention", "heads", "patch-grid") else None,
        "class": target,
        "fusion": args.fusion if method == "rollout" else None,
        "discard": args.discard if method == "rollout" else None,
        "start_layer": args.start_layer if method == "rollout" else None,
        "cmap": args.cmap,
        "alpha": args.alpha,
        "smooth": not args.blocky,
        "format": fmt,
        "width": width,
        "separate": args.separate if animation else None,
        "topk": args.topk,
        "patch_size": p,
        "grid": (gh, gw),
        "depth": depth,
    }


def _parse_class(text: str, labels: tuple[str, ...]) -> int:
    from .cli import UserError

    text = text.strip()
    if text.lstrip("-").isdigit():
        i = int(text)
        if not 0 <= i < len(labels):
            raise UserError(f"--class {i} is outside 0..{len(labels) - 1}")
        return i
    hits = [i for i, name in enumerate(labels) if name.lower() == text.lower()]
    if not hits:
        raise UserError(f"--class {text!r}: no class has that label; give its index (0..{len(labels) - 1})")
    if len(hits) > 1:
        raise UserError(f"--class {text!r} names classes {', '.join(map(str, hits))}; give the index")
    return hits[0]


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
    if m in CLASS_SPECIFIC and s["class"] is not None:
        parts.append(f"c{s['class']}")
    return "_".join([m, *parts])


# ----------------------------------------------------------------------------- one image


def _forward(lm, x: torch.Tensor, s: dict[str, Any]):
    """(logits [1, classes] or None, attentions, layout, grads or None, target index or None)."""
    from . import explain

    model = lm.model
    if s["method"] in ("grad-rollout", "chefer"):
        ag = explain.attention_gradients(model, x, s["class"])
        return ag.logits, ag.attentions, ag.layout, ag.grads, int(ag.target[0])
    with torch.no_grad():
        out = model(x, capture=True)
    has_head = model.cfg.num_classes > 0
    logits = out.logits if has_head else None
    target = int(out.logits.argmax(-1)[0]) if has_head else None
    if s["method"] in MAP_METHODS and s["class"] is not None:
        target = s["class"]
    return logits, out.attentions, out.layout, None, target


def explain_one(lm, path: Path, s: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Any]:
    """Explain one image: write its figure and JSON into ``out_dir``; return the JSON record."""
    from . import explain, viz
    from .images import load_image
    from .inference import topk
    from .preprocess import preprocess

    x, pic = preprocess(load_image(path), lm.data_config)
    x = x[None].to(lm.device)
    logits, attentions, layout, grads, target = _forward(lm, x, s)
    method, p = s["method"], s["patch_size"]
    gh, gw = layout.grid
    record: dict[str, Any] = {
        "image": str(path),
        "model": lm.name,
        "method": method,
        "settings": {k: v for k, v in s.items() if k not in ("patch_size", "grid", "depth", "method") and v is not None},
        "input_size": list(lm.data_config.input_size),
        "patch_size": p,
        "grid": [gh, gw],
        "tokens": layout.names(),
    }
    predictions = topk(logits.softmax(-1)[0].cpu(), s["topk"], lm.labels) if logits is not None else []
    record["predictions"] = predictions
    if target is not None:
        prob = float(logits.softmax(-1)[0, target])
        record["target"] = {
            "index": target,
            "label": lm.labels[target],
            "prob": prob,
            "source": "--class" if method in CLASS_SPECIFIC and s["class"] is not None else "top-1 prediction",
        }
    record["class_specific"] = method in CLASS_SPECIFIC
    caption = f"{path.name}  ·  {lm.name}"
    if predictions:
        caption += f"  ·  predicted: {predictions[0]['label']} ({predictions[0]['prob'] * 100:.1f}%)"
    look = {"cmap": s["cmap"], "alpha": s["alpha"], "smooth": s["smooth"]}
    qp = s["query_patch"]

    if method in ("attention", "rollout", "grad-rollout", "chefer", *MAP_METHODS):
        if method in MAP_METHODS:
            m = explain.METHODS[method](lm.model, x, target)
            title = f"{TITLES[method]} for '{lm.labels[target]}'"
            label = "relevance"
        elif method == "attention":
            if qp is None:
                m = explain.cls_attention(attentions, layout, s["layer"], s["head"])
                query = "[class]" if explain.query_index(layout) is not None else "mean of the patch queries"
            else:
                m = explain.query_attention(attentions, layout, s["layer"], qp, s["head"])
                query = f"patch {qp}"
            heads = "mean over heads" if s["head"] is None else f"head {s['head']}"
            title = f"Attention of {query}, layer {s['layer']}, {heads}"
            label = "attention weight"
        elif method == "rollout":
            m = explain.rollout(attentions, layout, s["fusion"], s["discard"], s["start_layer"])
            title = f"{TITLES[method]} ({s['fusion']} of heads"
            title += (
                (f", {s['discard']:.0%} discarded" if s["discard"] else "")
                + (f", from layer {s['start_layer']}" if s["start_layer"] else "")
                + ")"
            )
            label = "rollout"
        else:
            fn = explain.grad_rollout if method == "grad-rollout" else explain.chefer_relevance
            m = fn(attentions, grads, layout)
            title = f"{TITLES[method]} for '{lm.labels[target]}'"
            label = "relevance"
        m = m[0].detach().float().cpu()
        fig = viz.heatmap_figure(pic, m, title=title, label=label, show_input=True, mark=qp, caption=caption, **look)
        record.update(
            map=m.tolist(),
            map_axes=["row", "col"],
            map_min=float(m.min()),
            map_max=float(m.max()),
            display="colours span the map's own min..max",
        )
    elif method == "heads":
        layer = None if s["layer"] == "all" else s["layer"]
        maps = explain.head_maps(attentions, layout, layer, qp)[0].detach().float().cpu()
        query = "[class]" if qp is None else f"patch {qp}"
        where = "every layer" if layer is None else f"layer {layer}"
        fig = viz.heads_figure(pic, maps, title=f"Attention of {query} per head, {where}", layer=layer, mark=qp, **look)
        record.update(
            maps=maps.tolist(),
            map_axes=(["layer"] if layer is None else []) + ["head", "row", "col"],
            display="each panel's colours span its own min..max",
        )
    elif method == "patch-grid":
        fig = viz.patch_grid_figure(pic, p, layout.names(), highlight=qp)
        record["num_tokens"] = layout.num_prefix + gh * gw
        record["patches"] = [
            {
                "index": i,
                "row": i // gw,
                "col": i % gw,
                "box": [(i % gw) * p, (i // gw) * p, (i % gw + 1) * p, (i // gw + 1) * p],
                "position": layout.num_prefix + i,
            }
            for i in range(gh * gw)
        ]
    elif method == "distance":
        d = explain.mean_attention_distance(attentions, layout, p)[0].detach().float().cpu()
        ref = viz.uniform_attention_distance((gh, gw), p)
        fig = viz.distance_figure(d, title=f"Mean attention distance per head  ·  {path.name}", reference=ref)
        record.update(distances_px=d.tolist(), distances_axes=["layer", "head"], uniform_reference_px=ref)
    else:  # pragma: no cover - argparse restricts the choices
        raise ValueError(f"unknown method {method!r}")

    name = f"{stem}_{_tag(s)}"
    fig_path = viz.save_figure(fig, out_dir / f"{name}.{s['format']}", width_px=s["width"])
    record["figure"] = fig_path.name
    _write_json(out_dir / f"{name}.json", record)
    return record


def animate_one(lm, path: Path, s: dict[str, Any], out_dir: Path, stem: str) -> dict[str, Any]:
    """The attention-through-the-layers animation of one image (vit_demo.animate) + its JSON."""
    from .animate import animate_image
    from .images import load_image

    out = out_dir / f"{stem}_animation.{s['format']}"
    rec = animate_image(lm, load_image(path), out, s["format"], separate=s["separate"], head=s["head"],
                        target=s["class"], cmap=s["cmap"], alpha=s["alpha"], width=s["width"])
    rec = {"image": str(path), "model": lm.name, "method": "animation",
           "settings": {k: v for k, v in s.items() if k not in ("patch_size", "grid", "depth", "method") and v is not None},
           **rec, "files": [Path(f).name for f in rec["files"]]}
    _write_json(out_dir / f"{stem}_animation.json", rec)
    return rec


def explain_pos_embed(lm, s: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The image-independent position-embedding similarity figure, once per model."""
    from . import explain, viz

    sim = explain.pos_embed_similarity(lm.model).detach().float().cpu()
    gh, gw = sim.shape[1:]
    fig = viz.pos_embed_figure(sim, title=f"Position embedding similarity  ·  {lm.name}")
    stem = _safe_stem(lm.name)
    fig_path = viz.save_figure(fig, out_dir / f"{stem}_pos-embed.{s['format']}", width_px=s["width"])
    record = {
        "model": lm.name,
        "method": "pos-embed",
        "settings": {"format": s["format"], "width": s["width"]},
        "grid": [gh, gw],
        "similarity": sim.tolist(),
        "similarity_axes": ["patch", "row", "col"],
        "display": "shared colour scale -1..1 (cosine similarity)",
        "figure": fig_path.name,
    }
    _write_json(out_dir / f"{stem}_pos-embed.json", record)
    return record


ROW_KEYS = ("map", "maps", "distances_px", "similarity", "patches", "predictions")  # one row per line
INLINE_KEYS = ("input_size", "grid", "tokens", "map_axes", "distances_axes", "similarity_axes")


def _write_json(path: Path, record: dict[str, Any]) -> None:
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


def _safe_stem(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._") or "model"


def _stems(paths: list[Path]) -> list[str]:
    """A distinct output stem per input (``photo``, ``photo-2``, ...) for clashing names."""
    seen: dict[str, int] = {}
    out = []
    for p in paths:
        stem = _safe_stem(p.stem) or "image"
        n = seen.get(stem, 0) + 1
        seen[stem] = n
        out.append(stem if n == 1 else f"{stem}-{n}")
    return out


# ----------------------------------------------------------------------------- the command


def cmd_explain(args: argparse.Namespace) -> int:
    from .cli import UserError, load_from_args
    from .images import ImageError, find_images

    paths = find_images(args.images)
    if args.method != "pos-embed":
        if not args.images:
            raise UserError(f"--method {args.method} needs at least one image")
        if not paths:
            raise UserError("no images found in " + ", ".join(args.images))
    lm = load_from_args(args)
    s = _resolve_settings(args, lm)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    if args.method == "pos-embed":
        if args.images:
            print("note: the position-embedding figure does not depend on the image; written once", file=sys.stderr)
        rec = explain_pos_embed(lm, s, out_dir)
        print(f"wrote {out_dir / rec['figure']}")
        return 0

    one = animate_one if args.method == "animation" else explain_one
    failed = 0
    bar = tqdm(list(zip(paths, _stems(paths))), desc="explain", unit="image", disable=len(paths) <= 1, file=sys.stderr)
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
    if failed:
        print(f"{failed} of {len(paths)} images failed", file=sys.stderr)
    return 1 if failed else 0
