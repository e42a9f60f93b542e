"""Every check against timm compares like with like and says in which precision: the deck's timm
slide, the Compare tab, the Python API and the command line run the scratch model in fp32 against
timm's fp32 even when the model runs in bf16 everywhere else (a bf16 model against timm's fp32 differs
by bf16's rounding, 2e-2 in the logits: "MISMATCH" to an audience); bf16 against fp32 only when asked
for, and then called bf16's rounding. Where the app's bf16 prediction orders a near-tie otherwise than
the fp32 check, the Compare tab says so beside the numbers.

Also what the app says of a model: measured figures (bf16's speed-up and fidelity, the methods'
faithfulness) only for the model they were measured on, never for a model trained here; and the
small refusals a user meets: ``k`` below 1, a method name in another case or misspelt.

The suite runs with $VIT_DEMO_NO_BF16=1 (tests/conftest.py): bf16 is asked for by name here, as
tests/test_precision.py does (it runs on any CPU, emulated where not native)."""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_shapes_checkpoint
from PIL import Image

from vit_demo import methods
from vit_demo.analysis import analyze
from vit_demo.checkpoints.load import is_shipped, load_model
from vit_demo.checkpoints.verify import timm_twin
from vit_demo.precision import runs_bf16

NOT_SAID = ("MISMATCH", "Mismatch", "FAIL")  # what a like-with-like check of the real weights never says


@pytest.fixture(scope="module")
def lm16(deit_tiny_path: Path):
    """The shipped DeiT-Tiny as the app runs it on a CPU with bf16 (``--precision auto`` there)."""
    return load_model("deit_tiny_patch16_224", deit_tiny_path, device="cpu", precision="bf16")


@pytest.fixture(scope="module")
def twin(lm16, deit_tiny_path: Path):
    return timm_twin(lm16, deit_tiny_path)


@pytest.fixture(scope="module")
def cat(lm16, package_photos: dict[str, Path]):
    """(the photo, its analysis by the bf16 model: the prediction the app shows above the tabs)."""
    img = Image.open(package_photos["chelsea"]).convert("RGB")
    return img, analyze(lm16, img)


def test_deck_of_a_bf16_model_checks_timm_in_fp32(lm16, twin, cat, deit_tiny_path: Path) -> None:
    """The deck's timm slide (For presentations -> "Slide deck for this image" on a bf16 CPU): both in fp32,
    identical, and the title, the subtitle and the notes say so; the model still runs in bf16 after it."""
    from vit_demo.present import deck

    slide = deck.timm_slide(lm16, [cat[1].x], ["cat"], str(deit_tiny_path), 600, reference=twin)
    text = " ".join([slide.title, slide.subtitle, slide.notes])
    assert not any(word in text for word in NOT_SAID), text
    assert slide.title == "Checked against timm, both in fp32: identical"
    assert slide.subtitle.startswith("Identical to 0.0001, both in fp32: max logit difference 0.0e+00")
    assert "both models in float32 (the other slides ran deit_tiny_patch16_224 in bf16, for speed" in slide.notes
    assert slide.meta["passed"] and slide.meta["precision"] == "fp32"
    assert all(c["max_abs_logit_diff"] == 0.0 and c["precision"] == "fp32" for c in slide.meta["checks"])
    assert runs_bf16(lm16.model)  # the check ran it in fp32 for itself only


def test_compare_tab_names_the_precision_and_the_app_prediction(lm16, twin, cat) -> None:
    from vit_demo.app.tabs.compare import compare_markdown, compare_with_timm, verdict_html

    a = cat[1]
    c = compare_with_timm(a, lm16, twin)
    assert c["identical"] and (c["precision"], c["compared"]) == ("fp32", "both in fp32")
    table = compare_markdown(c)
    assert "| precision | both in fp32 |" in table
    top = a.topk(1)[0]
    assert f"| the prediction above the tabs, in bf16 (the app's precision) | {top['label']} {top['prob']:.1%}" in table
    assert "| same top-1 in bf16 as in fp32 | yes |" in table
    assert "<b>Identical to 0.0001, both in fp32</b>" in verdict_html(c) and "precision-note" not in verdict_html(c)


def test_compare_tab_says_plainly_when_bf16_flips_a_near_tie(lm16, twin, cat) -> None:
    """The prediction above the tabs (bf16) puts the runner-up first, as bf16's rounding does on a
    near-tie (the analysis made so: its two best logits swapped); the check runs fp32 from the same
    input. The disagreement is said in the summary and in the table, with both classes and numbers."""
    from vit_demo.app.tabs.compare import compare_markdown, compare_with_timm, verdict_html

    a = cat[1]
    first, second = a.logits.topk(2).indices.tolist()
    logits = a.logits.clone()
    logits[[first, second]] = logits[[second, first]]
    flipped = dataclasses.replace(a, logits=logits, class_maps={})
    c = compare_with_timm(flipped, lm16, twin)
    assert c["identical"] and c["scratch_topk"][0] == first and c["app_topk"][0] == second
    note = c["precision_note"]
    assert note.startswith("The prediction above and this check disagree on the top class: in bf16 (the app's "
                           f"precision) the model ranks {a.labels[second]} first ({c['app_probs'][0]:.1%}); in fp32, "
                           f"here, it ranks {a.labels[first]} first ({c['scratch_probs'][0]:.1%}).")
    assert "near-tie" in note and f'<p class="precision-note"><b>{html.escape(note)}</b></p>' in verdict_html(c)
    assert "| same top-1 in bf16 as in fp32 | **no: a near-tie that bf16's rounding reorders**" in compare_markdown(c)


def test_api_verify_is_like_with_like_unless_bf16_is_asked_for(deit_tiny_path: Path, package_photos) -> None:
    import vit_demo
    from vit_demo.precision import set_precision

    m = vit_demo.load(deit_tiny_path)
    set_precision(m.module, "bf16")  # a notebook that runs the model in bf16 for speed
    photo = package_photos["chelsea"]
    v = m.verify(photo)
    assert v.passed and v.precision == "fp32" and v.compared == "both in fp32" and v.max_abs_logit_diff == 0.0
    assert v.verdict.startswith("Identical to 0.0001, both in fp32:") and ("precision", "both in fp32") in v.rows()
    r = m.verify(photo, precision="bf16")  # asked for: bf16's rounding, said so
    assert not r.passed and 1e-3 < r.max_abs_logit_diff < 0.5 and r.compared == "the scratch model in bf16, timm's in fp32"
    assert r.verdict.startswith("bf16's rounding, as expected (the scratch model in bf16, timm's in fp32;")
    assert r.badge == "bf16 ROUNDING" and not any(word in r.verdict + r._repr_html_() for word in NOT_SAID)
    with pytest.raises(ValueError, match="precision 'fp16': fp32 .* or bf16"):
        m.verify(photo, precision="fp16")


# ----------------------------------------------------------------------------- figures only where measured


@pytest.fixture(scope="module")
def shapes_model(tmp_path_factory):
    """A model of the shapes' four classes saved as the train command saves one (no timm name, its own
    class names), run in bf16, and its analysis of a drawn shape."""
    from vit_demo.train.data import EASY, render_shape

    path = random_shapes_checkpoint(tmp_path_factory.mktemp("shapes") / "shapes.safetensors")
    lm = load_model(weights=path, device="cpu", precision="bf16")
    pic, _ = render_shape("circle", 32, np.random.default_rng(0), EASY)
    return path, lm, analyze(lm, pic)


def test_a_trained_model_is_told_no_figure_measured_on_deit_tiny(shapes_model, lm16) -> None:
    from vit_demo.app.sections.models import model_summary
    from vit_demo.app.tabs.relevance import IG_NOTE, methods_caption

    path, lm, a = shapes_model
    assert lm.timm_name != "deit_tiny_patch16_224" and not lm.shipped and not is_shipped(path) and lm16.shipped
    said = model_summary(lm)
    for borrowed in ("1.7", "3.3", "99.8", "1000 sample photos", "DeiT", "ViT-B", "0.996"):
        assert borrowed not in said, (borrowed, said)
    assert "Runs in **bf16 (asked for)**: matrix products in bfloat16, for speed" in said
    assert "What bf16 changes in this model's predictions was not measured here" in said
    caption = methods_caption(a, "mean", 0.0, 0, None, measured=is_shipped(path))
    for borrowed in ("ImageNet", "100 ", "1000 ", "0.325", "0.390", "0.141", "SRG was", "about 20 s"):
        assert borrowed not in caption, (borrowed, caption)
    assert "How faithful it is on this model was not measured here" in caption and IG_NOTE not in caption
    # the shipped DeiT-Tiny: the figures measured on it, where they belong
    ours = analyze(lm16, Image.fromarray(np.asarray(a.picture.resize((224, 224)))))
    assert IG_NOTE in methods_caption(ours, "mean", 0.0, 0, None, measured=lm16.shipped)
    assert "99.8 %" in model_summary(lm16) and "Measured on this architecture: 1.7 times as fast" in model_summary(lm16)


def test_the_relevance_tab_knows_the_shipped_model_by_its_content(shapes_model, deit_tiny_path: Path,
                                                                   tmp_path: Path) -> None:
    """The tab asks :func:`is_shipped` of the menu entry's file, the model description the loaded model:
    the shipped file wherever it lies, not a file merely named like it."""
    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.sections.models import model_summary

    path, _, _ = shapes_model
    impostor = tmp_path / deit_tiny_path.name
    impostor.write_bytes(deit_tiny_path.read_bytes()[:-1] + b"\0")  # its name and size, another content
    reg = ModelRegistry(weights=[deit_tiny_path, path], hub_names=(), random_names=(), precision="bf16")
    ours, theirs = f"file:{deit_tiny_path.name}", f"file:{path.name}"
    assert is_shipped(reg.spec(ours).path) and not is_shipped(reg.spec(theirs).path)
    assert reg.get(ours).shipped and not reg.get(theirs).shipped  # (the app's models name no folder in their source)
    assert "99.8 %" in model_summary(reg.get(ours)) and "99.8 %" not in model_summary(reg.get(theirs))
    assert not is_shipped(impostor) and not is_shipped(tmp_path / "missing.safetensors") and not is_shipped(None)


# ----------------------------------------------------------------------------- refusals a user can act on


@pytest.fixture(scope="module")
def api_model(deit_tiny_path: Path):
    import vit_demo

    return vit_demo.load(deit_tiny_path)


def test_k_below_one_is_refused_in_one_line(api_model, deit_tiny_path: Path, package_photos, capsys) -> None:
    from vit_demo.cli.main import main

    m = api_model
    photo = package_photos["coffee"]
    for k in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match=r"^k must be a whole number from 1 to 1000 \(the model's classes\), not "):
            m.predict(photo, k=k)
    assert len(m.predict(photo, k=3).labels) == 3 and len(m.predict(photo, k=5000).labels) == 1000  # above: all
    for cmd in (["predict", str(photo)], ["explain", str(photo), "--method", "chefer", "--out", "/tmp/unused.png"]):
        assert main([*cmd, "--weights", str(deit_tiny_path), "--topk", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.endswith("--topk must be a whole number from 1 to 1000 (the model's classes), not 0"), err


def test_method_names_in_any_case_or_a_did_you_mean(capsys) -> None:
    from vit_demo.app.tools import plain_error
    from vit_demo.cli.common import UserError, parse_methods
    from vit_demo.cli.main import main

    assert [methods.find(n) for n in ("Chefer", "LRP_Gated", "integrated gradients")] == [
        "chefer", "lrp-gated", "integrated-gradients"]
    assert methods.get("GradCAM").name == "gradcam"
    with pytest.raises(ValueError, match=r"^unknown method 'chefr' \(did you mean 'chefer'\?\); known: attention, "):
        methods.find("chefr")
    assert parse_methods("Chefer, ROLLOUT") == ["chefer", "rollout"] and parse_methods("ALL") == methods.names()
    with pytest.raises(UserError, match=r"unknown method\(s\) lrp-gatd \(did you mean 'lrp-gated'"):
        parse_methods("chefer,lrp-gatd")
    with pytest.raises(SystemExit):
        main(["explain", "x.png", "--method", "Chefr", "--out", "x.png"])
    assert "--method: unknown method 'Chefr' (did you mean 'chefer'?)" in capsys.readouterr().err
    # the MCP layer refuses a value outside the tool's list before the tool runs: the name it may mean first
    said = plain_error("Input validation error: 'Chefer' is not one of ['chefer', 'attnlrp', 'lrp', 'lrp-gated', "
                       "'grad-rollout', 'gradcam', 'integrated-gradients']")
    assert said == ("Input validation error: 'Chefer' is not allowed (did you mean 'chefer'?); one of chefer, attnlrp, "
                    "lrp, lrp-gated, grad-rollout, gradcam, integrated-gradients.")


def test_the_api_explains_a_method_named_in_another_case(api_model, package_photos) -> None:
    e = api_model.explain(package_photos["coffee"], method="Chefer")
    assert e.method == "chefer" and e.map.shape == (14, 14)
    assert torch.isfinite(torch.from_numpy(e.map)).all()
