"""Explainability maps against naive references written from the papers.

Each reference below is a direct, slow transcription of its paper: explicit loops over
layers, heads and rows, in float64, for one image at a time. The library's batched versions
must agree with them on the real DeiT-Tiny and real photos.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import load_photos

from vit_demo import methods
from vit_demo.methods.attention import (
    cls_attention,
    head_maps,
    mean_attention_distance,
    pos_embed_similarity,
    query_attention,
    query_index,
)
from vit_demo.methods.gradients import attention_gradients, chefer_relevance, grad_rollout
from vit_demo.methods.rollout import rollout, rollout_matrix

ATOL = 1e-5

# ----------------------------------------------------------------------------- naive references (one image, float64)


def naive_query_row(M, layout):
    """[N, N] -> [gh, gw]: the [class] row over patches, or the mean of the patch rows."""
    P, N = layout.num_prefix, M.shape[-1]
    if layout.cls_index is not None:
        row = M[layout.cls_index, P:]
    else:
        row = torch.zeros(N - P, dtype=M.dtype)
        for i in range(P, N):
            row = row + M[i, P:]
        row = row / (N - P)
    return row.reshape(layout.grid)


def naive_fuse(A, fusion):
    """[H, N, N] -> [N, N], one head at a time."""
    out = A[0].clone()
    for h in range(1, A.shape[0]):
        if fusion == "mean":
            out = out + A[h]
        elif fusion == "max":
            out = torch.maximum(out, A[h])
        else:
            out = torch.minimum(out, A[h])
    return out / A.shape[0] if fusion == "mean" else out


def naive_discard(F, cls, fraction):
    """Zero every entry outside the [class] row and column at or below the k-th smallest of them."""
    if fraction == 0:
        return F
    N = F.shape[0]
    rows = F.tolist()
    values = sorted(rows[i][j] for i in range(N) for j in range(N) if i != cls and j != cls)
    k = math.floor(fraction * len(values))
    t = values[k - 1]
    out = [[0.0 if i != cls and j != cls and rows[i][j] <= t else rows[i][j] for j in range(N)] for i in range(N)]
    return torch.tensor(out, dtype=torch.float64)


def naive_residual(F):
    """A + I, then every row divided by its sum."""
    M = F + torch.eye(F.shape[0], dtype=F.dtype)
    for i in range(M.shape[0]):
        M[i] = M[i] / M[i].sum()
    return M


def naive_rollout_matrix(attn, layout, fusion="mean", discard=0.0, start=0):
    """attn: list over layers of [H, N, N]. R = A_L ... A_start."""
    N = attn[0].shape[-1]
    R = torch.eye(N, dtype=torch.float64)
    for layer in range(start, len(attn)):
        R = naive_residual(naive_discard(naive_fuse(attn[layer], fusion), layout.cls_index, discard)) @ R
    return R


def naive_positive_mean(A, G):
    """E_h[(grad A * A)^+], one head at a time."""
    out = torch.zeros_like(A[0])
    for h in range(A.shape[0]):
        out = out + torch.clamp(G[h] * A[h], min=0)
    return out / A.shape[0]


def naive_grad_rollout(attn, grads, layout):
    R = torch.eye(attn[0].shape[-1], dtype=torch.float64)
    for layer in range(len(attn)):  # layer l's attention with layer l's gradient
        R = naive_residual(naive_positive_mean(attn[layer], grads[layer])) @ R
    return naive_query_row(R, layout)


def naive_chefer(attn, grads, layout):
    R = torch.eye(attn[0].shape[-1], dtype=torch.float64)
    for layer in range(len(attn)):
        R = R + naive_positive_mean(attn[layer], grads[layer]) @ R
    return naive_query_row(R, layout)


def naive_mean_distance(attn, layout, patch_size):
    """[L, H]: per patch query, sum_k w_k * |centre_q - centre_k| with w renormalised over patches."""
    P, (gh, gw) = layout.num_prefix, layout.grid
    ys = np.array([k // gw for k in range(gh * gw)], dtype=np.float64)
    xs = np.array([k % gw for k in range(gh * gw)], dtype=np.float64)
    out = torch.zeros(len(attn), attn[0].shape[0], dtype=torch.float64)
    for layer, A in enumerate(attn):
        A = A.numpy()
        for h in range(A.shape[0]):
            total = 0.0
            for q in range(gh * gw):
                w = A[h, P + q, P:]
                w = w / w.sum()
                d = np.sqrt((ys - q // gw) ** 2 + (xs - q % gw) ** 2) * patch_size
                total += float((w * d).sum())
            out[layer, h] = total / (gh * gw)
    return out


def image(tensors, b):
    """Per-layer list -> that image's per-layer list, float64."""
    return [t[b].double() for t in tensors]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def photos(deit_tiny, package_photos):
    """Three real photos (cat, espresso, Grace Hopper) as model inputs [3, 3, 224, 224]."""
    return load_photos(deit_tiny, [package_photos[n] for n in ("chelsea", "coffee", "grace_hopper")])


@pytest.fixture(scope="module")
def ag(deit_tiny, photos):
    return attention_gradients(deit_tiny.model, photos)


# ----------------------------------------------------------------------------- capture


def test_captured_attention_matches_timm(deit_tiny, deit_tiny_path, photos):
    import safetensors.torch
    import timm
    from timm.utils import AttentionExtract

    tm = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    tm.load_state_dict(safetensors.torch.load_file(str(deit_tiny_path)))
    for block in tm.blocks:
        block.attn.fused_attn = False  # the explicit softmax path, whose probabilities pass attn_drop
    extract = AttentionExtract(tm, method="hook")  # forward hooks on every '*attn_drop' (identity in eval)
    with torch.no_grad():
        theirs = extract(photos)
        ours = deit_tiny.model(photos, capture=True).attentions
    assert list(theirs) == [f"blocks.{i}.attn.attn_drop" for i in range(12)]
    for a, b in zip(ours, theirs.values()):
        assert a.shape == b.shape == (3, 3, 197, 197)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- raw attention


def test_cls_and_query_attention_match_naive(ag):
    layout = ag.layout
    assert query_index(layout) == 0 and layout.num_prefix == 1 and layout.grid == (14, 14)
    for b in range(3):
        attn = image(ag.attentions, b)
        for layer in (0, 5, 11):
            A = attn[layer]
            mean_row = sum(A[h, 0, 1:] for h in range(3)) / 3
            torch.testing.assert_close(cls_attention(ag.attentions, layout, layer)[b].double(),
                                       mean_row.reshape(14, 14), atol=ATOL, rtol=0)
            torch.testing.assert_close(cls_attention(ag.attentions, layout, layer, head=2)[b].double(),
                                       A[2, 0, 1:].reshape(14, 14), atol=ATOL, rtol=0)
            q = 3 * 14 + 9  # row 3, column 9
            mean_q = sum(A[h, 1 + q, 1:] for h in range(3)) / 3
            torch.testing.assert_close(query_attention(ag.attentions, layout, layer, q)[b].double(),
                                       mean_q.reshape(14, 14), atol=ATOL, rtol=0)


def test_head_maps(ag):
    layout = ag.layout
    every = head_maps(ag.attentions, layout)
    assert every.shape == (3, 12, 3, 14, 14)
    for layer in (0, 11):
        one = head_maps(ag.attentions, layout, layer)
        assert one.shape == (3, 3, 14, 14)
        torch.testing.assert_close(one, every[:, layer])
        for h in range(3):
            torch.testing.assert_close(one[:, h], cls_attention(ag.attentions, layout, layer, head=h))
    q = head_maps(ag.attentions, layout, 4, query_patch=100)
    for h in range(3):
        torch.testing.assert_close(q[:, h], query_attention(ag.attentions, layout, 4, 100, head=h))
    with pytest.raises(ValueError):
        query_attention(ag.attentions, layout, 0, 196)


# ----------------------------------------------------------------------------- rollout


@pytest.mark.parametrize(("fusion", "discard", "start"), [("mean", 0.0, 0), ("max", 0.9, 0), ("min", 0.5, 4),
                                                          ("mean", 0.9, 6)])
def test_rollout_matches_naive(ag, fusion, discard, start):
    # float64 into the library too, so that both sides see the same values at the discard threshold
    attn64 = [a.double() for a in ag.attentions]
    got = rollout(attn64, ag.layout, fusion, discard, start)
    assert got.shape == (3, 14, 14)
    for b in range(3):
        want = naive_query_row(naive_rollout_matrix(image(attn64, b), ag.layout, fusion, discard, start), ag.layout)
        torch.testing.assert_close(got[b], want, atol=ATOL, rtol=0)


def test_rollout_float32_matches_naive(ag):
    got = rollout(ag.attentions, ag.layout)
    assert got.dtype == torch.float32
    for b in range(3):
        want = naive_query_row(naive_rollout_matrix(image(ag.attentions, b), ag.layout), ag.layout)
        torch.testing.assert_close(got[b].double(), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("fusion", "discard"), [("mean", 0.0), ("max", 0.9), ("min", 0.99)])
def test_rollout_rows_sum_to_one(ag, fusion, discard):
    R = rollout_matrix(ag.attentions, ag.layout, fusion, discard)
    assert R.shape == (3, 197, 197)
    torch.testing.assert_close(R.sum(dim=-1), torch.ones(3, 197), atol=1e-5, rtol=0)
    assert bool((R >= 0).all())


def test_discard_keeps_class_entries(ag):
    """A one-layer rollout is (discarded A + I) row-normalised: the [class] row and column
    must survive any discard, per image, while the patch-to-patch block is mostly zeroed."""
    for layer in (0, 11):
        a = ag.attentions[layer]
        M = rollout_matrix([a], ag.layout, discard=0.99)
        fused = a.mean(dim=1)
        for b in range(3):
            assert bool((M[b, 0, :] > 0).all()) and bool((M[b, :, 0] > 0).all()), "a [class] entry was discarded"
            # the surviving [class] entries keep their relative size: row renormalisation only
            torch.testing.assert_close(M[b, 0, 1:] / M[b, 0, 1:].sum(), fused[b, 0, 1:] / fused[b, 0, 1:].sum())
            off_diagonal = M[b, 1:, 1:] - torch.diag(torch.diagonal(M[b, 1:, 1:]))
            zeros = float((off_diagonal == 0).sum()) / (196 * 195)
            assert zeros >= 0.985, f"image {b}: only {zeros:.3f} of the patch entries discarded"


# ----------------------------------------------------------------------------- gradients


def test_attention_gradients_match_retain_grad(deit_tiny, photos, ag):
    model = deit_tiny.model
    assert all(p.grad is None for p in model.parameters()), "attention_gradients left .grad on the parameters"
    with torch.enable_grad():
        out = model(photos, capture=True)
        for a in out.attentions:
            a.retain_grad()
        target = out.logits.argmax(dim=-1)
        out.logits[torch.arange(3), target].sum().backward()
    want = [a.grad for a in out.attentions]
    model.zero_grad(set_to_none=True)  # the session's model must stay clean
    assert torch.equal(ag.target, target) and ag.target.dtype == torch.long
    torch.testing.assert_close(ag.logits, out.logits.detach())
    for g, w in zip(ag.grads, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


def test_attention_gradients_targets(deit_tiny, photos, ag):
    model = deit_tiny.model
    with torch.inference_mode():  # still works: gradients are switched back on inside
        by_int = attention_gradients(model, photos, 7)
    assert by_int.target.tolist() == [7, 7, 7] and by_int.grads[0].requires_grad is False
    by_tensor = attention_gradients(model, photos, torch.tensor([7, 7, 7]))
    for g, h in zip(by_int.grads, by_tensor.grads):
        torch.testing.assert_close(g, h)
    assert not torch.allclose(by_int.grads[-1], ag.grads[-1]), "another class gives other gradients"
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError):
        attention_gradients(model, photos, torch.tensor([1, 2]))


def test_grad_rollout_and_chefer_match_naive(ag):
    gr = grad_rollout(ag.attentions, ag.grads, ag.layout)
    ch = chefer_relevance(ag.attentions, ag.grads, ag.layout)
    assert gr.shape == ch.shape == (3, 14, 14)
    for b in range(3):
        attn, grads = image(ag.attentions, b), image(ag.grads, b)
        torch.testing.assert_close(gr[b].double(), naive_grad_rollout(attn, grads, ag.layout), atol=ATOL, rtol=0)
        want = naive_chefer(attn, grads, ag.layout)
        torch.testing.assert_close(ch[b].double(), want, atol=ATOL, rtol=1e-5)
        assert float(want.max()) > 0


def test_layer_pairing_matters(ag):
    """Pairing layer l with layer L-1-l (a bug in popular code) gives another map."""
    mispaired = grad_rollout(ag.attentions, ag.grads[::-1], ag.layout)
    assert not torch.allclose(mispaired, grad_rollout(ag.attentions, ag.grads, ag.layout), atol=1e-4)


# ----------------------------------------------------------------------------- batches, shapes, other models


def test_batch_equals_single_images(deit_tiny, package_photos):
    model = deit_tiny.model
    x = load_photos(deit_tiny, [package_photos[n] for n in ("motorcycle", "camera", "astronaut", "rocket")])
    batch = attention_gradients(model, x)
    discard = rollout(batch.attentions, batch.layout, "mean", 0.9)
    gr = grad_rollout(batch.attentions, batch.grads, batch.layout)
    ch = chefer_relevance(batch.attentions, batch.grads, batch.layout)
    for b in range(4):
        # the same attention values alone: the discard threshold is per image, not image 0's
        alone = [a[b : b + 1] for a in batch.attentions]
        torch.testing.assert_close(rollout(alone, batch.layout, "mean", 0.9), discard[b : b + 1], atol=1e-7, rtol=0)
        # a separate forward and backward pass per image
        one = attention_gradients(model, x[b : b + 1])
        assert one.target.item() == batch.target[b].item()
        torch.testing.assert_close(grad_rollout(one.attentions, one.grads, one.layout), gr[b : b + 1],
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(chefer_relevance(one.attentions, one.grads, one.layout), ch[b : b + 1],
                                   atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(rollout(one.attentions, one.layout, "mean", 0.0),
                                   rollout(batch.attentions, batch.layout)[b : b + 1], atol=ATOL, rtol=0)


def test_non_square_input(deit_tiny, package_photos):
    x = load_photos(deit_tiny, [package_photos["motorcycle"]], size=(224, 320))
    ag = attention_gradients(deit_tiny.model, x)
    layout = ag.layout
    assert layout.grid == (14, 20)
    for fn in (lambda: cls_attention(ag.attentions, layout, -1), lambda: rollout(ag.attentions, layout, "max", 0.9),
               lambda: grad_rollout(ag.attentions, ag.grads, layout),
               lambda: chefer_relevance(ag.attentions, ag.grads, layout)):
        assert fn().shape == (1, 14, 20)
    assert head_maps(ag.attentions, layout).shape == (1, 12, 3, 14, 20)
    R = rollout_matrix(ag.attentions, layout, discard=0.5)
    torch.testing.assert_close(R.sum(dim=-1), torch.ones(1, 1 + 280), atol=1e-5, rtol=0)
    attn, grads = image(ag.attentions, 0), image(ag.grads, 0)
    torch.testing.assert_close(chefer_relevance(ag.attentions, ag.grads, layout)[0].double(),
                               naive_chefer(attn, grads, layout), atol=ATOL, rtol=1e-5)
    q = 5 * 20 + 17  # row 5, column 17 of the 14x20 grid
    torch.testing.assert_close(query_attention(ag.attentions, layout, 3, q, head=1)[0].double(),
                               attn[3][1, 1 + q, 1:].reshape(14, 20), atol=ATOL, rtol=0)
    mad = mean_attention_distance(ag.attentions, layout, 16)
    torch.testing.assert_close(mad[0].double(), naive_mean_distance(attn, layout, 16), atol=1e-4, rtol=1e-6)


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_reg4_gap_256"])
def test_register_token_models(name, photos):
    import timm

    from vit_demo.checkpoints.timm import from_timm

    torch.manual_seed(0)
    model, _ = from_timm(timm.create_model(name, pretrained=False, depth=2, img_size=224, num_classes=10))
    ag = attention_gradients(model, photos[:2])
    layout = ag.layout
    assert len(layout.reg_indices) == 4
    has_class = layout.cls_index is not None
    assert has_class == (name == "vit_small_patch14_reg4_dinov2")
    assert query_index(layout) == layout.cls_index
    grid = layout.grid
    assert grid == ((16, 16) if has_class else (14, 14))
    attn64 = [a.double() for a in ag.attentions]
    got = rollout(attn64, layout, "mean", 0.5)
    gr = grad_rollout(ag.attentions, ag.grads, layout)
    ch = chefer_relevance(ag.attentions, ag.grads, layout)
    raw = cls_attention(ag.attentions, layout, 1)
    for b in range(2):
        attn, grads = image(ag.attentions, b), image(ag.grads, b)
        want = naive_query_row(naive_rollout_matrix(image(attn64, b), layout, "mean", 0.5), layout)
        torch.testing.assert_close(got[b], want, atol=ATOL, rtol=0)
        torch.testing.assert_close(gr[b].double(), naive_grad_rollout(attn, grads, layout), atol=ATOL, rtol=0)
        torch.testing.assert_close(ch[b].double(), naive_chefer(attn, grads, layout), atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(raw[b].double(), naive_query_row(naive_fuse(attn[1], "mean"), layout),
                                   atol=ATOL, rtol=0)
    R = rollout_matrix(ag.attentions, layout, "max", 0.9)
    torch.testing.assert_close(R.sum(dim=-1), torch.ones_like(R[..., 0]), atol=1e-5, rtol=0)
    p = model.cfg.patch_size
    mad = mean_attention_distance(ag.attentions, layout, p)
    assert mad.shape == (2, 2, model.cfg.num_heads)
    torch.testing.assert_close(mad[1].double(), naive_mean_distance(image(ag.attentions, 1), layout, p),
                               atol=1e-4, rtol=1e-6)
    sim = pos_embed_similarity(model)  # no_embed_class: every row of pos_embed is a patch
    assert sim.shape == (grid[0] * grid[1], *grid)


# ----------------------------------------------------------------------------- what the heads do


def test_mean_attention_distance_matches_naive(ag):
    mad = mean_attention_distance(ag.attentions, ag.layout, 16)
    assert mad.shape == (3, 12, 3)
    torch.testing.assert_close(mad[0].double(), naive_mean_distance(image(ag.attentions, 0), ag.layout, 16),
                               atol=1e-4, rtol=1e-6)
    assert float(mad.min()) > 0 and float(mad.max()) < 224 * math.sqrt(2)


def test_pos_embed_similarity_matches_naive(deit_tiny):
    model = deit_tiny.model
    sim = pos_embed_similarity(model)
    assert sim.shape == (196, 14, 14)
    pos = model.pos_embed.detach()[0, 1:].double().numpy()  # drop [class]'s position embedding
    for i in range(196):
        for j in range(0, 196, 7):
            cos = pos[i] @ pos[j] / math.sqrt((pos[i] @ pos[i]) * (pos[j] @ pos[j]))
            assert abs(float(sim[i].flatten()[j]) - cos) < ATOL
    torch.testing.assert_close(torch.diagonal(sim.reshape(196, 196)), torch.ones(196), atol=1e-5, rtol=0)
    # a learned 2-D structure: a patch resembles its neighbour more than the far corner
    assert float(sim[0, 0, 1]) > float(sim[0, 13, 13])


# ----------------------------------------------------------------------------- the method table


def test_methods(deit_tiny, photos, ag):
    assert methods.names()[:2] == ["attention", "rollout"]  # class-agnostic first (the order: test_methods_contract)
    assert {"grad-rollout", "chefer"} <= set(methods.names(slow=False, class_specific=True))  # the rest: test_lrp, ...
    model = deit_tiny.model
    maps = {name: methods.get(name)(model, photos, None) for name in ("attention", "rollout", "grad-rollout", "chefer")}
    for name, m in maps.items():
        assert m.shape == (3, 14, 14) and bool(torch.isfinite(m).all()), name
    torch.testing.assert_close(maps["attention"], cls_attention(ag.attentions, ag.layout, 11))
    torch.testing.assert_close(maps["rollout"], rollout(ag.attentions, ag.layout))
    torch.testing.assert_close(maps["grad-rollout"], grad_rollout(ag.attentions, ag.grads, ag.layout))
    torch.testing.assert_close(maps["chefer"], chefer_relevance(ag.attentions, ag.grads, ag.layout))
    other = methods.get("chefer")(model, photos, torch.tensor([1, 2, 3]))
    assert not torch.allclose(other, maps["chefer"])
