"""The class-specific maps of an analysis as a background job: started at once (the app: right after
an upload's forward pass), run in lanes side by side where the cores allow (the methods that share
passes in one lane on the model, Integrated Gradients in another on a copy that shares its weights),
waited for by whoever needs them, never computed twice, and exactly the maps the methods give one
after another. A small random model for the 32-px shapes (the Train tab's recipe) keeps each map cheap."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from conftest import random_shapes_checkpoint
from PIL import Image

from vit_demo import analysis as A
from vit_demo import methods
from vit_demo.checkpoints.load import load_model
from vit_demo.methods.registry import Method
from vit_demo.progress import TimeUp, time_limit

SINGLE = methods.names(slow=False, class_specific=True)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_model(weights=random_shapes_checkpoint(tmp_path_factory.mktemp("jobs") / "random.safetensors"),
                      device="cpu", progress=False)


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8))


def one_by_one(lm, a, cls: int) -> dict[str, np.ndarray]:
    """The reference: every method in the registry's order on this thread, passes shared as before."""
    with methods.reuse(lm.model, a.x):
        return {n: methods.get(n)(lm.model, a.x, cls)[0].detach().numpy() for n in SINGLE}


@pytest.fixture
def two_lanes(monkeypatch):
    """Two lanes of one torch thread each, as the app runs them on 2 cores."""
    monkeypatch.setattr(A, "lane_count", lambda lm: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_lanes_put_integrated_gradients_beside_the_rest(lm, monkeypatch):
    """Two lanes: Integrated Gradients (16 gradient passes, sharing none) alone, the others in the
    registry's order; the methods kept in float32 on a bf16 model after those in the model's precision."""
    monkeypatch.setattr(A, "lane_count", lambda lm: 2)
    rest = [n for n in SINGLE if n != "integrated-gradients"]
    assert A.map_lanes(lm, SINGLE) == [rest, ["integrated-gradients"]]
    monkeypatch.setattr(A, "lane_count", lambda lm: 1)
    assert A.map_lanes(lm, SINGLE) == [SINGLE]

    class Bf16:  # what map_lanes reads of a bf16 model
        precision = "bf16"

    fp32_kept = [n for n in SINGLE if not methods.get(n).bf16_ok]
    assert "lrp-probed" in fp32_kept
    order = A.map_lanes(Bf16(), SINGLE)[0]
    assert order[-len(fp32_kept):] == fp32_kept and set(order) == set(SINGLE)


def test_lane_count_follows_cores_threads_load_and_memory(lm, monkeypatch):
    monkeypatch.setattr(A.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    monkeypatch.setattr(A.os, "getloadavg", lambda: (0.3, 0.2, 0.1))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert A.lane_count(lm) == 2  # the app on 2 idle cores: one torch thread per model run
    monkeypatch.setattr(A.os, "getloadavg", lambda: (1.6, 0.2, 0.1))
    assert A.lane_count(lm) == 2  # the app and its browser at work: still under the cores
    monkeypatch.setattr(A.os, "getloadavg", lambda: (2.2, 0.2, 0.1))
    assert A.lane_count(lm) == 1  # busier than its cores: two lanes would wait for each other
    monkeypatch.setattr(A.os, "getloadavg", lambda: (0.3, 0.2, 0.1))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert A.lane_count(lm) == 1  # two threads already fill both cores
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(A, "PARALLEL_BYTES", 1)
    assert A.lane_count(lm) == 1  # a model whose backward passes would double a big peak


def test_replica_shares_the_weights_not_the_hooks(lm):
    model = lm.model
    handle = model.blocks[0].register_forward_hook(lambda *a: None)  # e.g. a capture hook of the moment
    try:
        twin = A.replica(model, 1)
    finally:
        handle.remove()
    assert twin is not model and A.replica(model, 1) is twin
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert p.data_ptr() == q.data_ptr(), name
    assert not any(m._forward_hooks for m in twin.modules())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(twin(x).logits, model(x).logits, rtol=0, atol=0)


def test_started_job_gives_the_one_by_one_maps(lm, two_lanes):
    a = A.analyze(lm, picture(0))
    ref = one_by_one(lm, A.analyze(lm, picture(0)), a.top1)
    job = A.start_class_maps(a, lm)
    assert job is not None and job.lanes[1] == ["integrated-gradients"]
    assert A.start_class_maps(a, lm) is job  # started once, however many ask
    got = A.class_maps(a, lm)  # waits for the job, computes nothing again
    assert list(got) == SINGLE  # the registry's order, whichever lane made a map first
    for n in SINGLE:
        np.testing.assert_array_equal(got[n], ref[n], err_msg=n)
    assert a.jobs[a.top1] == [] and A.maps_so_far(a) == got
    assert A.start_class_maps(a, lm) is None  # all cached


def test_waiters_see_maps_as_they_come(lm, two_lanes):
    """A caller that waits for the top row gets it before the job has ended; maps_so_far never computes."""
    a = A.analyze(lm, picture(1))
    assert A.maps_so_far(a) == {}
    gate = threading.Event()
    ig = methods.get("integrated-gradients")
    slow_ig = Method(ig.name, lambda *args: (gate.wait(30), ig.fn(*args))[1], ig.title, ig.cite,
                               ig.slow, ig.class_specific, ig.bf16_ok, ig.solo)
    orig = methods.get

    def get(name):
        return slow_ig if name == "integrated-gradients" else orig(name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(A.methods, "get", get)
        job = A.start_class_maps(a, lm)
        top = A.maps_so_far(a, wait_for=("grad-rollout", "chefer"))
        assert {"grad-rollout", "chefer"} <= set(top) and "integrated-gradients" not in top
        rest = A.maps_so_far(a, wait_for=[n for n in SINGLE if n != "integrated-gradients"])
        assert set(rest) == set(SINGLE) - {"integrated-gradients"} and job.left >= 1  # IG still held back
        gate.set()
        assert set(A.class_maps(a, lm)) == set(SINGLE)


def test_failed_job_leaves_nothing_half_filled(lm, two_lanes, monkeypatch):
    a = A.analyze(lm, picture(2))
    orig = methods.get

    def broken(name):
        if name == "integrated-gradients":
            raise RuntimeError("out of memory (a test)")
        return orig(name)

    monkeypatch.setattr(A.methods, "get", broken)
    with pytest.raises(RuntimeError, match="a test"):
        A.class_maps(a, lm)
    assert a.class_maps.get(a.top1, {}) == {} and a.jobs[a.top1] == []
    monkeypatch.setattr(A.methods, "get", orig)
    assert set(A.class_maps(a, lm)) == set(SINGLE)  # asked again: computed


def test_the_callers_time_limit_goes_with_the_work(lm, two_lanes):
    """The lanes in the pool's threads stop at the caller's time limit (vit_demo.progress), as the
    maps did on the caller's own thread."""
    a = A.analyze(lm, picture(3))
    t0 = time.monotonic()
    with pytest.raises(TimeUp), time_limit(1e-6, "The maps"):
        A.class_maps(a, lm)
    assert time.monotonic() - t0 < 30
    assert a.class_maps.get(a.top1, {}) == {}


def test_other_classes_and_subsets(lm, two_lanes):
    a = A.analyze(lm, picture(4))
    other = (a.top1 + 1) % 4
    only = A.class_maps(a, lm, other, names=["chefer"])
    assert set(only) == {"chefer"}
    ref = one_by_one(lm, A.analyze(lm, picture(4)), other)
    np.testing.assert_array_equal(A.class_maps(a, lm, other)["integrated-gradients"], ref["integrated-gradients"])
