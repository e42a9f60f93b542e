"""The model `train` makes by default (a convolutional stem, CCT's tokenizer, no [class] token)
against timm: timm's VisionTransformer built from its config has no such stem, so the check starts
at the tokens (ours on both sides) and compares every stage after them, block by block, within
1e-5; a broken block weight fails it; the CLI and the Compare tab say what was compared; the plain
ViT (`--stem patch`) still compares whole, from the pixels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vit_demo.checkpoints.files import CheckpointError, read_checkpoint, save
from vit_demo.checkpoints.load import LoadedModel, load_model
from vit_demo.checkpoints.stem_twin import STEM_SCOPE, StemEmbed, is_stem_twin
from vit_demo.checkpoints.verify import compare, compare_one, format_report, stages_within, timm_twin, verdict, verify
from vit_demo.cli.main import main
from vit_demo.model import VisionTransformer
from vit_demo.train.recipe import scratch_config, scratch_data_config

TOL = 1e-5


def saved(tmp_path: Path, stem: str, seed: int = 0) -> Path:
    """A checkpoint of the default recipe's architecture at 32 px (4 classes), random weights with a
    head that is not zero and BatchNorm statistics of its own, as after training."""
    torch.manual_seed(seed)
    model = VisionTransformer(scratch_config(32, 4, stem=stem)).init_weights()
    nn.init.normal_(model.head.weight, std=0.5)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
    return save(model.eval(), scratch_data_config(32), tmp_path / f"{stem}.safetensors", name="", class_names=list("abcd"))


@pytest.fixture
def conv(tmp_path: Path) -> tuple[LoadedModel, Path]:
    path = saved(tmp_path, "conv")
    return load_model(weights=path, device="cpu"), path


def inputs(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_default_model_compares_block_by_block_from_the_tokens(conv: tuple[LoadedModel, Path]) -> None:
    lm, path = conv
    cfg = lm.model.cfg
    assert cfg.conv_stem and cfg.stem_pool and not cfg.class_token and cfg.global_pool == "avg" and cfg.fc_norm
    tm = timm_twin(lm, path)
    assert is_stem_twin(tm) and isinstance(tm.patch_embed, StemEmbed)
    # timm's class, timm's parts after the stem: only the patch embedding is ours
    assert type(tm).__module__ == "timm.models.vision_transformer" and type(tm.blocks[0]).__module__.startswith("timm.")
    ours = {n for n, m in tm.named_modules() if m.__module__.startswith("vit_demo")}
    assert ours and all(n.startswith("patch_embed") for n in ours), ours
    x = inputs()
    with torch.no_grad():
        a, b = lm.model(x).logits, tm(x)
    assert a.std() > 0.1 and (a - b).abs().max() <= TOL  # logits that vary, equal to 1e-5
    c = compare_one(lm.model, tm, x[:1], repeats=1)
    st = c["stages"]
    assert set(st) == {"tokens", "blocks", "norm", "pooled", "attention"} and len(st["blocks"]) == cfg.depth == 4
    assert st["tokens"] <= 1e-6 and max(st["blocks"]) <= TOL and max(st["attention"]) <= TOL and st["pooled"] <= TOL
    assert c["max_abs_logit_diff"] <= TOL and max(c["layer_attn_max_diff"]) <= TOL and c["topk_agree"]
    v = verdict(c)
    assert v.startswith("Identical to 0.0001 from the tokens on, both in fp32:") and v.endswith(STEM_SCOPE)
    assert "no timm counterpart" in v and "train --stem patch trains a model that timm builds whole" in v


def test_a_broken_block_weight_fails_the_check(conv: tuple[LoadedModel, Path]) -> None:
    lm, path = conv
    tm = timm_twin(lm, path)
    x = inputs()
    g = torch.Generator().manual_seed(0)
    kick = torch.randn(lm.model.cfg.embed_dim, generator=g)  # (not constant: LayerNorm's output sums to 0)
    with torch.no_grad():
        lm.model.blocks[3].attn.qkv.weight[0] += kick  # layer 4's queries: its attention changes, nothing before it
    c = compare_one(lm.model, tm, x[:1], repeats=1)
    assert max(c["stages"]["blocks"][:3]) <= TOL and c["stages"]["blocks"][3] > 1e-3
    v = verdict(c)
    assert v.startswith("Mismatch from the tokens on, both in fp32:") and "(first worst at layer 4)" in v and "block 4" in v, v
    with torch.no_grad():
        lm.model.blocks[3].attn.qkv.weight[0] -= kick
        lm.model.blocks[1].mlp.fc2.weight[:, 0] += kick  # block 2's MLP: its output and every later stage
    r = compare(lm.model, tm, list(x), batch_size=2, progress=False)
    st = r["stage_max_abs_diff"]
    assert st["blocks"][0] <= TOL and st["blocks"][1] > 1e-3 and st["pooled"] > 1e-3 and not stages_within(st, 1e-4)


def test_every_key_and_shape_is_checked(conv: tuple[LoadedModel, Path], tmp_path: Path) -> None:
    lm, path = conv
    sd, meta = read_checkpoint(path)
    from safetensors.torch import save_file

    bad = tmp_path / "bad.safetensors"
    save_file({k: v for k, v in sd.items() if k != "blocks.2.mlp.fc1.bias"} | {"blocks.0.norm1.weight": torch.ones(5)},
              str(bad), metadata=meta)
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.2\.mlp\.fc1\.bias") as e:
        timm_twin(lm, bad)
    assert "blocks.0.norm1.weight: checkpoint (5,) vs model (96,)" in str(e.value)


def test_cli_says_what_was_compared(conv: tuple[LoadedModel, Path], capsys: pytest.CaptureFixture) -> None:
    _, path = conv
    assert main(["verify", "--weights", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "compared:            from the tokens on (each block's output and attention" in out
    assert "PASSED: identical to 0.0001 from the tokens on, both in fp32" in out and "has no timm counterpart" in out
    assert "train --stem patch trains a model that timm builds whole" in out
    assert main(["verify", "--weights", str(path), "--device", "cpu", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["starts_at"] == "tokens" and r["scope"] == STEM_SCOPE and r["passed"] is True
    assert r["max_abs_logit_diff"] <= TOL and max(r["stage_max_abs_diff"]["blocks"]) <= TOL


def test_patch_model_still_compares_whole(tmp_path: Path) -> None:
    path = saved(tmp_path, "patch")
    lm = load_model(weights=path, device="cpu")
    tm = timm_twin(lm, path)
    assert not is_stem_twin(tm) and type(tm.patch_embed).__module__.startswith("timm.")
    c = compare_one(lm.model, tm, inputs(1), repeats=1)
    assert "stages" not in c and verdict(c).startswith("Identical to 0.0001, both in fp32: ") and "tokens" not in verdict(c)
    r = verify(None, path, images=[], device="cpu", progress=False)
    assert r["passed"] and r["starts_at"] == "pixels" and r["scope"] == "" and "stage_max_abs_diff" not in r
    assert r["max_abs_logit_diff"] <= TOL and "compared:" not in format_report(r)


def test_a_trained_default_model(tmp_path: Path) -> None:
    """Two epochs of the default recipe on generated shapes (the BatchNorm statistics its own)."""
    from vit_demo.train.data import make_shapes
    from vit_demo.train.loop import TrainOptions, run

    make_shapes(tmp_path / "shapes", per_class=16, size=32, seed=2, progress=False)
    out = tmp_path / "trained.safetensors"
    run(TrainOptions(data=str(tmp_path / "shapes"), out=str(out), epochs=2, batch_size=16, device="cpu",
                     progress=False), log=lambda _line: None)
    r = verify(None, out, images=[], device="cpu", progress=False)
    assert load_model(weights=out, device="cpu").model.cfg.conv_stem
    assert read_checkpoint(out)[0]["patch_embed.stem.1.num_batches_tracked"] > 0  # BatchNorm statistics of its own
    assert r["passed"] and r["starts_at"] == "tokens" and r["max_abs_logit_diff"] <= TOL
    assert max(r["stage_max_abs_diff"]["blocks"]) <= TOL and r["stage_max_abs_diff"]["pooled"] <= TOL


def test_compare_tab_on_a_default_model(conv: tuple[LoadedModel, Path], package_photos: dict[str, Path]) -> None:
    """The app's "Compare with timm" on a checkpoint given with --weights: it compares, and its
    verdict, table, note and the model's summary line say from where."""
    from PIL import Image

    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.sections.models import model_summary
    from vit_demo.app.tabs.compare import compare_markdown, compare_with_timm, press_note, verdict_html

    _, path = conv
    reg = ModelRegistry(weights=[path], hub_names=(), random_names=())
    key = f"file:{path.name}"
    lm = reg.get(key)
    a = reg.analyze(key, Image.open(package_photos["chelsea"]))
    c = compare_with_timm(a, lm, reg.timm_twin(key))
    assert c["identical"] and c["max_abs_logit_diff"] <= TOL, c["verdict"]
    assert c["verdict"].startswith("Identical to 0.0001 from the tokens on") and STEM_SCOPE in c["verdict"]
    assert '<span class="badge">PASS</span> <b>Identical to 0.0001 from the tokens on, both in fp32</b>' in verdict_html(c)
    table = compare_markdown(c)
    assert table.startswith("**Compared from the tokens on** (the convolutional stem has no timm counterpart)")
    assert "block output difference\\| per layer" in table and "| layer 4 |" in table
    assert STEM_SCOPE in press_note(lm) and "compared from the tokens on" in model_summary(lm)
    assert "no timm twin" not in model_summary(lm)
