"""The contract every registered method keeps (parametrised over the registry, so a new method is
checked by being registered): the map's shape, a batch equals its images one by one, the target
is respected, and the same call gives the same map; on a plain ViT, and (shortened) on a small
random model of every family the scratch model ports (SigLIP, PE, EVA-02, DINOv3, BEiT, ...).
And the extension point itself: a module dropped into ``vit_demo/methods/`` appears in
``explain --method`` and ``faithfulness --methods`` with no other edit."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vit_demo import methods
from vit_demo.methods.perturb import CausalSettings, RiseSettings
from vit_demo.model import VisionTransformer, ViTConfig

ROOT = Path(__file__).resolve().parents[1]
B = 3


@pytest.fixture(scope="module")
def small():
    """A small random ViT (PyTorch's default init) with a decisive head, so that the class
    probabilities react to masks well above float32's resolution, and 3 inputs."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(48, 64), patch_size=16, embed_dim=32, depth=2, num_heads=2,
                                        num_classes=7)).eval()
    with torch.no_grad():
        model.head.weight.mul_(3)
    x = torch.randn(B, 3, 48, 64, generator=torch.Generator().manual_seed(1))
    return model, x


# One small random model of every family of timm's ViT family that the scratch model ports
# (docs/families.md): the variants that change what a method reads or differentiates.
FAMILIES = {
    "siglip": dict(class_token=False, global_pool="map", act="gelu_tanh"),
    "pe": dict(global_pool="map", pool_include_prefix=True, rope="axial", rope_xy=True, rope_offset=1.0,
               rope_ref_grid=(4, 4), pre_norm=True, patch_bias=False),
    "eva02": dict(rope="axial", rope_ref_grid=(8, 8), mlp="glu", act="silu", qkv_bias=False, qv_bias=True,
                  global_pool="avg", fc_norm=True),
    "eva02-clip": dict(qkv_fused=False, qkv_bias=False, qv_bias=True, mlp="swiglu", act="silu", mlp_norm=True,
                       attn_norm=True, head_bias=False),
    "dinov3": dict(rope="dinov3", rope_half=True, rope_temperature=100.0, reg_tokens=2, pos_embed=False,
                   layer_scale=True, layer_scale_on_block=True, mlp="swiglu", act="silu"),
    "rope-mixed": dict(rope="mixed", rope_xy=True, rope_temperature=10.0),
    "sapiens2": dict(norm="rmsnorm", qk_norm=True, qkv_fused=False, kv_heads=(2, 1), layer_scale=True,
                     layer_scale_on_block=True, layer_scale_attn_only=True, mlp="glu", act="silu", rope="dinov3",
                     rope_half=True, pos_embed=False),
    "beit": dict(rel_pos="table", pos_embed=False, qkv_bias=False, qv_bias=True, layer_scale=True,
                 layer_scale_on_block=True, global_pool="avg", fc_norm=True),
    "beit-shared": dict(rel_pos="shared_table", pos_embed=False, global_pool="avg", fc_norm=True),
    "relpos": dict(rel_pos="mlp", rel_pos_hidden=16, pos_embed=False, class_token=False, global_pool="avg",
                   fc_norm=True, layer_scale=True, qkv_bias=False),
    "relpos-rpn": dict(rel_pos="shared_mlp", rel_pos_hidden=16, post_norm=True, pos_embed=False, class_token=False,
                       global_pool="avg"),
    "diff": dict(diff_attn=True, qk_norm=True, class_token=False, reg_tokens=1, no_embed_class=True, global_pool="avg",
                 layer_scale=True),
    "parallel-scaling": dict(block="scaling", norm="rmsnorm", qkv_bias=False, qk_norm=True, pre_norm=True),
    "diff-parallel": dict(block="scaling", diff_attn=True, fused_out_proj=True, layer_scale=True),
    "parallel-things": dict(block="things", layer_scale=True),
    "sam": dict(window_size=2, global_blocks=(1,), rel_pos="decomposed", neck_chans=16, pos_embed_grid=True,
                class_token=False, global_pool="avg", final_norm=False),  # SAM's encoder, with a head to explain
    "naflex": dict(naflex=True, no_embed_class=True, pos_embed_factorized=True, pos_embed_square=True, reg_tokens=1,
                   class_token=False, global_pool="avg", fc_norm=True, layer_scale=True),
    "aimv2": dict(norm="rmsnorm", patch_norm=True, mlp="swiglu", act="silu", qkv_bias=False, proj_bias=False,
                  class_token=False, global_pool="avg", fc_norm=True),
}


@pytest.fixture(scope="module")
def family_models():
    """Each family's small random model (PyTorch's init, then every parameter moved by noise so
    that zero-initialised tables and biases matter; a decisive head) and 2 inputs."""
    out = {}
    for i, (fid, variant) in enumerate(FAMILIES.items()):
        torch.manual_seed(i)
        model = VisionTransformer(ViTConfig(img_size=(48, 64), patch_size=16, embed_dim=32, depth=2, num_heads=2,
                                            num_classes=7, **variant)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
            model.head.weight.mul_(3)
        out[fid] = model, torch.randn(2, 3, 48, 64, generator=torch.Generator().manual_seed(1))
    return out


def call(name: str, model, x, target):
    """The registry's function; the slow ones with fewer masks (the contract does not depend on them)."""
    fast = {"rise": {"settings": RiseSettings(masks=16, chunk=8)},
            "lrp-causal": {"settings": CausalSettings(masks=32, levels=2, chunk=16)}}
    return methods.get(name).fn(model, x, target, **fast.get(name, {}))


@pytest.mark.parametrize("name", methods.names())
def test_method_contract(name, small):
    model, x = small
    t = torch.tensor([1, 4, 6])
    got = call(name, model, x, t)
    assert got.shape == (B, 3, 4) and got.dtype == torch.float32 and torch.isfinite(got).all()
    for b in range(B):  # the batch is its images one by one
        torch.testing.assert_close(call(name, model, x[b : b + 1], t[b : b + 1]), got[b : b + 1], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(call(name, model, x, t), got, atol=0, rtol=0)  # same call (same seed), same map
    other = call(name, model, x, torch.tensor([2, 0, 3]))
    top1 = model(x).logits.argmax(-1)
    if methods.get(name).class_specific:
        assert not torch.allclose(other, got), "the map does not depend on the class explained"
        torch.testing.assert_close(call(name, model, x, None), call(name, model, x, top1), atol=1e-6, rtol=1e-4)
    else:
        torch.testing.assert_close(other, got)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", methods.names())
def test_method_contract_on_every_family(name, family, family_models):
    """The contract, shortened (two images, three calls), on every family: shape, the batch is
    its images one by one, the target is respected (or ignored by a class-agnostic method)."""
    model, x = family_models[family]
    t = torch.tensor([1, 4])
    got = call(name, model, x, t)
    assert got.shape == (2, 3, 4) and got.dtype == torch.float32 and torch.isfinite(got).all()
    torch.testing.assert_close(call(name, model, x[1:], t[1:]), got[1:], atol=1e-6, rtol=1e-4)
    other = call(name, model, x, torch.tensor([2, 0]))
    if methods.get(name).class_specific:
        assert not torch.allclose(other, got), "the map does not depend on the class explained"
    else:
        torch.testing.assert_close(other, got)


def test_registry_order_and_records():
    names = methods.names()
    assert len(names) == len(set(names)) and {"attention", "rollout", "chefer", "lrp", "rise"} <= set(names)
    flags = [(methods.get(n).slow, methods.get(n).class_specific) for n in names]
    assert flags == sorted(flags), "class-agnostic first, then class-specific, the slow ones last"
    assert methods.single_pass() + methods.slow() == names
    for n in names:
        m = methods.get(n)
        assert m.title and m.cite and m.label == f"{m.title} ({m.cite})"
    with pytest.raises(ValueError, match="unknown method 'nope'; known: attention"):
        methods.get("nope")
    with pytest.raises(ValueError, match="registered twice"):
        methods.register("chefer", title="x", cite="y")(lambda model, x, target=None: x)


def test_reuse_shares_passes_and_gives_the_same_maps(small):
    """Inside methods.reuse, the gated LRP map reuses the CP-LRP map and the gradient rollout
    computed before it: the same numbers, fewer passes."""
    model, x = small
    t = torch.tensor([1, 4, 6])
    want = {n: methods.get(n)(model, x, t) for n in ("lrp", "grad-rollout", "lrp-gated")}
    calls = []
    hook = model.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        with methods.reuse(model, x):
            got = {n: methods.get(n)(model, x, t) for n in ("lrp", "grad-rollout", "lrp-gated")}
    finally:
        hook.remove()
    for n in want:
        torch.testing.assert_close(got[n], want[n])
    assert len(calls) == 2  # one LRP forward, one attention-gradient forward: lrp-gated ran none


@pytest.mark.slow  # commands in subprocesses
def test_a_new_method_is_one_file(tmp_path, deit_tiny_path, package_photos):
    """Copy the package, drop one module into its methods/ folder, and use the new method from the
    command line: explain writes its figure, faithfulness scores it."""
    pkg = tmp_path / "vit_demo"
    shutil.copytree(ROOT / "vit_demo", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "methods" / "centre_prior.py").write_text(textwrap.dedent('''
        """A deliberately simple method: distance from the image centre (no model involved)."""
        import torch

        from .registry import register


        @register("centre-prior", title="Centre prior", cite="a test", class_specific=False)
        def centre_prior(model, x, target=None):
            p = model.cfg.patch_size
            gh, gw = x.shape[-2] // p, x.shape[-1] // p
            ys, xs = torch.meshgrid(torch.arange(gh) - (gh - 1) / 2, torch.arange(gw) - (gw - 1) / 2, indexing="ij")
            return (-(ys**2 + xs**2)).float().expand(x.shape[0], gh, gw).clone()
    '''))
    env = {"PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "vit_demo", *a, "--weights", str(deit_tiny_path)],  # noqa: E731
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    r = run("explain", str(package_photos["coffee"]), "--method", "centre-prior", "--out", str(tmp_path / "out"),
            "--width", "400")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "coffee_centre-prior.png").is_file()
    r = run("faithfulness", "--images", str(package_photos["coffee"]), "--methods", "centre-prior,attention",
            "--target", "predicted", "--json")
    assert r.returncode == 0, r.stderr
    assert '"centre-prior"' in r.stdout and '"attention"' in r.stdout
