"""Reduced precision (issue 44): --precision auto|fp32|bf16, the detection, a model set to bfloat16,
the methods that stay in float32, and the checks against timm that stay in float32.

The suite runs with $VIT_DEMO_NO_BF16=1 (tests/conftest.py): auto is fp32 on every machine, as the
parity tests need; these tests ask for bf16 by name (it runs on any CPU, emulated where not native)."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo import methods, precision
from vit_demo.checkpoints.load import load_model
from vit_demo.model import VisionTransformer, ViTConfig


@pytest.fixture(scope="module")
def lm16(deit_tiny_path: Path):
    return load_model("deit_tiny_patch16_224", deit_tiny_path, device="cpu", precision="bf16")


def cli(*args: str) -> tuple[int, str, str]:
    from vit_demo.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def qkv_dtypes(model: VisionTransformer, run) -> set[torch.dtype]:
    """The dtypes the first block's qkv projection computed in while ``run()`` ran."""
    seen: set[torch.dtype] = set()
    handle = model.blocks[0].attn.qkv.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    try:
        run()
    finally:
        handle.remove()
    return seen


def test_detection_forced_off_gives_fp32_and_todays_numbers(deit_tiny, deit_tiny_path, monkeypatch):
    """With the detection off, auto is fp32 and the model is the class's, bit for bit: the same logits and
    attention as a model loaded without a precision; --precision bf16 still runs when asked for."""
    monkeypatch.setenv(precision.ENV_NO_BF16, "1")
    assert precision.detection_off() and not precision.bf16_is_fast("cpu")
    assert precision.resolve("auto", "cpu") == "fp32" and precision.resolve("bf16", "cpu") == "bf16"
    assert precision.describe("auto", "cpu") == "fp32 (auto: bf16 detection switched off by VIT_DEMO_NO_BF16)"
    auto = load_model("deit_tiny_patch16_224", deit_tiny_path, device="cpu", precision="auto")
    assert (auto.precision, deit_tiny.precision) == ("fp32", "fp32")
    assert "forward" not in vars(auto.model) and "embed" not in vars(auto.model)  # the class's own methods
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = auto.model(x, capture=True), deit_tiny.model(x, capture=True)
    assert torch.equal(a.logits, b.logits) and a.attentions[0].dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(a.attentions, b.attentions))
    monkeypatch.setenv(precision.ENV_NO_BF16, "0")
    assert not precision.detection_off()
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert precision.resolve("auto", "cpu") == ("bf16" if native else "fp32")
    with pytest.raises(ValueError, match="one of auto, fp32, bf16"):
        precision.resolve("fp16", "cpu")


def test_a_bf16_model_runs_bf16_but_its_pixels_and_logits(lm16, deit_tiny):
    """Set to bf16: the blocks compute in bfloat16, the patch embedding and the head in float32; the capture
    keeps bfloat16 probabilities in one block; full_precision() and set_precision(fp32) give float32 back,
    and a copy of the model keeps the setting, bound to the copy."""
    model = lm16.model
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert qkv_dtypes(model, lambda: model(x)) == {torch.bfloat16}
        out = model(x, capture=True)
        assert out.logits.dtype == torch.float32 and out.attentions[0].dtype == torch.bfloat16
        from vit_demo.methods.attention import in_float32, stacked

        assert stacked(out.attentions) is not None  # the capture's one block, in bfloat16
        wide = in_float32(out)
        assert wide.attentions[0].dtype == torch.float32 and stacked(wide.attentions) is not None
        ref = deit_tiny.model(x, capture=True)
        assert (out.logits - ref.logits).abs().max() < 0.3  # bfloat16's rounding, not another model
        plain = deit_tiny.model(x).logits
        with precision.full_precision():
            assert qkv_dtypes(model, lambda: model(x)) == {torch.float32}
            assert torch.equal(model(x).logits, plain)
        twin = copy.deepcopy(model)
        assert twin.forward.__self__ is twin and precision.model_precision(twin) == "bf16"
        precision.set_precision(twin, "fp32")
        assert "forward" not in vars(twin) and torch.equal(twin(x).logits, plain)


def test_bf16_predictions_agree_with_fp32_on_the_package_photos(lm16, deit_tiny, package_photos):
    from vit_demo.predict import predict_images

    paths = list(package_photos.values())
    a = predict_images(deit_tiny, paths, progress=False)
    b = predict_images(lm16, paths, progress=False)
    for p, r, s in zip(paths, a, b):
        assert r["topk"][0]["index"] == s["topk"][0]["index"], p.name
        assert abs(r["topk"][0]["prob"] - s["topk"][0]["prob"]) < 0.02, p.name


def test_precision_flag_header_line_and_json(deit_tiny_path, package_photos, tmp_path):
    """predict says the choice on its header line (stderr; its JSON on stdout is unchanged); explain's JSON
    records it; a bad value is refused by the parser."""
    cat = str(package_photos["chelsea"])
    rc, out, err = cli("predict", cat, "--weights", str(deit_tiny_path), "--precision", "bf16", "--json")
    assert rc == 0 and "deit_tiny_patch16_224 on cpu in bf16 (asked for" in err
    import json

    assert json.loads(out)[0]["topk"][0]["label"] == "Egyptian cat"
    rc, _, err = cli("predict", cat, "--weights", str(deit_tiny_path))
    assert rc == 0 and "in fp32 (auto: bf16 detection switched off by VIT_DEMO_NO_BF16)" in err
    rc, _, err = cli("explain", cat, "--weights", str(deit_tiny_path), "--method", "rollout", "--precision", "bf16",
                     "--out", str(tmp_path), "--width", "300")
    assert rc == 0, err
    assert json.loads((tmp_path / "chelsea_rollout.json").read_text())["precision"] == "bf16"
    with pytest.raises(SystemExit):
        cli("predict", cat, "--precision", "fp16")


def test_a_method_not_marked_bf16_ok_runs_in_fp32(lm16, deit_tiny):
    """The registry runs a method in the model's precision only when it is marked ``bf16_ok``; the others
    get float32 from a model set to bf16 (here RISE, with few masks), and every map is float32."""
    from vit_demo.methods.perturb import RiseSettings

    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    few = RiseSettings(masks=4, chunk=4)
    assert not methods.get("rise").bf16_ok
    seen = qkv_dtypes(lm16.model, lambda: methods.get("rise").fn(lm16.model, x, 3, settings=few))
    assert seen == {torch.float32}
    torch.testing.assert_close(methods.get("rise").fn(lm16.model, x, 3, settings=few),
                               methods.get("rise").fn(deit_tiny.model, x, 3, settings=few))
    shipped = [n for n in methods.names() if methods.get(n).bf16_ok]
    assert "lrp-amortised" in shipped
    seen = qkv_dtypes(lm16.model, lambda: methods.get("chefer")(lm16.model, x, 3))
    assert seen == {torch.bfloat16} and methods.get("chefer")(lm16.model, x, 3).dtype == torch.float32


def test_class_maps_in_bf16_rank_the_patches_as_fp32(lm16, deit_tiny, package_photos):
    """Class-specific maps of a bf16 model (the app's row, passes shared) rank the patches as the fp32
    model's do on a package photo: rank correlation above 0.995 for Chefer and gated LRP, above 0.95 for
    amortised LRP (weighted by 8 measured rank groups: a patch near a group's edge changes group); a method
    kept in fp32 (probed LRP) gives the fp32 map itself, bit for bit, though it reuses the gated map that
    ran before it in bf16 in the same scope (the scope keeps each precision's passes apart)."""
    from scipy.stats import spearmanr

    from vit_demo.analysis import analyze, class_maps

    names = ["chefer", "lrp-gated", "lrp-amortised", "lrp-probed"]
    assert not methods.get("lrp-probed").bf16_ok
    img = Image.open(package_photos["coffee"]).convert("RGB")
    a16, a32 = analyze(lm16, img), analyze(deit_tiny, img)
    assert a16.top1 == a32.top1 and a16.attentions[0].dtype == torch.float32
    m16, m32 = class_maps(a16, lm16, names=names), class_maps(a32, deit_tiny, names=names)
    for name in names:
        if not methods.get(name).bf16_ok:
            np.testing.assert_array_equal(m16[name], m32[name])
            continue
        rho = spearmanr(m16[name].ravel(), m32[name].ravel())[0]
        assert rho > (0.95 if name == "lrp-amortised" else 0.995), (name, rho)


def test_verify_in_bf16_reports_the_differences(deit_tiny_path):
    from vit_demo.checkpoints.verify import format_report, verify

    r = verify("deit_tiny_patch16_224", deit_tiny_path, device="cpu", progress=False, precision="bf16")
    assert r["precision"] == "bf16" and not r["passed"] and 1e-3 < r["max_abs_logit_diff"] < 0.5
    assert r["compared"] == "the scratch model in bf16, timm's in fp32"
    text = format_report(r)
    assert "bf16's rounding, as expected: not within 0.0001 of timm's fp32" in text
    assert not any(word in text for word in ("PASSED", "FAILED", "Mismatch", "MISMATCH"))
    assert "the scratch model in bf16, timm's in fp32" in text


def test_the_compare_tab_checks_in_fp32(lm16, package_photos):
    """The app's Compare with timm runs the bf16 model in float32: identical to timm, as before."""
    from vit_demo.analysis import analyze
    from vit_demo.app.sections.models import model_summary
    from vit_demo.app.tabs.compare import compare_with_timm, press_note
    from vit_demo.checkpoints.verify import timm_twin

    a = analyze(lm16, Image.open(package_photos["chelsea"]).convert("RGB"))
    c = compare_with_timm(a, lm16, timm_twin(lm16, lm16.source[5:]))
    assert c["identical"], c["verdict"]
    assert "Both run in fp32 here" in press_note(lm16)
    summary = model_summary(lm16)  # the shipped DeiT-Tiny: the figures measured on it
    assert "Runs in **bf16 (asked for)**: matrix products in bfloat16" in summary
    assert "Measured on this architecture: 1.7 times as fast as fp32" in summary and "99.8 %" in summary


def test_fp32_model_summary_says_fp32(deit_tiny):
    from vit_demo.app.sections.models import model_summary

    assert model_summary(deit_tiny).rstrip().endswith("Runs in fp32 (asked for).")


def test_rollout_sums_in_fp32_and_keeps_float64():
    """Attention in bfloat16 is fused into float32; float64 stays float64 (the reference tests' precision)."""
    from vit_demo.methods.rollout import rollout

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                        num_classes=3)).eval()
    with torch.inference_mode():
        out = model(torch.randn(1, 3, 32, 32), capture=True)
    assert rollout([a.bfloat16() for a in out.attentions], out.layout).dtype == torch.float32
    assert rollout([a.double() for a in out.attentions], out.layout).dtype == torch.float64
