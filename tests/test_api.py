"""The Python API (vit_demo.load, Model.predict / attention / explain / verify, vit_demo.survey /
atlas) against the command line's and the app's numbers for the same pictures; its input kinds,
batches, pickling, pictures, and the errors a notebook user reads."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit_demo
from vit_demo.api import Attention, Comparison, Explanation, LoadError, Model, Prediction, Results, Verification
from vit_demo.images import ImageError

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def cli(*args: str) -> tuple[int, str]:
    """``python -m vit_demo ARGS`` in this process: (exit status, stdout)."""
    from vit_demo.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def model(deit_tiny) -> Model:
    """The API's model around the session's DeiT-Tiny (what vit_demo.load() gives, loaded once)."""
    return Model(deit_tiny)


@pytest.fixture(scope="module")
def cat(package_photos) -> Path:
    return package_photos["chelsea"]


@pytest.fixture(scope="module")
def cup(package_photos) -> Path:
    return package_photos["coffee"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> tuple[Path, Path]:
    """8 shapes pictures (2 a class) and a small random model with the shapes' classes, as a file."""
    from vit_demo.checkpoints.files import save
    from vit_demo.model import VisionTransformer, ViTConfig
    from vit_demo.train.data import make_shapes
    from vit_demo.train.recipe import scratch_data_config

    root = tmp_path_factory.mktemp("api-shapes")
    make_shapes(root / "shapes", per_class=2, size=32, seed=1, progress=False)
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=2,
                                    num_classes=4)).init_weights().eval()
    torch.nn.init.normal_(m.head.weight, std=0.5)
    ckpt = save(m, scratch_data_config(32), root / "small.safetensors", name="small",
                class_names=["circle", "square", "star", "triangle"])
    return root / "shapes", ckpt


# ----------------------------------------------------------------------------- the acceptance's three lines


@pytest.mark.slow  # a fresh interpreter
def test_three_lines_in_a_fresh_process_import_no_gradio(cat):
    """The issue's command: import (torch-free), load the shipped model, one map; never Gradio."""
    code = ("import sys, vit_demo; assert 'torch' not in sys.modules; m = vit_demo.load(); "
            f"r = m.explain({str(cat)!r}, method='chefer'); print(r.map.shape); "
            "assert r._repr_png_().startswith(b'\\x89PNG'); assert 'gradio' not in sys.modules, 'gradio imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "(14, 14)"


# ----------------------------------------------------------------------------- predict


def test_predict_equals_the_cli_json(model, cat, cup):
    """The top-k of ``python -m vit_demo predict IMG IMG --json`` (its main(), in this process)."""
    rc, out = cli("predict", str(cat), str(cup), "--json", "--device", "cpu")
    assert rc == 0
    records = json.loads(out)
    both = model.predict([cat, cup])
    assert isinstance(both, Results) and len(both) == 2
    for r, ours in zip(records, both):
        assert [t["index"] for t in ours.topk] == [t["index"] for t in r["topk"]]
        assert [t["label"] for t in ours.topk] == [t["label"] for t in r["topk"]]
        np.testing.assert_allclose([t["prob"] for t in ours.topk], [t["prob"] for t in r["topk"]], atol=1e-6)
    one = model.predict(cat)
    assert isinstance(one, Prediction) and one.image == "chelsea.png" and one.label == "Egyptian cat"
    assert [t["index"] for t in one.topk] == [t["index"] for t in records[0]["topk"]]


def test_every_kind_of_image_gives_the_same_prediction(model, cat):
    """A path, a PIL image, a uint8 and a float array, a [3,H,W] tensor and a [1,3,H,W] batch of
    the same picture: the same top-5 and probabilities."""
    pil = Image.open(cat).convert("RGB")
    arr = np.array(pil)
    t = torch.from_numpy(arr).permute(2, 0, 1).float() / 255
    ref = model.predict(cat)
    for image in (pil, arr, arr.astype(np.float32) / 255, t, torch.from_numpy(arr).permute(2, 0, 1)):
        got = model.predict(image)
        assert [p["index"] for p in got.topk] == [p["index"] for p in ref.topk]
        np.testing.assert_allclose(got.probs, ref.probs, atol=1e-6)  # floats in 0..1 round back to the same 8 bits
    batch = model.predict(t[None], k=3)
    assert isinstance(batch, Results) and len(batch) == 1 and len(batch[0].labels) == 3


# ----------------------------------------------------------------------------- attention


def test_attention_and_rollout_are_the_apps(model, deit_tiny, cat):
    from vit_demo.analysis import analyze
    from vit_demo.app.tabs.attention import attention_maps
    from vit_demo.app.tabs.relevance import method_maps

    att = model.attention(cat)
    assert isinstance(att, Attention)
    assert att.maps.shape == (12, 3, 197, 197) and att.depth == 12 and att.num_heads == 3
    np.testing.assert_allclose(att.maps.sum(-1), 1.0, atol=1e-4)  # every row a distribution
    assert att.grid == (14, 14) and att.tokens == ("[class]",) and att.cls_index == 0
    a = analyze(deit_tiny, Image.open(cat).convert("RGB"))
    tiles = method_maps(a, None)  # the app's first two tiles: raw attention (last layer) and rollout
    raw, roll = (tiles[k] for k in tiles)
    np.testing.assert_array_equal(att.rollout, roll)
    np.testing.assert_allclose(att.map(-1), raw, atol=1e-7)
    np.testing.assert_allclose(att.map(4, head=1), attention_maps(a, 4, 1, None).numpy(), atol=1e-7)
    np.testing.assert_allclose(att.map(4, query=30), attention_maps(a, 4, "mean", 30).numpy(), atol=1e-7)
    np.testing.assert_allclose(att.heads(), attention_maps(a, 0, "layers", None).numpy(), atol=1e-7)
    v = att.view(11, head=2)
    assert isinstance(v, Explanation) and v.title == "Attention of [class], layer 12 of 12, head 3"
    np.testing.assert_array_equal(att.rollout_view().map, att.rollout)
    with pytest.raises(IndexError, match="layers 0..11"):
        att.map(12)


# ----------------------------------------------------------------------------- explain


def test_explain_equals_the_cli_figure_numbers(model, cat, tmp_path):
    rc, _ = cli("explain", str(cat), "--method", "chefer", "--out", str(tmp_path), "--device", "cpu")
    assert rc == 0
    rec = json.loads((tmp_path / "chelsea_chefer.json").read_text())
    r = model.explain(cat, method="chefer")
    assert isinstance(r, Explanation) and r.map.shape == (14, 14)
    np.testing.assert_allclose(r.map, np.array(rec["map"]), rtol=1e-4, atol=1e-6)
    assert (r.target, r.label) == (rec["target"]["index"], rec["target"]["label"]) == (285, "Egyptian cat")
    assert r.predictions[0]["label"] == rec["predictions"][0]["label"]
    rc, _ = cli("explain", str(cat), "--method", "rollout", "--out", str(tmp_path), "--device", "cpu")
    roll = json.loads((tmp_path / "chelsea_rollout.json").read_text())
    np.testing.assert_allclose(model.explain(cat, method="rollout").map, np.array(roll["map"]), atol=1e-6)


@pytest.mark.slow  # the faithfulness protocol
def test_several_pictures_and_methods_with_their_faithfulness(model, deit_tiny, cat, cup):
    """explain([img1, img2], method=[...]): a Results of Comparisons, each map the app's (class_maps);
    a map's faithfulness: the ``faithfulness --srg-saco`` command's numbers for that picture."""
    from vit_demo.analysis import analyze, class_maps

    b = model.explain([cat, cup], method=["chefer", "lrp-gated"])
    assert isinstance(b, Results) and all(isinstance(c, Comparison) for c in b)
    assert b.maps.shape == (2, 2, 14, 14) and b[1].methods == ["chefer", "lrp-gated"]
    assert [c["chefer"].label for c in b] == ["Egyptian cat", "espresso"]
    app = class_maps(analyze(deit_tiny, Image.open(cup).convert("RGB")), deit_tiny, 967)
    for name in ("chefer", "lrp-gated"):
        np.testing.assert_allclose(b[1][name].map, app[name], rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(model.explain(cup, method=name).map, b[1][name].map)
    scored = model.explain(cup, method="lrp-gated", faithfulness=True)
    rc, out = cli("faithfulness", "--images", str(cup), "--methods", "lrp-gated", "--srg-saco", "--replacement", "mean",
                  "--json", "--device", "cpu")
    theirs = json.loads(out)["scores"]["mean"]["lrp-gated"]
    for measure in ("deletion", "insertion", "srg", "saco"):
        assert scored.faithfulness[measure] == pytest.approx(theirs[measure]["mean"], abs=2e-4)
    assert scored.faithfulness["srg"] > 0.1  # faithful: hiding its top patches costs more than hiding its bottom ones
    other = model.explain(cup, method="chefer", target="cup")  # a label instead of the top-1
    assert (other.target, other.label) == (968, "cup") and not np.allclose(other.map, b[1]["chefer"].map)


# ----------------------------------------------------------------------------- verify


def test_verify_equals_the_cli_and_the_apps_comparison(model, deit_tiny, deit_tiny_path, cat):
    from vit_demo.analysis import analyze
    from vit_demo.app.tabs.compare import compare_with_timm
    from vit_demo.checkpoints.verify import timm_twin

    rc, out = cli("verify", "--json", "--device", "cpu")
    r = json.loads(out)
    v = model.verify()
    assert isinstance(v, Verification) and rc == 0 and v.passed and r["passed"]
    assert v.inputs == r["inputs"] == "8 random-noise inputs"
    assert v.max_abs_logit_diff == pytest.approx(r["max_abs_logit_diff"], abs=1e-7) and v.top1_agreement == 1.0
    on = model.verify(cat)
    app = compare_with_timm(analyze(deit_tiny, Image.open(cat).convert("RGB")), deit_tiny,
                            timm_twin(deit_tiny, deit_tiny_path))
    assert on.passed and app["identical"] and on.verdict == app["verdict"]
    assert on.scratch_topk == tuple(app["scratch_topk"]) and len(on.layer_attn_max_diff) == 12
    assert max(on.layer_attn_max_diff) <= 1e-4


# ----------------------------------------------------------------------------- a folder


def test_survey_and_atlas_equal_the_commands(shapes, tmp_path):
    folder, ckpt = shapes
    small = vit_demo.load(ckpt, device="cpu")
    assert small.labels == ("circle", "square", "star", "triangle")
    s = vit_demo.survey(folder, small, method="grad-rollout", out=tmp_path / "s")
    rc, out = cli("survey", "--images", str(folder), "--weights", str(ckpt), "--method", "grad-rollout", "--out",
                  str(tmp_path / "s-cli"), "--json", "--device", "cpu")
    c = json.loads(out)
    assert rc == 0 and s.data["count"] == c["count"] == 8 and s.data["accuracy"] == c["accuracy"]
    assert [(r["path"], r["predicted"], r["cluster"]) for r in s.images] == \
        [(r["path"], r["predicted"], r["cluster"]) for r in c["images"]]
    assert [k["size"] for k in s.clusters] == [k["size"] for k in c["clusters"]]
    assert Path(s.report).is_file() and s._repr_png_().startswith(PNG) and "Survey of 8 pictures" in s._repr_html_()
    a = vit_demo.atlas(folder, ckpt, concepts=3, out=tmp_path / "a")
    rc, out = cli("atlas", "--images", str(folder), "--weights", str(ckpt), "--concepts", "3", "--out",
                  str(tmp_path / "a-cli"), "--json", "--device", "cpu")
    c = json.loads(out)
    assert rc == 0 and a.data["images"] == c["images"] == 8 and len(a.heads) == len(c["heads"]) == 4
    for ours, theirs in zip(a.heads, c["heads"]):
        assert (ours["layer"], ours["head"]) == (theirs["layer"], theirs["head"])
        assert ours["importance"] == pytest.approx(theirs["importance"], abs=1e-5)
    assert a.data["findings"]["top_heads"] == c["findings"]["top_heads"]
    assert Path(a.report).is_file() and a._repr_png_().startswith(PNG) and "Most important heads" in a._repr_html_()


# ----------------------------------------------------------------------------- results: pickled, drawn, saved


@pytest.mark.slow  # every result drawn and saved at slide size
def test_results_pickle_draw_and_save(model, shapes, cat, cup, tmp_path):
    one = model.explain(cat, method="grad-rollout")
    results = [model.predict(cat), model.attention(cat), one, model.explain(cat, method=["grad-rollout", "rollout"]),
               model.explain([cat, cup], method="grad-rollout"), model.verify(cat)]
    for r in results:
        back = pickle.loads(pickle.dumps(r))
        assert type(back) is type(r)
        png = r._repr_png_()
        assert png.startswith(PNG) and Image.open(io.BytesIO(png)).width >= 300
        assert "<img" in r._repr_html_() or "<table>" in r._repr_html_()
        assert type(r.figure()).__name__ == "Figure"
    back = pickle.loads(pickle.dumps(results[1]))
    np.testing.assert_array_equal(back.maps, results[1].maps)
    np.testing.assert_array_equal(back.rollout, results[1].rollout)
    assert "Egyptian cat" in results[0]._repr_html_() and "43.9%" in results[0]._repr_html_()
    saved = one.save(tmp_path / "slide.png")
    assert Image.open(saved).width == 2400  # the app's "PNG for slides"
    assert results[4].save(tmp_path / "batch.png").is_file()


# ----------------------------------------------------------------------------- errors a notebook user can act on


def test_errors_say_what_to_do(model, cat, tmp_path):
    with pytest.raises(ValueError, match=r"unknown method 'chefr' \(did you mean 'chefer'\?\); known: .*chefer.*lrp-gated"):
        model.explain(cat, method="chefr")
    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    with pytest.raises(ImageError) as e:
        model.predict([cat, bad])
    assert "\n" not in str(e.value) and str(e.value).startswith("notes.png: not an image file")
    with pytest.raises(ValueError, match="float pixels must lie in 0..1 .*normalised"):
        model.explain(np.full((32, 32, 3), -1.5, dtype=np.float32))
    with pytest.raises(TypeError, match="is not an image; give a path, a PIL image"):
        model.predict(42)
    with pytest.raises(ValueError, match="no class has that label"):
        model.explain(cat, method="chefer", target="zebra crossing")
    with pytest.raises(LoadError, match="no such checkpoint") as e:
        vit_demo.load(tmp_path / "missing.safetensors")
    offline = r"hub is not reachable.*instead: vit_demo.load\('FILE'\)"  # the tests run with HF_HUB_OFFLINE=1
    with pytest.raises(LoadError, match=offline):
        vit_demo.load("vit_small_patch16_224.not_here")
    doc = vit_demo.load.__doc__
    assert "timm model by name" in doc and "checkpoint file" in doc and "transformers model folder" in doc
    assert "load" in dir(vit_demo) and vit_demo.Model is Model


def test_a_headless_model_says_why(tmp_path, cat):
    from vit_demo.checkpoints.files import save
    from vit_demo.model import VisionTransformer, ViTConfig
    from vit_demo.train.recipe import scratch_data_config

    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=0))
    headless = vit_demo.load(save(m.init_weights().eval(), scratch_data_config(32), tmp_path / "features.safetensors",
                                  name="features"), device="cpu")
    with pytest.raises(ValueError, match=r"chefer explains one class, and features is headless \(num_classes=0.*"
                                         r"class-agnostic maps work: attention, rollout"):
        headless.explain(cat, method="chefer")
    with pytest.raises(ValueError, match="headless .* no class scores to predict"):
        headless.predict(cat)
    r = headless.explain(cat, method="rollout")  # a class-agnostic map needs no classes
    assert r.map.shape == (4, 4) and r.target is None and r.predictions == ()
    assert headless.attention(cat).maps.shape == (2, 2, 17, 17)
