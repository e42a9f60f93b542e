"""The convolutional stem (a scratch-model option, Xiao et al. 2021): off by default and for every
port (the plain model's modules and keys are unchanged), saved and loaded strictly, compared with
timm from the tokens on (tests/model/test_stem_twin.py), and every explanation method runs on it; LRP's gamma rule for its 3x3
stride-2 convolutions equals the linear gamma rule applied to the unfolded patches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_demo import methods
from vit_demo.methods.lrp import gamma_conv, gamma_linear
from vit_demo.methods.perturb import CausalSettings, RiseSettings
from vit_demo.model import VisionTransformer, ViTConfig

CFG = ViTConfig(img_size=(32, 32), patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=4)


def stem_model(seed: int = 0) -> VisionTransformer:
    torch.manual_seed(seed)
    model = VisionTransformer(replace(CFG, conv_stem=True)).init_weights()
    nn.init.normal_(model.head.weight, std=0.5)  # a head that is not zero: maps depend on the class
    for m in model.modules():  # BatchNorm with statistics of its own, as after training
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 2)
    return model.eval()


def test_plain_model_is_unchanged_and_the_stem_is_extra() -> None:
    plain = VisionTransformer(CFG)
    assert plain.patch_embed.stem is None and ViTConfig().conv_stem is False
    assert [k for k in plain.state_dict() if k.startswith("patch_embed.")] == ["patch_embed.proj.weight", "patch_embed.proj.bias"]
    assert plain.patch_embed.proj.kernel_size == (4, 4)
    model = stem_model()
    keys = [k for k in model.state_dict() if k.startswith("patch_embed.")]
    assert keys[:2] == ["patch_embed.stem.0.weight", "patch_embed.stem.1.weight"] and "patch_embed.proj.weight" in keys
    assert model.patch_embed.proj.kernel_size == (1, 1) and model.patch_embed.proj.in_channels == 16
    feats = model.patch_embed(torch.randn(2, 3, 32, 32))
    assert feats[0].shape == (2, 64, 32) and feats[1] == (8, 8)
    with pytest.raises(ValueError, match="power of 2"):
        ViTConfig(patch_size=6, conv_stem=True)


def test_saved_and_loaded_strictly_timm_from_the_tokens(tmp_path: Path) -> None:
    from vit_demo.checkpoints.files import save
    from vit_demo.checkpoints.load import load_model
    from vit_demo.checkpoints.stem_twin import is_stem_twin
    from vit_demo.checkpoints.verify import timm_twin
    from vit_demo.train.recipe import scratch_data_config

    model = stem_model()
    path = save(model, scratch_data_config(32), tmp_path / "stem.safetensors", name="", class_names=list("abcd"))
    lm = load_model(weights=path, device="cpu")
    assert lm.model.cfg.conv_stem and lm.labels == tuple("abcd")
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(lm.model(x).logits, model(x).logits, atol=0, rtol=0)  # BatchNorm statistics too
    tm = timm_twin(lm, path)  # the stride-2 stem (not CCT's pooled one): timm's blocks fed its tokens
    assert is_stem_twin(tm)
    with torch.no_grad():
        assert (tm(x) - model(x).logits).abs().max() <= 1e-5


def test_conv_gamma_rule_equals_the_linear_rule_on_unfolded_patches() -> None:
    """Naive reference: each output of a 3x3 stride-2 convolution is a linear map of its (zero
    padded) patch; the gamma rule there, folded back onto the pixels, is the relevance."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=True)
    x = torch.randn(2, 3, 12, 12)
    relevance_out = torch.randn(2, 8, 6, 6)

    xa = x.clone().requires_grad_(True)
    out = gamma_conv(conv, xa, 0.25)
    torch.testing.assert_close(out, conv(x), atol=1e-6, rtol=1e-5)  # same values
    (grad,) = torch.autograd.grad(out, xa, relevance_out)

    xb = x.clone().requires_grad_(True)
    patches = F.unfold(xb, 3, padding=1, stride=2).transpose(1, 2)  # [B, 36, 27]
    lin = nn.Linear(27, 8)
    lin.weight.data, lin.bias.data = conv.weight.reshape(8, -1), conv.bias
    out_ref = gamma_linear(lin, patches, 0.25)  # [B, 36, 8]
    (grad_ref,) = torch.autograd.grad(out_ref, xb, relevance_out.flatten(2).transpose(1, 2))
    torch.testing.assert_close(x * grad, x * grad_ref, atol=1e-5, rtol=1e-4)
    assert float((x * grad).sum()) == pytest.approx(float((relevance_out * out.detach()).sum()), rel=0.5)  # roughly conserved


@pytest.mark.parametrize("name", methods.names())
def test_every_method_runs_on_a_conv_stem(name: str) -> None:
    model = stem_model()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    fast = {"rise": {"settings": RiseSettings(masks=16, chunk=8)},
            "lrp-causal": {"settings": CausalSettings(masks=32, levels=2, chunk=16)}}
    got = methods.get(name).fn(model, x, torch.tensor([1, 3]), **fast.get(name, {}))
    assert got.shape == (2, 8, 8) and torch.isfinite(got).all() and got.abs().sum() > 0
    assert not model.training and all(p.grad is None for p in model.parameters())
