"""Hugging Face transformers folders: random-initialised ViTForImageClassification, ViTModel
and DeiTForImageClassificationWithTeacher built locally from small configs (no download),
ported, then compared with transformers' own model; class names, preprocessing, strictness,
and no transformers import for a safetensors folder."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_demo.checkpoints.files import CheckpointError, UnsupportedModelError, read_checkpoint
from vit_demo.checkpoints.hf import from_hf_folder
from vit_demo.cli.main import main

transformers = pytest.importorskip("transformers", reason="optional: pip install -c requirements.txt -e \".[crosscheck]\"")

ROOT = Path(__file__).resolve().parent.parent
FRUIT = ["apple", "banana", "cherry", "damson", "elderberry"]
SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=32,
             patch_size=8, initializer_range=0.3, id2label=dict(enumerate(FRUIT)),
             label2id={n: i for i, n in enumerate(FRUIT)})


def make_folder(tmp: Path, arch: str, **overrides) -> Path:
    """A transformers folder of ``arch`` with random weights (seeded), config.json,
    model.safetensors and preprocessor_config.json."""
    torch.manual_seed(0)
    cfg_cls = transformers.DeiTConfig if arch.startswith("DeiT") else transformers.ViTConfig
    model = getattr(transformers, arch)(cfg_cls(**{**SMALL, **overrides}))
    folder = tmp / arch
    model.save_pretrained(folder)
    proc = (transformers.DeiTImageProcessor(size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32},
                                            image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
            if arch.startswith("DeiT") else transformers.ViTImageProcessor(size={"height": 32, "width": 32}))
    proc.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch,overrides", [
    ("ViTForImageClassification", {}),
    ("ViTForImageClassification", {"qkv_bias": False, "hidden_act": "quick_gelu"}),
    ("ViTModel", {}),
    ("DeiTForImageClassificationWithTeacher", {}),
], ids=["vit", "vit-nobias-quickgelu", "vit-headless", "deit-teacher"])
def test_port_and_verify_against_transformers(tmp_path: Path, capsys, arch: str, overrides: dict) -> None:
    folder = make_folder(tmp_path, arch, **overrides)
    out = tmp_path / "ported.safetensors"
    assert main(["port", "--from", str(folder), "--out", str(out)]) == 0
    _, meta = read_checkpoint(out)
    assert meta["hf_architecture"] == arch
    headless = arch == "ViTModel"
    assert ("class_names" in meta) is not headless
    if not headless:
        assert json.loads(meta["class_names"]) == FRUIT
    capsys.readouterr()
    for size in ([], ["--input-size", "32x48"]):  # the trained size, and a non-square one (interpolate_pos_encoding)
        rc = main(["verify", "--weights", str(out), "--reference", str(folder), "--device", "cpu", "--json", *size])
        r = json.loads(capsys.readouterr().out)
        assert rc == 0 and r["passed"], r
        assert r["max_abs_logit_diff"] <= 1e-4 and r["reference"] == f"transformers {arch}"
        assert "reference_ms_per_image" in r and "timm_ms_per_image" not in r
        assert r["input_size"] == ([32, 48] if size else [32, 32])
    # the numbers are not trivially small: random weights at initializer_range 0.3
    with torch.inference_mode():
        model, _, _ = from_hf_folder(folder)
        assert model(torch.randn(2, 3, 32, 32)).logits.abs().max() > 0.1


def test_class_names_reach_predict(tmp_path: Path, package_photos: dict[str, Path], capsys) -> None:
    folder = make_folder(tmp_path, "ViTForImageClassification")
    out = tmp_path / "fruit.safetensors"
    assert main(["port", "--from", str(folder), "--out", str(out)]) == 0
    assert "5 class names" in capsys.readouterr().out
    assert main(["predict", str(package_photos["coffee"]), "--weights", str(out), "--topk", "5", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)[0]["topk"]
    assert sorted(t["label"] for t in top) == sorted(FRUIT)
    # a transformers folder works directly as --weights too
    assert main(["predict", str(package_photos["coffee"]), "--weights", str(folder), "--topk", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["topk"] == top[:2]


def test_preprocessing_from_the_image_processor(tmp_path: Path) -> None:
    _, dc, _ = from_hf_folder(make_folder(tmp_path, "DeiTForImageClassificationWithTeacher"))
    assert dc.input_size == (32, 32) and dc.scale_size == (36, 36) and dc.crop_mode == "squash"
    assert dc.interpolation == "bicubic" and dc.mean == pytest.approx((0.485, 0.456, 0.406))
    _, dc, _ = from_hf_folder(make_folder(tmp_path, "ViTForImageClassification"))
    assert dc.input_size == (32, 32) and dc.crop_pct == 1.0 and dc.interpolation == "bilinear"
    assert dc.mean == (0.5, 0.5, 0.5) and dc.std == (0.5, 0.5, 0.5)


@pytest.mark.slow  # the command in a subprocess
def test_safetensors_folder_ports_without_transformers(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "DeiTForImageClassificationWithTeacher")
    out = tmp_path / "deit.safetensors"
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from vit_demo.cli.main import main\n"
        f"sys.exit(main(['port', '--from', {str(folder)!r}, '--out', {str(out)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    with torch.inference_mode():
        ref = transformers.DeiTForImageClassificationWithTeacher.from_pretrained(folder).eval()
        x = torch.randn(2, 3, 32, 32)
        ours, _, _ = from_hf_folder(folder)
        from vit_demo.checkpoints.load import from_checkpoint

        reloaded, _, _ = from_checkpoint(out)
        torch.testing.assert_close(reloaded(x).logits, ref(pixel_values=x).logits, atol=1e-5, rtol=0)


def test_pytorch_model_bin(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "ViTForImageClassification")
    sd, _ = read_checkpoint(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(sd, folder / "pytorch_model.bin")
    model, _, meta = from_hf_folder(folder)
    assert "pytorch_model.bin" in meta["source"]
    ref = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        torch.testing.assert_close(model(x).logits, ref(pixel_values=x).logits, atol=1e-5, rtol=0)
    # a pickle that would build objects is refused, not run
    torch.save({"w": torch.zeros(1), "x": argparse.Namespace(a=1)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused|weights-only"):
        from_hf_folder(folder)


def test_unsupported_and_broken_folders_are_named(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "ViTForImageClassification")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu_new"}))
    with pytest.raises(UnsupportedModelError, match="hidden_act='gelu_new'"):
        from_hf_folder(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["ViTForMaskedImageModeling"]}))
    with pytest.raises(UnsupportedModelError, match="ViTForMaskedImageModeling.*supported: ViTForImageClassification"):
        from_hf_folder(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))  # the file has 2 layers
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.2\."):
        from_hf_folder(folder)
    (folder / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import save_file

    sd, _ = read_checkpoint(folder / "model.safetensors")
    save_file({**sd, "vit.encoder.layer.0.attention.attention.rotary.weight": torch.zeros(4)}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="no place for: vit.encoder.layer.0.attention.attention.rotary.weight"):
        from_hf_folder(folder)
    rc = main(["port", "--from", str(tmp_path), "--out", str(tmp_path / "x.safetensors")])  # no config.json there
    assert rc == 2


def test_app_registry_takes_a_transformers_folder(tmp_path: Path, package_photos: dict[str, Path]) -> None:
    """The app's "Use your own checkpoint" path accepts a transformers folder; its names are the labels."""
    from PIL import Image

    from vit_demo.app.registry import ModelRegistry

    folder = make_folder(tmp_path, "ViTForImageClassification")
    reg = ModelRegistry(hub_names=())
    spec = reg.add_checkpoint(str(folder))
    a = reg.analyze(spec.key, Image.open(package_photos["coffee"]))
    assert a.labels == tuple(FRUIT) and a.topk(1)[0]["label"] in FRUIT


# ----------------------------------------------------------------------------- DINOv2, CLIP, SigLIP

FAMILY_SMALL = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
FAMILIES = {  # transformers class -> (its config class, overrides, its image processor)
    "Dinov2Model": ("Dinov2Config", dict(layerscale_value=0.5, initializer_range=0.3), "BitImageProcessor"),
    "Dinov2Model-swiglu": ("Dinov2Config", dict(use_swiglu_ffn=True, initializer_range=0.3), "BitImageProcessor"),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(num_register_tokens=4, initializer_range=0.3),
                                 "BitImageProcessor"),
    "CLIPVisionModel": ("CLIPVisionConfig", dict(intermediate_size=96, initializer_factor=3.0), "CLIPImageProcessor"),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", dict(intermediate_size=96, projection_dim=24,
                                                               initializer_factor=3.0), "CLIPImageProcessor"),
    "SiglipVisionModel": ("SiglipVisionConfig", dict(intermediate_size=96), "SiglipImageProcessor"),
}


def make_family_folder(tmp: Path, fid: str) -> Path:
    """A transformers folder of a DINOv2 / CLIP / SigLIP vision model: random weights (seeded),
    every parameter moved by noise (so that LayerScale, norms and SigLIP's probe matter), and
    the family's image processor at 32 px."""
    cfg_name, overrides, proc = FAMILIES[fid]
    torch.manual_seed(0)
    model = getattr(transformers, fid.split("-")[0])(getattr(transformers, cfg_name)(**FAMILY_SMALL, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp / fid
    model.save_pretrained(folder)
    size = {"shortest_edge": 32} if proc != "SiglipImageProcessor" else {"height": 32, "width": 32}
    kwargs = {"crop_size": {"height": 32, "width": 32}} if proc != "SiglipImageProcessor" else {}
    getattr(transformers, proc)(size=size, **kwargs).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("fid", FAMILIES)
def test_dinov2_clip_siglip_port_and_verify(tmp_path: Path, capsys, fid: str) -> None:
    """port --from DIR, then verify --reference DIR at the model's size and at a non-square one
    (transformers' own interpolation of the position embedding): logits (or the pooled features
    of a headless model) within 1e-4."""
    folder = make_family_folder(tmp_path, fid)
    out = tmp_path / "ported.safetensors"
    assert main(["port", "--from", str(folder), "--out", str(out)]) == 0
    _, meta = read_checkpoint(out)
    assert meta["hf_architecture"] == fid.split("-")[0]
    capsys.readouterr()
    for size in ([], ["--input-size", "32x48"]):
        rc = main(["verify", "--weights", str(out), "--reference", str(folder), "--device", "cpu", "--json", *size])
        r = json.loads(capsys.readouterr().out)
        assert rc == 0 and r["passed"], r
        assert r["max_abs_logit_diff"] <= 1e-4 and r["reference"] == f"transformers {fid.split('-')[0]}"
        assert r["input_size"] == ([32, 48] if size else [32, 32])
    model, dc, _ = from_hf_folder(folder)
    with torch.inference_mode():
        assert model(torch.randn(2, 3, 32, 32)).logits.abs().max() > 0.1
    proc = json.loads((folder / "preprocessor_config.json").read_text())
    assert dc.mean == pytest.approx(tuple(proc["image_mean"])) and dc.input_size == (32, 32)
    cfg = model.cfg
    if fid == "Dinov2WithRegistersModel":
        assert (cfg.reg_tokens, cfg.no_embed_class, cfg.layer_scale) == (4, True, True)
    if fid == "CLIPVisionModelWithProjection":
        assert (cfg.num_classes, cfg.head_bias, cfg.pre_norm, cfg.act) == (24, False, True, "quick_gelu")
    if fid == "SiglipVisionModel":
        assert (cfg.global_pool, cfg.class_token, cfg.act) == ("map", False, "gelu_tanh")


def test_siglip_without_its_head_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**FAMILY_SMALL, intermediate_size=96,
                                                                            vision_use_head=False))
    model.save_pretrained(tmp_path / "siglip")
    with pytest.raises(UnsupportedModelError, match="vision_use_head=false"):
        from_hf_folder(tmp_path / "siglip")
