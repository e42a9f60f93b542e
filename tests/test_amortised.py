"""Amortised LRP (vit_demo/methods/amortised.py): the map against a step-by-step reference written
from its definition (features by hand, the shipped networks as plain matrix products, the rank
groups hidden one by one), its weights file checked key by key, and the sanity check of Adebayo
et al. on a real photo: the map must change when the trained model's weights are randomised."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import decisive_tiny_vit
from safetensors.torch import load_file, save_file

from vit_demo import methods
from vit_demo.evaluate.sanity import reinit_, spearman, stages
from vit_demo.methods.amortised import INPUTS, WEIGHTS, load_predictor
from vit_demo.methods.perturb import unit_range


@pytest.fixture(scope="module")
def tiny():
    """A 4x4-patch model with a decisive head, 2 images and their top-1 classes."""
    model = decisive_tiny_vit()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        t = model(x).logits.argmax(-1)
    return model, x, t


def naive_features(maps: dict[str, torch.Tensor]) -> torch.Tensor:
    """[C, gh, gw] for one image: each map over its largest magnitude and as ranks (ties row-major),
    then every channel's mean and maximum over the patch's 3x3 neighbours inside the grid."""
    chans = []
    for name in INPUTS:
        m = maps[name]
        gh, gw = m.shape
        values = m.flatten().tolist()
        order = sorted(range(gh * gw), key=lambda i: (values[i], i))
        rank = torch.zeros(gh * gw)
        for r, i in enumerate(order):
            rank[i] = r / (gh * gw - 1)
        chans += [m / max(abs(v) for v in values), rank.reshape(gh, gw)]
    X = torch.stack(chans)
    C, gh, gw = X.shape
    mean, most = torch.zeros_like(X), torch.zeros_like(X)
    for i in range(gh):
        for j in range(gw):
            window = X[:, max(i - 1, 0) : i + 2, max(j - 1, 0) : j + 2].reshape(C, -1)
            mean[:, i, j], most[:, i, j] = window.mean(1), window.amax(1)
    return torch.cat([X, mean, most])


def naive_effect(X: torch.Tensor) -> torch.Tensor:
    """The shipped networks on every patch as plain products, averaged: [C, gh, gw] -> [gh, gw]."""
    w = load_file(str(WEIGHTS))
    count = len({k.split(".")[1] for k in w if k.startswith("nets.")})
    out = torch.zeros(X.shape[1:])
    for i in range(X.shape[1]):
        for j in range(X.shape[2]):
            z = (X[:, i, j] - w["mean"].flatten()) / w["std"].flatten()
            total = 0.0
            for n in range(count):
                h = F.gelu(w[f"nets.{n}.0.weight"][:, :, 0, 0] @ z + w[f"nets.{n}.0.bias"])
                h = F.gelu(w[f"nets.{n}.2.weight"][:, :, 0, 0] @ h + w[f"nets.{n}.2.bias"])
                total += float(w[f"nets.{n}.4.weight"][:, :, 0, 0] @ h + w[f"nets.{n}.4.bias"])
            out[i, j] = total / count
    return out


def prob(model, x, target) -> float:
    with torch.no_grad():
        return float(model(x[None]).logits.softmax(-1)[0, target])


def hidden(x: torch.Tensor, patches: list[int], p: int = 8, gw: int = 4) -> torch.Tensor:
    """x with the listed patches set to 0 (the mean colour in normalised space)."""
    out = x.clone()
    for i in patches:
        r, c = divmod(i, gw)
        out[:, r * p : (r + 1) * p, c * p : (c + 1) * p] = 0
    return out


def test_amortised_lrp_is_its_definition(tiny):
    """seed = u(max(gated, 0)) x u(the networks' prediction from the hand-made features); its 8 rank
    groups each hidden alone; map = u(seed) x (0.05 + u(fall of the class probability))."""
    model, x, t = tiny
    got = methods.get("lrp-amortised")(model, x, t)
    for b in range(2):
        xb, tb = x[b : b + 1], t[b : b + 1]
        maps = {n: methods.get(n)(model, xb, tb)[0].detach() for n in INPUTS}  # each on its own, no sharing
        effect = naive_effect(naive_features(maps))
        seed = unit_range(maps["lrp-gated"].clamp(min=0)[None])[0] * unit_range(effect[None])[0]
        values = seed.flatten().tolist()
        order = sorted(range(16), key=lambda i: (-values[i], i))
        cut = [[order[r] for r in range(16) if r * 8 // 16 == k] for k in range(8)]
        p0 = prob(model, x[b], int(t[b]))
        fall = torch.tensor([p0 - prob(model, hidden(x[b], g), int(t[b])) for g in cut])
        fall = (fall - fall.min()) / (fall.max() - fall.min())
        factor = torch.zeros(16)
        for k, g in enumerate(cut):
            factor[g] = 0.05 + fall[k]
        want = unit_range(seed[None])[0] * factor.reshape(4, 4)
        torch.testing.assert_close(got[b], want, atol=2e-5, rtol=0)
        assert not torch.equal(got[b].argsort(), methods.get("lrp-probed")(model, xb, tb)[0].argsort())
    assert "lrp-amortised" in methods.single_pass() and not methods.get("lrp-amortised").slow


def test_the_predictor_file_is_checked_key_by_key(tmp_path):
    predictor = load_predictor()
    assert len(predictor.nets) == 5 and predictor.std.min() > 0
    state = load_file(str(WEIGHTS))
    broken = dict(state)
    del broken["nets.2.2.bias"]
    save_file(broken, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['nets.2.2.bias'\]"):
        load_predictor(tmp_path / "missing.safetensors")
    wrong = dict(state)
    wrong["mean"] = torch.zeros(1, 40, 1, 1)
    save_file(wrong, str(tmp_path / "shape.safetensors"))
    with pytest.raises(ValueError, match=r"shape.safetensors is not an effect predictor .*mean: \(1, 40, 1, 1\)"):
        load_predictor(tmp_path / "shape.safetensors")


@pytest.mark.slow  # the sanity check's cascade
def test_the_map_changes_when_the_weights_are_randomised(deit_tiny, package_photos):
    """Cascading randomisation (Adebayo et al., NeurIPS 2018) on a real photo: with the trained
    DeiT-Tiny's head randomised, then everything (the cascade's first and last steps), the map's
    ranks no longer follow the trained map's."""
    from vit_demo.images import load_image
    from vit_demo.preprocess import preprocess

    img = load_image(package_photos["astronaut"])
    x = preprocess(img, deit_tiny.input_config(img.size))[0][None]
    model = copy.deepcopy(deit_tiny.model)
    t = torch.tensor([int(model(x).logits.argmax())])
    trained = methods.get("lrp-amortised")(model, x, t)
    again = methods.get("lrp-amortised")(model, x, t)
    assert torch.equal(trained, again)
    g, cascade = torch.Generator().manual_seed(0), stages(model)
    reinit_(cascade[0][1], g)  # the head
    head = float(spearman(trained, methods.get("lrp-amortised")(model, x, t))[0])
    for _, parts in cascade[1:]:  # then every block and the embedding
        reinit_(parts, g)
    everything = float(spearman(trained, methods.get("lrp-amortised")(model, x, t))[0])
    assert head < 0.5 and abs(everything) < 0.3, (head, everything)
