"""Memory budgets: the analysis cache and the model store are bounded by bytes, with LRU
eviction, and answers stay correct when items are evicted (real DeiT-Tiny, real photos)."""

from __future__ import annotations

import threading

import pytest
import torch
from PIL import Image

from vit_demo import methods
from vit_demo.analysis import AnalysisCache, analysis_nbytes, analyze, class_maps
from vit_demo.app.examples import builtin_examples
from vit_demo.budget import ByteLRU, module_nbytes, tensor_nbytes
from vit_demo.images import load_image


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    """Five different real photos (matplotlib / scikit-image sample data)."""
    ex = builtin_examples()
    if len(ex) < 5:
        pytest.skip("needs the matplotlib and scikit-image sample photos")
    return [load_image(e.path) for e in ex[:5]]


@pytest.fixture(scope="module")
def reference(deit_tiny, photos) -> list[torch.Tensor]:
    """Each photo's logits from an uncached analysis."""
    return [analyze(deit_tiny, p).logits for p in photos]


def expected_bytes(lm, a) -> int:
    """Written from the shapes: depth x [1, heads, N, N] float32 attention, the [1, 3, H, W] input,
    the logits, the RGB model-input picture (Pillow: 4 bytes a pixel)."""
    cfg = lm.model.cfg
    n = a.layout.num_prefix + a.layout.num_patches
    h, w = lm.data_config.input_size[-2:]
    return 4 * (cfg.depth * cfg.num_heads * n * n + 3 * h * w + cfg.num_classes) + 4 * h * w


def test_analysis_bytes(deit_tiny, photos):
    a = analyze(deit_tiny, photos[0])
    assert a.layout.num_prefix + a.layout.num_patches == 197  # [class] + 196 patches
    assert analysis_nbytes(a) == expected_bytes(deit_tiny, a) == 6_395_312
    cache = AnalysisCache(max_bytes=10 << 20)
    cache.get(deit_tiny, photos[0])
    assert cache.nbytes == analysis_nbytes(a)
    maps = class_maps(cache.get(deit_tiny, photos[0]), deit_tiny)  # the maps grow the record ...
    cache.get(deit_tiny, photos[0])  # ... and the next visit weighs it again
    assert len(maps) == len(methods.names(slow=False, class_specific=True)) == 9
    assert cache.nbytes == analysis_nbytes(a) + sum(m.nbytes for m in maps.values()) == 6_395_312 + 9 * 14 * 14 * 4


def heap_bytes() -> int:
    """Bytes of glibc's heap in use plus its mmapped blocks (``mallinfo2``)."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33 or later (mallinfo2)")
    fn.restype = Info
    info = fn()
    return info.uordblks + info.hblkhd


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA", "L", "P", "1", "I;16", "I", "F"])
def test_picture_bytes_are_what_pillow_holds(mode):
    """The budgets weigh a picture by the memory Pillow takes for it, measured in the C heap:
    an RGB picture takes 4 bytes a pixel, not the 3 its bands suggest (issue 35: 93 MiB of the
    pictures of 200 fresh sessions were outside the budgets)."""
    from vit_demo.budget import image_nbytes

    before = heap_bytes()
    pictures = [Image.new(mode, (800, 600)) for _ in range(8)]
    took = (heap_bytes() - before) / len(pictures)
    assert abs(took - image_nbytes(pictures[0])) < 0.02 * took  # (Pillow's line table: 5 KB)


def test_eviction_least_recently_used(deit_tiny, photos, reference):
    size = analysis_nbytes(analyze(deit_tiny, photos[0]))
    cache = AnalysisCache(max_bytes=3 * size + size // 2)  # room for three
    first = [cache.get(deit_tiny, p) for p in photos[:3]]
    assert len(cache) == 3 and cache.nbytes == 3 * size
    cache.get(deit_tiny, photos[0])  # photo 0 used again: photo 1 is now the oldest
    cache.get(deit_tiny, photos[3])
    keys = [cache.key(deit_tiny, p) for p in photos]
    assert keys[1] not in cache and all(keys[i] in cache for i in (0, 2, 3))
    assert cache.evictions == 1 and cache.nbytes == 3 * size <= cache.max_bytes
    # the evicted photo comes back: computed again (a miss), the same answer bit for bit
    misses = cache.misses
    again = cache.get(deit_tiny, photos[1])
    assert cache.misses == misses + 1 and again is not first[1]
    assert torch.equal(again.logits, reference[1])
    assert all(torch.equal(x, y) for x, y in zip(again.attentions, first[1].attentions))
    assert keys[2] not in cache  # and it pushed out the least recently used one, photo 2


def test_oversize_analysis_served_not_kept(deit_tiny, photos, reference):
    cache = AnalysisCache(max_bytes=1 << 20)  # 1 MiB: less than one DeiT-Tiny analysis (6.1 MiB)
    a = cache.get(deit_tiny, photos[2])
    assert torch.equal(a.logits, reference[2]) and a.depth == 12
    assert len(cache) == 0 and cache.nbytes == 0
    cache.get(deit_tiny, photos[2])
    assert cache.misses == 2 and cache.hits == 0  # never kept, so computed each time


def test_no_cross_talk_under_eviction(deit_tiny, photos, reference):
    """Two users, photos interleaved, a cache that holds one analysis: each gets its own answer."""
    cache = AnalysisCache(max_bytes=analysis_nbytes(analyze(deit_tiny, photos[0])) + 1)
    wrong: list[str] = []

    def user(order: list[int]) -> None:
        for i in order:
            if not torch.equal(cache.get(deit_tiny, photos[i]).logits, reference[i]):
                wrong.append(f"photo {i}")

    threads = [threading.Thread(target=user, args=(o,)) for o in ([0, 1, 2, 3, 4, 0], [4, 3, 2, 1, 0, 4])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(cache) == 1


def test_model_budget(deit_tiny, deit_tiny_timm):
    """Models and timm twins weighed by their parameters; the one in use is never evicted."""
    tiny = module_nbytes(deit_tiny.model)
    assert tiny == 4 * deit_tiny.model.num_params == 4 * 5_717_416
    assert module_nbytes(deit_tiny_timm) == tiny  # the same weights, the same bytes
    small = torch.nn.Linear(1000, 1000)  # 4 MB: a stand-in third model
    evicted = []
    store: ByteLRU[str, torch.nn.Module] = ByteLRU(2 * tiny + 1000, module_nbytes,
                                                   on_evict=lambda k, v: evicted.append(k))
    store.put("model:tiny", deit_tiny.model)
    store.put("twin:tiny", deit_tiny_timm, protect=["model:tiny"])
    assert store.keys() == ["model:tiny", "twin:tiny"] and store.nbytes == 2 * tiny
    store.put("model:small", small)  # over budget: the least recently used leaves
    assert evicted == ["model:tiny"] and store.keys() == ["twin:tiny", "model:small"]
    # a model larger than the whole budget is kept while in use (alone), unlike an analysis
    small_budget: ByteLRU[str, torch.nn.Module] = ByteLRU(tiny // 2, module_nbytes)
    assert small_budget.put("m", deit_tiny.model, keep_oversize=True) and small_budget.keys() == ["m"]
    assert not small_budget.put("n", deit_tiny_timm, protect=["m"]) and small_budget.keys() == ["m"]
    small_budget.put("n", deit_tiny_timm, protect=["m"], keep_oversize=True)  # twin of the model in use
    assert small_budget.keys() == ["m", "n"]
    small_budget.put("s", small)  # another model picked: both leave
    assert small_budget.keys() == ["s"] and small_budget.nbytes == module_nbytes(small)


def test_tensor_bytes_count_shared_storage_once():
    t = torch.zeros(1000)
    assert tensor_nbytes([t, t[:10], {"v": t.view(10, 100)}]) == 4000
    assert tensor_nbytes([t, torch.zeros(10, dtype=torch.float16)]) == 4020
    with pytest.raises(ValueError):
        ByteLRU(-1, len)


def test_sessions_hold_no_analysis_of_their_own(deit_tiny, deit_tiny_path, photos, reference):
    """Two users, a registry whose cache holds one analysis: a session does not keep its analysis
    alive (sessions add nothing to the budget); when the other user's photo pushed it out, the
    session's analysis is computed again, the same answer. The model budget holds the model."""
    import gc

    from vit_demo.app.registry import ModelRegistry
    from vit_demo.app.session import Session, Upload

    size = analysis_nbytes(analyze(deit_tiny, photos[0]))
    reg = ModelRegistry([deit_tiny_path], cache_bytes=size + 1, models_bytes=64 << 20)
    key = reg.default_key()
    users = []
    for i in (0, 1):
        s = Session(model_key=key, upload=Upload(photos[i], f"photo {i}", photos[i].size))
        s.reanalyze = lambda s: reg.analyze(s.model_key, s.upload.picture)
        s.analysis = reg.analyze(key, photos[i])
        users.append(s)
    gc.collect()
    assert len(reg.analyses) == 1 and users[0].peek() is None and users[1].peek() is not None
    misses = reg.analyses.misses
    assert users[0].ready and torch.equal(users[0].analysis.logits, reference[0])  # recomputed
    assert reg.analyses.misses == misses + 1 and users[1].peek() is None  # ... and it took the cache's place
    assert torch.equal(users[1].analysis.logits, reference[1])
    assert reg.is_loaded(key) and module_nbytes(reg.get(key).model) == 4 * 5_717_416  # float32 parameters

