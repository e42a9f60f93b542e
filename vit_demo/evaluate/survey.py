"""A whole folder at once: every picture through the model and one explanation method, a record
per picture, and the maps clustered per predicted class (:mod:`.clusters`, SpRAy; per folder where the
folders are not the model's classes, the small classes pooled: :mod:`.grouping`).

Per picture (:func:`picture_record`): the top-k, the label (from the ImageFolder's sub-folder or
the ImageNet ``<wnid>_<name>`` file name) and whether the top-1 is right, the confidence, and
numbers of the map of the predicted class. The map is taken as a distribution ``p`` over the
patch grid (its positive part, normalised to sum 1; uniform when it has no positive mass):

- **entropy**: -sum p log p / log(patches), in [0, 1] (1: spread evenly; 0: one patch);
- **concentration**: the share of the mass on the top 10 % of the patches;
- **centre mass**: the share on the central region (the middle half of each side: 1/4 of the
  area), **border mass**: on the outer ring (the outer eighth of each side: 7/16 of the area);
- with a shapes folder's ``boxes.json``: **mass in box** and the **pointing hit**
  (:mod:`.pointing`), and where it lists watermarks, the **mass on the watermark's patches**
  (the patches the mark touches);
- **off-object**: 1 - mass in box where there is a box, else the border mass.

The maps are kept on the patch grid (pooled to at most :data:`MAP_SIDE` cells a side), so memory
grows by a few hundred floats per picture, never by pictures. Under ``torchrun`` every process
takes every ``world``-th picture (:mod:`vit_demo.distributed.torchrun`, shared with the training and the atlas)
and process 0 gathers the records and the maps, clusters them and writes the result.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from .. import methods as registry
from ..data.annotations import BOXES_FILE, read_boxes, read_watermarks
from ..distributed.torchrun import Dist, finish, gather_objects, init_distributed
from ..images import ImageError, find_images, load_image
from ..labels import class_from_filename
from ..preprocess import DataConfig, preprocess
from ..progress import batches, check, report
from .child import Child
from .clusters import MIN_TO_SPLIT, arrange, cluster_maps
from .faithfulness import spread
from .geometry import box_to_input, cell_coverage, hit_patches, near_edge, patch_coverage, peak_place
from .grouping import POOLED_NAMES, Group, grouping, groups_of, label_notes, predicted_counts

if TYPE_CHECKING:
    from ..checkpoints.load import LoadedModel

DEFAULT_METHOD = "lrp-amortised"  # the most faithful map that is not slow (SRG and SaCo on held-out photos, docs/faithfulness.md)
LABEL_MODES = ("auto", "folders", "names")
MAP_SIDE = 16  # maps with more patches a side are average-pooled to this many cells
TOP_SHARE = 0.1  # concentration: the mass on this share of the patches
TOPK = 5
CLUSTERING = ("sklearn.cluster", "sklearn.manifold", "sklearn.decomposition", "sklearn.metrics")  # the child's imports

EachPicture = Callable[[dict[str, Any], Image.Image, np.ndarray], None]  # (record, model-input picture, map [h, w])
Loader = Callable[[str], Image.Image]  # a picture's path -> an RGB picture, or ImageError (default: load_image)


@dataclass
class Picture:
    """One file of the survey: its index in the listing, its path as given, its path relative to
    the folder (the key of ``boxes.json``) and its label, when the folder names one."""

    index: int
    path: str
    rel: str
    label: str | None = None


# ----------------------------------------------------------------------------- the folder


def list_pictures(images: str | os.PathLike, labels: str = "auto", limit: int | None = None) -> tuple[list[Picture], str]:
    """The pictures of a folder, sorted, and the label mode used: ``folders`` (an ImageFolder,
    ``DIR/<class>/<image>``: the label is the sub-folder), ``names`` (the ImageNet ``<wnid>_...``
    file names of the shared sample) or ``auto`` (folders when there are class sub-folders).
    ``limit``: N pictures spread evenly through the listing. ValueError when there are none."""
    if labels not in LABEL_MODES:
        raise ValueError(f"--labels must be one of {', '.join(LABEL_MODES)}, not {labels!r}")
    root = Path(images)
    if not root.is_dir():
        raise ValueError(f"{images}: no such folder")
    subdirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    by_class = {d.name: find_images([d]) for d in subdirs}
    by_class = {c: fs for c, fs in by_class.items() if fs}
    mode = labels if labels != "auto" else ("folders" if by_class else "names")
    if mode == "folders":
        if not by_class:
            raise ValueError(f"{images}: --labels folders needs one sub-folder of pictures per class; found none")
        found = [(f, c) for c, fs in by_class.items() for f in fs]
    else:
        found = [(f, None) for f in find_images([root])]
    if not found:
        raise ValueError(f"{images}: no pictures found (looked for {'sub-folders of ' if mode == 'folders' else ''}"
                         f"image files)")
    if limit is not None:
        found = spread(found, limit)
    return [Picture(i, str(f), f.relative_to(root).as_posix(), c) for i, (f, c) in enumerate(found)], mode


def label_index(pic: Picture, mode: str, labels: Sequence[str]) -> int | None:
    """The model's class index of the picture's label: the sub-folder's name among the model's
    class names (case-insensitive), or the ImageNet class of the file name (for 1000-class models)."""
    if mode == "folders":
        names = [n.lower() for n in labels]
        return names.index(pic.label.lower()) if pic.label and pic.label.lower() in names else None
    c = class_from_filename(Path(pic.path).name)
    if c is not None and len(labels) == 1000:
        pic.label = labels[c]
        return c
    return None


def require_classifier(lm: LoadedModel, needs: str) -> None:
    """ValueError for a headless model (no classifier): a folder job ``needs`` its class scores."""
    if lm.model.cfg.num_classes == 0:
        raise ValueError(f"{lm.name} is headless (no classifier): {needs}")


@contextmanager
def folder_job(lm: LoadedModel, images: str | os.PathLike, labels: str, limit: int | None
               ) -> Iterator[tuple[list[Picture], Folder, Dist]]:
    """A job over the folder ``images`` (the survey, the atlas): its pictures (:func:`list_pictures`),
    what the folder says (:func:`read_folder`), and this process's place in the torchrun group,
    joined for the ``with`` block."""
    pictures, mode = list_pictures(images, labels, limit)
    folder = read_folder(images, mode, lm.data_config)
    dist = init_distributed(lm.device)
    try:
        yield pictures, folder, dist
    finally:
        finish(dist)


def none_readable(images: str | os.PathLike, pictures: Sequence[Picture], errors: Sequence[str]) -> ValueError:
    """The error of a folder job none of whose pictures could be read (the first three reasons)."""
    return ValueError(f"{images}: none of the {len(pictures)} pictures could be read: " + "; ".join(errors[:3]))


# ----------------------------------------------------------------------------- map statistics


def distributions(maps: Tensor) -> Tensor:
    """[B, h, w] maps -> their positive parts normalised to sum 1 (uniform without positive mass)."""
    flat = maps.reshape(maps.shape[0], -1).double().clamp(min=0)
    total = flat.sum(dim=1, keepdim=True)
    flat = torch.where(total > 0, flat / total.clamp(min=1e-300), torch.full_like(flat, 1 / flat.shape[1]))
    return flat.reshape(maps.shape)


def entropy(distribution: Tensor) -> Tensor:
    """Normalised entropy of [B, h, w] distributions, in [0, 1]."""
    flat = distribution.reshape(distribution.shape[0], -1)
    h = -(flat * flat.clamp(min=1e-300).log()).sum(dim=1)
    return h / math.log(flat.shape[1]) if flat.shape[1] > 1 else torch.zeros_like(h)


def concentration(distribution: Tensor) -> Tensor:
    """The mass of [B, h, w] distributions on their top :data:`TOP_SHARE` of patches (at least one)."""
    flat = distribution.reshape(distribution.shape[0], -1)
    k = max(1, math.ceil(TOP_SHARE * flat.shape[1]))
    return flat.topk(k, dim=1).values.sum(dim=1)


def region_masses(distribution: Tensor, input_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """(centre mass, border mass) of [B, h, w] distributions (see the module docstring)."""
    H, W = input_size
    grid = tuple(distribution.shape[-2:])
    centre = cell_coverage((W / 4, H / 4, 3 * W / 4, 3 * H / 4), input_size, grid)
    inner = cell_coverage((W / 8, H / 8, 7 * W / 8, 7 * H / 8), input_size, grid)
    return (distribution * centre).sum(dim=(1, 2)), (distribution * (1 - inner)).sum(dim=(1, 2))


def pool_map(distribution: Tensor) -> Tensor:
    """[B, h, w] distributions average-pooled to at most :data:`MAP_SIDE` cells a side (still summing to 1)."""
    side = MAP_SIDE
    h, w = distribution.shape[-2:]
    if h <= side and w <= side:
        return distribution
    q = F.adaptive_avg_pool2d(distribution[:, None].float(), (min(h, side), min(w, side)))[:, 0].double()
    return q / q.sum(dim=(1, 2), keepdim=True).clamp(min=1e-300)


# ----------------------------------------------------------------------------- one batch


@dataclass
class Batch:
    """The readable pictures of one chunk, ready for the model."""

    pictures: list[Picture]
    x: Tensor  # [b, 3, H, W] on the model's device
    shown: list[Image.Image]  # the model-input pictures
    sizes: list[tuple[int, int]]  # the files' own (width, height)


def read_batch(chunk: Sequence[Picture], lm: LoadedModel, errors: list[str], load: Loader | None = None
               ) -> Batch | None:
    """Load (with ``load``: the app's limits on pixels and its reduction at load) and preprocess
    ``chunk``, the time limit checked before each picture; unreadable files go to ``errors``
    (None if none is readable)."""
    pics, xs, shown, sizes = [], [], [], []
    for pic in chunk:
        check()
        try:
            img = (load or load_image)(pic.path)
        except ImageError as e:
            errors.append(str(e))
            continue
        x, seen = preprocess(img, lm.data_config)
        pics.append(pic)
        xs.append(x)
        shown.append(seen)
        sizes.append(img.size)
    if not pics:
        return None
    return Batch(pics, torch.stack(xs).to(lm.device), shown, sizes)


@dataclass
class Folder:
    """What the folder says beyond its pictures: labels, boxes and watermarks (by relative path)."""

    mode: str
    boxes: dict[str, list[float]]
    watermarks: dict[str, list[float]]
    shortcut: dict[str, Any]  # boxes.json's "shortcut" entry (the class it marks), {} without one
    watermark_box: tuple[float, float, float, float] | None  # where the mark sits, in model-input pixels


def read_folder(root: str | os.PathLike, mode: str, dc: DataConfig) -> Folder:
    """Labels mode, and the shapes' ``boxes.json`` (boxes, watermarks) when the folder has one."""
    path = Path(root) / BOXES_FILE
    if not path.is_file():
        return Folder(mode, {}, {}, {}, None)
    boxes, marks = read_boxes(root), read_watermarks(root)
    try:
        meta = json.loads(path.read_text())
        size, shortcut = int(meta.get("size", 0)), dict(meta.get("shortcut", {}))
    except (ValueError, TypeError, AttributeError):
        size, shortcut = 0, {}
    mark = None
    if marks and size:
        mark = box_to_input(next(iter(marks.values())), (size, size), dc)
    return Folder(mode, boxes, marks, shortcut, mark)


def picture_record(pic: Picture, probs: Tensor, distribution: Tensor, labels: Sequence[str], label_idx: int | None,
                   size: tuple[int, int], lm: LoadedModel, folder: Folder) -> dict[str, Any]:
    """The record of one picture: ``probs`` [classes], ``distribution`` [gh, gw] its map as a distribution."""
    dc, patch = lm.data_config, lm.model.cfg.patch_size
    top = probs.topk(min(TOPK, probs.numel()))
    pred = int(top.indices[0])
    q = distribution[None]
    centre, border = region_masses(q, dc.input_size)
    rec: dict[str, Any] = {
        "index": pic.index, "path": pic.path, "label": pic.label, "label_index": label_idx,
        "predicted": labels[pred], "predicted_index": pred,
        "correct": None if label_idx is None else pred == label_idx, "confidence": round(float(top.values[0]), 6),
        "topk": [{"index": int(i), "label": labels[int(i)], "prob": round(float(v), 6)} for v, i in zip(*top)],
        "entropy": round(float(entropy(q)[0]), 6), "concentration": round(float(concentration(q)[0]), 6),
        "centre_mass": round(float(centre[0]), 6), "border_mass": round(float(border[0]), 6),
    }
    rec["off_object"] = rec["border_mass"]
    if pic.rel in folder.boxes:
        box = box_to_input(folder.boxes[pic.rel], size, dc)
        grid = tuple(distribution.shape)
        rec["mass_in_box"] = round(float((distribution * patch_coverage(box, grid, patch)).sum()), 6)
        rec["pointing_hit"] = bool(hit_patches(box, grid, patch).flatten()[int(distribution.argmax())])
        rec["off_object"] = round(1 - rec["mass_in_box"], 6)
    if folder.watermark_box is not None:
        rec["watermark"] = pic.rel in folder.watermarks
        mark = cell_coverage(folder.watermark_box, dc.input_size, tuple(distribution.shape)) > 0
        rec["mass_on_watermark"] = round(float(distribution[mark].sum()), 6)
    return rec


# ----------------------------------------------------------------------------- the pass over the folder


def survey_pictures(lm: LoadedModel, pictures: Sequence[Picture], folder: Folder, method: str, batch_size: int = 16,
                    each: EachPicture | None = None, progress: bool = True, dist: Dist | None = None,
                    load: Loader | None = None) -> tuple[list[dict[str, Any]], np.ndarray, list[str]]:
    """This process's share of ``pictures`` through the model and ``method`` (the map of each
    picture's predicted class): (records, maps [n, h, w] float32 as distributions, errors).
    ``each(record, model-input picture, map)`` is called per picture as it is done (thumbnails)."""
    dist = dist or Dist()
    mine = list(pictures)[dist.rank :: dist.world]
    fn, labels = registry.get(method), lm.labels
    label_idx = {pic.index: label_index(pic, folder.mode, labels) for pic in mine}
    records, maps, errors, done = [], [], [], 0
    for chunk in batches(mine, batch_size, f"survey ({method})", progress and dist.main):
        b = read_batch(chunk, lm, errors, load)
        done += len(chunk)
        if b is None:
            continue
        with torch.inference_mode():
            probs = lm.model(b.x).logits.float().softmax(dim=-1).cpu()
        with registry.reuse(lm.model, b.x):
            p = distributions(fn(lm.model, b.x, probs.argmax(dim=-1).to(lm.device)).detach().cpu())
        small = pool_map(p).float().numpy()
        for j, pic in enumerate(b.pictures):
            rec = picture_record(pic, probs[j], p[j], labels, label_idx[pic.index], b.sizes[j], lm, folder)
            records.append(rec)
            maps.append(small[j])
            if each is not None:
                each(rec, b.shown[j], small[j])
        report(done / max(1, len(mine)), "pictures", done=done, total=len(mine))
    grid = [min(MAP_SIDE, s // lm.model.cfg.patch_size) for s in lm.data_config.input_size]
    return records, np.stack(maps) if maps else np.zeros((0, *grid), np.float32), errors


def gather(records: list[dict[str, Any]], maps: np.ndarray, errors: list[str], dist: Dist
           ) -> tuple[list[dict[str, Any]], np.ndarray, list[str]] | None:
    """Every process's records, maps and errors on process 0, in the folder's order (None elsewhere)."""
    parts = gather_objects((records, maps, errors), dist)
    if parts is None:
        return None
    if len(parts) > 1:
        records = [r for part in parts for r in part[0]]
        maps = np.concatenate([part[1] for part in parts])
        errors = [e for part in parts for e in part[2]]
    order = np.argsort([r["index"] for r in records], kind="stable")
    return [records[i] for i in order], maps[order], errors


# ----------------------------------------------------------------------------- clusters and summary


def clusters_of(records: list[dict[str, Any]], maps: np.ndarray, folder: Folder, input_size: tuple[int, int],
                groups: Sequence[Group], seed: int = 0, found: list[tuple[np.ndarray, list[float]]] | None = None
                ) -> list[dict[str, Any]]:
    """Cluster the maps of each of ``groups`` (:mod:`.grouping`); sets each record's ``cluster`` and
    returns the clusters: id, class (the group's name), size, accuracy, prototype (the members' mean
    map) and members. ``found``: each group's :func:`cluster_maps` already computed (in order)."""
    out: list[dict[str, Any]] = []
    mark = None
    if folder.watermark_box is not None and len(maps):
        mark = cell_coverage(folder.watermark_box, input_size, maps.shape[1:]).numpy() > 0
    for j, group in enumerate(groups):
        assign, spectrum = found[j] if found is not None else cluster_maps(maps[group.members], seed)
        for k in range(int(assign.max()) + 1):
            members = group.members[assign == k]
            out.append(cluster_record(len(out), records, members, maps, group, spectrum, mark))
    return out


def cluster_record(cid: int, records: list[dict[str, Any]], members: np.ndarray, maps: np.ndarray, group: Group,
                   spectrum: list[float], mark: np.ndarray | None) -> dict[str, Any]:
    """One cluster's record (and its members' ``cluster``); ``predicted``: what the model called
    its pictures, where the group is not one predicted class (a folder, the pooled small classes)."""
    proto = maps[members].mean(axis=0)
    rs = [records[i] for i in members]
    for r in rs:
        r["cluster"] = cid
    judged = [r["correct"] for r in rs if r["correct"] is not None]
    c = {"id": cid, "class": group.name, "class_index": group.class_index, "size": len(rs),
         "accuracy": round(sum(judged) / len(judged), 6) if judged else None,
         "mean_confidence": round(float(np.mean([r["confidence"] for r in rs])), 6),
         "off_object": round(float(np.mean([r["off_object"] for r in rs])), 6),
         "members": [r["path"] for r in rs], "prototype": np.round(proto, 6).tolist(), "eigenvalues": spectrum}
    if group.class_index is None:
        c["predicted"] = predicted_counts(records, members)
    if mark is not None:
        c["mass_on_watermark"] = round(float(proto[mark].sum()), 6)
        c["watermarked"] = sum(bool(r.get("watermark")) for r in rs)
    return c


def watermark_finding(records: list[dict[str, Any]], clusters: list[dict[str, Any]], target: str | None
                      ) -> dict[str, Any] | None:
    """For a folder with watermarks: where the watermarked pictures of ``target`` (the class the
    shortcut marks) went: the cluster holding most of them, its share and its prototype's mass
    on the mark's patches; and the cluster whose prototype puts the most mass on the mark."""
    marked = [r for r in records if r.get("watermark") and (target is None or r["label"] == target)]
    if not marked or not clusters:
        return None
    counts: dict[int, int] = {}
    for r in marked:
        counts[r["cluster"]] = counts.get(r["cluster"], 0) + 1
    best = max(counts, key=lambda k: (counts[k], -k))
    top = max(clusters, key=lambda c: c["mass_on_watermark"])
    return {"class": target, "watermarked": len(marked), "cluster": best,
            "share_in_cluster": round(counts[best] / len(marked), 6),
            "cluster_mass_on_watermark": clusters[best]["mass_on_watermark"],
            "most_watermark_cluster": top["id"], "most_watermark_mass": top["mass_on_watermark"]}


FLAG_SIZE = 3  # a cluster this size or more can be flagged
FLAG_SHARE = 0.5  # flagged: this share of its prototype within one cell of its peak near the edge, or off the object
# ... or this share there, and CONTRAST times what the folder's other maps put there. Chosen on a model that learnt
# the shapes and a white mark (tests/data/README.md): its marked circles' mean map had 43 % within one cell of the
# mark's corner (6.6 times the other maps'), under FLAG_SHARE; on 10 other surveys (DeiT-Tiny on ImageNet photos,
# noise, shapes; shapes models on noise and on clean and marked sets) no cluster near the edge passed both (the
# closest: 39 % at 3.2 times, 16 % at 4.7 times; docs/survey.md).
CONTRAST_SHARE, CONTRAST = 0.3, 4.0


def place_contrast(cluster: dict[str, Any], clusters: Sequence[dict[str, Any]], row: int, col: int, share: float
                   ) -> float:
    """``share`` (the cluster's mean map within one cell of (row, col)) over what the folder's other
    pictures' maps put there on average (the other clusters' prototypes weighted by their sizes);
    0 where there are no other pictures."""
    others = [c for c in clusters if c["id"] != cluster["id"]]
    count = sum(c["size"] for c in others)
    if not count:
        return 0.0
    near = (slice(max(0, row - 1), row + 2), slice(max(0, col - 1), col + 2))
    there = sum(c["size"] * float(np.asarray(c["prototype"])[near].sum()) for c in others) / count
    return share / max(there, 1e-12)


def survey_findings(records: list[dict[str, Any]], clusters: list[dict[str, Any]], grid: tuple[int, int]
                    ) -> dict[str, Any]:
    """What stands out, for the top of the report, told nothing about the folder: the clusters
    (of :data:`FLAG_SIZE` pictures or more) whose prototype sits at one place near the edge (at
    least :data:`FLAG_SHARE` of its mass within one cell of its peak, the peak in the outer
    quarter of the map's ``grid``; or :data:`CONTRAST_SHARE` there and :data:`CONTRAST` times
    what the other pictures' maps put there) or, where the folder has boxes, mostly off the
    object: possible Clever-Hans features; the classes decided in more than one way; the wrong answers."""
    boxed = any("mass_in_box" in r for r in records)
    flagged, ways = [], {}
    for c in clusters:
        if c["size"] < FLAG_SIZE:
            continue
        if c["class"] not in POOLED_NAMES:  # the pooled small classes are not one class decided two ways
            ways[c["class"]] = ways.get(c["class"], 0) + 1
        row, col, share = peak_place(c["prototype"])
        contrast = place_contrast(c, clusters, row, col, share)
        at_edge = near_edge(row, col, grid) and (share >= FLAG_SHARE or (share >= CONTRAST_SHARE and contrast >= CONTRAST))
        if at_edge or (boxed and c["off_object"] >= FLAG_SHARE):
            flagged.append({"cluster": c["id"], "class": c["class"], "size": c["size"], "accuracy": c["accuracy"],
                            "place": {"row": row, "col": col}, "one_place_share": round(share, 6),
                            "contrast": round(contrast, 3), "off_object": c["off_object"],
                            "off_object_is": "off the box" if boxed else "on the border"})
    flagged.sort(key=lambda f: (-f["size"], f["cluster"]))
    wrong = sum(r["correct"] is False for r in records)
    return {"suspicious_clusters": flagged, "split_classes": sorted(k for k, v in ways.items() if v > 1),
            "wrong": wrong, "grid": list(grid)}


def plain_notes(records: list[dict[str, Any]], how: str, groups: Sequence[Group], clusters: Sequence[dict[str, Any]],
                by: str) -> list[str]:
    """What the clusters and the 2-D view cannot say for this folder, in plain words (none when
    they can say something): too few pictures to compare, or no group of maps that stands out."""
    n = len(records)
    if n == 1:
        return ["One picture: nothing to compare its map with, so there are no clusters and no 2-D view."]
    notes = []
    if how == "same":
        notes.append(f"All {n} maps are the same: there is nothing to cluster, and the 2-D view puts every "
                     "picture in one place.")
    elif how == "two":
        notes.append(f"The {n} pictures have only two different maps: the 2-D view puts them at its two ends.")
    if how == "same":
        return notes
    if max(len(g.members) for g in groups) < MIN_TO_SPLIT:
        notes.append(f"Too few pictures per {by} to find clusters (a group needs at least {MIN_TO_SPLIT}): "
                     f"each {by} is one cluster.")
    elif len(clusters) == len(groups):
        where = "the pictures' maps form" if len(groups) == 1 else f"the maps of each {by} form"
        notes.append(f"No groups stand out: {where} one cluster (no set of maps is well apart from the rest).")
    return notes


def summarise(lm: LoadedModel, records: list[dict[str, Any]], maps: np.ndarray, errors: list[str], folder: Folder,
              method: str, root: str, seconds: float, dist: Dist, seed: int = 0, child: Child | None = None
              ) -> dict[str, Any]:
    """The survey's result (the ``--json`` object): images, clusters, the embedding and the totals.
    ``child``: a child process (:mod:`.child`) that runs scikit-learn's part (clusters, embedding),
    so that a crash there fails the survey, not the process."""
    by = grouping(records)
    groups = groups_of(records, by)
    members = [g.members for g in groups]
    if child is not None:
        found, xy, how = child.run(arrange, maps, members, seed)
    else:
        found, xy, how = arrange(maps, members, seed)
    clusters = clusters_of(records, maps, folder, lm.data_config.input_size, groups, seed, found)
    for r, (x, y) in zip(records, xy):
        r["xy"] = [round(float(x), 5), round(float(y), 5)]
    judged = [r["correct"] for r in records if r["correct"] is not None]
    result = {
        "folder": root, "model": lm.name, "method": method, "method_title": registry.get(method).title,
        "labels": folder.mode, "count": len(records), "labelled": len(judged),
        "accuracy": round(sum(judged) / len(judged), 6) if judged else None,
        "grid": [s // lm.model.cfg.patch_size for s in lm.data_config.input_size], "map_grid": list(maps.shape[1:]),
        "grouped_by": by, "embedding": how, "images": records, "clusters": clusters, "errors": errors,
        "notes": [*label_notes(records, folder.mode, lm.name, len(lm.labels)),
                  *plain_notes(records, how, groups, clusters, by)],
        "seconds": round(seconds, 2), "processes": dist.world, "device": str(lm.device),
        "precision": lm.precision,
        "findings": survey_findings(records, clusters, tuple(maps.shape[1:])),
    }
    if folder.watermark_box is not None:
        (H, W), (x0, y0, x1, y1) = lm.data_config.input_size, folder.watermark_box
        result["watermark_box"] = [round(x0 / W, 6), round(y0 / H, 6), round(x1 / W, 6), round(y1 / H, 6)]
        result["shortcut"] = folder.shortcut
        result["watermark"] = watermark_finding(records, clusters, folder.shortcut.get("class"))
    return result


def relative_paths(result: dict[str, Any]) -> dict[str, Any]:
    """The same result naming every picture relative to the surveyed folder, and the folder
    "the upload": a report made on a server names no path of it (changed in place)."""
    root, folder_name = str(result["folder"]).rstrip("/"), "the upload"

    def rel(path: str) -> str:
        return path[len(root) + 1:] if path.startswith(root + "/") else Path(path).name

    for r in result["images"]:
        r["path"] = rel(r["path"])
    for c in result["clusters"]:
        c["members"] = [rel(p) for p in c["members"]]
    result["errors"] = [e.replace(root + "/", "").replace(root, folder_name) for e in result["errors"]]
    result["folder"] = folder_name
    return result


def survey(lm: LoadedModel, images: str | os.PathLike, method: str = DEFAULT_METHOD, labels: str = "auto",
           limit: int | None = None, batch_size: int = 16, each: EachPicture | None = None, progress: bool = True,
           seed: int = 0, isolated: bool = False, load: Loader | None = None) -> dict[str, Any] | None:
    """Survey the folder ``images`` (see the module docstring). Under ``torchrun`` only process 0
    returns the result (the others None). ValueError for a headless model, an unknown method, or
    a folder with no pictures. ``seed``: the clustering's and the 2-D view's (the same folder and
    seed give the same result); ``isolated``: the clustering in a child process (:func:`summarise`), started
    with the survey so that it imports scikit-learn while the model works (:class:`.child.Child`);
    ``load``: how a picture is read (the app's limits; default :func:`vit_demo.images.load_image`)."""
    t0 = time.perf_counter()
    method = registry.find(method)  # any case ("LRP-Amortised"); an unknown name with the names it may mean
    require_classifier(lm, "a survey needs predictions")
    with folder_job(lm, images, labels, limit) as (pictures, folder, dist), ExitStack() as stack:
        child = stack.enter_context(Child(CLUSTERING, "The survey's clustering")) if isolated and dist.main else None
        records, maps, errors = survey_pictures(lm, pictures, folder, method, batch_size, each, progress, dist, load)
        gathered = gather(records, maps, errors, dist)
        if gathered is None:
            return None
        records, maps, errors = gathered
        if not records:
            raise none_readable(images, pictures, errors)
        return summarise(lm, records, maps, errors, folder, method, str(images), time.perf_counter() - t0, dist, seed,
                         child)
