"""The fast capture path (issue 30) gives the numbers of the slow one:

- without autograd every layer's attention lands in one block, its scores written into the block
  itself: the same values, bit for bit, as a capture with autograd on (one tensor per layer), for a
  plain ViT, a relative-bias model, registers, an attention-pool head and a head size whose scale
  1/sqrt(d) is not a power of 2;
- rollout, computed as one row carried down the layers, is the row of the full rollout matrix,
  for every kind of query (the [class] token, the mean of the patch queries, the pool's probe),
  head fusion, discard and start layer;
- rollout and the heads' maps read the one block as one [L, B, H, N, N] view (no copy) and give
  the numbers they give on separate per-layer tensors;
- without autograd a plain block (bfloat16: packed weights) gives vit.py's block's numbers bit for
  bit, runs a hook set on any of its parts, and follows a parameter changed in place.
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch

from vit_demo.methods.attention import class_row, head_maps, stacked
from vit_demo.methods.rollout import rollout, rollout_matrix
from vit_demo.model import VisionTransformer, ViTConfig
from vit_demo.precision import set_precision

SMALL = dict(img_size=(32, 32), patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0, num_classes=5)
KINDS = {
    "class token": {},
    "no class token (average pool)": dict(class_token=False, global_pool="avg", fc_norm=True),
    "attention-pool head": dict(class_token=False, global_pool="map"),
    "registers, relative bias": dict(reg_tokens=2, pos_embed=False, rel_pos="mlp", rel_pos_hidden=16),
    "head size 24 (a scale that is not a power of 2)": dict(embed_dim=48),
}


@cache
def model_of(kind: str) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**{**SMALL, **KINDS[kind]})).eval()
    with torch.no_grad():  # no zeros anywhere: every parameter moves the numbers
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kind", list(KINDS))
def test_capture_without_autograd_keeps_the_values(kind: str) -> None:
    model = model_of(kind)
    x = torch.randn(2, 3, 32, 32)
    slow = model(x, capture=True)  # autograd on: one tensor per layer
    assert len({a.untyped_storage().data_ptr() for a in slow.attentions}) == 3
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            fast = model(x, capture=True)
        assert len({a.untyped_storage().data_ptr() for a in fast.attentions}) == 1  # one block
        for a, b in zip(fast.attentions, slow.attentions):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b.detach(), atol=0, rtol=0)
        torch.testing.assert_close(fast.logits, slow.logits.detach(), atol=0, rtol=0)
        torch.testing.assert_close(fast.attentions[-1].sum(-1), torch.ones(2, 2, fast.attentions[-1].shape[-1]))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("fusion", "discard", "start"), [("mean", 0.0, 0), ("max", 0.5, 0), ("min", 0.0, 1),
                                                          ("mean", 0.3, 2)])
def test_rollout_is_the_row_of_the_rollout_matrix(kind: str, fusion: str, discard: float, start: int) -> None:
    torch.manual_seed(1)
    with torch.inference_mode():
        out = model_of(kind)(torch.randn(2, 3, 32, 32), capture=True)
    attn64 = [a.double() for a in out.attentions]
    layout = out.layout if out.layout.probe is None else out.layout._replace(probe=out.layout.probe.double())
    got = rollout(attn64, layout, fusion, discard, start)
    want = class_row(rollout_matrix(attn64, layout, fusion, discard, start), layout)
    assert got.shape == (2, 4, 4)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    assert not torch.allclose(got[0], got[1])  # two images, two maps


@pytest.mark.parametrize("kind", list(KINDS))
def test_maps_read_the_block_as_one_view(kind: str) -> None:
    torch.manual_seed(2)
    with torch.inference_mode():
        out = model_of(kind)(torch.randn(2, 3, 32, 32), capture=True)
        every = stacked(out.attentions)
        assert every is not None and every.shape == (3, *out.attentions[0].shape)
        assert every.data_ptr() == out.attentions[0].data_ptr()  # a view of the block, not a copy
        torch.testing.assert_close(every[2], out.attentions[2], atol=0, rtol=0)
        apart = [a.clone() for a in out.attentions]  # one tensor per layer: the per-layer path
        assert stacked(apart) is None and stacked(out.attentions[::-1]) is None
        for fusion, discard, start in (("mean", 0.0, 0), ("max", 0.3, 1)):
            torch.testing.assert_close(rollout(out.attentions, out.layout, fusion, discard, start),
                                       rollout(apart, out.layout, fusion, discard, start), atol=1e-7, rtol=1e-6)
        for query_patch in (None, 5):
            got = head_maps(out.attentions, out.layout, query_patch=query_patch)
            assert got.shape == (2, 3, 2, 4, 4)
            torch.testing.assert_close(got, head_maps(apart, out.layout, query_patch=query_patch), atol=0, rtol=0)


def bf16_copy(kind: str) -> VisionTransformer:
    return set_precision(copy.deepcopy(model_of(kind)), "bf16")


def same_outputs(a, b) -> None:
    torch.testing.assert_close(a.logits, b.logits.detach(), atol=0, rtol=0)
    for p, q in zip(a.attentions, b.attentions):
        torch.testing.assert_close(p, q.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["class token", "head size 24 (a scale that is not a power of 2)"])
def test_the_lean_block_gives_the_block_s_numbers_in_bfloat16(kind: str) -> None:
    """Without autograd a block multiplies by packed bfloat16 weights and skips the module calls:
    bit for bit the numbers of vit.py's block (autograd on), at one batch size and then another."""
    model = bf16_copy(kind)
    for batch in (2, 5):
        x = torch.randn(batch, 3, 32, 32)
        with torch.inference_mode():
            fast = model(x, capture=True)
        same_outputs(fast, model(x, capture=True))


def test_a_hook_on_a_part_runs_without_autograd() -> None:
    model = bf16_copy("class token")
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        plain = model(x).logits
    handle = model.blocks[1].mlp.fc1.register_forward_hook(lambda m, i, o: o + 1.0)
    try:
        with torch.inference_mode():
            hooked = model(x, capture=True)
        assert not torch.equal(hooked.logits, plain)
        same_outputs(hooked, model(x, capture=True))  # the hook's numbers, as with autograd
    finally:
        handle.remove()


def test_packed_weights_follow_a_changed_parameter() -> None:
    model = bf16_copy("class token")
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        before = model(x).logits
    with torch.no_grad():  # in place, as an optimiser step or load_state_dict does
        model.blocks[0].mlp.fc1.weight.mul_(-1.0)
        model.blocks[2].attn.qkv.bias.add_(0.5)
    with torch.inference_mode():
        after = model(x, capture=True)
    assert not torch.equal(after.logits, before)
    same_outputs(after, model(x, capture=True))
    state = {k: v.clone() for k, v in model_of("class token").state_dict().items()}
    model.load_state_dict(state)
    with torch.inference_mode():
        torch.testing.assert_close(model(x).logits, before, atol=0, rtol=0)
