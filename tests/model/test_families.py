"""Every family of timm's ViT modules the scratch model ports, one small random-init model each:
the same logits as timm (fast and capture paths) within 1e-4, the same top-1, and every layer's
attention equal to timm's own (fused attention off), at the model's size and, where timm resizes
(``dynamic_img_size``), at a non-square one. Then the refusals, each named with its reason.

The models are timm's own architectures with fewer blocks and narrower layers (timm's constructor
keywords), every parameter moved by noise so that LayerScale, biases and tables matter."""

from __future__ import annotations

from functools import partial

import pytest
import timm
import torch
from conftest import perturbed_timm
from timm.layers import DiffAttention
from timm.models.vision_transformer import ParallelScalingBlock

from vit_demo.checkpoints.files import UnsupportedModelError
from vit_demo.checkpoints.timm import config_from_timm, from_timm
from vit_demo.checkpoints.verify import timm_attentions

TOL = 1e-4
SMALL = dict(depth=2, embed_dim=64, num_heads=4)

# (id, timm name, constructor keywords, timm resizes it: True / False, what it exercises)
FAMILIES = [
    ("siglip", "vit_base_patch32_siglip_256", dict(SMALL, img_size=64), True,
     "SigLIP: attention-pool (MAP) head, GELU-tanh, no [class]"),
    ("map-prefix", "test_vit3", dict(depth=2, img_size=64), True, "MAP head reading a register token, LayerScale"),
    ("eva02", "eva02_tiny_patch14_224", dict(depth=2, embed_dim=64, num_heads=2, img_size=56), True,
     "EVA-02: axial RoPE rescaled to the pretraining grid, packed SwiGLU, q/v biases, avg pool"),
    ("eva02-clip", "eva02_base_patch16_clip_224", dict(depth=2, embed_dim=64, num_heads=2, img_size=64), True,
     "EVA-02 CLIP: separate q/k/v, SwiGLU with its hidden norm, the attention's inner norm, projection head"),
    ("eva02-e", "eva02_enormous_patch14_clip_224", dict(SMALL, img_size=56), True, "EVA-02-E: res-post blocks"),
    ("eva", "eva_giant_patch14_224", dict(SMALL, img_size=56), True, "EVA: q/v biases, no RoPE"),
    ("dinov3", "vit_small_plus_patch16_dinov3_qkvb", dict(depth=2, embed_dim=64, num_heads=2, img_size=64), True,
     "DINOv3: its RoPE (rotate-half, [-1, 1] coordinates), 4 registers, no absolute position, LayerScale as gamma"),
    ("pe", "vit_pe_core_tiny_patch16_384", dict(depth=2, embed_dim=64, num_heads=2, img_size=64), True,
     "Perception Encoder: RoPE in (x, y) with offset, MAP over [class] too, pre-norm, projection head"),
    ("rope-vit", "vit_small_patch16_rope_224", dict(depth=2, embed_dim=64, num_heads=2, img_size=64), True,
     "RoPE-ViT: axial RoPE, no absolute position"),
    ("rope-mixed", "vit_small_patch16_rope_mixed_ape_224", dict(depth=2, embed_dim=64, num_heads=2, img_size=64), True,
     "RoPE-ViT mixed: learned frequencies per block and head, with absolute position"),
    ("sapiens2", "vit_base_patch16_sapiens2", dict(depth=2, embed_dim=64, num_heads=4, num_kv_heads=(4, 2),
                                                    img_size=(64, 48)), True,
     "Sapiens2: RMSNorm, qk-norm, grouped k/v heads in some blocks, LayerScale on attention only, DINOv3 RoPE"),
    ("beit", "beit_base_patch16_224", dict(SMALL, img_size=64), False, "BEiT: a relative position table per block"),
    ("beit-shared", "beit_base_patch16_224", dict(SMALL, img_size=64, use_rel_pos_bias=False,
                                                  use_shared_rel_pos_bias=True), False, "BEiT: one shared table"),
    ("beit3", "beit3_base_patch16_224", dict(SMALL, img_size=64), True, "BEiT-3: inner norms in attention and MLP"),
    ("aimv2", "aimv2_large_patch14_224", dict(SMALL, img_size=56), True,
     "AIMv2: RMSNorm, SwiGLU, no biases, a norm in the patch embedding"),
    ("dinov2-g", "vit_giant_patch14_dinov2", dict(depth=2, embed_dim=96, num_heads=4, img_size=56), True,
     "DINOv2-giant: packed SwiGLU"),
    ("qk-norm", "vit_small_patch16_224", dict(SMALL, img_size=64, qk_norm=True), True, "qk-norm"),
    ("rms-vit", "test_vit4", dict(depth=2, img_size=64), True, "RMSNorm ViT with a register"),
    ("relpos", "vit_relpos_medium_patch16_cls_224", dict(SMALL, img_size=64), False,
     "relpos ViT: a relative-position MLP per block, [class]"),
    ("relpos-shared", "vit_srelpos_small_patch16_224", dict(SMALL, img_size=64), False, "relpos ViT: one shared MLP"),
    ("relpos-rpn", "vit_relpos_small_patch16_rpn_224", dict(SMALL, img_size=64), False, "relpos ViT, res-post blocks"),
    ("vit-rpn", "vit_base_patch16_rpn_224", dict(SMALL, img_size=64), True, "ViT with res-post blocks"),
    ("diff", "vit_dwee_patch16_reg1_gap_256", dict(SMALL, img_size=64, qk_norm=True), True,
     "differential attention: softmax1 - lambda softmax2 per head, its RMSNorm, lambda_init by depth"),
    ("parallel-scaling", "vit_base_patch16_xp_224", dict(SMALL, img_size=64), True,
     "parallel scaling blocks (ViT-22B): one in_proj for MLP and q/k/v, RMSNorm, qk-norm, MLP bias apart"),
    ("parallel-pwee", "vit_pwee_patch16_reg1_gap_256",
     dict(SMALL, img_size=64, block_fn=partial(ParallelScalingBlock, fuse_out_proj=True)), True,
     "parallel scaling blocks with one fused out_proj and LayerScale"),
    ("diff-parallel", "vit_dpwee_patch16_reg1_gap_256", dict(SMALL, img_size=64), True,
     "differential attention in a parallel scaling block"),
    ("parallel-things", "vit_small_patch16_18x2_224", dict(SMALL, img_size=64), True,
     "two attention branches, then two MLP branches, LayerScale on each"),
    ("avgmax", "eva02_tiny_patch14_224", dict(depth=2, embed_dim=64, num_heads=2, img_size=56, global_pool="avgmax"),
     True, "avg + max pooling"),
]


class DualLambda(DiffAttention):
    """timm's differential attention with two scalar lambdas (no pretrained model uses it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, dual_lambda=True, **kwargs)


def check(model, tm, x) -> None:
    with torch.no_grad():
        ref, fast, out = tm(x), model(x).logits, model(x, capture=True)
        _, ref_attn = timm_attentions(tm, x)
    assert (fast - ref).abs().max().item() <= TOL
    assert (out.logits - ref).abs().max().item() <= TOL, "capture path differs"
    assert torch.equal(fast.argmax(-1), ref.argmax(-1))
    assert ref.abs().max() > 0.1, "logits too small to mean anything"
    assert len(out.attentions) == len(ref_attn) == model.cfg.depth
    for a, b in zip(out.attentions, ref_attn):
        assert (a - b).abs().max().item() <= 1e-5
    if model.cfg.global_pool == "map":  # the pool's query: a distribution over the tokens
        torch.testing.assert_close(out.layout.probe.sum(-1), torch.ones(x.shape[0]))


@pytest.mark.parametrize("fid,name,kwargs,dynamic,what", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_matches_timm(fid: str, name: str, kwargs: dict, dynamic: bool, what: str) -> None:
    tm = perturbed_timm(name, **kwargs)
    model, _ = from_timm(tm)
    H, W = model.cfg.img_size
    check(model, tm, torch.randn(2, 3, H, W, generator=torch.Generator().manual_seed(1)))
    p = model.cfg.patch_size
    size = (H - p, W + 2 * p)  # non-square, another grid
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2))
    if dynamic:
        tm_dyn = perturbed_timm(name, **kwargs, dynamic_img_size=True)
        model_dyn, _ = from_timm(tm_dyn)
        check(model_dyn, tm_dyn, x)
    else:  # timm has no other input size for relative-position tables and MLPs; neither do we, in words
        with pytest.raises(ValueError, match="relative position bias is defined for the"):
            model(x)


@pytest.mark.parametrize("name,kwargs,reason", [
    ("samvit_base_patch16_224", dict(depth=1, embed_dim=64, num_heads=2, img_size=64, global_attn_indexes=()),
     "a classifier on SAM's encoder"),
    ("naflexvit_base_patch16_gap", dict(depth=1, embed_dim=64, num_heads=2, rope_type="axial"), "RoPE in a NaFlex ViT"),
    ("vit_dwee_patch16_reg1_gap_256", dict(depth=1, attn_layer=DualLambda),
     "two scalar lambdas"),
])
def test_refused_with_its_reason(name: str, kwargs: dict, reason: str) -> None:
    with torch.device("meta"):
        tm = timm.create_model(name, pretrained=False, **kwargs)
    with pytest.raises(UnsupportedModelError, match=reason):
        config_from_timm(tm)


SAM = dict(depth=3, embed_dim=64, num_heads=2, img_size=96, window_size=4, global_attn_indexes=(1,), neck_chans=32)


@pytest.mark.parametrize("size", [(96, 96), (80, 112)], ids=["native", "non-square"])
def test_sam_encoder_matches_timm(size: tuple[int, int]) -> None:
    """SAM's image encoder (windows, a global block, decomposed relative positions, the neck):
    the same pooled features as timm at its size and at a non-square one (timm resamples the
    position embedding and the global block's tables; 5x7 patches leave windows padded), every
    block's attention equal to timm's (windows on the diagonal), and gradients through the
    captured maps do not change the input gradient (the windowed map enters as a term worth 0)."""
    tm = perturbed_timm("samvit_base_patch16", **SAM)
    model, _ = from_timm(tm)
    cfg = model.cfg
    assert (cfg.window_size, cfg.global_blocks, cfg.rel_pos, cfg.neck_chans, cfg.num_classes) == (4, (1,), "decomposed", 32, 0)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    check(model, tm, x)
    grads = []
    for capture in (False, True):
        xg = x.clone().requires_grad_(True)
        out = model(xg, capture=capture)
        grads.append(torch.autograd.grad(out.logits[:, 0].sum(), [xg, *(out.attentions or [])]))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-6, rtol=1e-5)
    assert all(g.abs().sum() > 0 for g in grads[1][1:])


NAFLEX = [  # (timm name, what it exercises); 4x4 position tables (8x8 for RADIO) so that 64x64 is their own size
    ("naflexvit_base_patch16_gap", "NaFlex: bicubic antialiased positions, 4 registers, avg pool"),
    ("naflexvit_base_patch16_parfac_gap", "NaFlex: one position table per axis, aspect-preserving"),
    ("naflexvit_base_patch16_siglip", "SigLIP 2 NaFlex: bilinear positions, MAP head, GELU-tanh"),
    ("naflexvit_base_patch16_radio_v3", "C-RADIOv3: 128-grid table (8 here), aligned corners, no antialias, [class]"),
]


@pytest.mark.parametrize("name,what", NAFLEX, ids=[n.split("_patch16_")[1] for n, _ in NAFLEX])
def test_naflex_matches_timm(name: str, what: str) -> None:
    """NaFlexViT on an image (timm's dense path): the same logits as timm at the position table's
    own size and at two non-square ones (timm resamples the table its way at every size)."""
    grid = (8, 8) if "radio" in name else (4, 4)
    tm = perturbed_timm(name, depth=2, embed_dim=64, num_heads=2, pos_embed_grid_size=grid)
    model, _ = from_timm(tm)
    assert model.cfg.naflex and model.cfg.img_size == (16 * grid[0], 16 * grid[1])
    for i, size in enumerate([(64, 64), (48, 80), (96, 64)]):
        check(model, tm, torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(i)))


def test_config_read_not_tabled() -> None:
    """A variant switched on by a constructor keyword shows up in the config: nothing is looked up by name."""
    with torch.device("meta"):
        tm = timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=3, global_pool="max", num_reg_tokens=2,
                               qk_norm=True, use_abs_pos_emb=False, num_classes=5)
    cfg = config_from_timm(tm)
    assert (cfg.depth, cfg.global_pool, cfg.reg_tokens, cfg.qk_norm, cfg.pos_embed, cfg.num_classes) == (
        3, "max", 2, True, False, 5)
    assert (cfg.rope, cfg.rope_ref_grid, cfg.mlp, cfg.act, cfg.qv_bias) == ("axial", (16, 16), "glu", "silu", True)


def test_verify_command_on_a_family(capsys) -> None:
    """``verify --model NAME --random-init`` at a non-square size (timm's own init, its dynamic
    size), and a relative-bias model at another size is refused in one line."""
    import json

    from vit_demo.cli.main import main

    rc = main(["verify", "--model", "eva02_tiny_patch14_224", "--random-init", "--device", "cpu", "--input-size", "210x252",
               "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 0 and r["passed"] and r["input_size"] == [210, 252] and r["max_abs_logit_diff"] <= TOL
    rc = main(["verify", "--model", "vit_relpos_small_patch16_224", "--random-init", "--device", "cpu", "--input-size",
               "224x288"])
    assert rc == 2 and "relative position bias is defined for the 14x14 patch grid" in capsys.readouterr().err
