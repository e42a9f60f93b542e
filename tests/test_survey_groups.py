"""How the survey groups a folder before it clusters its maps: by folder where the folders are not
the model's classes (a zip of bird/, dog/, reptile/ for a 1000-class model: no accuracy, and the
report still grouped), the small classes pooled where they would make one "cluster" each (90
pictures, 84 "clusters"), and a plain note where no group stands out."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import random_shapes_checkpoint

from vit_demo.train.data import make_shapes


@pytest.fixture(scope="module")
def renamed_folders(tmp_path_factory) -> tuple[Path, Path]:
    """24 shapes pictures in folders named bird/, dog/, reptile/ (none a class of the model) and
    a random scratch model with the shapes' four classes."""
    root = tmp_path_factory.mktemp("groups")
    make_shapes(root / "shapes", per_class=6, size=32, seed=8, progress=False)
    pictures = sorted((root / "shapes").rglob("*.png"))
    for i, name in enumerate(("bird", "dog", "reptile")):
        (root / "animals" / name).mkdir(parents=True)
        for p in pictures[i * 8 : (i + 1) * 8]:
            shutil.copy(p, root / "animals" / name / p.name)
    return root / "animals", random_shapes_checkpoint(root / "random.safetensors")


def test_folders_that_are_not_classes_group_the_report(renamed_folders: tuple[Path, Path], tmp_path: Path) -> None:
    """The folders are no class of the model: no accuracy, a note that says why (naming them), and
    the maps clustered per folder, each cluster with what the model called its pictures; the
    report, the tab's status line and the command's summary say the same."""
    from vit_demo.app.tabs.folder import status_text
    from vit_demo.checkpoints.load import load_model
    from vit_demo.cli.survey import summary_lines
    from vit_demo.evaluate.survey import survey
    from vit_demo.present.survey_report import write_report

    folder, ckpt = renamed_folders
    lm = load_model(weights=ckpt, device="cpu", progress=False)
    res = survey(lm, folder, "chefer", progress=False)
    assert (res["labels"], res["labelled"], res["accuracy"], res["grouped_by"]) == ("folders", 0, None, "folder")
    assert res["notes"][0] == ("No accuracy: the folders (bird, dog, reptile) are not classes of random (4 classes), so "
                               "no prediction can be scored against them. The clusters are of each folder's maps "
                               "instead, each with what the model called its pictures.")
    assert {c["class"] for c in res["clusters"]} == {"bird", "dog", "reptile"}
    by_path = {im["path"]: im for im in res["images"]}
    for c in res["clusters"]:
        assert c["class_index"] is None and all(by_path[p]["label"] == c["class"] for p in c["members"])
        called = Counter(by_path[p]["predicted"] for p in c["members"])
        assert c["predicted"] == [[k, n] for k, n in sorted(called.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
    status = status_text(res, res["notes"])
    assert "no accuracy: the folders are not the model's classes" in status and "no labels" not in status
    assert "clusters of the folders; folders whose maps fall into more than one cluster" in status
    assert "no accuracy: the folders are not the model's classes" in summary_lines(res, tmp_path / "report.html")
    page = write_report(res, tmp_path / "report").read_text()
    assert "No accuracy: the folders are not classes of this model" in page


def records_in(classes: list[int], seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """Records predicted as ``classes`` (one per picture) and random 8x8 maps."""
    rng = np.random.default_rng(seed)
    recs = [{"predicted_index": c, "predicted": f"class {c}", "label": None, "label_index": None, "correct": None,
             "confidence": 0.5, "off_object": 0.3, "path": f"p{i}.png"} for i, c in enumerate(classes)]
    return recs, rng.dirichlet(np.ones(64), len(classes)).reshape(-1, 8, 8)


def test_many_small_classes_are_pooled_and_the_clusters_capped() -> None:
    """90 pictures the model calls 84 different things were 84 "clusters"; now the classes of fewer
    than 8 pictures are clustered together and the count stays within the cap; 4 classes of 30
    (the lesson's folders) are grouped as before, one group each."""
    from vit_demo.evaluate.grouping import POOLED, cluster_cap, groups_of
    from vit_demo.evaluate.survey import Folder, clusters_of

    recs, maps = records_in(list(range(78)) + [100] * 12)  # 78 classes of one picture, one of 12
    groups = groups_of(recs, "predicted class")
    assert [(g.name, g.class_index, len(g.members)) for g in groups] == [("class 100", 100, 12), (POOLED, None, 78)]
    clusters = clusters_of(recs, maps, Folder("names", {}, {}, {}, None), (32, 32), groups)
    assert len(clusters) <= cluster_cap(90) == 11 and sorted(m for c in clusters for m in c["members"]) == sorted(
        r["path"] for r in recs)
    pooled = [c for c in clusters if c["class"] == POOLED]
    assert pooled and all(c["class_index"] is None and len(c["predicted"]) == 3 for c in pooled)
    four, _ = records_in([c for c in range(4) for _ in range(30)])
    assert [len(g.members) for g in groups_of(four, "predicted class")] == [30] * 4
    few, _ = records_in([0, 0, 1, 2])  # 3 groups, within the cap: not pooled
    assert [g.name for g in groups_of(few, "predicted class")] == ["class 0", "class 1", "class 2"]


def test_a_survey_without_distinct_groups_says_so() -> None:
    """Noise maps in one class: one cluster, and a note that no group stands out; one picture per
    class: each is one cluster, and the note says there are too few."""
    from vit_demo.evaluate.grouping import groups_of
    from vit_demo.evaluate.survey import Folder, clusters_of, plain_notes

    recs, maps = records_in([0] * 40)
    groups = groups_of(recs, "predicted class")
    clusters = clusters_of(recs, maps, Folder("names", {}, {}, {}, None), (32, 32), groups)
    assert len(clusters) == 1
    assert plain_notes(recs, "tsne", groups, clusters, "predicted class") == [
        "No groups stand out: the pictures' maps form one cluster (no set of maps is well apart from the rest)."]
    recs, maps = records_in([0, 1, 2])
    groups = groups_of(recs, "predicted class")
    clusters = clusters_of(recs, maps, Folder("names", {}, {}, {}, None), (32, 32), groups)
    assert plain_notes(recs, "pca", groups, clusters, "predicted class") == [
        "Too few pictures per predicted class to find clusters (a group needs at least 8): each predicted class is "
        "one cluster."]


@pytest.mark.slow  # DeiT-Tiny's maps of 36 photos
def test_a_zip_of_animal_folders_for_deit_tiny(sample_images: list[Path], tmp_path: Path) -> None:
    """The reported case on the real model: photos in bird/, dog/, reptile/ (none of DeiT-Tiny's
    1000 classes). No accuracy, the note says why, the clusters are the folders' (a few, not one per
    predicted class); the same photos loose are pooled into a few clusters too."""
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.grouping import cluster_cap
    from vit_demo.evaluate.survey import survey

    folders = {"bird": range(7, 25), "dog": range(151, 269), "reptile": range(33, 69)}  # ImageNet class indices
    (tmp_path / "loose").mkdir()
    for name, idx in folders.items():
        (tmp_path / "my_photos" / name).mkdir(parents=True)
        for i in list(idx)[:: len(idx) // 12][:12]:
            shutil.copy(sample_images[i], tmp_path / "my_photos" / name / sample_images[i].name)
            shutil.copy(sample_images[i], tmp_path / "loose" / f"photo{i}.jpg")  # loose, unlabelled
    lm = load_model(device="cpu", progress=False)
    res = survey(lm, tmp_path / "my_photos", progress=False)
    assert (res["count"], res["accuracy"], res["grouped_by"]) == (36, None, "folder")
    assert res["notes"][0].startswith("No accuracy: the folders (bird, dog, reptile) are not classes of "
                                      f"{lm.name} (1000 classes)")
    assert {c["class"] for c in res["clusters"]} == {"bird", "dog", "reptile"} and len(res["clusters"]) <= 9
    loose = survey(lm, tmp_path / "loose", progress=False)
    assert loose["count"] == 36 and len({im["predicted"] for im in loose["images"]}) > 20
    assert len(loose["clusters"]) <= cluster_cap(36) == 8
