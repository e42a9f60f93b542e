"""The "Whole folder" tab: several pictures (or a zip of them, class sub-folders as labels) through
the model and one single-pass method at once (:mod:`vit_demo.evaluate.survey`): a gallery that
filters and sorts (wrong, least confident, most off-object, one cluster), the clusters of the
maps per predicted class (per folder where the folders are not the model's classes) with their
prototypes, the 2-D embedding of all maps, and the HTML report to download. A click on a tile
opens that picture in the other tabs."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import gradio as gr

from ... import methods
from ...evaluate.child import ChildDied
from ...evaluate.survey import DEFAULT_METHOD, relative_paths, survey
from ...present.survey_report import Thumbnails, accuracy_words, embedding_image, write_report
from ...progress import reporting
from ..common import friendly, png
from ..context import Context, Section
from ..exports import within_budget
from ..uploads import BATCH, picture_limit, picture_loader, received, unreadable

SHOWS = [("all pictures", "all"), ("wrong predictions", "wrong"), ("right predictions", "right"),
         ("with the watermark", "marked")]
SORTS = [("file order", "file"), ("least confident first", "conf-asc"), ("most confident first", "conf-desc"),
         ("most off-object first", "off-desc"), ("most spread map first", "ent-desc"),
         ("most concentrated map first", "ent-asc")]
OPEN_IN = "relevance"  # the tab a clicked tile opens: Rollout & relevance (its id; test_house checks it)
log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- files and views


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
    label = f" · {r['label']}" if r["correct"] is None and r.get("label") else label  # a folder that is no class
    return f"{mark}{r['predicted']} {r['confidence']:.0%}{label} · cluster {r['cluster']} · {Path(r['path']).name}"


def status_text(result: dict[str, Any], notes: list[str]) -> str:
    by_folder = result.get("grouped_by") == "folder"
    acc = (f"accuracy **{result['accuracy']:.1%}** on {result['labelled']}" if result["accuracy"] is not None
           else accuracy_words(result))
    several = result["findings"]["split_classes"]
    split = "folders whose maps fall into more than one cluster" if by_folder else \
        "classes the model decides in more than one way"
    lines = [f"**{result['count']} pictures** · {result['method_title']} maps of the predicted class · {acc} · "
             f"{len(result['clusters'])} clusters{' of the folders' if by_folder else ''}; {split}: "
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
        gr.Markdown(f"Many pictures at once (up to {limit}; a zip's sub-folders are taken as the classes, and scored "
                    "where they are the model's classes): each picture's prediction and map, a gallery to sort and "
                    "filter, and the maps **clustered per predicted class** (SpRAy; per folder when the folders are not "
                    "the model's classes): a class the model decides in two ways, e.g. by the object and by a "
                    "watermark, shows two clusters. Click a tile to open that picture in the other tabs.",
                    elem_classes="caption")
        with gr.Row(equal_height=True):
            self.uploads = gr.File(label="Pictures or a zip", file_count="multiple", file_types=["image", ".zip"],
                                 type="filepath", height=120, elem_id="folder-files", scale=3)
            ctx.folder_files = self.uploads
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
                                    isolated=True, load=picture_loader(ctx.cfg.limits), batch_size=BATCH)
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
