"""The forward pass can be read where each number is formed: every attention's q, k, v and its scores
before the softmax pass its hook points (``hook_q``, ``hook_k``, ``hook_v``, ``hook_scores``), every
MLP's hidden activation its ``hook_hidden``, in the plain ViT and in every family (RoPE turns q and k
before their points; a relative bias is in the scores). A hook reads the model's own numbers (the
softmax of the scores it sees is the captured attention), can replace them, and an unhooked point
is no module call at all."""

from __future__ import annotations

import pytest
import torch

from vit_demo.model import HookPoint, VisionTransformer, ViTConfig

# One tiny model of each kind of attention, MLP and block the families build.
KINDS = {
    "plain": {},
    "rope": dict(rope="axial"),
    "rope-mixed": dict(rope="mixed", rope_xy=True, reg_tokens=1),
    "beit": dict(rel_pos="table", pos_embed=False, qkv_bias=False, qv_bias=True),
    "beit-shared": dict(rel_pos="shared_table", pos_embed=False),
    "relpos-rpn": dict(rel_pos="shared_mlp", rel_pos_hidden=8, post_norm=True, pos_embed=False),
    "gqa-swiglu": dict(qkv_fused=False, kv_heads=(1, 1), qk_norm=True, mlp="swiglu", act="silu"),
    "diff": dict(diff_attn=True),
    "scaling": dict(block="scaling"),
    "things": dict(block="things"),
    "sam": dict(window_size=2, global_blocks=(1,), rel_pos="decomposed", class_token=False, global_pool="avg",
                pos_embed_grid=True),
    "map": dict(class_token=False, global_pool="map"),
}
# Where the captured attention is the softmax of the scores the block's point saw, as they are.
PLAIN_SOFTMAX = {"plain", "rope", "rope-mixed", "beit", "beit-shared", "relpos-rpn", "gqa-swiglu", "scaling", "map"}


def tiny(kind: str) -> tuple[VisionTransformer, torch.Tensor]:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 48), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                        num_classes=5, **KINDS[kind])).eval()
    with torch.no_grad():  # zero-initialised tables and biases matter too
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model, torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))


def recorded(model: VisionTransformer, x: torch.Tensor, capture: bool) -> tuple[dict[str, list[torch.Tensor]], object]:
    """Every hook point's tensors (copies: the capture kernel's softmax runs in place), and the output."""
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [m.register_forward_hook(lambda _m, _a, out, name=name: seen.setdefault(name, []).append(out.clone()))
               for name, m in model.named_modules() if isinstance(m, HookPoint)]
    try:
        with torch.no_grad():
            out = model(x, capture=capture)
    finally:
        for h in handles:
            h.remove()
    return seen, out


@pytest.mark.parametrize("kind", KINDS)
def test_every_point_sees_the_models_own_numbers(kind: str) -> None:
    model, x = tiny(kind)
    points = [name for name, m in model.named_modules() if isinstance(m, HookPoint)]
    seen, out = recorded(model, x, capture=True)
    # every point fires (a parallel-branch block's scores pass its first branch's point, all branches side by side)
    assert set(points) - set(seen) <= {f"blocks.{i}.attns.1.attn.hook_scores" for i in range(2)}
    for i in range(len(model.blocks)):
        names = [n for n in points if n.startswith(f"blocks.{i}.")]
        assert {n.rsplit(".", 1)[1] for n in names} >= {"hook_q", "hook_k", "hook_v", "hook_scores", "hook_hidden"}
        if kind in PLAIN_SOFTMAX:
            at = f"blocks.{i}.attn." if kind != "scaling" else f"blocks.{i}."
            (q,), (k,), (scores,) = seen[at + "hook_q"], seen[at + "hook_k"], seen[at + "hook_scores"]
            assert q.shape == k.shape == (2, 2, out.layout.num_prefix + 24, 16)
            torch.testing.assert_close(scores.softmax(-1), out.attentions[i], rtol=0, atol=1e-6)
            if kind in ("plain", "rope", "rope-mixed", "gqa-swiglu", "scaling"):  # no bias: the scores are q k^T / sqrt(D)
                torch.testing.assert_close(scores, q @ k.transpose(-2, -1) * 16**-0.5, rtol=1e-5, atol=1e-5)
        assert all(seen[n][0].shape[-1] == 128 for n in names if n.endswith("hook_hidden"))  # MLP ratio 4


def test_rope_turns_q_and_k_before_their_points() -> None:
    """The points hold q and k as they enter the scores: the patches' turned (each pair keeps its
    length), the prefix tokens' as the projection gave them."""
    model, x = tiny("rope-mixed")
    attn = model.blocks[1].attn
    raw = []
    handle = attn.qkv.register_forward_hook(lambda _m, _a, out: raw.append(out))
    try:
        seen, _ = recorded(model, x, capture=False)
    finally:
        handle.remove()
    B, N, _ = raw[0].shape
    q_raw, k_raw, _ = raw[0].reshape(B, N, 3, 2, 16).permute(2, 0, 3, 1, 4)
    for turned, plain in ((seen["blocks.1.attn.hook_q"][0], q_raw), (seen["blocks.1.attn.hook_k"][0], k_raw)):
        torch.testing.assert_close(turned[:, :, :2], plain[:, :, :2])  # [class], [reg0]
        assert not torch.allclose(turned[:, :, 2:], plain[:, :, 2:], atol=1e-3)
        pairs = lambda t: t[:, :, 2:].unflatten(-1, (8, 2)).norm(dim=-1)  # noqa: E731
        torch.testing.assert_close(pairs(turned), pairs(plain), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["beit", "beit-shared"])
def test_a_relative_bias_is_in_the_scores(kind: str) -> None:
    model, x = tiny(kind)
    seen, _ = recorded(model, x, capture=True)
    positions = model.positions((4, 6), x.device)
    for i, block in enumerate(model.blocks):
        (q,), (k,), (scores,) = (seen[f"blocks.{i}.attn.{p}"] for p in ("hook_q", "hook_k", "hook_scores"))
        bias = block.attn.position_bias(positions.grid, positions.bias)
        assert bias.abs().max() > 1e-3
        torch.testing.assert_close(scores - q @ k.transpose(-2, -1) * 16**-0.5, bias.expand_as(scores),
                                   rtol=1e-5, atol=1e-5)


def test_the_fast_path_forms_no_scores_but_passes_q_k_v_and_the_hidden_layer() -> None:
    model, x = tiny("plain")
    seen, out = recorded(model, x, capture=False)
    assert out.attentions is None
    assert {n.rsplit(".", 1)[1] for n in seen} == {"hook_q", "hook_k", "hook_v", "hook_hidden"}


def test_a_hook_can_replace_what_passes_and_an_unhooked_point_is_no_call() -> None:
    model, x = tiny("rope")
    with torch.no_grad():
        before = model(x).logits
        handle = model.blocks[0].attn.hook_v.register_forward_hook(lambda _m, _a, v: torch.zeros_like(v))
        changed = model(x).logits
        handle.remove()
        again = model(x).logits
    assert not torch.allclose(before, changed, atol=1e-4)
    assert torch.equal(before, again)
    point, t = HookPoint(), torch.randn(3)
    assert point(t) is t
    handle = point.register_forward_pre_hook(lambda _m, args: (args[0] * 2,))
    assert torch.equal(point(t), 2 * t)
    handle.remove()
    assert point(t) is t
