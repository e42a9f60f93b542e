"""SRG (Blücher et al. 2024) and SaCo (Wu et al., CVPR 2024) against step-by-step loops written
from the papers, and probed LRP (both kinds) against its definition, on a small random model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import decisive_tiny_vit

from vit_demo import methods
from vit_demo.evaluate.srg_saco import gaussian_blur, measures, replacement, saco
from vit_demo.methods.lrp import gated_lrp_map
from vit_demo.methods.perturb import unit_range
from vit_demo.methods.probe import ProbeSettings, probed_map


@pytest.fixture(scope="module")
def tiny():
    """A 4x4-patch model with a decisive head, 3 images, their top-1 classes and two maps each."""
    model = decisive_tiny_vit()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 32, 32, generator=g)
    with torch.no_grad():
        t = model(x).logits.argmax(-1)
    maps = [torch.randn(3, 4, 4, generator=g), methods.get("lrp-gated")(model, x, t)]
    return model, x, t, maps


def prob(model, x, target):
    with torch.no_grad():
        return float(model(x[None]).logits.softmax(-1)[0, target])


def without(x, fill, patches, p, gw):
    """x with the listed patches replaced by ``fill``'s."""
    out = x.clone()
    for i in patches:
        r, c = divmod(i, gw)
        out[:, r * p : (r + 1) * p, c * p : (c + 1) * p] = fill[:, r * p : (r + 1) * p, c * p : (c + 1) * p]
    return out


def naive(model, x, fill, saliency, target, per_step, groups):
    """One image, one map: SRG, deletion and SaCo step by step from the papers."""
    gh, gw = saliency.shape
    n, p = gh * gw, model.cfg.patch_size
    values = saliency.flatten().tolist()
    order = sorted(range(n), key=lambda i: (-values[i], i))  # most relevant first, ties row-major
    steps = -(-n // per_step)
    morf = [prob(model, without(x, fill, order[: k * per_step], p, gw), target) for k in range(steps + 1)]
    lerf = [prob(model, without(x, fill, order[n - min(k * per_step, n):], p, gw), target) for k in range(steps + 1)]
    # SaCo, Wu et al. Algorithm 1: K equal groups by rank, each removed alone
    cut = [[order[r] for r in range(n) if r * groups // n == k] for k in range(groups)]
    p0 = prob(model, x, target)
    effect = [p0 - prob(model, without(x, fill, g, p, gw), target) for g in cut]
    sal = [sum(values[i] for i in g) for g in cut]
    f = total = 0.0
    for i in range(groups - 1):
        for j in range(i + 1, groups):
            w = sal[i] - sal[j] if effect[i] >= effect[j] else -(sal[i] - sal[j])
            f, total = f + w, total + abs(w)
    return {"srg": sum(lerf) / len(lerf) - sum(morf) / len(morf), "deletion": sum(morf) / len(morf),
            "saco": f / total}


@pytest.mark.parametrize("kind", ["mean", "blur"])
def test_measures_match_the_papers_loops(tiny, kind):
    model, x, t, maps = tiny
    got = measures(model, x, maps, t, kind, per_step=3, groups=4)
    fill = replacement(x, kind)
    for b in range(3):
        for k, m in enumerate(maps):
            want = naive(model, x[b], fill[b], m[b], int(t[b]), per_step=3, groups=4)
            for key, v in want.items():
                assert got[key][b, k].item() == pytest.approx(v, abs=2e-6), (key, b, k)
    assert got["saco"].abs().max() <= 1 and not torch.equal(got["saco"][:, 0], got["saco"][:, 1])


def test_saco_by_hand():
    sal = torch.tensor([[3.0, 2.0, 1.0]] * 3)
    eff = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [1.0, 3.0, 2.0]])
    # last row: (1,2) -1, (1,3) -2, (2,3) +1 of weights 1, 2, 1
    assert saco(sal, eff).tolist() == [1.0, -1.0, -0.5]
    assert saco(torch.ones(1, 3), eff[:1]).tolist() == [0.0]  # a flat map has no salience to contradict


def test_blur_is_a_normalised_gaussian():
    x = torch.randn(2, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gaussian_blur(torch.full_like(x, 0.7), 2.0), torch.full_like(x, 0.7))
    r = 6
    k1 = torch.exp(-(torch.arange(-r, r + 1.0) / 2.0) ** 2 / 2)
    k2 = torch.outer(k1, k1) / k1.sum() ** 2
    padded = F.pad(x, (r, r, r, r), mode="replicate")
    want = F.conv2d(padded, k2.expand(3, 1, -1, -1), groups=3)
    torch.testing.assert_close(gaussian_blur(x, 2.0), want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="mean, blur"):
        replacement(x, "noise")


def test_faithfulness_cli_srg_saco(tmp_path, capsys):
    """``faithfulness --srg-saco``: every score per replacement kind, the random map near 0, the costs timed."""
    import json

    import timm
    from PIL import Image
    from skimage import data

    from vit_demo.checkpoints.files import save
    from vit_demo.checkpoints.timm import from_timm
    from vit_demo.cli.main import main

    torch.manual_seed(0)
    model, dc = from_timm(timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=1, embed_dim=32,
                                            num_heads=2, num_classes=10).eval())
    weights = save(model, dc, tmp_path / "tiny.safetensors", name="tiny", source="test",
                   class_names=[f"c{i}" for i in range(10)])
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.fromarray(data.astronaut()).save(imgs / "astronaut.png")
    args = ["faithfulness", "--images", str(imgs), "--weights", str(weights), "--methods", "gradcam", "--srg-saco"]
    assert main([*args, "--replacement", "blur", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["images"] == 1 and r["kinds"] == ["blur"] and set(r["scores"]["blur"]) == {"gradcam", "random"}
    assert set(r["scores"]["blur"]["gradcam"]) == {"deletion", "insertion", "srg", "saco"}
    assert r["seconds_per_photo"]["forward"] > 0 and r["seconds_per_photo"]["gradcam"] > 0
    assert -1 <= r["scores"]["blur"]["random"]["saco"]["mean"] <= 1
    assert main([*args, "--replacement", "noise"]) == 2
    assert "--replacement takes mean, blur" in capsys.readouterr().err


def seed_and_groups(model, x, t) -> tuple[torch.Tensor, list[list[int]]]:
    """The gated map of one image [4, 4] and its 3 rank groups (patch indices, the top first)."""
    seed = gated_lrp_map(model, x, t)[0]
    values = seed.flatten().tolist()
    order = sorted(range(16), key=lambda i: (-values[i], i))
    return seed, [[order[r] for r in range(16) if r * 3 // 16 == k] for k in range(3)]


def weighted(seed: torch.Tensor, cut: list[list[int]], effect: torch.Tensor, floor: float) -> torch.Tensor:
    """The gated map scaled to [0, 1] times its group's effect scaled to [0, 1] plus the floor."""
    effect = (effect - effect.min()) / (effect.max() - effect.min())
    factor = torch.zeros(16)
    for k, g in enumerate(cut):
        factor[g] = floor + effect[k]
    return unit_range(seed.clamp(min=0)[None])[0] * factor.reshape(4, 4)


def test_probed_lrp_is_its_definition(tiny):
    """Rank groups of the gated map, each hidden alone, its fall in probability scaled to [0, 1]
    with the floor, times the gated map scaled to [0, 1]."""
    model, x, t, _ = tiny
    s = ProbeSettings(groups=3)
    got = probed_map(model, x, t, s)
    for b in range(3):
        seed, cut = seed_and_groups(model, x[b : b + 1], t[b : b + 1])
        p0 = prob(model, x[b], int(t[b]))
        fall = torch.tensor([p0 - prob(model, without(x[b], torch.zeros_like(x[b]), g, 8, 4), int(t[b])) for g in cut])
        torch.testing.assert_close(got[b], weighted(seed, cut, fall, s.floor), atol=2e-5, rtol=0)
    assert "lrp-probed" in methods.single_pass() and not methods.get("lrp-probed").slow


def test_path_probed_lrp_is_its_definition(tiny):
    """Rank groups of the gated map; each group's rise when shown after the groups above it plus its
    fall when hidden after them, scaled to [0, 1] with the floor, times the gated map scaled to [0, 1]."""
    model, x, t, _ = tiny
    s = ProbeSettings(groups=3, path=True)
    got = probed_map(model, x, t, s)
    for b in range(3):
        seed, cut = seed_and_groups(model, x[b : b + 1], t[b : b + 1])
        blank = torch.zeros_like(x[b])
        shown = [prob(model, without(x[b], blank, sum(cut[k:], []), 8, 4), int(t[b])) for k in range(4)]  # top k shown
        hidden = [prob(model, without(x[b], blank, sum(cut[:k], []), 8, 4), int(t[b])) for k in range(4)]
        effect = torch.tensor([shown[k + 1] - shown[k] + hidden[k] - hidden[k + 1] for k in range(3)])
        torch.testing.assert_close(got[b], weighted(seed, cut, effect, s.floor), atol=2e-5, rtol=0)
    assert not torch.equal(got, probed_map(model, x, t, ProbeSettings(groups=3)))  # not the groups hidden alone
    assert "lrp-path" not in methods.names()  # an experiment (benchmarks/tune_probe.py), not registered
