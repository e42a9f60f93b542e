"""The survey's report: a self-contained HTML page in the output folder (inline CSS and script,
thumbnails as files beside it, nothing fetched from anywhere: its Content-Security-Policy allows
no network at all), the same JSON as ``survey --json`` beside it, and the pictures the app shows.

- :class:`Thumbnails`: called for every picture as the survey goes (so no picture is kept in
  memory): the photo and the photo with its map, small JPEGs in ``thumbs/``;
- :func:`write_report`: ``report.html``, ``survey.json`` and one picture per cluster prototype;
- :func:`embedding_image` / :func:`prototype_image`: the same views as PIL pictures (the app).

The page leads with its finding (:func:`finding_html`, written into the HTML, no script needed):
the clusters flagged as possible Clever-Hans features with their prototypes, the watermark where
the folder names one, the classes decided in more than one way. Then a gallery that filters
(wrong, right, watermarked, one class, one cluster, a text) and sorts (least / most confident,
most off-object, most spread or concentrated map); the clusters (prototype, size, accuracy; a
click shows the members); the 2-D embedding of all maps as a scatter of thumbnails. A click on
a tile or a point opens the picture with its numbers.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ..viz import overlay_image

THUMB = 128  # px, the longer side of a gallery thumbnail
PROTO = 112  # px, a cluster prototype's picture
CMAP = "inferno"
ALPHA = 0.6


def thumbnail(picture: Image.Image, size: int = THUMB) -> Image.Image:
    """The picture at ``size`` px on its longer side: small pictures grow by whole pixels (no blur)."""
    w, h = picture.size
    s = size / max(w, h)
    if s >= 2:
        k = int(s)
        return picture.resize((w * k, h * k), Image.Resampling.NEAREST)
    return picture.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.LANCZOS)


class Thumbnails:
    """Writes ``thumbs/NNNNN.jpg`` (the model-input picture) and ``thumbs/NNNNN-map.jpg`` (with its
    map) for each record and puts their paths, relative to ``out``, into the record."""

    def __init__(self, out: str | Path, size: int = THUMB, cmap: str = CMAP, alpha: float = ALPHA) -> None:
        self.out, self.size, self.cmap, self.alpha = Path(out), size, cmap, alpha
        (self.out / "thumbs").mkdir(parents=True, exist_ok=True)

    def __call__(self, rec: dict[str, Any], picture: Image.Image, heat: np.ndarray) -> None:
        stem = f"thumbs/{rec['index']:05d}"
        pic = thumbnail(picture, self.size)
        pic.save(self.out / f"{stem}.jpg", quality=88)
        overlay_image(pic, heat, self.cmap, self.alpha, smooth=False).save(self.out / f"{stem}-map.jpg", quality=88)
        rec["thumb"], rec["overlay"] = f"{stem}.jpg", f"{stem}-map.jpg"


def prototype_image(proto: Any, mark: tuple[float, float, float, float] | None = None,
                    picture: Image.Image | None = None) -> Image.Image:
    """A cluster's prototype (its members' mean map) at :data:`PROTO` px, one flat square per cell,
    scaled to its own maximum: alone, or over ``picture``; ``mark``: a box (fractions of the side:
    x0, y0, x1, y1) to outline (the watermark)."""
    p = np.asarray(proto, dtype=np.float64)
    img = overlay_image(picture, p, CMAP, 1.0 if picture is None else 0.45, smooth=False, size=PROTO, vmin=0.0,
                        vmax=float(p.max()) or 1.0)
    if mark is not None:
        w, h = img.size
        x0, y0, x1, y1 = mark
        ImageDraw.Draw(img).rectangle((x0 * w, y0 * h, x1 * w - 1, y1 * h - 1), outline=(0, 229, 255), width=2)
    return img


def finding_image(result: dict[str, Any], cluster: dict[str, Any], root: str | Path,
                  mark: tuple[float, float, float, float] | None = None) -> Image.Image:
    """A flagged cluster's prototype over its most confident member's picture (the prototype alone,
    mostly black around one bright cell, read as a black square at thumbnail size), at :data:`PROTO` px."""
    members = [r for r in result["images"] if r.get("cluster") == cluster["id"] and r.get("thumb")]
    best = max(members, key=lambda r: r.get("confidence") or 0.0, default=None)
    path = Path(root) / best["thumb"] if best is not None else None
    if path is None or not path.is_file():
        return prototype_image(cluster["prototype"], mark)
    with Image.open(path) as im:
        return prototype_image(cluster["prototype"], mark, im.convert("RGB"))


def embedding_image(result: dict[str, Any], root: str | Path, thumb: int = 40) -> Image.Image:
    """All maps' 2-D embedding as a 720-px picture: each picture's map thumbnail (``thumb`` px) at
    its point, framed red when the prediction is wrong, green when right, grey without a label."""
    size = 720
    canvas = Image.new("RGB", (size, size), (250, 250, 250))
    draw = ImageDraw.Draw(canvas)
    span = size - thumb - 8
    for r in result["images"]:
        if "xy" not in r or "overlay" not in r:
            continue
        x, y = 4 + r["xy"][0] * span, 4 + (1 - r["xy"][1]) * span
        with Image.open(Path(root) / r["overlay"]) as im:
            canvas.paste(thumbnail(im.convert("RGB"), thumb - 4), (round(x) + 2, round(y) + 2))
        colour = (160, 160, 160) if r["correct"] is None else (0, 150, 60) if r["correct"] else (215, 25, 28)
        draw.rectangle((round(x), round(y), round(x) + thumb - 1, round(y) + thumb - 1), outline=colour, width=2)
    return canvas


def mark_fraction(result: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """The watermark's box as fractions of the model input (x0, y0, x1, y1), if the folder has one."""
    box = result.get("watermark_box")
    return tuple(box) if box else None


def page_data(result: dict[str, Any]) -> dict[str, Any]:
    """What the page's script reads: the records and clusters without the big arrays."""
    keep = ("index", "path", "label", "predicted", "correct", "confidence", "entropy", "concentration", "centre_mass",
            "border_mass", "off_object", "mass_in_box", "pointing_hit", "watermark", "mass_on_watermark", "cluster",
            "xy", "thumb", "overlay", "topk")
    images = [{k: r[k] for k in keep if k in r} for r in result["images"]]
    for r in images:
        r["name"] = Path(r["path"]).name
    clusters = [{k: c[k] for k in ("id", "class", "size", "accuracy", "mean_confidence", "off_object",
                                   "mass_on_watermark", "watermarked", "image", "predicted") if k in c}
                for c in result["clusters"]]
    head = {k: result.get(k) for k in ("folder", "model", "method", "method_title", "labels", "count", "labelled",
                                       "accuracy", "embedding", "seconds", "processes", "device", "grid",
                                       "watermark", "shortcut", "notes", "grouped_by")}
    return {"head": head, "images": images, "clusters": clusters}


def script_json(data: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element (no ``</`` can end it)."""
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


MAX_FLAGS = 5  # flagged clusters listed at the top


def accuracy_words(result: dict[str, Any]) -> str:
    """'accuracy 0.810 on 100 labelled', or why there is none: no labels, or folders that are not the
    model's classes (the command's summary, the Python API, the app's status line)."""
    if result["accuracy"] is not None:
        return f"accuracy {result['accuracy']:.3f} on {result['labelled']} labelled"
    return "no accuracy: the folders are not the model's classes" if result.get("grouped_by") == "folder" else "no labels"


def contrast(flag: dict[str, Any]) -> str:
    """' (5.2 times what the other pictures' maps put there)' for a flagged cluster, where measured."""
    c = flag.get("contrast")
    return f" ({c:.1f} times what the other pictures' maps put there)" if c else ""


def finding_html(result: dict[str, Any]) -> str:
    """The few lines at the top of the page, before any gallery: what stands out (the result's
    ``findings``: clusters at one place near the edge or off the object, each with its prototype;
    the watermark where the folder names one; the classes decided in more than one way; the accuracy)."""
    f, e, pct = result.get("findings") or {}, html.escape, (lambda v: "–" if v is None else f"{v:.0%}")
    lines = []
    for k in f.get("suspicious_clusters", [])[:MAX_FLAGS]:
        lines.append(f'<li class="flag"><img src="clusters/{k["cluster"]}-finding.png" '
                     f'alt="cluster {k["cluster"]}: its prototype over its most confident picture">'
                     f'<b>Possible Clever-Hans feature: cluster {k["cluster"]}</b> of <b>{e(k["class"])}</b> ({k["size"]} '
                     f'pictures, accuracy {pct(k["accuracy"])}): {k["one_place_share"]:.0%} of its mean map within one cell of '
                     f'row {k["place"]["row"]}, column {k["place"]["col"]} of the {f["grid"][0]}x{f["grid"][1]} map'
                     f'{contrast(k)}; {k["off_object"]:.0%} {e(k["off_object_is"])}.</li>')
    if f and not f.get("suspicious_clusters"):
        lines.append("<li>No cluster of three or more maps sits at one place near the picture's edge or off the object.</li>")
    w = result.get("watermark")
    if w:
        lines.append(f"<li>{w['watermarked']} pictures of <b>{e(str(w['class']))}</b> carry the watermark: "
                     f"{w['share_in_cluster']:.1%} of them are in cluster {w['cluster']}, whose prototype puts "
                     f"{w['cluster_mass_on_watermark']:.1%} of its mass on the watermark's patches.</li>")
    if f.get("split_classes"):
        names = f["split_classes"]
        more = f" and {len(names) - 20} more" if len(names) > 20 else ""
        what = ("Folders whose maps fall into more than one cluster" if result.get("grouped_by") == "folder"
                else "Decided in more than one way (more than one cluster)")
        lines.append(f"<li>{what}: {e(', '.join(names[:20]))}{more}.</li>")
    if result.get("accuracy") is not None:
        lines.append(f"<li>Accuracy {result['accuracy']:.1%} on {result['labelled']} labelled pictures "
                     f"({f.get('wrong', 0)} wrong).</li>")
    elif result.get("grouped_by") == "folder":
        lines.append("<li>No accuracy: the folders are not classes of this model (see the note below); the clusters "
                     "are of each folder's maps.</li>")
    return "<ul>" + "".join(lines) + "</ul>" if lines else ""


def write_report(result: dict[str, Any], out: str | Path) -> Path:
    """``report.html``, ``survey.json`` and ``clusters/C.png`` (each prototype) in ``out``; returns the page."""
    out = Path(out)
    (out / "clusters").mkdir(parents=True, exist_ok=True)
    mark = mark_fraction(result)
    for c in result["clusters"]:
        prototype_image(c["prototype"], mark).save(out / "clusters" / f"{c['id']}.png")
        c["image"] = f"clusters/{c['id']}.png"
    flagged = {k["cluster"] for k in (result.get("findings") or {}).get("suspicious_clusters", [])}
    for c in result["clusters"]:
        if c["id"] in flagged:
            finding_image(result, c, out, mark).save(out / "clusters" / f"{c['id']}-finding.png")
    (out / "survey.json").write_text(json.dumps(result, indent=1))
    title = f"Survey of {Path(result['folder']).name or result['folder']} · {result['model']} · {result['method_title']}"
    page = (PAGE.replace("%TITLE%", html.escape(title)).replace("%STYLE%", STYLE).replace("%SCRIPT%", SCRIPT)
            .replace("%FINDING%", finding_html(result)).replace("%DATA%", script_json(page_data(result))))
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the page

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>%TITLE%</title>
<style>%STYLE%</style>
</head>
<body>
<header>
  <h1>%TITLE%</h1>
  <p id="summary"></p>
  <div id="finding">%FINDING%</div>
  <p id="notes" hidden></p>
</header>
<nav id="filters" aria-label="Filters">
  <label>Show <select id="show">
    <option value="all">all pictures</option>
    <option value="wrong">wrong predictions</option>
    <option value="right">right predictions</option>
    <option value="marked">with the watermark</option>
  </select></label>
  <label>Class <select id="cls"><option value="">every class</option></select></label>
  <label>Cluster <select id="cluster"><option value="">every cluster</option></select></label>
  <label>Sort by <select id="sort">
    <option value="file">file order</option>
    <option value="conf-asc">least confident first</option>
    <option value="conf-desc">most confident first</option>
    <option value="off-desc">most off-object first</option>
    <option value="ent-desc">most spread map first</option>
    <option value="ent-asc">most concentrated map first</option>
  </select></label>
  <label>Find <input id="find" type="search" placeholder="file or class name"></label>
  <button id="reset" type="button">Reset</button>
  <span id="count" aria-live="polite"></span>
</nav>
<main>
  <section><h2>Gallery</h2>
    <p class="hint">Each tile: the picture with the map of its predicted class (hover: the picture alone). A red frame is a
    wrong prediction. Click a tile for its numbers.</p>
    <div id="gallery"></div></section>
  <section><h2>Clusters of explanations</h2>
    <p class="hint" id="clusters-hint">The maps of each predicted class, clustered (SpRAy: spectral clustering, the number of
    clusters by the eigengap; classes of fewer than 8 pictures, when there are many, clustered together as "several classes").
    Each card is a cluster's prototype, the mean of its members' maps. A class the model decides in more than one way has more
    than one card. Click a card to show its members.</p>
    <label class="small"><input type="checkbox" id="all-clusters"> also show the classes with a single cluster of one or two
    pictures (hidden when there are many clusters)</label>
    <div id="clusters"></div></section>
  <section><h2>All maps in two dimensions</h2>
    <p class="hint" id="embed-hint"></p>
    <div id="embedding"></div></section>
</main>
<dialog id="detail"><form method="dialog"><button class="close" aria-label="Close">×</button></form>
<div id="detail-body"></div></dialog>
<script type="application/json" id="survey-data">%DATA%</script>
<script>%SCRIPT%</script>
</body>
</html>
"""

STYLE = """
:root { --ink:#222; --muted:#666; --line:#ddd; --bad:#d7191c; --good:#00963c; --accent:#1f77b4; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); margin: 0; }
header, main, nav { padding: 0 16px; }
h1 { font-size: 1.3rem; margin: 14px 0 4px; } h2 { font-size: 1.1rem; margin: 22px 0 4px; }
.hint, .small { color: var(--muted); font-size: .88rem; margin: 2px 0 8px; }
#notes { color: #555; font-style: italic; }
#finding { background: #fff4ce; border-left: 4px solid #e6a700; padding: 2px 12px; }
#finding:empty { display: none; } #finding ul { margin: 6px 0; padding-left: 18px; }
#finding .flag { color: #a10000; } #finding .flag img { width: 72px; height: 72px;
                                                       vertical-align: middle; margin-right: 6px; }
nav { position: sticky; top: 0; z-index: 2; background: #fafafa; border-bottom: 1px solid var(--line);
      display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; padding-top: 8px; padding-bottom: 8px; }
nav select, nav input, nav button { font: inherit; padding: 3px 6px; max-width: 16rem; }
#count { color: var(--muted); }
#gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(140px, 1fr)); gap: 10px; }
.tile { margin: 0; border: 2px solid var(--line); border-radius: 6px; padding: 4px; cursor: pointer; background: #fff; }
.tile.wrong { border-color: var(--bad); } .tile.right { border-color: #bfe3cb; }
.tile .pics { position: relative; aspect-ratio: 1; background: #eee; }
.tile .pics img { position: absolute; inset: 0; width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }
.tile .pics:hover .overlay { opacity: 0; }
.tile figcaption { font-size: .78rem; line-height: 1.3; margin-top: 3px; overflow-wrap: anywhere; }
.tile .name { color: var(--muted); }
.badge { display: inline-block; border-radius: 3px; padding: 0 4px; margin-right: 3px; font-size: .72rem; background: #eee; }
.badge.bad { background: var(--bad); color: #fff; } .badge.mark { background: #e6a700; color: #000; }
#clusters { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 6px; cursor: pointer; background: #fff; font-size: .82rem; }
.card.on { outline: 3px solid var(--accent); }
.card img { width: 100%; image-rendering: pixelated; display: block; }
#embedding { position: relative; width: min(100%, 760px); aspect-ratio: 1; border: 1px solid var(--line); background: #fafafa; }
#embedding img { position: absolute; width: 34px; height: 34px; object-fit: cover; border: 2px solid #aaa; cursor: pointer;
                 image-rendering: pixelated; }
#embedding img.wrong { border-color: var(--bad); } #embedding img.right { border-color: var(--good); }
#embedding img.out { opacity: .12; }
dialog { max-width: min(96vw, 720px); border: 1px solid var(--line); border-radius: 8px; }
dialog .close { float: right; font-size: 1.3rem; border: 0; background: none; cursor: pointer; }
#detail-body img { width: min(42vw, 300px); image-rendering: pixelated; margin-right: 6px; }
#detail-body table { border-collapse: collapse; font-size: .88rem; } #detail-body td { padding: 1px 8px 1px 0; }
@media (max-width: 600px) { #gallery { grid-template-columns: repeat(auto-fill, minmax(104px, 1fr)); } nav { position: static; } }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("survey-data").textContent);
const IMAGES = DATA.images, CLUSTERS = DATA.clusters, HEAD = DATA.head;
const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; };
const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + " %";
const state = { show: "all", cls: "", cluster: "", sort: "file", find: "" };
const FEW_CLUSTERS = 40;  // more: the classes with one small cluster are hidden until asked for

function verdict(r) { return r.correct === true ? "right" : r.correct === false ? "wrong" : "unlabelled"; }

function matches(r) {
  if (state.show === "wrong" && r.correct !== false) return false;
  if (state.show === "right" && r.correct !== true) return false;
  if (state.show === "marked" && !r.watermark) return false;
  if (state.cls !== "" && r.predicted !== state.cls) return false;
  if (state.cluster !== "" && String(r.cluster) !== state.cluster) return false;
  if (state.find) {
    const q = state.find.toLowerCase();
    if (![r.name, r.predicted, r.label || ""].some((s) => String(s).toLowerCase().includes(q))) return false;
  }
  return true;
}

const SORTS = {
  "file": (a, b) => a.index - b.index,
  "conf-asc": (a, b) => a.confidence - b.confidence || a.index - b.index,
  "conf-desc": (a, b) => b.confidence - a.confidence || a.index - b.index,
  "off-desc": (a, b) => b.off_object - a.off_object || a.index - b.index,
  "ent-desc": (a, b) => b.entropy - a.entropy || a.index - b.index,
  "ent-asc": (a, b) => a.entropy - b.entropy || a.index - b.index,
};

function tile(r) {
  const f = el("figure", "tile " + verdict(r));
  f.dataset.index = r.index;
  f.dataset.confidence = r.confidence;
  f.dataset.cluster = r.cluster;
  const pics = el("div", "pics");
  const photo = el("img", "photo"); photo.src = r.thumb; photo.alt = r.name; photo.loading = "lazy";
  const over = el("img", "overlay"); over.src = r.overlay; over.alt = "map of " + r.name; over.loading = "lazy";
  pics.append(photo, over);
  const cap = el("figcaption");
  if (r.correct === false) cap.append(el("span", "badge bad", "wrong"));
  if (r.watermark) cap.append(el("span", "badge mark", "watermark"));
  cap.append(el("span", "badge", "cluster " + r.cluster));
  cap.append(el("div", "pred", r.predicted + " · " + pct(r.confidence)));
  if (r.label && r.correct === false) cap.append(el("div", "label", "label: " + r.label));
  cap.append(el("div", "name", r.name));
  f.append(pics, cap);
  f.addEventListener("click", () => openDetail(r));
  return f;
}

function render() {
  const shown = IMAGES.filter(matches).sort(SORTS[state.sort]);
  const g = $("gallery");
  g.replaceChildren(...shown.map(tile));
  $("count").textContent = shown.length + " of " + IMAGES.length + " pictures";
  const on = new Set(shown.map((r) => r.index));
  for (const p of $("embedding").children) p.classList.toggle("out", !on.has(Number(p.dataset.index)));
  for (const c of $("clusters").children) c.classList.toggle("on", c.dataset.id === state.cluster);
}

function openDetail(r) {
  const b = $("detail-body");
  b.replaceChildren();
  const pics = el("div");
  for (const src of [r.overlay, r.thumb]) { const i = el("img"); i.src = src; i.alt = r.name; pics.append(i); }
  b.append(el("h3", "", r.name), pics);
  const rows = [["path", r.path], ["label", r.label || "–"], ["predicted", r.predicted + " (" + pct(r.confidence) + ")"],
    ["top-5", (r.topk || []).map((t) => t.label + " " + pct(t.prob)).join(", ")], ["cluster", String(r.cluster)],
    ["map entropy", r.entropy.toFixed(3)], ["mass on the top 10 % of patches", pct(r.concentration)],
    ["centre mass", pct(r.centre_mass)], ["border mass", pct(r.border_mass)], ["off-object", pct(r.off_object)]];
  if (r.mass_in_box !== undefined) {
    rows.push(["mass in the box", pct(r.mass_in_box)], ["pointing hit", r.pointing_hit ? "yes" : "no"]);
  }
  if (r.mass_on_watermark !== undefined) rows.push(["watermark", r.watermark ? "yes" : "no"],
                                                   ["mass on the watermark's patches", pct(r.mass_on_watermark)]);
  const t = el("table");
  for (const [k, v] of rows) { const tr = el("tr"); tr.append(el("td", "", k), el("td", "", v)); t.append(tr); }
  b.append(t);
  $("detail").showModal();
}

function clusterCards() {
  const multi = new Set();
  const per = {};
  for (const c of CLUSTERS) per[c.class] = (per[c.class] || 0) + 1;
  for (const k in per) if (per[k] > 1) multi.add(k);
  const few = CLUSTERS.length <= FEW_CLUSTERS;
  $("all-clusters").parentElement.hidden = few;
  const all = few || $("all-clusters").checked;
  const cards = CLUSTERS.filter((c) => all || multi.has(c.class) || c.size >= 3).map((c) => {
    const d = el("div", "card");
    d.dataset.id = String(c.id);
    const i = el("img"); i.src = c.image; i.alt = "prototype of cluster " + c.id;
    const size = c.size + (c.size === 1 ? " picture" : " pictures");
    d.append(i, el("div", "", "cluster " + c.id + " · " + c.class), el("div", "", size + " · accuracy " + pct(c.accuracy)),
             el("div", "", "off-object " + pct(c.off_object)));
    if (c.predicted) d.append(el("div", "", "called: " + c.predicted.map((p) => p[0] + " " + p[1]).join(", ")));
    if (c.mass_on_watermark !== undefined) d.append(el("div", "", "on the watermark " + pct(c.mass_on_watermark) +
                                                      " · " + c.watermarked + " marked"));
    d.addEventListener("click", () => { state.cluster = state.cluster === String(c.id) ? "" : String(c.id);
      $("cluster").value = state.cluster; render(); $("gallery").scrollIntoView(); });
    return d;
  });
  $("clusters").replaceChildren(...cards);
  render();
}

function embedding() {
  const box = $("embedding");
  for (const r of IMAGES) {
    if (!r.xy) continue;
    const i = el("img", verdict(r)); i.src = r.overlay; i.alt = r.name; i.title = r.name + ": " + r.predicted;
    i.dataset.index = r.index;
    i.style.left = "calc(" + (r.xy[0] * 100).toFixed(2) + "% - " + (r.xy[0] * 34).toFixed(1) + "px)";
    i.style.top = "calc(" + ((1 - r.xy[1]) * 100).toFixed(2) + "% - " + ((1 - r.xy[1]) * 34).toFixed(1) + "px)";
    i.addEventListener("click", () => openDetail(r));
    box.append(i);
  }
  const how = { tsne: "t-SNE", pca: "PCA" }[HEAD.embedding];
  $("embed-hint").textContent = how ? "Each picture's map, placed by " + how + " of the maps (similar maps land " +
    "close together); a red frame is a wrong prediction. The filters above fade the others." :
    "Too few different maps to place them by their likeness (see the note at the top).";
}

function setup() {
  const byFolder = HEAD.grouped_by === "folder";
  const acc = HEAD.accuracy !== null ? "accuracy " + pct(HEAD.accuracy) + " on " + HEAD.labelled + " labelled" :
    byFolder ? "no accuracy (the folders are not the model's classes)" : "no labels";
  if (byFolder) $("clusters-hint").textContent = "The folders are not the model's classes, so the maps of each folder " +
    "are clustered (spectral clustering, the number of clusters by the eigengap). Each card is a cluster's prototype, the " +
    "mean of its members' maps, with what the model called its pictures. Click a card to show its members.";
  $("summary").textContent = HEAD.count + " pictures of " + HEAD.folder + " · model " + HEAD.model + " · map: " +
    HEAD.method_title + " of the predicted class · " + acc + " · " + CLUSTERS.length + " clusters · " + HEAD.seconds + " s";
  if ((HEAD.notes || []).length) { $("notes").hidden = false; $("notes").textContent = HEAD.notes.join(" "); }
  if (!IMAGES.some((r) => r.watermark)) $("show").querySelector("option[value=marked]").remove();
  for (const name of [...new Set(IMAGES.map((r) => r.predicted))].sort()) $("cls").append(new Option(name, name));
  for (const c of CLUSTERS) $("cluster").append(new Option(c.id + ": " + c["class"] + " (" + c.size + ")", String(c.id)));
  const bind = (id) => $(id).addEventListener(id === "find" ? "input" : "change", () => { state[id] = $(id).value; render(); });
  ["show", "cls", "cluster", "sort", "find"].forEach(bind);
  $("reset").addEventListener("click", () => {
    Object.assign(state, { show: "all", cls: "", cluster: "", sort: "file", find: "" });
    for (const id in state) $(id).value = state[id];
    render();
  });
  $("all-clusters").addEventListener("change", clusterCards);
  embedding();
  clusterCards();
}
setup();
"""
