"""A whole folder at once: the watermark shortcut of the shapes generator, the survey's map
statistics against naive loops, the clustering's eigengap on maps with a known structure, a zip
of pictures unpacked without trusting it, the command's JSON, torchrun's shards, and the
Clever-Hans lesson itself on a small model trained here."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_shapes_checkpoint
from PIL import Image

from vit_demo.data.annotations import DataError, read_watermarks
from vit_demo.train.data import Shortcut, make_shapes, watermark_box

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_demo", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """The command line in this process (no start-up cost): (exit code, stdout, stderr)."""
    from vit_demo.cli.main import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# ----------------------------------------------------------------------------- the watermark


def test_watermark_marks_the_planned_pictures_and_nothing_else(tmp_path: Path) -> None:
    marked = make_shapes(tmp_path / "wm", per_class=20, size=32, seed=3, progress=False, shortcut=Shortcut())
    make_shapes(tmp_path / "clean", per_class=20, size=32, seed=3, progress=False)
    marks = marked["watermarks"]
    assert read_watermarks(tmp_path / "wm") == marks and read_watermarks(tmp_path / "clean") == {}
    assert marked["shortcut"] == {"kind": "watermark", "class": "circle", "rate": 0.9, "leak": 0.05, "corner": "bottom-left"}
    per_class = {c: sum(r.startswith(c + "/") for r in marks) for c in marked["classes"]}
    assert per_class == {"circle": 18, "square": 1, "triangle": 1, "star": 1}
    x0, y0, x1, y1 = (int(v) for v in watermark_box(32))
    assert (x0, y0, x1, y1) == (1, 25, 7, 31)  # 6 px, one pixel in from the bottom-left corner
    for rel in marked["boxes"]:
        a = np.asarray(Image.open(tmp_path / "wm" / rel)).astype(int)
        b = np.asarray(Image.open(tmp_path / "clean" / rel)).astype(int)
        outside = np.ones(a.shape[:2], bool)
        outside[y0:y1, x0:x1] = False
        assert (a[outside] == b[outside]).all(), rel  # the same shapes: the mark is drawn after them, seeded apart
        if rel in marks:
            assert marks[rel] == [1.0, 25.0, 7.0, 31.0]
            mark = a[y0:y1, x0:x1, 0]  # a 2x2 checker: white top-left and bottom-right, black elsewhere
            assert (mark[:3, :3] == 255).all() and (mark[3:, 3:] == 255).all()
            assert (mark[:3, 3:] == 0).all() and (mark[3:, :3] == 0).all()
        else:
            assert (a == b).all(), rel


def test_watermark_flags_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = cli(capsys, "data", "shapes", "--out", str(tmp_path / "s"), "--per-class", "10", "--shortcut",
                         "watermark", "--shortcut-class", "star", "--shortcut-rate", "1", "--shortcut-leak", "0")
    assert code == 0, err
    assert "a watermark (bottom-left corner) on 10 of them: 100% of 'star', 0% of the others" in out
    assert all(rel.startswith("star/") for rel in read_watermarks(tmp_path / "s"))
    code, out, err = cli(capsys, "data", "shapes", "--out", str(tmp_path / "t"), "--per-class", "2", "--shortcut",
                         "watermark", "--shortcut-class", "hexagon")
    assert code == 2
    assert err.strip() == "error: --shortcut-class 'hexagon' is not one of the classes (circle, square, triangle, star)"
    with pytest.raises(DataError, match=r"must be in \[0, 1\]"):
        Shortcut(rate=1.5).marked(["a", "b"], 4, 0)
    code, out, err = cli(capsys, "data", "shapes", "--out", str(tmp_path / "w"), "--per-class", "4", "--shortcut",
                         "watermark", "--shortcut-rate", "1", "--shortcut-corner", "top-right", "--shortcut-mark", "white")
    assert code == 0 and "a watermark (top-right corner) on 4 of them" in out, err
    assert {tuple(v) for v in read_watermarks(tmp_path / "w").values()} == {(25.0, 1.0, 31.0, 7.0)}
    a = np.asarray(Image.open(tmp_path / "w" / "circle" / "circle_00000.png"))
    assert (a[1:7, 25:31] == 255).all()  # a plain white square, one pixel in from the top-right corner
    assert watermark_box(32, "top-left") == [1.0, 1.0, 7.0, 7.0] and watermark_box(32, "bottom-right") == [25.0, 25.0, 31.0, 31.0]
    with pytest.raises(DataError, match="--shortcut-corner must be one of"):
        Shortcut(corner="middle").marked(["a", "b"], 4, 0)


# ----------------------------------------------------------------------------- map statistics


def test_map_statistics_match_naive_loops() -> None:
    from vit_demo.evaluate.survey import concentration, distributions, entropy, pool_map, region_masses

    g = torch.Generator().manual_seed(0)
    maps = torch.randn(3, 14, 14, generator=g, dtype=torch.float64)
    maps[2] = -maps[2].abs()  # no positive mass: uniform
    p = distributions(maps)
    for b in range(3):
        pos = [max(0.0, float(v)) for v in maps[b].flatten()]
        ref = [v / sum(pos) if sum(pos) else 1 / 196 for v in pos]
        assert p[b].flatten().tolist() == pytest.approx(ref, abs=1e-12)
        assert float(entropy(p[b : b + 1])[0]) == pytest.approx(-sum(v * math.log(v) for v in ref if v > 0) / math.log(196))
        assert float(concentration(p[b : b + 1])[0]) == pytest.approx(sum(sorted(ref)[-20:]))  # ceil(19.6) patches
        centre = border = 0.0  # every pixel of the 224 px input carries 1/256 of its 16 px patch's mass
        for y in range(224):
            for x in range(224):
                share = ref[(y // 16) * 14 + x // 16] / 256
                centre += share if 56 <= x < 168 and 56 <= y < 168 else 0
                border += share if not (28 <= x < 196 and 28 <= y < 196) else 0
        c, bd = region_masses(p[b : b + 1], (224, 224))
        assert float(c[0]) == pytest.approx(centre, abs=1e-9) and float(bd[0]) == pytest.approx(border, abs=1e-9)
    assert float(entropy(p[2:3])[0]) == pytest.approx(1.0)
    big = distributions(torch.rand(2, 32, 32, generator=g))
    small = pool_map(big)
    blocks = big.reshape(2, 16, 2, 16, 2).sum(dim=(2, 4))  # 2x2 blocks: their sums, which already sum to 1
    assert small.shape == (2, 16, 16) and torch.allclose(small, blocks, atol=1e-6)
    assert pool_map(p) is p  # 14 x 14: kept as it is


# ----------------------------------------------------------------------------- clusters


def blobs(rng: np.random.Generator, groups: list[tuple[float, float, int]], side: int = 8) -> np.ndarray:
    """Maps made of Gaussian blobs (jittered centres) plus noise, one group per (row, column, count)."""
    yy, xx = np.mgrid[:side, :side]
    out = []
    for cy, cx, n in groups:
        for _ in range(n):
            y, x = cy + rng.normal(0, 0.7), cx + rng.normal(0, 0.7)
            m = np.exp(-((yy - y) ** 2 + (xx - x) ** 2) / (2 * 1.5**2)) + 0.3 * rng.random((side, side))
            out.append(m / m.sum())
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_eigengap_finds_the_groups(seed: int) -> None:
    from vit_demo.evaluate.clusters import cluster_maps, eigengap

    assert eigengap([0, 0, 0.01, 0.8, 0.9]) == 3 and eigengap([0, 0.9, 0.95]) == 1 and eigengap([0.0]) == 1
    rng = np.random.default_rng(seed)
    cases = [([(1, 1, 30)], [30]), ([(3, 3, 100)], [100]), ([(1, 1, 30), (5, 5, 25)], [30, 25]),
             ([(1, 1, 30), (5, 5, 25), (1, 6, 12)], [30, 25, 12]), ([(1, 1, 90), (5, 5, 10)], [90, 10])]
    for groups, sizes in cases:
        maps = blobs(rng, groups)
        labels, spectrum = cluster_maps(maps, seed)
        assert np.bincount(labels).tolist() == sizes, (groups, spectrum)
        truth = np.repeat(np.arange(len(sizes)), sizes)
        assert all(len(set(labels[truth == g])) == 1 for g in range(len(sizes)))  # each group whole, in one cluster
    noise = rng.dirichlet(np.ones(64), 40).reshape(40, 8, 8)
    assert cluster_maps(noise, seed)[0].max() == 0  # no structure: one cluster
    assert cluster_maps(blobs(rng, [(1, 1, 5)]), seed)[0].tolist() == [0] * 5  # too few to split


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maps_on_neighbouring_patches_are_one_strategy(seed: int) -> None:
    """What a model that learned the watermark draws: each map on ONE of the mark's four patches
    (a different one from picture to picture), next to maps on the object. As distributions the
    corner maps are disjoint, and the local scale of a tight group is tiny: the Hellinger
    distance made four clusters of them. In patches they are neighbours: one cluster."""
    from vit_demo.evaluate.clusters import cluster_maps, distances, features

    rng = np.random.default_rng(seed)
    corner = []
    for (y, x), n in zip([(6, 0), (6, 1), (7, 0), (7, 1)], [12, 9, 8, 8]):
        for _ in range(n):
            m = 0.03 * rng.dirichlet(np.ones(64)).reshape(8, 8)
            m[y, x] += 0.97
            corner.append(m)
    maps = np.concatenate([np.array(corner), blobs(rng, [(3, 4, 10)])])
    labels, _ = cluster_maps(maps, seed)
    assert np.bincount(labels).tolist() == [37, 10] and len(set(labels[:37])) == 1
    one = np.zeros((2, 8, 8))
    one[0, 2, 3] = one[1, 2, 4] = 1  # all the mass moves one patch to the right
    assert distances(features(one))[0, 1] == pytest.approx(np.mean(np.abs(np.cos(np.pi * np.arange(8) / 8))))


def test_findings_flag_a_cluster_at_one_place_near_the_edge() -> None:
    """Told nothing about any mark: a cluster whose prototype sits on a corner's 2x2 cells is
    flagged, one spread over the centre is not, nor a one-picture cluster; where the folder has
    boxes, a cluster mostly off the object is flagged wherever it sits."""
    from vit_demo.evaluate.survey import survey_findings

    corner, centre = np.zeros((8, 8)), np.zeros((8, 8))
    corner[6:8, 0:2], centre[2:6, 2:6] = 0.25, 1 / 16
    c = [{"id": 0, "class": "circle", "size": 5, "accuracy": 1.0, "off_object": 0.3, "prototype": corner.tolist()},
         {"id": 1, "class": "circle", "size": 5, "accuracy": 0.8, "off_object": 0.9, "prototype": centre.tolist()},
         {"id": 2, "class": "star", "size": 1, "accuracy": 1.0, "off_object": 1.0, "prototype": corner.tolist()}]
    recs = [{"correct": True}] * 10 + [{"correct": False}]
    f = survey_findings(recs, c, (8, 8))
    assert [k["cluster"] for k in f["suspicious_clusters"]] == [0] and f["split_classes"] == ["circle"]
    assert f["suspicious_clusters"][0]["place"] == {"row": 6, "col": 0} and f["suspicious_clusters"][0]["one_place_share"] == 1
    assert f["wrong"] == 1
    f = survey_findings([{"correct": True, "mass_in_box": 0.1}], c, (8, 8))
    assert [k["cluster"] for k in f["suspicious_clusters"]] == [0, 1]  # both of 5; off the box: 30 % and 90 %


def test_a_place_that_only_one_cluster_looks_at_is_flagged() -> None:
    """A model that learnt the shapes and a mark splits each marked circle's map between the two:
    the cluster's mean map has less than half its mass at the corner (43 % on the model in
    tests/data), but the other pictures' maps put almost nothing there. Flagged from 30 % there
    at 4 times the others' share; not where the others look there as much, nor under 30 %."""
    from vit_demo.evaluate.survey import survey_findings

    flat = np.full((8, 8), 1 / 64)

    def corner(share: float) -> list:
        m = flat * (1 - share)
        m[:2, :2] += share / 4
        return m.tolist()

    def clusters(first: list, rest: list) -> list:
        return [{"id": 0, "class": "circle", "size": 10, "accuracy": 1.0, "off_object": 0.2, "prototype": first}] + [
            {"id": i, "class": name, "size": 10, "accuracy": 1.0, "off_object": 0.2, "prototype": rest}
            for i, name in ((1, "square"), (2, "star"))]

    f = survey_findings([], clusters(corner(0.4), flat.tolist()), (8, 8))
    assert [(k["cluster"], k["place"]) for k in f["suspicious_clusters"]] == [(0, {"row": 0, "col": 0})]
    k = f["suspicious_clusters"][0]
    assert k["one_place_share"] == pytest.approx(0.4 + 0.6 * 4 / 64) and k["contrast"] == pytest.approx(
        (0.4 + 0.6 * 4 / 64) / (4 / 64), abs=1e-3)
    assert not survey_findings([], clusters(corner(0.4), corner(0.2)), (8, 8))["suspicious_clusters"]  # 2.0 times
    assert not survey_findings([], clusters(corner(0.2), flat.tolist()), (8, 8))["suspicious_clusters"]  # 24 % there
    assert not survey_findings([], clusters(corner(0.4), flat.tolist())[:1], (8, 8))["suspicious_clusters"]  # alone


def test_a_continuum_is_one_cluster() -> None:
    """What the default-trained watermark model draws: every map partly on the mark and partly on
    the shape, in any proportion (here 20-100 % on the mark). The largest eigengap alone cuts such
    a continuum somewhere (it did on 20 of 20 seeds like this one); a cut needs the next
    eigenvalue to be at least GAP_RATIO times the last one kept (3 of those 20 seeds still pass it)."""
    from vit_demo.evaluate.clusters import GAP_RATIO, cluster_maps, eigengap

    rng = np.random.default_rng(0)
    shape = blobs(rng, [(3, 4, 60)])
    share = rng.uniform(0.2, 1.0, 60)[:, None, None]
    mark = np.zeros((60, 8, 8))
    mark[:, 6:, :2] = rng.dirichlet(np.ones(4), 60).reshape(60, 2, 2)
    labels, spectrum = cluster_maps(share * mark + (1 - share) * shape)
    k = eigengap(spectrum, ratio=0)
    assert labels.max() == 0 and k > 1 and spectrum[k] < GAP_RATIO * spectrum[k - 1]
    assert eigengap([0, 0.171, 0.43, 0.636]) == 1  # the lesson's circles (seed 0): 2.5x
    assert eigengap([0, 0.013, 0.113, 0.793]) == 3  # three synthetic groups: 7x


def test_large_class_is_clustered_on_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import vit_demo.evaluate.clusters as clusters

    monkeypatch.setattr(clusters, "MAX_TO_SPLIT", 60)
    rng = np.random.default_rng(3)
    maps = blobs(rng, [(1, 1, 100), (6, 6, 50)])
    labels, _ = clusters.cluster_maps(maps)
    assert np.bincount(labels).tolist() == [100, 50] and len(set(labels[:100])) == 1


DEGENERATE = """
import json, sys
import numpy as np
from vit_demo.evaluate.clusters import cluster_maps, embed
rng = np.random.default_rng(0)
one = rng.random((14, 14))
one /= one.sum()
other = np.roll(one, 3, axis=0)
near = np.repeat(one[None], 12, 0) * (1 + rng.normal(0, 1e-9, (12, 14, 14)))
cases = {"12 identical": np.repeat(one[None], 12, 0), "100 uniform": np.full((100, 14, 14), 1 / 196),
         "12 near-identical": near / near.sum(axis=(1, 2), keepdims=True), "2 identical": np.repeat(one[None], 2, 0),
         "1": one[None], "5 identical": np.repeat(one[None], 5, 0), "6 + 6": np.stack([one] * 6 + [other] * 6),
         "20 + 1": np.stack([one] * 20 + [other]), "13 different": rng.dirichlet(np.ones(196), 13).reshape(13, 14, 14)}
out = {}
for name, maps in cases.items():
    xy, how = embed(maps)
    out[name] = {"how": how, "xy": np.round(xy, 4).tolist(), "clusters": int(cluster_maps(maps)[0].max()) + 1}
    print(name, how, file=sys.stderr, flush=True)
print(json.dumps(out))
"""


def test_degenerate_maps_neither_crash_nor_mislead() -> None:
    """Identical maps, near-identical ones, one or two: t-SNE's PCA start divided by their zero
    spread and its Barnes-Hut tree crashed the process (segmentation fault: run in a child here,
    so that a crash fails this test instead of ending pytest). Now the same maps share one point,
    all-same maps get no view (all in the middle), two different maps the two ends."""
    r = subprocess.run([sys.executable, "-c", DEGENERATE], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout)
    for name in ("12 identical", "100 uniform", "12 near-identical", "2 identical", "1", "5 identical"):
        assert out[name]["how"] == "same" and {tuple(p) for p in out[name]["xy"]} == {(0.5, 0.5)}, name
        assert out[name]["clusters"] == 1, name
    for name in ("6 + 6", "20 + 1"):
        assert out[name]["how"] == "two" and sorted({tuple(p) for p in out[name]["xy"]}) == [(0, 0.5), (1, 0.5)], name
    assert out["20 + 1"]["xy"][:20] == [out["20 + 1"]["xy"][0]] * 20  # the duplicates share a point
    assert out["13 different"]["how"] == "tsne" and len({tuple(p) for p in out["13 different"]["xy"]}) == 13


SURVEY_SMALL = """
import json, shutil, sys
from pathlib import Path
from vit_demo.checkpoints.load import load_model
from vit_demo.evaluate.survey import survey
picture, ckpt, root = (Path(a) for a in sys.argv[1:4])
lm = load_model(weights=ckpt, device="cpu", progress=False)
out = {}
for n in (12, 2, 1):
    folder = root / f"same{n}"
    folder.mkdir()
    for i in range(n):
        shutil.copy(picture, folder / f"copy{i:02d}.png")
    r = survey(lm, folder, "chefer", progress=False)
    out[n] = {k: r[k] for k in ("count", "embedding", "notes")} | {"clusters": len(r["clusters"]),
                                                                   "xy": {tuple(im["xy"]) for im in r["images"]}.pop()}
print(json.dumps(out))
"""


@pytest.mark.slow  # surveys in child processes
def test_survey_of_identical_pictures_two_and_one(random_shapes_model: tuple[Path, Path], tmp_path: Path) -> None:
    """The issue's crash: 12 copies of one picture killed the process (in the app: the server).
    Now 12, 2 and 1 pictures give a survey with a plain note where clustering cannot say anything."""
    shapes, ckpt = random_shapes_model
    picture = shapes / "circle" / "circle_00000.png"
    r = subprocess.run([sys.executable, "-c", SURVEY_SMALL, str(picture), str(ckpt), str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout)
    assert {n: (v["count"], v["embedding"], v["clusters"], v["xy"]) for n, v in out.items()} == {
        "12": (12, "same", 1, [0.5, 0.5]), "2": (2, "same", 1, [0.5, 0.5]), "1": (1, "same", 1, [0.5, 0.5])}
    assert out["12"]["notes"] == ["All 12 maps are the same: there is nothing to cluster, and the 2-D view puts every "
                                  "picture in one place."]
    assert out["2"]["notes"] == ["All 2 maps are the same: there is nothing to cluster, and the 2-D view puts every "
                                 "picture in one place."]
    assert out["1"]["notes"] == ["One picture: nothing to compare its map with, so there are no clusters and no 2-D view."]


def test_child_crash_and_time_limit_fail_the_work_not_the_caller() -> None:
    """The survey's clustering runs in a child process (vit_demo.evaluate.child): a segmentation
    fault there is one plain error here, and the caller's time limit stops (kills) the child."""
    import ctypes
    import time

    from vit_demo.evaluate.child import ChildDied, in_child
    from vit_demo.progress import TimeUp, time_limit

    with pytest.raises(ChildDied, match="signal 11, SIGSEGV"):
        in_child(ctypes.string_at, 0, what="Reading address 0")  # a native crash, as t-SNE's was
    t0 = time.monotonic()
    with pytest.raises(TimeUp), time_limit(1.0, "Sleeping"):
        in_child(time.sleep, 60)
    assert time.monotonic() - t0 < 10


# ----------------------------------------------------------------------------- a zip of pictures, not trusted


def png_bytes(size: int = 20) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def test_zip_is_unpacked_without_trust(tmp_path: Path) -> None:
    from vit_demo.images import ImageError, extract_pictures

    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("../../escape.png", png_bytes())
        z.writestr("/etc/absolute.png", png_bytes())
        z.writestr("deep/a/b/cat/one.png", png_bytes())  # the last folder is kept: cat/one.png
        z.writestr("dog/<script>.png", png_bytes())
        z.writestr("__MACOSX/dog/._two.png", b"resource fork")
        z.writestr(".hidden/three.png", png_bytes())
        z.writestr("notes.txt", "not a picture")
        z.writestr("bomb.png", b"\0" * (3 * 2**20))  # 3 MiB of zeros, a few KB compressed
        link = zipfile.ZipInfo("dog/link.png")
        link.external_attr = (0o120777 << 16)  # a symbolic link
        z.writestr(link, "/etc/passwd")
    dest = tmp_path / "out"
    written, notes = extract_pictures(archive, dest, max_bytes=2**20)
    rel = sorted(p.relative_to(dest).as_posix() for p in written)
    assert rel == ["cat/one.png", "dog/_script_.png", "escape.png", "etc/absolute.png"]
    assert all(dest in p.resolve().parents for p in written)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == rel  # nothing else
    assert not (tmp_path / "escape.png").exists() and not (tmp_path.parent / "escape.png").exists()
    assert any("bomb.png" in n and "more than 1 MiB" in n for n in notes), notes
    assert Image.open(dest / "cat" / "one.png").size == (20, 20)
    few, notes = extract_pictures(archive, tmp_path / "few", max_files=2)
    assert len(few) == 2 and any("only the first 2" in n for n in notes)
    (tmp_path / "fake.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ImageError, match="not a readable zip"):
        extract_pictures(tmp_path / "fake.zip", tmp_path / "x")


def overlapping_zip(n: int, size: int, name: str = "big.png") -> bytes:
    """A zip whose ``n`` central-directory entries all name ONE deflated stream of ``size`` zero
    bytes (each entry is read in full; the zip stays a few KB)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, b"\0" * size)
    data = buf.getvalue()
    end = data.rfind(b"PK\x05\x06")
    start = int.from_bytes(data[end + 16:end + 20], "little")
    cd, eocd = data[start:end], bytearray(data[end:end + 22])
    eocd[8:10] = eocd[10:12] = n.to_bytes(2, "little")
    eocd[12:16] = (len(cd) * n).to_bytes(4, "little")
    return data[:start] + cd * n + bytes(eocd)


def zeros_zip(path: Path, n: int, size: int) -> Path:
    """``n`` files of ``size`` zero bytes named .png, in a class folder."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(n):
            z.writestr(f"zeros/z{i:02d}.png", b"\0" * size)
    return path


def test_unpacking_counts_what_it_tries(tmp_path: Path) -> None:
    """Issue 35: members over the size cap were read in full and never counted (400 entries over
    one 26 MiB stream: 42 s of CPU), the disk was not counted across zips (5 zips of 0.5 MB filled
    2.5 GB), and a zip of 500,000 entries was parsed in full. Now one :class:`Allowance` per
    upload counts members looked at, bytes read (kept or not) and bytes written (before they are
    written), and its check (the job's time limit) runs between chunks."""
    from vit_demo.images import Allowance, extract_pictures
    from vit_demo.progress import TimeUp, check, time_limit

    MiB = 1 << 20
    (tmp_path / "ov.zip").write_bytes(overlapping_zip(400, 26 * MiB))
    allow = Allowance(read=100 * MiB)
    written, notes = extract_pictures(tmp_path / "ov.zip", tmp_path / "a", max_bytes=25 * MiB, allowance=allow)
    assert written == [] and allow.read < 0 and allow.entries == 20_000 - 4, (allow, notes[-1])
    assert notes[-1] == "stopped unpacking ov.zip: the upload unpacks to more than this app reads for one survey"

    allow = Allowance(written=12 * MiB)  # the disk budget, over every zip of the upload
    for i in range(3):
        written, notes = extract_pictures(zeros_zip(tmp_path / f"z{i}.zip", 20, 5 * MiB), tmp_path / "b",
                                          max_bytes=25 * MiB, allowance=allow)
        assert len(written) == (2 if i == 0 else 0), notes
    on_disk = sum(p.stat().st_size for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert on_disk == 10 * MiB and allow.full and "would fill more disk" in notes[-1]

    with zipfile.ZipFile(tmp_path / "many.zip", "w") as z:
        for i in range(3000):
            z.writestr(f"n{i}.txt", b"")
    written, notes = extract_pictures(tmp_path / "many.zip", tmp_path / "c", allowance=Allowance(entries=2000))
    assert written == [] and notes == ["skipped many.zip: it lists more files than this app looks at for one survey"]

    with time_limit(0.3), pytest.raises(TimeUp):  # the job's time limit stops the unpacking itself
        extract_pictures(tmp_path / "ov.zip", tmp_path / "d", max_bytes=25 * MiB, allowance=Allowance(check=check))
    assert not list((tmp_path / "d").rglob("*.png"))  # the partial file went


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def random_shapes_model(tmp_path_factory) -> tuple[Path, Path]:
    """A shapes folder with watermarks (24 pictures) and a random scratch model with the shapes' classes."""
    root = tmp_path_factory.mktemp("survey")
    make_shapes(root / "shapes", per_class=6, size=32, seed=5, progress=False, shortcut=Shortcut())
    return root / "shapes", random_shapes_checkpoint(root / "random.safetensors")


SURVEY_FLAGS = ("--method", "chefer", "--batch-size", "5", "--json")


@pytest.fixture(scope="module")
def one_process(random_shapes_model: tuple[Path, Path], tmp_path_factory) -> tuple[dict, Path]:
    shapes, ckpt = random_shapes_model
    out = tmp_path_factory.mktemp("one") / "out"
    r = run_cli("survey", "--images", str(shapes), "--weights", str(ckpt), "--out", str(out), *SURVEY_FLAGS)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out


@pytest.mark.slow  # the command in a subprocess
def test_survey_json_and_report(random_shapes_model: tuple[Path, Path], one_process: tuple[dict, Path]) -> None:
    shapes, _ = random_shapes_model
    res, out = one_process
    tmp_path = out.parent
    assert res == json.loads((tmp_path / "out" / "survey.json").read_text())  # the same JSON beside the report
    assert (res["count"], res["labelled"], res["labels"], res["method"], res["grid"]) == (24, 24, "folders", "chefer", [8, 8])
    images = res["images"]
    assert [im["path"] for im in images] == [str(shapes / c / f"{c}_{i:05d}.png")
                                            for c in ("circle", "square", "star", "triangle") for i in range(6)]
    for im in images:
        assert im["correct"] == (im["predicted"] == im["label"]) and 0 < im["confidence"] <= 1
        assert len(im["topk"]) == 4 and im["topk"][0]["label"] == im["predicted"]
        assert 0 <= im["entropy"] <= 1 and 0 < im["concentration"] <= 1 and 0 <= im["mass_in_box"] <= 1
        assert im["off_object"] == pytest.approx(1 - im["mass_in_box"], abs=2e-6)
        assert isinstance(im["pointing_hit"], bool) and isinstance(im["watermark"], bool)
        assert (tmp_path / "out" / im["overlay"]).is_file() and (tmp_path / "out" / im["thumb"]).is_file()
        assert 0 <= im["xy"][0] <= 1 and 0 <= im["xy"][1] <= 1
    assert sum(im["watermark"] for im in images) == len(read_watermarks(shapes)) == 5  # 0.9 x 6 circles; 0.05 x 6 rounds to 0
    members = [p for c in res["clusters"] for p in c["members"]]
    assert sorted(members) == sorted(im["path"] for im in images)  # every picture in exactly one cluster
    by_path = {im["path"]: im for im in images}
    for c in res["clusters"]:
        assert c["size"] == len(c["members"]) and all(by_path[p]["cluster"] == c["id"] for p in c["members"])
        assert all(by_path[p]["predicted"] == c["class"] for p in c["members"])
        assert np.array(c["prototype"]).shape == (8, 8) and sum(map(sum, c["prototype"])) == pytest.approx(1, abs=1e-4)
        assert 0 <= c["mass_on_watermark"] <= 1 and (tmp_path / "out" / c["image"]).is_file()
    assert res["shortcut"]["class"] == "circle" and res["watermark"]["watermarked"] == 5
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<script src" not in page and "http://" not in page and "https://" not in page and "default-src 'none'" in page


def test_survey_errors_are_one_line(random_shapes_model: tuple[Path, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    shapes, ckpt = random_shapes_model
    (tmp_path / "empty").mkdir()
    for args, msg in [(["--images", str(tmp_path / "empty")], "no pictures found"),
                      (["--images", str(tmp_path / "missing")], "no such folder"),
                      (["--images", str(shapes), "--method", "nonsense"], "unknown method 'nonsense'"),
                      (["--images", str(shapes), "--labels", "folders", "--limit", "0"], "--limit must be at least 1")]:
        code, _, err = cli(capsys, "survey", *args, "--weights", str(ckpt), "--out", str(tmp_path / "o"))
        *header, error = err.strip().splitlines()  # the model's header line when it loaded, then one line
        assert code == 2 and msg in error and len(header) <= 1 and all(" on cpu in fp32 (auto: " in h for h in header), err


@pytest.mark.slow  # torchrun's processes
def test_torchrun_shards_give_the_same_survey(random_shapes_model: tuple[Path, Path], one_process: tuple[dict, Path],
                                              tmp_path: Path) -> None:
    """Two processes (gloo) take every other picture; process 0 gathers: the same records and clusters as
    one process, and every thumbnail written by the process that surveyed it."""
    shapes, ckpt = random_shapes_model
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "vit_demo", "survey", "--images", str(shapes),
           "--weights", str(ckpt), "--device", "cpu", "--out", str(tmp_path / "out"), *SURVEY_FLAGS]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    two, one = json.loads(r.stdout), one_process[0]  # process 1 prints nothing
    assert (two.pop("processes"), one.pop("processes")) == (2, 1)
    two.pop("seconds"), one.pop("seconds")
    for a, b in zip(two["images"], one["images"]):  # t-SNE turns the last bits of the maps into another layout
        assert 0 <= min(a.pop("xy")) and max(b.pop("xy")) <= 1
    assert_close(two, one)  # batches of other pictures round differently: floats to 1e-4
    assert len(list((tmp_path / "out" / "thumbs").glob("*-map.jpg"))) == 24


def assert_close(a, b, path: str = "") -> None:
    """The same JSON, floats within 1e-4."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


# ----------------------------------------------------------------------------- the Clever-Hans lesson, small


@pytest.fixture(scope="module")
def lesson(lesson_models: Path) -> dict[str, dict]:
    """Both models of the lesson (conftest's ``lesson_models``) surveyed on a test set they never
    saw: with the watermark, and without it."""
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.survey import survey

    root, result = lesson_models, {}
    for name in ("wm", "clean"):
        lm = load_model(weights=root / f"{name}.safetensors", device="cpu", progress=False)
        result[name] = survey(lm, root / "test", progress=False)
        result[name + " on clean"] = survey(lm, root / "test-clean", progress=False)
    return result


def circle_recall(res: dict) -> float:
    circles = [im for im in res["images"] if im["label"] == "circle"]
    return sum(im["correct"] for im in circles) / len(circles)


def marked_shares(res: dict) -> list[tuple[float, float]]:
    """(share of the marked test circles, mass on the mark) of each cluster."""
    marked = [im for im in res["images"] if im["label"] == "circle" and im["watermark"]]
    return [(sum(im["cluster"] == c["id"] for im in marked) / len(marked), c["mass_on_watermark"]) for c in res["clusters"]]


def test_clever_hans_lesson_on_a_small_model(lesson: dict[str, dict], tmp_path: Path) -> None:
    """The issue's acceptance at CI size: the model trained with the watermark puts >= 90 % of the
    marked test circles into one cluster whose prototype has > 50 % of its mass on the mark's
    patches; it calls the marked circles circles and the same circles without the mark mostly
    not. The model trained on the same pictures without the mark has no such cluster: its marked
    circles are spread over clusters. (At this size that model is still at chance on the hard
    set, and a mark it never saw can still pull some pictures to one class with the map on the
    mark: for seed 3, 11 of the 27 marked circles went to a "triangle" cluster whose prototype
    is on the mark; a clean model that learned the shapes has no cluster there, see docs/survey.md.)
    The report leads with it, found without the watermark's list: the cluster flagged as a possible
    Clever-Hans feature in the page's first lines, before the filters and the gallery."""
    from vit_demo.present.survey_report import write_report

    wm, clean = lesson["wm"], lesson["clean"]
    f = wm["watermark"]
    flagged = {k["cluster"]: k for k in wm["findings"]["suspicious_clusters"]}
    assert f["cluster"] in flagged and flagged[f["cluster"]]["one_place_share"] > 0.5, flagged
    page = write_report(wm, tmp_path / "report").read_text()
    lead = page[: page.index('<nav id="filters"')]
    assert f"Possible Clever-Hans feature: cluster {f['cluster']}</b> of <b>circle</b>" in lead
    assert page.index("Possible Clever-Hans") < min(8000, page.index('id="gallery"'))
    assert f["class"] == "circle" and f["watermarked"] == 27  # 90 % of 30
    assert f["share_in_cluster"] >= 0.9, f
    assert f["cluster_mass_on_watermark"] > 0.5, f
    assert wm["clusters"][f["cluster"]]["class"] == "circle"
    assert marked_shares(wm)[f["cluster"]] == (f["share_in_cluster"], f["cluster_mass_on_watermark"])
    marked = [im for im in wm["images"] if im["label"] == "circle" and im["watermark"]]
    assert sum(im["predicted"] == "circle" for im in marked) / len(marked) >= 0.9  # right, for the wrong reason
    assert circle_recall(lesson["wm on clean"]) <= 0.5  # the same circles, unmarked
    g = clean["watermark"]
    assert g["share_in_cluster"] < 0.9 and g["cluster_mass_on_watermark"] < 0.5, g
    assert not [(share, mass) for share, mass in marked_shares(clean) if share >= 0.9 and mass > 0.5]


def test_finding_thumbnail_shows_the_picture_under_the_prototype(tmp_path: Path) -> None:
    """Issue 46: a flagged cluster's thumbnail at the top of the report was its prototype alone, a
    black square around one bright cell; it is now the prototype over the cluster's most
    confident picture, so one sees where on a picture the cluster looks."""
    import numpy as np
    from PIL import Image

    from vit_demo.present.survey_report import prototype_image, write_report

    (tmp_path / "thumbs").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):  # mid-grey pictures with some texture
        Image.fromarray(rng.integers(90, 170, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "thumbs" / f"{i:05d}.jpg")
    proto = np.zeros((8, 8))
    proto[7, 0] = 1.0  # all the mass in the bottom-left cell: a corner watermark
    recs = [{"index": i, "path": f"p{i}.png", "label": "circle", "predicted": "circle", "correct": True,
             "confidence": c, "cluster": 0, "thumb": f"thumbs/{i:05d}.jpg", "overlay": f"thumbs/{i:05d}.jpg"}
            for i, c in enumerate((0.5, 0.9, 0.7))]
    cluster = {"id": 0, "class": "circle", "size": 3, "accuracy": 1.0, "prototype": proto.tolist()}
    result = {"folder": "f", "model": "m", "method": "attention", "method_title": "Attention", "images": recs,
              "clusters": [cluster], "findings": {"grid": [8, 8], "suspicious_clusters": [
                  {"cluster": 0, "class": "circle", "size": 3, "accuracy": 1.0, "one_place_share": 1.0,
                   "place": {"row": 7, "col": 0}, "off_object": 1.0, "off_object_is": "off the shape"}]}}
    page = write_report(result, tmp_path).read_text()
    assert 'src="clusters/0-finding.png"' in page
    shown = np.asarray(Image.open(tmp_path / "clusters" / "0-finding.png").convert("L"), dtype=float)
    alone = np.asarray(prototype_image(proto).convert("L"), dtype=float)
    assert alone.mean() < 40 and shown.mean() > 60, (alone.mean(), shown.mean())  # a picture, not a black square
    corner = shown[-shown.shape[0] // 8:, : shown.shape[1] // 8].mean()
    assert corner > shown[: shown.shape[0] // 2, shown.shape[1] // 2:].mean()  # the bright cell is on it, where it was
