"""Captions that interpret a chart are computed from that chart's numbers: the Model diagnostics tab's
(mean attention distance against the even spread, the position-embedding similarity's grid) and the
rollout sentence. DeiT-Tiny's charts show local heads early, far heads late and a learned 2-D grid; an
untrained model's and a briefly trained one's show none of it, and their captions must say so."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, random_shapes_checkpoint
from PIL import Image

from vit_demo.analysis import analyze
from vit_demo.checkpoints.load import load_model
from vit_demo.methods.attention import grid_structure, pos_embed_similarity

DEIT_SAYS = ("learned the 2-D grid", "look locally", "Attention reaches farther with depth")


def diagnostics():
    from vit_demo.app.tabs import diagnostics as D

    return D


def naive_structure(sim: np.ndarray) -> dict[str, float]:
    """grid_structure written pair by pair from its docstring (Spearman: Pearson of average ranks)."""
    n, gh, gw = sim.shape
    rows = []
    for i, j in itertools.permutations(range(n), 2):
        (ri, ci), (rj, cj) = divmod(i, gw), divmod(j, gw)
        rows.append((sim.reshape(n, n)[i, j], abs(ri - rj), abs(ci - cj), ((ri - rj) ** 2 + (ci - cj) ** 2) ** 0.5))
    s, dr, dc, d = (np.array(c, dtype=float) for c in zip(*rows))

    def ranks(x):
        order = sorted(range(len(x)), key=lambda k: x[k])
        r = np.empty(len(x))
        k = 0
        while k < len(order):
            m = k
            while m + 1 < len(order) and x[order[m + 1]] == x[order[k]]:
                m += 1
            r[order[k:m + 1]] = (k + m) / 2 + 1
            k = m + 1
        return r

    return {"rank_corr": float(np.corrcoef(ranks(s), ranks(-d))[0, 1]), "across": s[(dr == 0) & (dc == 1)].mean(),
            "down": s[(dr == 1) & (dc == 0)].mean(), "far": s[d >= d.max() / 2].mean(), "same_row": s[dr == 0].mean(),
            "same_col": s[dc == 0].mean(), "other": s[(dr > 0) & (dc > 0)].mean()}


def test_grid_structure_matches_pair_by_pair():
    gen = torch.Generator().manual_seed(0)
    sim = torch.rand(20, 4, 5, generator=gen).round(decimals=1)  # ties on purpose
    got, want = grid_structure(sim), naive_structure(sim.numpy())
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k


def test_deit_tiny_captions_say_what_its_charts_show(deit_tiny, package_photos):
    D = diagnostics()
    a = analyze(deit_tiny, Image.open(package_photos["coffee"]).convert("RGB"))
    d, even = D.distances(a)
    assert even == pytest.approx(116.5, abs=0.1)  # a 14 x 14 grid of 16-px patches
    cap = D.distance_caption(d, even)
    k = d.shape[0] // 3
    n_local = int((d[:k] / even < D.LOCAL).sum())
    assert n_local >= 3 and f"In layers 1–4, {n_local} of 12 heads look locally" in cap, cap
    assert f"the nearest {d[:k].min():.0f} px" in cap
    assert "Attention reaches farther with depth" in cap
    pos = D.pos_caption(deit_tiny)
    g = grid_structure(pos_embed_similarity(deit_tiny.model))
    assert "**This model learned the 2-D grid**" in pos, pos
    assert f"neighbours {g['across']:.2f} across and {g['down']:.2f} down" in pos and g["rank_corr"] > 0.6
    assert "Patches in the same row or column are alike too" in pos


def test_an_untrained_model_is_said_to_have_none_of_it(tmp_path: Path):
    D = diagnostics()
    lm = load_model(weights=random_shapes_checkpoint(tmp_path / "random.safetensors"), device="cpu", progress=False)
    a = analyze(lm, Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)))
    cap, pos = D.distance_caption(*D.distances(a)), D.pos_caption(lm)
    assert "**Every head of every layer sits on it** (17 px)" in cap, cap
    assert "**No 2-D grid**" in pos, pos
    for claim in DEIT_SAYS:
        assert claim not in cap + pos


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A ViT trained here for 8 epochs on 240 pictures of shapes (one torch thread: the same model on
    every run): val accuracy about 0.4, its attention still spread evenly, no grid in its embeddings."""
    from vit_demo.train.data import EASY, make_shapes

    root = tmp_path_factory.mktemp("trained")
    make_shapes(root / "shapes", per_class=60, size=32, seed=1, progress=False, style=EASY)
    out = root / "shapes.safetensors"
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(root / "shapes"), "--out", str(out),
                        "--epochs", "8", "--batch-size", "16", "--lr", "2e-3", "--seed", "3", "--no-progress",
                        "--precision", "fp32", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["epochs"] == 8
    return out


@pytest.mark.slow
def test_a_trained_model_whose_charts_say_the_opposite(trained: Path, package_photos):
    """The issue's case: a model trained in the app, every head near the even spread, no grid. Its
    captions say that, with its numbers, and none of DeiT-Tiny's claims; the tab sends them with the charts."""
    D = diagnostics()
    lm = load_model(weights=trained, device="cpu", progress=False)
    a = analyze(lm, Image.open(package_photos["coffee"]).convert("RGB"))
    d, even = D.distances(a)
    assert (d / even).min() >= D.FAR  # what its chart shows: no head anywhere near local
    g = grid_structure(pos_embed_similarity(lm.model))
    assert g["rank_corr"] < D.TRACE
    cap, pos = D.distance_caption(d, even), D.pos_caption(lm)
    assert f"**No head of any layer looks locally**: every one sits at {(d / even).min():.0%}" in cap, cap
    assert "**No 2-D grid**" in pos and f"rank correlation of similarity with closeness {g['rank_corr']:.2f}" in pos
    for claim in DEIT_SAYS:
        assert claim not in cap + pos

    class Reg:  # what the tab asks of the registry
        def default_key(self):
            return "m"

        def model_picture(self, key, what, draw):
            return draw(lm)

    class Sess:
        analysis, model_key, model_views = a, "m", {}

    tab = D.DiagnosticsTab()
    tab.dist_img, tab.dist_md, tab.pos_img, tab.pos_md, tab._reg = "dist", "dist_md", "pos", "pos_md", Reg()
    out = tab.lazy(Sess())
    assert out["dist_md"] == cap and out["pos_md"] == pos
    assert tab.model_view(Sess()) == {}  # sent once per model


def test_distance_caption_reads_any_shape_of_chart():
    D = diagnostics()
    even = 100.0
    late_near = np.array([[95, 100, 90], [90, 95, 99], [60, 40, 45], [30, 35, 20]], dtype=float)
    cap = D.distance_caption(late_near, even)
    assert "In layer 1, no head looks locally (the nearest at 90 px) and 3 far" in cap, cap
    assert "in layer 4, 0 of 3 look far, 3 locally (20–35 px)" in cap
    assert "less far in the late layers than in the early ones" in cap
    flat = np.array([[30, 95, 60], [35, 90, 55], [40, 92, 58]], dtype=float)
    assert "about as far in the late layers as in the early ones" in D.distance_caption(flat, even)
    one = D.distance_caption(np.array([[20.0, 100.0]]), even)
    assert one.endswith("In layer 1, 1 of 2 heads look locally (under half that distance, the nearest 20 px) and 1 far "
                        "(at 85% of it or more).")


def test_position_caption_tells_reading_order_from_a_grid():
    """A 1-D embedding of the reading order (each token like the tokens just before and after it in the
    sequence, not like the one below it): the caption says the order along the row, not the grid."""
    D = diagnostics()
    gh = gw = 8
    i = torch.arange(gh * gw, dtype=torch.float64)[:, None]
    freqs = torch.linspace(0.0, 1 / 16, 48, dtype=torch.float64)[None]  # alike within a few steps, not 8 (a row) apart
    codes = torch.cat([torch.cos(2 * torch.pi * i * freqs), torch.sin(2 * torch.pi * i * freqs)], 1).float()

    class Model:
        pos_embed = codes

    class Lm:
        model = Model()

    sim = torch.nn.functional.normalize(codes, dim=-1)
    sim = (sim @ sim.T).reshape(gh * gw, gh, gw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "pos_embed_similarity", lambda model: sim)
        cap = D.pos_caption(Lm())
    assert "**This model learned the order along its row (the reading order) only**" in cap, cap


def test_rollout_caption_parses_without_a_class_token():
    from vit_demo.app.tabs.relevance import methods_caption
    from vit_demo.checkpoints.load import LoadedModel
    from vit_demo.model import VisionTransformer, ViTConfig
    from vit_demo.preprocess import DataConfig

    torch.manual_seed(0)
    cfg = ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=4,
                    class_token=False, global_pool="avg")
    lm = LoadedModel(VisionTransformer(cfg).eval(), DataConfig(input_size=(32, 32)), "avgpool", "test", None,
                     class_names=("a", "b", "c", "d"))
    a = analyze(lm, Image.new("RGB", (32, 32), "gray"))
    cap = methods_caption(a, "mean", 0.0, 0, None)
    assert ("**Attention rollout**: which patches the patch tokens draw their information from, through all the "
            "layers (averaged over the patch tokens") in cap, cap
    assert "on average from" not in cap
