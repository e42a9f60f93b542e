"""The atlas's report: one self-contained HTML page (inline CSS, no script, nothing fetched: its
Content-Security-Policy allows no network), crops beside it in ``crops/``, and ``atlas.json``.

The page leads with its finding (the most important heads, each class's top concepts, the
concepts flagged as possible Clever-Hans features), then the faithfulness check, then every
concept and every head with its top patches: crops of the model-input picture, 3x3 patches
around the one that counts, that patch outlined.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from ..images import ImageError, load_image
from ..preprocess import DataConfig, preprocess
from ..progress import check

CROP = 84  # px, a crop's side
CONTEXT = 1  # patches of context around the outlined one, each side
MAX_CLASSES = 40  # classes listed in the finding


class Crops:
    """Writes ``crops/<id>.png`` for (path, row, col) and remembers the model-input pictures it read;
    ``load``: how a picture is read (the app's limits; default :func:`vit_demo.images.load_image`),
    the time limit checked before each."""

    def __init__(self, out: Path, dc: DataConfig, patch: int, load: Callable[[str], Image.Image] | None = None) -> None:
        self.out, self.dc, self.patch, self.load = out, dc, patch, load or load_image
        self.pictures: dict[str, Image.Image | None] = {}
        (out / "crops").mkdir(parents=True, exist_ok=True)

    def picture(self, path: str) -> Image.Image | None:
        if path not in self.pictures:
            check()
            try:
                self.pictures[path] = preprocess(self.load(path), self.dc)[1]
            except ImageError:
                self.pictures[path] = None
        return self.pictures[path]

    def __call__(self, path: str, row: int, col: int) -> str | None:
        """The crop's path relative to the page (None when the picture cannot be read)."""
        name = hashlib.sha1(f"{path}|{row}|{col}".encode()).hexdigest()[:16]
        rel = f"crops/{name}.png"
        if (self.out / rel).is_file():
            return rel
        img = self.picture(path)
        if img is None:
            return None
        p, c = self.patch, CONTEXT
        box = ((col - c) * p, (row - c) * p, (col + c + 1) * p, (row + c + 1) * p)
        crop = img.crop(box).resize((CROP, CROP), Image.Resampling.NEAREST)
        s = CROP / ((2 * c + 1) * p)
        ImageDraw.Draw(crop).rectangle((c * p * s, c * p * s, (c + 1) * p * s - 1, (c + 1) * p * s - 1),
                                       outline=(0, 229, 255), width=2)
        crop.save(self.out / rel)
        return rel


def gallery(top: list[dict[str, Any]], crops: Crops) -> str:
    tiles = []
    for t in top:
        rel = crops(t["path"], t["row"], t["col"])
        if rel is not None:
            name = html.escape(Path(t["path"]).name)
            tiles.append(f'<img src="{rel}" alt="{name}, row {t["row"]}, column {t["col"]}" '
                         f'title="{name} · row {t["row"]}, column {t["col"]}">')
    return f'<div class="crops">{"".join(tiles)}</div>'


def finding_html(result: dict[str, Any]) -> str:
    """The few lines at the top: what stands out."""
    f, e = result["findings"], html.escape
    lines = []
    for k in f["suspicious_concepts"]:
        where = (f"{k['one_place_share']:.0%} of its top patches at one place (row {k['place']['row']}, column "
                 f"{k['place']['col']}), {k['border_share']:.0%} on the border")
        if k.get("off_object_share") is not None:
            where += f", {k['off_object_share']:.0%} off the object"
        where += f"; present there in {k['place_presence']:.0%} of the pictures"
        lines.append(f'<li class="flag"><b>Possible Clever-Hans feature: concept {k["id"]}</b>, among the top concepts of '
                     f'{e(", ".join(k["top_for"]))}, sits at one place near the picture\'s edge or off the object ({where}).'
                     f'{e(turned_text(k, k["top_for"]))} <a href="#concept-{k["id"]}">See it</a>.</li>')
    heads = "; ".join(f'<a href="#head-{h["layer"]}-{h["head"]}">layer {h["layer"]} head {h["head"]}</a> '
                      f'({h["importance"]:+.3f}: {e(h["summary"])})' for h in f["top_heads"][:3])
    lines.append(f"<li>Most important heads (fall of the true-class logit when ablated): {heads}.</li>")
    classes = list(f["class_concepts"].items())
    per = "; ".join(f"<b>{e(c)}</b>: {', '.join(str(i) for i in ids)}" for c, ids in classes[:MAX_CLASSES])
    more = f" (and {len(classes) - MAX_CLASSES} more classes)" if len(classes) > MAX_CLASSES else ""
    lines.append(f"<li>Each class's top concepts at layer {result['concept_layer']}: {per}{more}.</li>")
    fa = result["faithfulness"]
    verdict = "passes" if fa["passed"] else "FAILS"
    lines.append(f"<li>Faithfulness check {verdict}: occluding each class's top {fa['concepts_removed']} concepts lowers its "
                 f"logit by {fa['top_fall']:.3f} on average, {fa['random_draws']} random draws of as many concepts by "
                 f"{fa['random_fall']:.3f} (the top ones fall more on {fa['share_top_larger']:.0%} of the pictures). "
                 f"NMF reconstruction error {result['reconstruction_error']:.3f}.</li>")
    return "<ul>" + "".join(lines) + "</ul>"


def turned_text(concept: dict[str, Any], classes: list[str] | None = None, least: float = 0.0) -> str:
    """' Stamped on the other classes' pictures, it turns 33% of them into circle.': the largest share
    the concept's addition turns into one of ``classes`` (default: any), if above ``least``; ""
    otherwise (and for an atlas made before additions were measured)."""
    turned = concept.get("turned") or {}
    shares = [(v, c) for c, v in turned.items() if v is not None and v > least and (classes is None or c in classes)]
    if not shares:
        return ""
    share, cls = max(shares)
    return f" Stamped on the other classes' pictures, it turns {share:.0%} of them into {cls}."


def ways(concept: dict[str, Any], cls: str) -> str:
    """How a concept's importance for ``cls`` was measured: ' (removed -0.003, added +1.250, 33% turned)'."""
    rem, add = (concept.get("removal") or {}).get(cls), (concept.get("addition") or {}).get(cls)
    words = [f"removed {rem:+.3f}" if rem is not None else "", f"added {add:+.3f}" if add is not None else ""]
    turned = (concept.get("turned") or {}).get(cls)
    if turned:
        words.append(f"{turned:.0%} turned")
    words = [w for w in words if w]
    return f" ({', '.join(words)})" if words else ""


def concept_html(concept: dict[str, Any], crops: Crops) -> str:
    imp = sorted(concept["importance"].items(), key=lambda kv: -kv[1])[:6]
    best = ", ".join(f"{html.escape(k)} {v:+.3f}{ways(concept, k)}" for k, v in imp)
    flag = ' <span class="badge">possible Clever-Hans</span>' if concept["suspicious"] else ""
    off = f", {concept['off_object_share']:.0%} off the object" if concept.get("off_object_share") is not None else ""
    return (f'<section class="item{" flagged" if concept["suspicious"] else ""}" id="concept-{concept["id"]}">'
            f'<h3>Concept {concept["id"]}{flag}</h3><p class="small">Most important for: {best}. Top patches: '
            f'{concept["one_place_share"]:.0%} at one place (row {concept["place"]["row"]}, column {concept["place"]["col"]}), '
            f'{concept["border_share"]:.0%} on the border{off}.</p>'
            f'{gallery(concept["top"], crops)}</section>')


def accuracy_change(drop: float | None) -> str:
    """``", accuracy -1.2%"`` for a head whose removal costs that much accuracy; a change that rounds
    to nothing reads ``±0.0%`` (never ``-0.0%``); "" when the atlas had no labels."""
    if drop is None:
        return ""
    change = round(-float(drop), 3)
    return ", accuracy ±0.0%" if change == 0 else f", accuracy {change:+.1%}"


def head_html(head: dict[str, Any], crops: Crops) -> str:
    acc = accuracy_change(head["accuracy_drop"])
    return (f'<section class="item" id="head-{head["layer"]}-{head["head"]}"><h3>Layer {head["layer"]}, head {head["head"]}: '
            f'{html.escape(head["summary"])}</h3><p class="small">Ablated: logit {-head["importance"]:+.3f}{acc} · entropy '
            f'{head["entropy"]:.2f} · on [class] {head["class_share"]:.0%} · on other prefix tokens {head["prefix_share"]:.0%} · '
            f'positional {head["positional"]:.2f}</p>{gallery(head["top"], crops)}</section>')


def write_report(result: dict[str, Any], out: str | Path, dc: DataConfig, patch: int,
                 load: Callable[[str], Image.Image] | None = None) -> Path:
    """``report.html``, ``atlas.json`` and ``crops/`` in ``out`` (the pictures read with ``load``:
    :class:`Crops`); sets ``result["report"]``; returns the page."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    crops = Crops(out, dc, patch, load)
    path = out / "report.html"
    result["report"] = str(path)
    heads = sorted(result["heads"], key=lambda h: -h["importance"])
    body = (f'<div id="finding">{finding_html(result)}</div>'
            f'<h2>Concepts at layer {result["concept_layer"]}</h2><p class="hint">The patch tokens after block '
            f'{result["concept_layer"]}, split by sign and factorised by NMF into {len(result["concepts"])} concepts; '
            f'importance for a class: the larger of two measures. <i>Removed</i>: the fall of the class\'s logit on '
            f'its pictures when the patches where the concept is present are occluded in the embeddings (moved '
            f'towards the folder\'s median there). <i>Added</i>: the rise of the class\'s logit on the other '
            f'classes\' pictures when the concept\'s own patches (around its strongest patch in the pictures where it '
            f'is strongest) are stamped on them, with the share of them it turns into the class: a feature that is '
            f'enough for a class without being needed by it (a mark on most of its pictures) shows only there. Each '
            f'crop: the patch where the concept is strongest in one picture (outlined), best first.</p>'
            + "".join(concept_html(c, crops) for c in result["concepts"])
            + '<h2>Heads, most important first</h2><p class="hint">Importance: mean-ablation (Michel et al. 2019), the '
              "head's output replaced by its mean over the folder. Each crop: the patch the head's [class] row weights most "
              "in one picture (for a model without [class], the mean of the patch queries' rows).</p>"
            + "".join(head_html(h, crops) for h in heads))
    title = html.escape(f"Atlas of {result['model']} over {Path(result['folder']).name} ({result['images']} pictures)")
    path.write_text(PAGE.replace("%TITLE%", title).replace("%STYLE%", STYLE).replace("%BODY%", body), encoding="utf-8")
    (out / "atlas.json").write_text(json.dumps(result, indent=1))
    return path


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'">
<title>%TITLE%</title><style>%STYLE%</style></head>
<body><h1>%TITLE%</h1>%BODY%</body></html>
"""

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 0 16px 40px; }
h1 { font-size: 1.3rem; margin: 14px 0 4px; } h2 { font-size: 1.1rem; margin: 22px 0 4px; }
h3 { font-size: .98rem; margin: 4px 0; }
.hint, .small { color: #666; font-size: .88rem; margin: 2px 0 8px; }
#finding { background: #fff4ce; border-left: 4px solid #e6a700; padding: 4px 12px; }
#finding .flag { color: #a10000; }
.item { border-top: 1px solid #ddd; padding: 6px 0; } .item.flagged { background: #fde8e8; }
.badge { background: #d7191c; color: #fff; border-radius: 3px; padding: 0 5px; font-size: .78rem; }
.crops { display: flex; flex-wrap: wrap; gap: 6px; } .crops img { width: 84px; height: 84px; image-rendering: pixelated; }
"""
