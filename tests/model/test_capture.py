"""The fast capture path (issue 30) gives the numbers of the slow one:

- without autograd every layer's attention lands in one block, its scores written into the block
  itself: the same values, bit for bit, as a capture with autograd on (one tensor per layer), for a
  plain ViT, a relative-bias model, registers, an attention-pool head and a head size whose scale
  1/sqrt(d) is not a power of 2;
- rollout, computed as one row carried down the layers, is the row of the full rollout matrix,
  for every kind of query (the [class] token, the mean of the patch queries, the pool's probe),
  head fusion, discard and start layer;
- rollout and the heads' maps read the one block as one [L, B, H, N, N] view (no copy) and give
  the numbers they give on separate per-layer tensors.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from vit_demo.methods.attention import class_row, head_maps, stacked
from vit_demo.methods.rollout import rollout, rollout_matrix
from vit_demo.model import VisionTransformer, ViTConfig

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
