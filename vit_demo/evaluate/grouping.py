"""How the survey (:mod:`.survey`) groups a folder's pictures before it clusters their maps, and what
it says about the folder's labels.

- **By predicted class** (SpRAy's way): the maps of the pictures the model calls one class are
  compared with one another. The default, and always where the labels are the model's classes.
- **By folder**: where the folder's sub-folders are not the model's classes (a zip of
  ``bird/``, ``dog/``, ``reptile/`` for DeiT-Tiny's 1000 ImageNet classes, none of which is
  called "bird"), no accuracy can be computed, and grouping by predicted class scattered 90
  pictures over 84 classes of one or two pictures each: 84 "clusters", none of them a finding.
  Each folder's maps are clustered instead, and each cluster says what the model called its
  pictures.
- **The small groups pooled**: a group of fewer than :data:`~.clusters.MIN_TO_SPLIT` pictures
  is never split, and each was a "cluster" of its own: 838 of them for the shared 1000 ImageNet
  photos (836 predicted classes). Where there are more groups than :func:`cluster_cap` (one per 8
  pictures, at least 8), the small ones are clustered together as one group (:data:`POOLED`):
  maps that sit at one place across several classes still gather (a watermark on pictures the
  model calls different things). With a group's own bound (a group of n pictures splits into at
  most n / 4 clusters, :data:`~.clusters.MIN_CLUSTER`), a survey has at most about a quarter as
  many clusters as pictures, and in practice far fewer (docs/survey.md: the counts on unlike folders).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .clusters import MAX_K, MIN_TO_SPLIT

BY_CLASS, BY_FOLDER = "predicted class", "folder"
POOLED = "several classes"  # the name of the pooled group
POOLED_NAMES = (POOLED, "several folders")  # ... by predicted class, by folder
NAMED = 10  # folders named in a note


@dataclass
class Group:
    """Pictures whose maps are clustered together: ``name`` (the predicted class, the folder, or
    :data:`POOLED`), the model's class index (only when grouped by predicted class), the records' indices."""

    name: str
    class_index: int | None
    members: np.ndarray


def grouping(records: Sequence[dict[str, Any]]) -> str:
    """:data:`BY_FOLDER` where the pictures have folder labels and none of them is one of the
    model's classes, else :data:`BY_CLASS`."""
    labelled = [r for r in records if r.get("label")]
    if labelled and all(r.get("label_index") is None for r in labelled) and len(labelled) == len(records):
        return BY_FOLDER
    return BY_CLASS


def cluster_cap(count: int) -> int:
    """The most groups a survey of ``count`` pictures clusters before it pools the small ones: one
    per :data:`~.clusters.MIN_TO_SPLIT` pictures, at least :data:`~.clusters.MAX_K` (one group's most)."""
    return max(MAX_K, count // MIN_TO_SPLIT)


def groups_of(records: Sequence[dict[str, Any]], by: str) -> list[Group]:
    """The groups (the largest first), the small ones pooled where they would make more clusters
    than :func:`cluster_cap` allows (see the module docstring)."""
    key = (lambda r: r["label"]) if by == BY_FOLDER else (lambda r: r["predicted_index"])
    members: dict[Any, list[int]] = {}
    for i, r in enumerate(records):
        members.setdefault(key(r), []).append(i)
    order = sorted(members, key=lambda k: (-len(members[k]), str(k)))
    small = [k for k in order if len(members[k]) < MIN_TO_SPLIT]
    big = [k for k in order if len(members[k]) >= MIN_TO_SPLIT]
    pool = len(small) > 1 and len(order) > cluster_cap(len(records))
    out = []
    for k in big + ([] if pool else small):
        first = records[members[k][0]]
        name, index = (k, None) if by == BY_FOLDER else (first["predicted"], k)
        out.append(Group(name, index, np.array(members[k])))
    if pool:
        rest = np.array(sorted(i for k in small for i in members[k]))
        out.append(Group(POOLED_NAMES[by == BY_FOLDER], None, rest))
    return out


def predicted_counts(records: Sequence[dict[str, Any]], members: np.ndarray, most: int = 3) -> list[list[Any]]:
    """What the model called the pictures ``members``: [[class, count], ...], the most common first."""
    counts = Counter(records[i]["predicted"] for i in members)
    return [[name, n] for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:most]]


def label_notes(records: Sequence[dict[str, Any]], mode: str, model: str, classes: int) -> list[str]:
    """Why pictures with folder labels got no score: their folders are not among the model's classes."""
    if mode != "folders":
        return []
    missing = sorted({r["label"] for r in records if r.get("label") and r.get("label_index") is None})
    if not missing:
        return []
    named = ", ".join(missing[:NAMED]) + (f" and {len(missing) - NAMED} more" if len(missing) > NAMED else "")
    if grouping(records) == BY_FOLDER:
        return [f"No accuracy: the folders ({named}) are not classes of {model} ({classes} classes), so no "
                "prediction can be scored against them. The clusters are of each folder's maps instead, each "
                "with what the model called its pictures."]
    return [f"The folders {named} are not classes of {model}: their pictures are not scored."]
