"""The atlas: its head numbers against naive loops over one picture, mean-ablation against a
forward pass written out by hand with the head's output replaced, concept removal and the NMF's
reconstruction error, the command's JSON and report, and the watermark lesson at CI size."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import small_shapes_vit

from vit_demo.model import VisionTransformer
from vit_demo.train.data import Shortcut, make_shapes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("kw", [{"reg_tokens": 2}, {"class_token": False, "global_pool": "avg"}])
def test_head_numbers_match_naive_loops(kw: dict) -> None:
    """Mean distance, entropy, the shares on [class] / other prefix tokens and the top patch of
    every head, against Python loops over one picture's queries and keys."""
    from vit_demo.evaluate.atlas import HeadSums, captured_pass

    model = small_shapes_vit(**kw)
    x = torch.randn(2, 3, 32, 32)
    out, outputs, _, _ = captured_pass(model, x, 1)
    sums = HeadSums()
    sums.add(out.attentions, out.layout, 8, outputs)
    numbers, peaks = sums.numbers[0], sums.peaks[0]
    P, lay = model.cfg.num_prefix_tokens, out.layout
    cls = lay.cls_index
    for layer, a in enumerate(out.attentions):
        for head in range(2):
            A = a[0, head].double().tolist()
            N = len(A)
            dist = ent = on_cls = on_prefix = 0.0
            for q in range(P, N):
                qy, qx = divmod(q - P, 4)
                w = sum(A[q][P:])
                dist += sum(A[q][k] / w * math.hypot((qy - (k - P) // 4) * 8, (qx - (k - P) % 4) * 8) for k in range(P, N))
                ent += -sum(p * math.log(p) for p in A[q]) / math.log(N)
                on_cls += A[q][cls] if cls is not None else 0.0
                on_prefix += sum(A[q][k] for k in range(P) if k != cls)
            n = N - P
            assert numbers[0, :, layer, head].tolist() == pytest.approx([dist / n, ent / n, on_cls / n, on_prefix / n], abs=1e-5)
            row = A[cls][P:] if cls is not None else [sum(A[q][k] for q in range(P, N)) / n for k in range(P, N)]
            assert int(peaks[0, 1, layer, head]) == int(np.argmax(row))
            assert peaks[0, 0, layer, head] == pytest.approx(max(row), abs=1e-6)


def hand_forward(model: VisionTransformer, x: torch.Tensor, layer: int, head: int, value: torch.Tensor) -> torch.Tensor:
    """The plain ViT's forward pass written out, head ``head`` of block ``layer`` outputting ``value`` [N, D]."""
    t, _ = model.embed(x)
    for i, blk in enumerate(model.blocks):
        at = blk.attn
        q, k, v = at.project(blk.norm1(t))
        o = ((q * at.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v  # [B, H, N, D]
        if i == layer:
            o[:, head] = value
        t = t + at.proj(o.transpose(1, 2).flatten(2))
        t = t + blk.mlp(blk.norm2(t))
    return model.forward_head(model.norm(t))[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, object]:
    """12 shapes pictures and the small random model with the shapes' classes, loaded as a checkpoint."""
    from vit_demo.checkpoints.files import save
    from vit_demo.checkpoints.load import load_model
    from vit_demo.train.recipe import scratch_data_config

    root = tmp_path_factory.mktemp("atlas")
    make_shapes(root / "shapes", per_class=3, size=32, seed=2, progress=False, shortcut=Shortcut())
    ckpt = save(small_shapes_vit(reg_tokens=1), scratch_data_config(32), root / "m.safetensors", name="small",
                class_names=["circle", "square", "star", "triangle"])
    return root / "shapes", load_model(weights=ckpt, device="cpu", progress=False)


def test_mean_ablation_matches_a_forward_pass_by_hand(folder: tuple[Path, object]) -> None:
    """The importance of every head = the mean fall of the true class's logit when the head's output
    is its mean over the folder, computed here with :func:`hand_forward` and the means taken by hand."""
    from vit_demo.evaluate.atlas import first_pass, head_importance
    from vit_demo.evaluate.survey import list_pictures, read_batch, read_folder

    shapes, lm = folder
    pics, mode = list_pictures(shapes)
    seen = first_pass(lm, pics, read_folder(shapes, mode, lm.data_config), 2, 5, False)
    drop, wrong = head_importance(lm, seen, seen.sums.outputs / seen.sums.count, 5, False)
    drop, acc = drop / len(pics), wrong / len(pics)
    model = lm.model
    x = read_batch(pics, lm, []).x
    y = torch.tensor([["circle", "square", "star", "triangle"].index(p.label) for p in pics])
    t, _ = model.embed(x)
    heads_out = []
    with torch.no_grad():
        for blk in model.blocks:  # every block's per-head outputs [B, H, N, D], by hand
            q, k, v = blk.attn.project(blk.norm1(t))
            heads_out.append(((q * blk.attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v)
            t = t + blk.attn.proj(heads_out[-1].transpose(1, 2).flatten(2))
            t = t + blk.mlp(blk.norm2(t))
        base = model(x).logits
        for layer in range(3):
            for head in range(2):
                z = hand_forward(model, x, layer, head, heads_out[layer][:, head].mean(dim=0))
                fall = (base.gather(1, y[:, None]) - z.gather(1, y[:, None])).mean()
                assert drop[layer, head] == pytest.approx(float(fall), abs=1e-4)
                right = (base.argmax(1) == y).float().mean() - (z.argmax(1) == y).float().mean()
                assert acc[layer, head] == pytest.approx(float(right), abs=1e-6)
    assert np.abs(drop).max() > 1e-3  # the heads matter for this model


def test_concept_occlusion_and_reconstruction_error() -> None:
    """The NMF's reported error is small where few concepts made the tokens (negative tokens too),
    and fewer concepts fit worse; a concept's presence is its code over its 99th percentile,
    clipped at 1; occlusion moves each patch embedding towards the baseline by its presence."""
    from vit_demo.evaluate.atlas import fit_concepts, occlude

    g = np.random.default_rng(0)
    true = g.random((3, 6)) * (g.random((3, 6)) > 0.5)
    tokens = (g.random((5, 16, 3)) @ true + 0.01 * g.standard_normal((5, 16, 6))).astype(np.float32)
    for signed in (tokens, -tokens):  # the split [relu(x), relu(-x)] codes negative tokens as well
        c = fit_concepts(signed, 3)
        x = signed.reshape(-1, 6)
        recon = c.codes.reshape(-1, 3) @ c.basis  # in token space
        assert c.error < 0.05 and np.linalg.norm(x - recon) / np.linalg.norm(x) < 0.05  # three concepts made these
    c3 = fit_concepts(tokens, 3)
    assert fit_concepts(tokens, 2).error > c3.error
    pres = c3.presence()
    for k in range(3):
        q = np.percentile(c3.codes[:, :, k], 99)
        assert np.allclose(pres[:, :, k], np.minimum(c3.codes[:, :, k] / q, 1), atol=1e-6)
    x = torch.from_numpy(np.concatenate([g.random((5, 1, 6)).astype(np.float32), tokens], axis=1))
    base = torch.from_numpy(g.random((16, 6)).astype(np.float32))
    m = torch.from_numpy(pres[:, :, 0])
    out = occlude(x, m, base, 1)
    for b in range(5):
        assert torch.equal(out[b, 0], x[b, 0])
        for p in range(16):
            want = x[b, 1 + p] + float(m[b, p]) * (base[p] - x[b, 1 + p])
            assert torch.allclose(out[b, 1 + p], want, atol=1e-6)


def test_concept_addition_stamps_the_concept_s_own_patches(folder: tuple[Path, object]) -> None:
    """Adding a concept to a picture, against a loop written out: its source is one of the concept's
    8 strongest pictures in turn (never itself); within one patch of the source's top patch, each
    patch embedding is the source's there (elsewhere nothing moves); the blocks run on it as the
    model runs them; the rise of every logit and the new prediction come back."""
    from vit_demo.evaluate.atlas import concept_gains, first_pass, stamp_sources
    from vit_demo.evaluate.survey import list_pictures, read_folder

    shapes, lm = folder
    pics, mode = list_pictures(shapes)
    seen = first_pass(lm, pics, read_folder(shapes, mode, lm.data_config), 2, 5, False)
    g = np.random.default_rng(4)
    n, P, k = len(pics), lm.model.cfg.num_prefix_tokens, 1
    codes = (g.random((n, 16, 3)) * (g.random((n, 16, 3)) > 0.6)).astype(np.float32)
    rises, preds = concept_gains(lm, seen, codes, k, batch_size=5)
    embeds, logits = np.concatenate(seen.embeds), np.concatenate(seen.logits)
    top = list(np.argsort(-codes[:, :, k].max(axis=1), kind="stable")[:8])
    src = stamp_sources(codes[:, :, k], n)
    model = lm.model
    for i in range(n):
        s = top[i % 8] if top[i % 8] != i else top[(i + 1) % 8]
        assert src[i] == s != i
        r0, c0 = divmod(int(codes[s, :, k].argmax()), 4)
        e = embeds[i].copy()
        for cell in range(16):
            r, c = divmod(cell, 4)
            if abs(r - r0) <= 1 and abs(c - c0) <= 1:
                e[P + cell] = embeds[s, P + cell]
        t = torch.from_numpy(e)[None]
        with torch.no_grad():
            for blk in model.blocks:
                t = blk(t, False, model.positions((4, 4), t.device))[0]
            z = model.forward_head(model.norm(t))[0][0].numpy()
        assert rises[i] == pytest.approx(z - logits[i], abs=1e-4) and preds[i] == z.argmax()
    assert np.abs(rises).max() > 1e-3


def same_json(a: object, b: object, path: str = "") -> None:
    """The same JSON, floats within 1e-4."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-4), path
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            same_json(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_json(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.slow  # torchrun's processes
def test_atlas_command_json_and_torchrun(folder: tuple[Path, object], tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    """The command (in this process): the JSON the issue names (layers and heads from 1, rows and
    columns from 0, top lists best first), the report beside it, and a bad layer as one line. Then
    under torchrun: two processes (gloo) each take every other picture for the model passes,
    process 0 gathers them, fits the concepts and prints the same JSON as one process."""
    import os

    from vit_demo.cli.main import main

    shapes, lm = folder
    ckpt = shapes.parent / "m.safetensors"
    args = ["atlas", "--images", str(shapes), "--weights", str(ckpt), "--device", "cpu", "--concepts", "3",
            "--batch-size", "1", "--json"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["images"] == 12 and len(res["heads"]) == 6 and len(res["concepts"]) == 3 and res["processes"] == 1
    assert [(h["layer"], h["head"]) for h in res["heads"]] == [(i, j) for i in (1, 2, 3) for j in (1, 2)]
    for h in res["heads"]:
        assert {"mean_distance", "entropy", "importance", "summary", "top"} <= h.keys() and h["summary"]
        vals = [t["value"] for t in h["top"]]
        assert vals == sorted(vals, reverse=True) and all(0 <= t["row"] < 4 and 0 <= t["col"] < 4 for t in h["top"])
    for c in res["concepts"]:
        assert c["layer"] == 2 and set(c["importance"]) == {"circle", "square", "star", "triangle"}
        vals = [t["value"] for t in c["top"]]
        assert vals == sorted(vals, reverse=True)
    assert 0 < res["reconstruction_error"] < 1
    assert Path(res["report"]).is_file() and res == json.loads((tmp_path / "one" / "atlas.json").read_text())
    page = Path(res["report"]).read_text()
    assert "http://" not in page and "https://" not in page
    assert main(["atlas", "--images", str(shapes), "--weights", str(ckpt), "--layer", "9", "--out", str(tmp_path / "bad")]) == 2
    header, error = capsys.readouterr().err.strip().splitlines()  # the model's header line, then the error
    assert header.startswith("small on cpu in fp32") and error == "error: --layer must be in 0..3 for small, not 9"

    torchrun = Path(sys.executable).with_name("torchrun")
    r = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "vit_demo", *args, "--out",
                        str(tmp_path / "two")], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(r.stdout)  # process 1 prints nothing
    assert (two.pop("processes"), res.pop("processes")) == (2, 1)
    for key in ("seconds", "report"):
        two.pop(key), res.pop(key)
    same_json(two, res)


# ----------------------------------------------------------------------------- the Clever-Hans lesson


def test_atlas_finds_the_watermark_unprompted(lesson_models: Path, tmp_path: Path) -> None:
    """The issue's acceptance at CI size: the lesson's model (conftest: train's defaults, a compact
    conv transformer without [class], a short run on shapes where 90 % of the circles carry a mark
    in the bottom-left corner); its atlas of the held-out marked test set at the default layer,
    told nothing about the mark, has among the circle's three most important concepts one whose
    top patches sit on the mark's patches, flags it first and says so at the top of its report.
    (docs/atlas.md: a second lesson, a white mark top-left on the stars, another seed, as well.)"""
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.atlas import atlas
    from vit_demo.evaluate.geometry import cell_coverage
    from vit_demo.present.atlas_report import write_report
    from vit_demo.train.data import watermark_box

    lm = load_model(weights=lesson_models / "wm.safetensors", device="cpu", progress=False)
    assert lm.model.cfg.class_token is False  # the default scratch model reads out the tokens' mean
    res = atlas(lm, lesson_models / "test", progress=False, batch_size=60)
    assert res["concept_layer"] == 3 and len(res["heads"]) == 16 and all(h["class_share"] == 0 for h in res["heads"])
    grid = tuple(res["grid"])
    mark = cell_coverage(watermark_box(32), (32, 32), grid).numpy() > 0  # the 2x2 patches of the corner
    by_id = {c["id"]: c for c in res["concepts"]}
    on_mark = {k: np.mean([mark[t["row"], t["col"]] for t in by_id[k]["top"]]) for k in by_id}
    circle_top = res["findings"]["class_concepts"]["circle"]
    found = [k for k in circle_top if on_mark[k] >= 0.75]
    assert found, (circle_top, on_mark)
    flagged = [k["id"] for k in res["findings"]["suspicious_concepts"]]
    assert flagged[0] == found[0], (found, flagged)
    page = write_report(res, tmp_path / "out", lm.data_config, lm.model.cfg.patch_size).read_text()
    finding = page[page.index('<div id="finding">') : page.index("</div>")]
    assert f"Possible Clever-Hans feature: concept {found[0]}</b>" in finding and "circle" in finding
    assert finding.index("Possible Clever-Hans") < finding.index("Most important heads")
    assert res["faithfulness"]["passed"], res["faithfulness"]


SHORTCUT_MODELS = ROOT / "tests" / "data"  # shapes-mark-*.safetensors: tests/data/README.md


def shortcut_atlas(tmp_path: Path, weights: str, cls: str, corner: str, mark: str
                   ) -> tuple[object, dict, dict, int]:
    """A shortcut model of tests/data over a held-out set (seed 1, 30 a class) with its mark on
    ``cls``: (the model, its atlas at the defaults, the one concept whose top patches sit on the
    mark (three quarters of them at least), how many of the other classes' 90 clean pictures the
    mark drawn on them turns into ``cls``)."""
    from vit_demo.checkpoints.load import load_model
    from vit_demo.evaluate.atlas import atlas
    from vit_demo.evaluate.geometry import cell_coverage
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess
    from vit_demo.train.data import add_watermark, watermark_box

    lm = load_model(weights=SHORTCUT_MODELS / weights, device="cpu", progress=False)
    make_shapes(tmp_path / "test", per_class=30, seed=1, progress=False,
                shortcut=Shortcut(target=cls, corner=corner, mark=mark))
    make_shapes(tmp_path / "clean", per_class=30, seed=1, progress=False)
    others = [p for c in lm.labels if c != cls for p in sorted((tmp_path / "clean" / c).glob("*.png"))]
    x = torch.stack([preprocess(add_watermark(load_image(p), corner, mark)[0], lm.data_config)[0] for p in others])
    with torch.no_grad():
        turned = int((lm.model(x).logits.argmax(1) == lm.labels.index(cls)).sum())
    res = atlas(lm, tmp_path / "test", progress=False, batch_size=60)
    on = cell_coverage(watermark_box(32, corner), (32, 32), tuple(res["grid"])).numpy() > 0
    found = [c for c in res["concepts"] if np.mean([on[t["row"], t["col"]] for t in c["top"]]) >= 0.75]
    assert len(found) == 1, [c["id"] for c in found]
    return lm, res, found[0], turned


def flagged_for(res: dict, k: dict, cls: str) -> None:
    """Concept ``k`` among the class's top three (the larger of removal and addition), flagged, and
    named as a possible Clever-Hans feature."""
    assert k["id"] in res["findings"]["class_concepts"][cls] and cls in k["top_for"] and k["suspicious"]
    assert k["id"] in [f["id"] for f in res["findings"]["suspicious_concepts"]]
    assert k["importance"][cls] == max(k["removal"][cls], k["addition"][cls])


@pytest.mark.slow
def test_atlas_finds_a_shortcut_that_is_enough_but_not_needed(tmp_path: Path) -> None:
    """A model trained at the defaults' size on shapes with a white mark top-left on 90 % of the
    circles (tests/data/README.md) that turns other shapes into circles when the mark is stamped
    on them. Its atlas over a held-out marked set, told nothing about the mark, ranks the mark's
    concept among the circle's three most important and flags it, because it measures what adding
    the concept to the other classes' pictures does; by removal alone (occluding it on the circles,
    the atlas's only measure before) the concept was 5th for "circle", out of its top three."""
    from vit_demo.evaluate.survey import survey
    from vit_demo.present.atlas_report import write_report

    lm, res, k, turned = shortcut_atlas(tmp_path, "shapes-mark-circle.safetensors", "circle", "top-left", "white")
    assert turned == 30  # the mark turns 30 of the 90 other shapes into circles
    flagged_for(res, k, "circle")
    by_id = {c["id"]: c for c in res["concepts"]}
    removal = sorted(by_id, key=lambda i: -by_id[i]["removal"]["circle"])
    assert removal.index(k["id"]) >= 3  # deletion alone: out of the circle's top three
    assert k["removal"]["circle"] < 0.3 < 0.9 < k["addition"]["circle"] == k["importance"]["circle"]
    assert k["turned"]["circle"] >= 0.25  # its own patches turn a quarter of the other shapes into circles
    page = write_report(res, tmp_path / "out", lm.data_config, lm.model.cfg.patch_size).read_text()
    finding = page[page.index('<div id="finding">') : page.index("</div>")]
    assert (f"Possible Clever-Hans feature: concept {k['id']}</b>" in finding
            and f"it turns {k['turned']['circle']:.0%} of them into circle" in finding)
    # the survey's lesson says the same: the marked circles' cluster, flagged at the mark's corner
    sv = survey(lm, tmp_path / "test", progress=False)
    flags = [(f["class"], f["place"]) for f in sv["findings"]["suspicious_clusters"]]
    assert flags == [("circle", {"row": 1, "col": 1})] and sv["watermark"]["share_in_cluster"] > 0.9, flags


@pytest.mark.slow
def test_atlas_finds_a_shortcut_of_another_class_corner_and_mark(tmp_path: Path) -> None:
    """The same finding on an unlike setup, so that it is not tuned to one model: a checkered mark
    bottom-right on 90 % of the squares (tests/data/README.md). The mark drawn on the 90 other
    shapes turns 25 of them into squares; the atlas's concept on the mark is among the square's top
    three, flagged, its addition larger than its removal and turning a fifth of the other shapes;
    the survey flags the squares' cluster at the mark's corner."""
    from vit_demo.evaluate.survey import survey

    lm, res, k, turned = shortcut_atlas(tmp_path, "shapes-mark-square.safetensors", "square", "bottom-right", "checker")
    assert turned >= 20, turned
    flagged_for(res, k, "square")
    assert k["removal"]["square"] < k["addition"]["square"] and k["addition"]["square"] > 0.9
    assert k["turned"]["square"] >= 0.2
    sv = survey(lm, tmp_path / "test", progress=False)
    assert ("square", {"row": 6, "col": 6}) in [(f["class"], f["place"]) for f in sv["findings"]["suspicious_clusters"]]


def test_accuracy_change_never_reads_minus_zero() -> None:
    """Issue 46: a head whose removal changed no prediction read "accuracy -0.0%"."""
    from vit_demo.present.atlas_report import accuracy_change

    assert accuracy_change(0.0) == ", accuracy ±0.0%"
    assert accuracy_change(-0.0) == accuracy_change(0.0004) == accuracy_change(-0.0004) == ", accuracy ±0.0%"
    assert accuracy_change(0.125) == ", accuracy -12.5%" and accuracy_change(-0.05) == ", accuracy +5.0%"
    assert accuracy_change(None) == ""
