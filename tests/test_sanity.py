"""The model-randomisation sanity check (Adebayo et al. 2018) and the CLI entry points of the
new methods: Spearman against scipy, the cascade re-initialises exactly one stage more each step,
and ``sanity`` / ``explain --method`` / ``faithfulness --methods all`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo import methods
from vit_demo.cli.main import main
from vit_demo.evaluate.sanity import average_ranks, cascade, reinit_, spearman, stages


def test_spearman_matches_scipy_with_ties():
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (3, 7, 7), generator=g).float()  # many ties, as in a ReLU'd map
    b = a + torch.randn(3, 7, 7, generator=g)
    got = spearman(a, b)
    for i in range(3):
        assert abs(float(got[i]) - spearmanr(a[i].flatten(), b[i].flatten()).statistic) < 1e-9
    assert average_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [2.5, 0.0, 2.5, 1.0]
    assert float(spearman(torch.ones(1, 4), torch.arange(4.0)[None])[0]) == 0.0  # a constant map


@pytest.fixture(scope="module")
def tiny():
    import timm

    from vit_demo.checkpoints.timm import from_timm

    torch.manual_seed(0)
    tm = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=2, num_classes=10).eval()
    return from_timm(tm)


def test_stages_cover_the_model_top_down(tiny):
    model, _ = tiny
    names = [n for n, _ in stages(model)]
    assert names == ["head", "block 1", "block 0", "embedding"]
    covered = {id(p) for _, parts in stages(model) for part in parts
               for p in ([part] if isinstance(part, torch.nn.Parameter) else part.parameters())}
    assert covered == {id(p) for p in model.parameters()}, "every parameter belongs to one stage"


def test_reinit_changes_only_its_stage(tiny):
    import copy

    model, _ = tiny
    work = copy.deepcopy(model)
    parts = stages(work)
    reinit_(parts[1][1], torch.Generator().manual_seed(0))  # the last block only
    for (name, p), (_, q) in zip(model.named_parameters(), work.named_parameters()):
        if not name.startswith("blocks.1."):
            assert torch.equal(p, q), f"{name} is outside the stage but changed"
        elif p.dim() > 1:  # every weight matrix of the block is new
            assert not torch.equal(p, q), f"{name} was not re-initialised"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run it on a lent GPU machine)")
def test_reinit_on_cuda_equals_reinit_on_cpu(tiny):
    """The CPU generator drives re-initialisation on any device: a CUDA model gets the very
    numbers the CPU model gets (sanity --device cuda once failed on the generator's device)."""
    import copy

    model, _ = tiny
    on_cpu, on_gpu = copy.deepcopy(model), copy.deepcopy(model).cuda()
    for m in (on_cpu, on_gpu):
        g = torch.Generator().manual_seed(0)
        for _, parts in stages(m):
            reinit_(parts, g)
    for (name, p), (_, q) in zip(on_cpu.named_parameters(), on_gpu.named_parameters()):
        assert torch.equal(p, q.cpu()), name


def test_cascade_on_a_small_model(tiny):
    model, _ = tiny
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    before = [p.clone() for p in model.parameters()]
    r = cascade(model, x, torch.tensor([1, 2]), ["grad-rollout", "gradcam"], seed=0)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters())), "the cascade runs on a copy"
    for v in r.values():
        assert v["rank"].shape == (4, 2) and bool(((v["rank"] >= -1) & (v["rank"] <= 1)).all())
    again = cascade(model, x, torch.tensor([1, 2]), ["gradcam"], seed=0)
    torch.testing.assert_close(again["gradcam"]["rank"], r["gradcam"]["rank"])  # seeded


def test_sanity_cli(tiny, tmp_path, capsys):
    from skimage import data

    from vit_demo.checkpoints.files import save

    model, dc = tiny
    weights = save(model, dc, tmp_path / "tiny.safetensors", name="tiny", source="test",
                   class_names=[f"c{i}" for i in range(10)])
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.fromarray(data.astronaut()).save(imgs / "astronaut.png")
    Image.fromarray(data.coffee()).save(imgs / "coffee.png")
    out = tmp_path / "out"
    assert main(["sanity", "--images", str(imgs), "--weights", str(weights), "--methods", "gradcam,rollout",
                 "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["images"] == 2 and r["stages"] == ["head", "block 1", "block 0", "embedding"]
    assert set(r["methods"]) == {"gradcam", "rollout"} and len(r["methods"]["gradcam"]["rank"]) == 4
    # rollout does not depend on the head: randomising only the head leaves its map as it was
    assert r["methods"]["rollout"]["rank"][0] == pytest.approx(1.0)
    assert (out / "sanity_randomisation.png").stat().st_size > 10_000
    assert main(["sanity", "--images", str(imgs), "--weights", str(weights), "--methods", "nope"]) == 2
    assert "unknown method(s) nope" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["gradcam", "lrp-gated",
                                    pytest.param("lrp-causal", marks=pytest.mark.slow)])  # hundreds of DeiT-Tiny passes
def test_explain_cli_new_methods(deit_tiny, deit_tiny_path, package_photos, tmp_path, method):
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    img = package_photos["coffee"]
    assert main(["explain", str(img), "--weights", str(deit_tiny_path), "--method", method, "--class", "7",
                 "--out", str(tmp_path), "--width", "400"]) == 0
    rec = json.loads((tmp_path / f"{img.stem}_{method}_c7.json").read_text())
    assert (tmp_path / rec["figure"]).exists() and rec["target"]["index"] == 7 and rec["class_specific"]
    x = preprocess(load_image(img), deit_tiny.data_config)[0][None]
    want = methods.get(method)(deit_tiny.model, x, 7)[0]
    np.testing.assert_allclose(np.array(rec["map"]), want.numpy(), atol=1e-6, rtol=1e-4)
