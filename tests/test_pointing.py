"""The pointing game against a naive reference: box -> model input by pushing a drawn box
through the real eval transform, patch coverage by counting sub-pixels, and scores by loops."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_shapes_checkpoint
from PIL import Image

from vit_demo import methods
from vit_demo.evaluate.geometry import box_to_input, hit_patches, patch_coverage
from vit_demo.evaluate.pointing import score_maps
from vit_demo.preprocess import DataConfig, model_input_image
from vit_demo.train.data import make_shapes

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("size, dc", [((32, 32), DataConfig(input_size=(32, 32), crop_pct=1.0)),
                                      ((80, 60), DataConfig(input_size=(32, 32), crop_pct=0.875)),
                                      ((50, 90), DataConfig(input_size=(48, 48), crop_pct=0.9))])
def test_box_follows_the_eval_transform(size: tuple[int, int], dc: DataConfig) -> None:
    w, h = size
    box = (0.3 * w, 0.2 * h, 0.8 * w, 0.75 * h)
    mask = Image.new("RGB", size)
    mask.paste((255, 255, 255), tuple(round(v) for v in box))
    seen = np.asarray(model_input_image(mask, DataConfig(**{**dc.to_dict(), "interpolation": "nearest"})))[..., 0] > 127
    ys, xs = np.nonzero(seen)
    naive = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)  # the drawn box as the model sees it
    assert np.allclose(box_to_input(box, size, dc), naive, atol=1.5)


def naive_coverage(box, grid, patch, sub: int = 32) -> torch.Tensor:
    out = torch.zeros(grid, dtype=torch.float64)
    for i in range(grid[0]):
        for j in range(grid[1]):
            inside = 0
            for a in range(sub):
                for b in range(sub):
                    x, y = (j + (b + 0.5) / sub) * patch, (i + (a + 0.5) / sub) * patch
                    inside += box[0] <= x < box[2] and box[1] <= y < box[3]
            out[i, j] = inside / sub**2
    return out


def test_coverage_hits_and_scores_match_naive_loops() -> None:
    g = torch.Generator().manual_seed(0)
    boxes = [(3.2, 5.0, 17.5, 30.1), (0.0, 0.0, 32.0, 32.0), (13.1, 13.2, 14.0, 14.5), (20.0, 2.5, 31.9, 11.0)]
    covs, hits = [], []
    for box in boxes:
        cov = patch_coverage(box, (8, 8), 4)
        assert torch.allclose(cov, naive_coverage(box, (8, 8), 4), atol=1 / 32 + 1e-9)
        hit = hit_patches(box, (8, 8), 4)
        centres = [(i, j) for i in range(8) for j in range(8)
                   if box[0] <= 4 * j + 2 <= box[2] and box[1] <= 4 * i + 2 <= box[3]]
        assert {tuple(t) for t in hit.nonzero().tolist()} == set(centres or [(3, 3)])  # tiny box: its centre's patch
        covs.append(cov)
        hits.append(hit)
    maps = torch.randn(4, 8, 8, generator=g, dtype=torch.float64)
    maps[1] = 0  # no positive mass: counts as uniform
    hit, share = score_maps(maps, torch.stack(covs), torch.stack(hits))
    for b in range(4):
        m = maps[b].flatten()
        k = max(range(64), key=lambda i: m[i])
        assert hit[b] == float(hits[b].flatten()[k])
        pos = [max(0.0, float(v)) for v in m]
        tot = sum(pos)
        ref = sum((p / tot if tot else 1 / 64) * float(c) for p, c in zip(pos, covs[b].flatten()))
        assert share[b] == pytest.approx(ref, abs=1e-9)


@pytest.mark.slow  # the pointing game, every method
def test_pointing_cli_covers_every_method(tmp_path: Path) -> None:
    make_shapes(tmp_path / "shapes", per_class=3, size=32, seed=5, progress=False)
    ckpt = random_shapes_checkpoint(tmp_path / "random.safetensors")
    r = subprocess.run([sys.executable, "-m", "vit_demo", "pointing", "--data", str(tmp_path / "shapes"), "--weights",
                        str(ckpt), "--methods", "all", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["images"] == 12 and res["grid"] == [8, 8] and list(res["methods"]) == methods.names()
    for m in [*res["methods"].values(), res["random"]]:
        assert 0 <= m["pointing_accuracy"] <= 1 and 0 < m["mass_in_box"] < 1
    assert 0 < res["baseline"]["box_area_share"] < res["baseline"]["hit_patch_share"] + 0.2
    r = subprocess.run([sys.executable, "-m", "vit_demo", "pointing", "--data", str(tmp_path / "shapes"), "--weights",
                        str(ckpt), "--methods", "nonsense"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "unknown method" in r.stderr and "lrp-causal, all" in r.stderr
