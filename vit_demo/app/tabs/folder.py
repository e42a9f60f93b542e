"""The "Whole folder" tab: several pictures (or a zip of them, class sub-folders as labels) through
the model and one single-pass method at once (:mod:`vit_demo.evaluate.survey`): a gallery that
filters and sorts (wrong, least confident, most off-object, one cluster), the clusters of the
maps per predicted class with their prototypes, the 2-D embedding of all maps, and the HTML
report to download. A click on a tile opens that picture in the other tabs."""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from ... import methods
from ...evaluate.child import ChildDied
from ...evaluate.survey import DEFAULT_METHOD, relative_paths, survey
from ...images import IMAGE_SUFFIXES, Allowance, ImageError, extract_pictures, safe_parts
from ...present.survey_report import Thumbnails, embedding_image, write_report
from ...progress import check, reporting
from ..common import friendly, png
from ..context import Context, Section
from ..exports import export_dir, within_budget
from ..server.workspace import folder_bytes, trim, workspace
from .relevance import RelevanceTab

MAX_PICTURES = 1000  # per survey on this computer
MAX_PICTURES_EXPOSED = 100  # per survey when the app is reachable by others
ENTRIES_PER_PICTURE = 20  # members of the uploaded zips looked at, per picture a survey may take
READ_BYTES = 1 << 30  # bytes decompressed per survey, kept or not (about 3 s of CPU)
SHOWS = [("all pictures", "all"), ("wrong predictions", "wrong"), ("right predictions", "right"),
         ("with the watermark", "marked")]
SORTS = [("file order", "file"), ("least confident first", "conf-asc"), ("most confident first", "conf-desc"),
         ("most off-object first", "off-desc"), ("most spread map first", "ent-desc"),
         ("most concentrated map first", "ent-asc")]
OPEN_IN = RelevanceTab.name  # the tab a clicked tile opens
log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- files and views


def allowance(max_files: int) -> Allowance:
    """What one survey's upload may unpack: :data:`ENTRIES_PER_PICTURE` members per picture it may
    keep, :data:`READ_BYTES` decompressed, what the exports' disk budget has room for (the oldest
    exports go first to make room for half of it), within the slow lane's time limit."""
    ws = workspace()
    trim(ws.exports, ws.exports_budget // 2)
    room = max(0, ws.exports_budget - folder_bytes(ws.exports))
    return Allowance(entries=ENTRIES_PER_PICTURE * max_files, read=READ_BYTES, written=room, check=check)


def gather_uploads(files: list[Any], dest: Path, max_files: int, max_bytes: int, allow: Allowance
                   ) -> tuple[Path, list[str]]:
    """Copy the uploaded pictures and the pictures of uploaded zips into ``dest/pictures`` (a zip's
    sub-folders become class folders; loose pictures go to ``unlabelled/`` when there are any),
    every byte charged to ``allow`` before it is written. Returns the folder and notes on what
    was skipped."""
    pics = dest / "pictures"
    pics.mkdir(parents=True)
    notes: list[str] = []
    count = 0
    for f in files or []:
        allow.tick()
        path = Path(f if isinstance(f, str) else getattr(f, "path", None) or f.get("path"))
        if count >= max_files:
            notes.append(f"only the first {max_files} pictures are used")
            break
        if path.suffix.lower() == ".zip":
            written, more = extract_pictures(path, pics, max_files - count, max_bytes, allow)
            count += len(written)
            notes += more
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            try:
                allow.take_written(path.stat().st_size)
            except ValueError as e:
                notes.append(f"skipped {path.name}: {e}")
                continue
            name = (safe_parts(path.name) or ["picture"])[-1]
            shutil.copyfile(path, pics / f"{count:05d}_{name}")
            count += 1
        else:
            notes.append(f"skipped {path.name}: not a picture or a zip")
    if count == 0:
        raise ImageError("no pictures in the upload: choose several image files or a zip of them"
                         + (f" ({notes[-1]})" if notes else ""))
    loose = [p for p in pics.iterdir() if p.is_file()]
    if loose and any(p.is_dir() for p in pics.iterdir()):
        (pics / "unlabelled").mkdir(exist_ok=True)
        for p in loose:
            p.rename(pics / "unlabelled" / p.name)
    return pics, notes


def picture_limit(ctx: Context) -> int:
    """Pictures one folder job may take: :data:`MAX_PICTURES`, :data:`MAX_PICTURES_EXPOSED` when exposed."""
    return MAX_PICTURES_EXPOSED if ctx.cfg.exposed else MAX_PICTURES


@contextmanager
def received(ctx: Context, files: list[Any]) -> Iterator[tuple[Path, Path, list[str]]]:
    """The uploaded pictures (and zips) of one folder job, within the survey's limits
    (:func:`picture_limit`, :func:`allowance`, the upload cap), in a new export folder whose name
    no one can guess: ``(folder, its pictures, notes on what was skipped)``. The job runs inside;
    if it fails, its files go at once. The survey and the atlas both take their pictures here."""
    limit = picture_limit(ctx)
    allow = allowance(limit)
    base = export_dir()
    out = base / secrets.token_hex(16)
    try:
        pics, notes = gather_uploads(files, out, limit, ctx.cfg.limits.max_upload_bytes, allow)
        yield out, pics, notes
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise


def unreadable(e: ValueError, pics: Path, notes: list[str]) -> ImageError:
    """A job's "nothing readable" error, said without the server's folder."""
    why = str(e).replace(f"{pics}/", "").replace(str(pics), "the upload")
    return ImageError(why + (f" ({notes[-1]})" if notes else ""))


def arrange(result: dict[str, Any], show: str, sort: str, cluster: Any) -> list[dict[str, Any]]:
    """The records the gallery shows, filtered and sorted as the menus say."""
    keep = {"all": lambda r: True, "wrong": lambda r: r["correct"] is False, "right": lambda r: r["correct"] is True,
            "marked": lambda r: bool(r.get("watermark"))}[show or "all"]
    rs = [r for r in result["images"] if keep(r) and (cluster in (None, "", "all") or r["cluster"] == int(cluster))]
    key = {"file": lambda r: r["index"], "conf-asc": lambda r: r["confidence"], "conf-desc": lambda r: -r["confidence"],
           "off-desc": lambda r: -r["off_object"], "ent-desc": lambda r: -r["entropy"],
           "ent-asc": lambda r: r["entropy"]}[sort or "file"]
    return sorted(rs, key=lambda r: (key(r), r["index"]))


def caption(r: dict[str, Any]) -> str:
    mark = "✗ " if r["correct"] is False else "✓ " if r["correct"] else ""
    label = f" (label: {r['label']})" if r["correct"] is False and r["label"] else ""
    return f"{mark}{r['predicted']} {r['confidence']:.0%}{label} · cluster {r['cluster']} · {Path(r['path']).name}"


def status_text(result: dict[str, Any], notes: list[str]) -> str:
    acc = "no labels" if result["accuracy"] is None else f"accuracy **{result['accuracy']:.1%}** on {result['labelled']}"
    several = sorted({c["class"] for c in result["clusters"]
                      if sum(d["class"] == c["class"] for d in result["clusters"]) > 1})
    lines = [f"**{result['count']} pictures** · {result['method_title']} maps of the predicted class · {acc} · "
             f"{len(result['clusters'])} clusters; classes the model decides in more than one way: "
             f"{', '.join(several[:10]) or 'none'} · {result['seconds']:.1f} s"]
    w = result.get("watermark")
    if w:
        lines.append(f"**Watermark:** {w['share_in_cluster']:.0%} of the {w['watermarked']} marked pictures of "
                     f"'{w['class']}' are in cluster {w['cluster']}, whose prototype puts "
                     f"{w['cluster_mass_on_watermark']:.0%} of its mass on the mark.")
    lines += [f"*{n}*" for n in notes[:5]]
    return "\n\n".join(lines)


def cluster_choices(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [("every cluster", "all")] + [(f"{c['id']}: {c['class']} ({c['size']})", str(c["id"])) for c in result["clusters"]]


def report_zip(out: Path) -> Path:
    """The report folder as one zip (report.html, survey.json, thumbnails, prototypes)."""
    return Path(shutil.make_archive(str(out / "survey-report"), "zip", out, "report"))


# ----------------------------------------------------------------------------- the section


class FolderTab(Section):
    name, title = "folder", "Whole folder"

    def layout(self, ctx: Context) -> None:
        limit = picture_limit(ctx)
        gr.Markdown(f"Many pictures at once (up to {limit}; a zip's sub-folders are taken as the classes): each picture's "
                    "prediction and map, a gallery to sort and filter, and the maps **clustered per predicted class** "
                    "(SpRAy): a class the model decides in two ways, e.g. by the object and by a watermark, shows two "
                    "clusters. Click a tile to open that picture in the other tabs.", elem_classes="caption")
        with gr.Row(equal_height=True):
            self.uploads = gr.File(label="Pictures or a zip", file_count="multiple", file_types=["image", ".zip"],
                                 type="filepath", height=120, elem_id="folder-files", scale=3)
            self.method = gr.Dropdown([(methods.get(m).title, m) for m in methods.single_pass()], value=DEFAULT_METHOD,
                                      label="Method", elem_id="folder-method", scale=2)
            self.run_btn = gr.Button("Survey these pictures", variant="primary", elem_id="folder-run", scale=1)
        self.status = gr.Markdown(elem_id="folder-status")
        with gr.Row():
            self.show_dd = gr.Dropdown(SHOWS, value="all", label="Show", elem_id="folder-show")
            self.sort_dd = gr.Dropdown(SORTS, value="file", label="Sort by", elem_id="folder-sort")
            self.cluster_dd = gr.Dropdown([("every cluster", "all")], value="all", label="Cluster", elem_id="folder-cluster")
        self.gallery = gr.Gallery(label="Pictures with their maps (click one to open it in the other tabs)", columns=6,
                                  fit_columns=False, height=520, allow_preview=False, object_fit="contain",
                                  elem_id="folder-gallery", buttons=[])
        self.protos = gr.Gallery(label="Clusters: each one's prototype (the mean map of its members; click to filter)",
                                 columns=8, fit_columns=False, height=240, allow_preview=False, object_fit="contain",
                                 elem_id="folder-clusters", buttons=[])
        with gr.Row():
            self.embedding = gr.Image(label="All maps in 2-D: similar maps land together; red frame: a wrong prediction",
                                      interactive=False, format="png", height=480, elem_id="folder-embedding",
                                      buttons=["fullscreen", "download"])
            self.report = gr.File(label="The report (HTML, opens offline)", elem_id="folder-report", height=120)
        self.survey_state = gr.State(None)

    def views_for(self, surveyed: dict[str, Any], show: str, sort: str, cluster: Any) -> tuple[list, list[int]]:
        """The gallery's tiles for the menus' choices, and the records' indices in their order."""
        rs = arrange(surveyed["result"], show, sort, cluster)
        out = Path(surveyed["dir"])
        return [(str(out / "report" / r["overlay"]), caption(r)) for r in rs], [r["index"] for r in rs]

    def run_survey(self, ctx: Context, files: Any, method: str, sess: Any, progress: Any) -> dict:
        with received(ctx, files) as (out, pics, notes):
            lm = ctx.model(ctx.session(sess))
            with reporting(lambda share, text: progress(share, desc=f"survey: {text}")):
                try:  # scikit-learn's part in a child process: a crash there fails this survey only
                    result = survey(lm, pics, method or DEFAULT_METHOD, each=Thumbnails(out / "report"), progress=False,
                                    isolated=True)
                except ValueError as e:  # nothing readable: said without the server's folder
                    raise unreadable(e, pics, notes) from e
                except ChildDied as e:
                    log.error("survey of %d files: %s", len(files), e)
                    raise gr.Error(str(e), print_exception=False) from e
            relative_paths(result)  # the report and its JSON name no server path
            notes = [*result["notes"], *notes, *result["errors"]]
            write_report(result, out / "report")
        emb = png(embedding_image(result, out / "report", thumb=56))
        report = report_zip(out)
        within_budget()
        surveyed = {"dir": str(out), "result": result}
        tiles, surveyed["order"] = self.views_for(surveyed, "all", "file", "all")
        protos = [(str(out / "report" / c["image"]), f"{c['id']}: {c['class']} · {c['size']}") for c in result["clusters"]]
        return {self.survey_state: surveyed, self.status: status_text(result, notes), self.gallery: tiles,
                self.protos: protos, self.embedding: emb, self.report: str(report),
                self.show_dd: "all", self.sort_dd: "file",
                self.cluster_dd: gr.update(choices=cluster_choices(result), value="all")}

    def wire(self, ctx: Context) -> None:
        outputs = [self.survey_state, self.status, self.gallery, self.protos, self.embedding, self.report, self.show_dd,
                   self.sort_dd, self.cluster_dd]

        @friendly
        def on_run(files, method, sess, progress=gr.Progress()):  # noqa: B008 - Gradio's progress bar
            if not files:
                raise gr.Error("Choose some pictures (or a zip of them) first.", print_exception=False)
            return self.run_survey(ctx, files, method, sess, progress)

        @friendly
        def on_filter(show, sort, cluster, surveyed):
            if not surveyed:
                return gr.skip()
            tiles, surveyed["order"] = self.views_for(surveyed, show, sort, cluster)
            return {self.survey_state: surveyed, self.gallery: tiles}

        def on_tile(surveyed, sess, evt: gr.SelectData):
            if not surveyed or not isinstance(evt.index, int) or not 0 <= evt.index < len(surveyed["order"]):
                return gr.skip()
            rec = surveyed["result"]["images"][surveyed["order"][evt.index]]
            sess = ctx.session(sess)
            sess.open_tab = OPEN_IN
            picture = str(Path(surveyed["dir"]) / "pictures" / rec["path"])  # the path is relative to the upload
            return {ctx.state: sess, ctx.image: picture, ctx.tabs: gr.Tabs(selected=OPEN_IN)}

        def on_proto(surveyed, evt: gr.SelectData):
            if not surveyed or not isinstance(evt.index, int) or not 0 <= evt.index < len(surveyed["result"]["clusters"]):
                return gr.skip()
            return str(surveyed["result"]["clusters"][evt.index]["id"])

        self.run_btn.click(on_run, [self.uploads, self.method, ctx.state], outputs,
                           api_visibility="private", **ctx.slow)  # a folder takes minutes: the slow lane
        gr.on([self.show_dd.input, self.sort_dd.input, self.cluster_dd.change], on_filter,
              [self.show_dd, self.sort_dd, self.cluster_dd, self.survey_state], [self.survey_state, self.gallery],
              api_visibility="private", show_progress="hidden")
        self.gallery.select(on_tile, [self.survey_state, ctx.state], [ctx.state, ctx.image, ctx.tabs],
                            api_visibility="private", show_progress="hidden")
        self.protos.select(on_proto, [self.survey_state], [self.cluster_dd], api_visibility="private",
                           show_progress="hidden")
