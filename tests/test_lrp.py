"""LRP (CP-LRP, AttnLRP) in the scratch model against the authors' rule library.

The reference is lxt 2.1 (+ zennit for the gamma rule) applied to timm's model of the same
weights, patched per instance (never per class): lxt's ``layer_norm_forward`` on every
LayerNorm, ``non_linear_forward`` (identity rule) on every GELU, lxt's CP / AttnLRP attention
wrappers around the attention, zennit's ``Gamma`` on every Linear and Conv2d with lxt's
``monkey_patch_zennit`` (restored afterwards). Maps (and every input value's relevance) must agree to 1e-4 of the largest |value|.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import types
from types import MethodType

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vit_demo import methods
from vit_demo.methods import lrp
from vit_demo.methods.gradients import attention_gradients

pytest.importorskip("lxt")
pytest.importorskip("zennit")


def lxt_modules():
    """lxt's rules and patches without ``lxt.efficient.models`` (it imports BERT internals that
    transformers 5 no longer has): a bare package object stands in for ``lxt.efficient``."""
    if "lxt.efficient" not in sys.modules:
        spec = importlib.util.find_spec("lxt")
        pkg = types.ModuleType("lxt.efficient")
        pkg.__path__ = [os.path.join(os.path.dirname(spec.origin), "efficient")]
        sys.modules["lxt.efficient"] = pkg
    from lxt.efficient import patches, zennit_patches

    return patches, zennit_patches


def _sdpa(module, q, k, v, *args, **kwargs):
    return F.scaled_dot_product_attention(q, k, v)


def lxt_timm_relevance(tm, x, target, rules: lrp.LrpRules):
    """x * grad from lxt + zennit on a timm VisionTransformer (instance patches)."""
    from timm.layers.attention import Attention
    from zennit.composites import LayerMapComposite
    from zennit.core import BasicHook
    from zennit.rules import Gamma

    tm = copy.deepcopy(tm)  # the patches stay on this copy
    patches, zp = lxt_modules()
    wrap = patches.cp_wrap_attention_forward if rules.attention == "cp" else patches.wrap_attention_forward
    attend = wrap(_sdpa)

    def attention_forward(self, x, attn_mask=None, is_causal=False):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = attend(self, q, k, v).transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.proj_drop(self.proj(self.norm(out)))

    for m in tm.modules():
        if isinstance(m, nn.LayerNorm):
            m.forward = MethodType(patches.layer_norm_forward, m)
        elif isinstance(m, nn.GELU):
            m.original_forward = m.forward
            m.forward = MethodType(patches.non_linear_forward, m)
        elif isinstance(m, Attention):
            m.forward = MethodType(attention_forward, m)
    saved = BasicHook.forward, BasicHook.backward
    zp.monkey_patch_zennit()
    try:
        composite = LayerMapComposite([(nn.Conv2d, Gamma(rules.gamma_conv)), (nn.Linear, Gamma(rules.gamma_linear))])
        with composite.context(tm):
            x = x.detach().clone().requires_grad_(True)
            tm(x).gather(1, target[:, None]).sum().backward()
    finally:
        BasicHook.forward, BasicHook.backward = saved
    return (x * x.grad).detach()


def patch_sum(r, p):
    return F.avg_pool2d(r.sum(dim=1, keepdim=True), p, p)[:, 0] * p * p


def assert_maps_close(ours, ref, tol):
    """Equal within ``tol`` times the largest |value| of the reference (float32 sums in another order)."""
    scale = float(ref.abs().max())
    assert scale > 0
    torch.testing.assert_close(ours, ref, atol=tol * scale, rtol=0)


@pytest.fixture(scope="module")
def two_photos(deit_tiny, package_photos):
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    x = torch.stack([preprocess(load_image(package_photos[n]), deit_tiny.data_config)[0] for n in ("coffee", "chelsea")])
    return x, torch.tensor([967, 281])  # their classes: espresso, tabby


@pytest.fixture(scope="module")
def one_photo(two_photos):
    x, t = two_photos
    return x[1:], t[1:]


@pytest.mark.parametrize("rules", [lrp.CP_LRP, lrp.ATTN_LRP], ids=["cp", "attnlrp"])
def test_matches_lxt_on_deit_tiny(deit_tiny, deit_tiny_timm, one_photo, rules):
    x, t = one_photo
    ref = lxt_timm_relevance(deit_tiny_timm, x, t, rules)  # on a copy: the session's timm model stays as it was
    ours = lrp.input_relevance(deit_tiny.model, x, t, rules)
    assert_maps_close(ours, ref, 1e-4)  # every input value, not only the patch sums
    assert_maps_close(lrp.patch_relevance(deit_tiny.model, x, t, rules), patch_sum(ref, 16), 1e-4)
    # conservation-ish: the relevance sums to about the logit, far from 0
    with torch.no_grad():
        logit = deit_tiny.model(x).logits.gather(1, t[:, None])[:, 0]
    assert bool((ours.sum(dim=(1, 2, 3)) > 0.1 * logit).all())


# small_pair (tests/conftest.py): random small timm models, register tokens + LayerScale, no [class] token, a distillation token


@pytest.mark.parametrize("rules", [lrp.LrpRules("cp", 0.1, 0.5), lrp.LrpRules("attnlrp", 0.01, 1.0)], ids=["cp", "attnlrp"])
def test_matches_lxt_on_token_variants(small_pair, rules):
    """gamma > 0: with gamma = 0 (LRP-0) the rule divides by outputs near 0 and single input values
    differ by up to 5e-4 of the scale between summation orders (patch sums still within 2e-5)."""
    name, tm, model, x = small_pair
    t = torch.tensor([1, 2, 3, 4])
    ref = lxt_timm_relevance(tm, x[:2], t[:2], rules)
    ours = lrp.input_relevance(model, x[:2], t[:2], rules)
    assert_maps_close(ours, ref, 1e-4)
    p = model.cfg.patch_size
    assert_maps_close(lrp.patch_relevance(model, x[:2], t[:2], rules), patch_sum(ref, p), 1e-4)


def test_batch_equals_singles(small_pair):
    name, _, model, x = small_pair
    for method in ("lrp", "attnlrp"):
        batch = methods.get(method)(model, x, None)
        p = model.cfg.patch_size
        assert batch.shape == (4, 224 // p, 224 // p)
        for b in range(4):
            torch.testing.assert_close(methods.get(method)(model, x[b : b + 1], None), batch[b : b + 1], atol=1e-6, rtol=1e-4)


MODE_LOGIT_RTOL = 1e-5
"""How close the explanation mode's logits are to the plain forward's, relative to the logits'
scale (max |logit| of the batch). The mode changes gradients, not values, but it computes some
values another way: the patch convolution as a matrix product of the flattened patches (the
gamma rule's form) and LayerNorm from its own mean and variance (the std held constant). Each
sums in another order than the fused kernel, a float32 rounding difference (~1e-6 of the
activations' scale: 1.1e-5 on patch embeddings of size 13) that 12 blocks carry to the logits:
measured 1.4e-6 of the logits' scale on the six package photos (2.2e-6 for the worst single
photo), with 1 or 2 threads; which photos, which CPU and its BLAS kernels move it around, and an
absolute 1e-5 bound failed on a clean clone once the difference reached 1.4e-5. 1e-5 of the
scale leaves 4x headroom and would still catch a rule that changed a value (those are O(1))."""


def test_mode_leaves_plain_gradients_alone(deit_tiny, two_photos):
    """The rules live on this instance only while the mode is on; outside, gradients are plain.
    Inside, the logits equal the plain ones within :data:`MODE_LOGIT_RTOL` of their scale."""
    model = deit_tiny.model
    x, t = two_photos
    before = attention_gradients(model, x, t)
    with pytest.raises(RuntimeError, match="boom"), lrp.explanation_mode(model, lrp.ATTN_LRP):
        assert all(b.attn.relevance_rule is lrp.attnlrp_attention for b in model.blocks)
        raise RuntimeError("boom")
    lrp.patch_relevance(model, x, t, lrp.CP_LRP)
    after = attention_gradients(model, x, t)
    for g, h in zip(before.grads, after.grads):
        torch.testing.assert_close(g, h, atol=0, rtol=0)
    assert all(not m._forward_hooks for m in model.modules())
    assert all(b.attn.relevance_rule is None for b in model.blocks)
    assert all(p.grad is None for p in model.parameters())
    # the mode changes gradients, not values
    with torch.no_grad():
        plain = model(x).logits
    with torch.no_grad(), lrp.explanation_mode(model, lrp.CP_LRP):
        torch.testing.assert_close(model(x).logits, plain, atol=MODE_LOGIT_RTOL * float(plain.abs().max()), rtol=0)


def test_gradient_passes_on_other_threads_keep_their_own_rules():
    """The app runs two events at once on one model: while one thread is in explanation mode
    (instance hooks on), a plain gradient pass on another thread must keep plain gradients,
    and GradCAM must see only its own forward. lrp.gradient_lock serialises gradient passes."""
    import threading

    from vit_demo.model import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(64, 64), patch_size=8, embed_dim=64, depth=4, num_heads=2,
                                        num_classes=5)).eval()
    for p in model.parameters():  # a zero head (or tiny weights) would make every map trivial
        p.data.normal_(0, 0.3)
    x = torch.randn(8, 3, 64, 64)  # big enough that the threads overlap inside the passes
    want = {m: methods.get(m)(model, x, 1) for m in ("lrp", "grad-rollout", "chefer", "gradcam")}
    bad: list[str] = []

    def loop(method: str) -> None:
        for _ in range(15):
            try:  # in the rules' window a plain pass fails outright (attention held constant) or differs
                if not torch.allclose(methods.get(method)(model, x, 1), want[method], atol=1e-6, rtol=1e-5):
                    bad.append(f"{method}: a different map")
            except RuntimeError as e:
                bad.append(f"{method}: {e}")

    threads = [threading.Thread(target=loop, args=(m,)) for m in want]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
