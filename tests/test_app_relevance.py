"""The relevance row of the "Rollout & relevance" tab: the new maps are the library's maps for
the chosen class, they arrive with the other class-specific maps, and RISE and causal LRP appear
only after they have been asked for (their progress callbacks see every forward pass)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo import methods
from vit_demo.analysis import analyze, class_maps, on_demand_map
from vit_demo.methods.perturb import CausalSettings, RiseSettings, causal_lrp, rise

pytestmark = pytest.mark.slow  # every slow map of the tab on DeiT-Tiny


def test_relevance_row(deit_tiny, package_photos):
    from vit_demo.app.tabs.relevance import TOP_ROW, relevance_maps, relevance_names, relevance_pending

    row = [n for n in methods.names(class_specific=True) if n not in TOP_ROW]  # the registry, less the top row
    assert relevance_names() == row and {"lrp", "attnlrp", "lrp-gated", "gradcam"} <= set(row)
    single = [n for n in row if not methods.get(n).slow]
    a = analyze(deit_tiny, Image.open(package_photos["coffee"]).convert("RGB"))
    assert relevance_maps(a, None, None) == {}
    assert len(relevance_pending(a, None)) == len(single)  # placeholders before the backward passes
    rel = relevance_maps(a, deit_tiny, 7)
    assert [t.split("\n")[0] for t in rel] == [methods.get(k).title for k in single]
    cm = class_maps(a, deit_tiny, 7)
    for key in ("gradcam", "lrp-gated"):  # lrp-gated recomputes lrp and grad-rollout; attnlrp: tests/test_lrp.py
        want = methods.get(key)(deit_tiny.model, a.x, 7)[0].numpy()
        np.testing.assert_allclose(cm[key], want, atol=1e-6, rtol=1e-4)
    assert relevance_pending(a, 7) == []
    seen = []
    few = RiseSettings(masks=32, chunk=8)  # the app runs the default 256; fewer keep the test fast
    m = on_demand_map(a, deit_tiny, "rise", 7, progress=seen.append, settings=few)
    assert seen == [0.25, 0.5, 0.75, 1.0]  # one call per forward pass
    assert m.shape == (14, 14)
    torch.testing.assert_close(torch.from_numpy(m), rise(deit_tiny.model, a.x, 7, few)[0])
    assert list(relevance_maps(a, deit_tiny, 7))[-1].startswith("RISE")
    seen.clear()
    few = CausalSettings(masks=32, chunk=16)
    m = on_demand_map(a, deit_tiny, "lrp-causal", 7, progress=seen.append, settings=few)
    assert seen == [0.5, 1.0]
    torch.testing.assert_close(torch.from_numpy(m), causal_lrp(deit_tiny.model, a.x, 7, few)[0], atol=1e-6, rtol=1e-4)
    assert list(relevance_maps(a, deit_tiny, 7))[-1].startswith("Causal LRP")


def test_relevance_tab_starts_the_maps_with_the_analysis(tmp_path, monkeypatch):
    """The tab's start_maps (the upload's follow-up calls it first) starts the class maps in the
    background and returns at once; the tab's first picture shows what is made so far, and the
    follow-up's pictures what is made then (the top row first)."""
    from conftest import random_shapes_checkpoint

    from vit_demo import analysis as A
    from vit_demo.app.tabs.relevance import RelevanceTab, pending_titles, relevance_pending
    from vit_demo.checkpoints.load import load_model

    lm = load_model(weights=random_shapes_checkpoint(tmp_path / "random.safetensors"), device="cpu", progress=False)
    a = analyze(lm, Image.fromarray(np.random.default_rng(5).integers(0, 256, (40, 48, 3), dtype=np.uint8)))
    single = [n for n in methods.names(class_specific=True, slow=False)]
    assert len(pending_titles(a, None)) == 2 and len(relevance_pending(a, None)) == len(single) - 2

    class Sess:
        analysis, ready = a, True

    monkeypatch.setattr(A, "lane_count", lambda lm: 2)
    t0 = time.perf_counter()
    RelevanceTab().start_maps(Sess(), lm)
    assert time.perf_counter() - t0 < 1.0 and a.jobs[a.top1]  # started, not waited for
    top = A.maps_so_far(a, wait_for=("grad-rollout", "chefer"))
    assert {"grad-rollout", "chefer"} <= set(top)
    assert pending_titles(a, None) == []
    class_maps(a, lm)
    assert relevance_pending(a, None) == [] and a.jobs[a.top1] == []
