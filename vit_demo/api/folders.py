"""A whole folder from Python: ``vit_demo.survey()`` and ``vit_demo.atlas()``, the code of the
``survey`` and ``atlas`` commands (:mod:`vit_demo.evaluate.survey`, :mod:`vit_demo.evaluate.atlas`)
with their HTML reports (:mod:`vit_demo.present`), and results that show the report's finding."""

from __future__ import annotations

import html
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from PIL import Image

from .. import viz
from ..evaluate import atlas as atlas_code
from ..evaluate import survey as survey_code
from ..present import atlas_report, survey_report
from ..viz.charts import model_card_figure
from .drawable import Drawable, img_tag, picture_figure
from .model import Model, load


@dataclass(frozen=True, eq=False)
class SurveyResult(Drawable):
    """A survey of a folder: ``data`` is the object ``python -m vit_demo survey --json`` prints
    (every picture's record, the clusters of maps, the findings); ``report`` its HTML page."""

    data: dict[str, Any] = field(repr=False)
    report: str  # report.html (open it in a browser; it works offline)

    @property
    def clusters(self) -> list[dict[str, Any]]:
        return self.data["clusters"]

    @property
    def images(self) -> list[dict[str, Any]]:
        return self.data["images"]

    def __repr__(self) -> str:
        d = self.data
        return (f"<vit_demo.SurveyResult of {d['count']} pictures, {d['model']}, {d['method']}: "
                f"{len(d['clusters'])} clusters; report {self.report}>")

    def render(self) -> Image.Image:
        """The 2-D view of every map (the app's Folder tab): each picture's map at its place, framed
        green when the prediction is right, red when wrong, grey without a label."""
        return survey_report.embedding_image(self.data, Path(self.report).parent, thumb=56)

    def figure(self) -> Figure:
        return picture_figure(self.render(), f"Survey · {self.data['model']} · {self.data['method_title']}")

    def _repr_html_(self) -> str:
        d = self.data
        acc = survey_report.accuracy_words(d)
        head = (f"<p><b>Survey of {d['count']} pictures</b> with {html.escape(d['model'])} and "
                f"{html.escape(d['method_title'])} ({acc}): {len(d['clusters'])} clusters of maps. "
                f"Report: <code>{html.escape(self.report)}</code></p>")
        return head + survey_report.finding_html(d) + img_tag(self.render())


@dataclass(frozen=True, eq=False)
class AtlasResult(Drawable):
    """An atlas of a folder: ``data`` is the object ``python -m vit_demo atlas --json`` prints
    (every head, the concepts, the findings, the faithfulness check); ``report`` its HTML page."""

    data: dict[str, Any] = field(repr=False)
    report: str

    @property
    def heads(self) -> list[dict[str, Any]]:
        return self.data["heads"]

    @property
    def concepts(self) -> list[dict[str, Any]]:
        return self.data["concepts"]

    def __repr__(self) -> str:
        d = self.data
        return (f"<vit_demo.AtlasResult of {d['model']} over {d['images']} pictures: {len(d['heads'])} heads, "
                f"{len(d['concepts'])} concepts; report {self.report}>")

    def rows(self) -> list[tuple[str, str]]:
        d, f, fa = self.data, self.data["findings"], self.data["faithfulness"]
        top = "; ".join(f"L{h['layer']} H{h['head']} ({h['importance']:+.3f})" for h in f["top_heads"][:3])
        flagged = ", ".join(str(k["id"]) for k in f["suspicious_concepts"]) or "none"
        return [("model", d["model"]), ("pictures", str(d["images"])),
                ("heads", f"{d['layers']} layers x {d['heads_per_layer']} heads"),
                ("concepts", f"{len(d['concepts'])} at layer {d['concept_layer']}"),
                ("most important heads", top), ("possible Clever-Hans concepts", flagged),
                ("faithfulness", f"top concepts {fa['top_fall']:.3f}, random {fa['random_fall']:.3f} "
                                 f"({'passes' if fa['passed'] else 'fails'})")]

    def render(self) -> Image.Image:
        return viz.figure_to_image(self.figure(), 1000)

    def figure(self) -> Figure:
        return model_card_figure(self.rows())

    def _repr_html_(self) -> str:
        d = self.data
        return (f"<p><b>Atlas of {html.escape(d['model'])}</b> over {d['images']} pictures. Report: "
                f"<code>{html.escape(self.report)}</code></p>" + atlas_report.finding_html(d))


def model_of(model: Model | str | os.PathLike | None) -> Model:
    return model if isinstance(model, Model) else load(model)


def out_folder(out: str | os.PathLike | None, what: str) -> Path:
    return Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=f"vit_demo-{what}-"))


def survey(folder: str | os.PathLike, model: Model | str | os.PathLike | None = None, *,
           method: str = survey_code.DEFAULT_METHOD, labels: str = "auto", limit: int | None = None,
           out: str | os.PathLike | None = None, batch_size: int = 16, seed: int = 0,
           progress: bool = False) -> SurveyResult:
    """``python -m vit_demo survey`` from Python: every picture of ``folder`` through ``model`` (a
    :class:`Model`, a name or path for :func:`load`, or None: the shipped DeiT-Tiny) and ``method``;
    the maps clustered per predicted class (per folder where the folders are not the model's classes);
    the report written to ``out`` (default: a new
    temporary folder). ``labels``: "auto", "folders" (DIR/<class>/<image>) or "imagenet" (file names);
    ``limit``: N pictures spread through the folder."""
    m = model_of(model)
    dest = out_folder(out, "survey")
    result = survey_code.survey(m.loaded, folder, method, labels, limit, batch_size,
                                each=survey_report.Thumbnails(dest), progress=progress, seed=seed)
    page = survey_report.write_report(result, dest)
    return SurveyResult(data=result, report=str(page))


def atlas(folder: str | os.PathLike, model: Model | str | os.PathLike | None = None, *, layer: int | None = None,
          concepts: int = atlas_code.DEFAULT_CONCEPTS, labels: str = "auto", limit: int | None = None,
          out: str | os.PathLike | None = None, batch_size: int = 16, seed: int = 0,
          progress: bool = False) -> AtlasResult:
    """``python -m vit_demo atlas`` from Python: what each head and each learned concept of
    ``model`` looks for over ``folder``; ``layer``: the block whose output tokens make the concepts
    (from 1; 0 the embeddings; default the last but one); the report written to ``out`` (default:
    a new temporary folder)."""
    m = model_of(model)
    dest = out_folder(out, "atlas")
    result = atlas_code.atlas(m.loaded, folder, layer, concepts, labels, limit, batch_size, progress=progress, seed=seed)
    page = atlas_report.write_report(result, dest, m.loaded.data_config, m.loaded.model.cfg.patch_size)
    return AtlasResult(data=result, report=str(page))
