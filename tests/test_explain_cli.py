"""``python -m vit_demo explain`` end to end on the real DeiT-Tiny and shared photos: the files
it writes, and that the numbers in its JSON are the library's numbers for that image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_demo.cli.main import main
from vit_demo.images import load_image
from vit_demo.methods.attention import head_maps, mean_attention_distance, pos_embed_similarity, query_attention
from vit_demo.methods.gradients import attention_gradients, chefer_relevance
from vit_demo.methods.rollout import rollout
from vit_demo.preprocess import preprocess

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "vit_demo", "explain", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def model_input(lm, path: Path) -> torch.Tensor:
    return preprocess(load_image(path), lm.data_config)[0][None]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow  # the command in a subprocess
def test_rollout_subprocess(deit_tiny, deit_tiny_path, package_photos, tmp_path):
    img = package_photos["coffee"]
    r = run_cli(str(img), "--weights", str(deit_tiny_path), "--method", "rollout", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    stem = img.stem
    fig, js = tmp_path / f"{stem}_rollout.png", tmp_path / f"{stem}_rollout.json"
    assert fig.is_file() and js.is_file()
    with Image.open(fig) as im:
        assert im.width == 2400
        assert np.asarray(im.convert("L")).std() > 20
    d = read_json(js)
    x = model_input(deit_tiny, img)
    with torch.no_grad():
        out = deit_tiny.model(x, capture=True)
    expected = rollout(out.attentions, out.layout)[0]
    got = torch.tensor(d["map"])
    assert got.shape == (14, 14)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    top1 = int(out.logits.argmax())
    assert d["target"]["index"] == top1 and d["target"]["label"] == deit_tiny.labels[top1]
    assert d["predictions"][0]["index"] == top1 and len(d["predictions"]) == 5
    assert d["method"] == "rollout" and d["settings"]["fusion"] == "mean" and d["grid"] == [14, 14]
    assert d["figure"] == fig.name and d["class_specific"] is False


@pytest.mark.slow  # the command in a subprocess
def test_chefer_folder_with_a_bad_image_subprocess(deit_tiny, deit_tiny_path, package_photos, tmp_path):
    """A folder (linked photos + a broken file), a chosen class, PDF output: the good images
    are explained, the bad one is one line on stderr, and the exit status says so."""
    src = tmp_path / "in"
    src.mkdir()
    photos = [package_photos["chelsea"], package_photos["grace_hopper"]]
    for p in photos:
        (src / p.name).symlink_to(p)
    (src / "broken.jpg").write_bytes(b"this is not a JPEG")
    out = tmp_path / "out"
    r = run_cli(
        str(src),
        "--weights",
        str(deit_tiny_path),
        "--method",
        "chefer",
        "--class",
        "goldfish",
        "--format",
        "pdf",
        "--out",
        str(out),
    )
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "broken.jpg" in errors[0]
    assert "Traceback" not in r.stderr
    for p in photos:
        pdf, js = out / f"{p.stem}_chefer_c1.pdf", out / f"{p.stem}_chefer_c1.json"
        assert pdf.read_bytes()[:5] == b"%PDF-"
        d = read_json(js)
        assert d["target"] == {**d["target"], "index": 1, "label": "goldfish", "source": "--class"}
        ag = attention_gradients(deit_tiny.model, model_input(deit_tiny, p), 1)
        expected = chefer_relevance(ag.attentions, ag.grads, ag.layout)[0]
        torch.testing.assert_close(torch.tensor(d["map"]), expected, atol=1e-5, rtol=1e-4)
    assert not list(out.glob("broken*"))


def test_attention_query_patch_and_heads(deit_tiny, deit_tiny_path, package_photos, tmp_path, capsys):
    img = package_photos["motorcycle"]
    w = str(deit_tiny_path)
    rc = main(
        [
            "explain",
            str(img),
            "--weights",
            w,
            "--method",
            "attention",
            "--layer",
            "5",
            "--head",
            "1",
            "--query-patch",
            "45",
            "--width",
            "2000",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    d = read_json(tmp_path / f"{img.stem}_attention_L5_H1_q45.json")
    x = model_input(deit_tiny, img)
    with torch.no_grad():
        out = deit_tiny.model(x, capture=True)
    expected = query_attention(out.attentions, out.layout, 5, 45, head=1)[0]
    torch.testing.assert_close(torch.tensor(d["map"]), expected, atol=1e-6, rtol=1e-5)
    assert d["settings"]["layer"] == 5 and d["settings"]["head"] == 1 and d["settings"]["query_patch"] == 45
    # the flags keep their meaning (indices from 0); the JSON says it both ways, the figure as people count
    assert d["settings"]["layer_number"] == 6 and d["settings"]["head_number"] == 2
    with Image.open(tmp_path / d["figure"]) as im:
        assert im.width == 2000

    rc = main(
        [
            "explain",
            str(img),
            "--weights",
            w,
            "--method",
            "heads",
            "--layer",
            "all",
            "--format",
            "svg",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    d = read_json(tmp_path / f"{img.stem}_heads_all.json")
    maps = torch.tensor(d["maps"])
    assert maps.shape == (12, 3, 14, 14) and d["map_axes"] == ["layer", "head", "row", "col"]
    torch.testing.assert_close(maps, head_maps(out.attentions, out.layout)[0], atol=1e-6, rtol=1e-5)
    assert b"<svg" in (tmp_path / d["figure"]).read_bytes()[:400]


def test_distance_patch_grid_and_pos_embed(deit_tiny, deit_tiny_path, package_photos, tmp_path):
    img = package_photos["astronaut"]
    w = str(deit_tiny_path)
    assert main(["explain", str(img), "--weights", w, "--method", "distance", "--out", str(tmp_path)]) == 0
    d = read_json(tmp_path / f"{img.stem}_distance.json")
    with torch.no_grad():
        out = deit_tiny.model(model_input(deit_tiny, img), capture=True)
    expected = mean_attention_distance(out.attentions, out.layout, 16)[0]
    torch.testing.assert_close(torch.tensor(d["distances_px"]), expected, atol=1e-4, rtol=1e-5)

    assert (
        main(
            [
                "explain",
                str(img),
                "--weights",
                w,
                "--method",
                "patch-grid",
                "--query-patch",
                "3",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    d = read_json(tmp_path / f"{img.stem}_patch-grid_q3.json")
    assert d["num_tokens"] == 197 and d["tokens"] == ["[class]"]
    assert d["patches"][15] == {"index": 15, "row": 1, "col": 1, "box": [16, 16, 32, 32], "position": 16}

    assert main(["explain", "--weights", w, "--method", "pos-embed", "--out", str(tmp_path)]) == 0
    js = next(tmp_path.glob("*_pos-embed.json"))
    sim = torch.tensor(read_json(js)["similarity"])
    torch.testing.assert_close(sim, pos_embed_similarity(deit_tiny.model), atol=1e-6, rtol=1e-5)
    with Image.open(js.with_suffix(".png")) as im:
        assert im.width == 2400


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--method", "attention", "--layer", "12"], "--layer 12 is outside 0..11"),
        (["--method", "attention", "--head", "3"], "--head 3 is outside 0..2"),
        (["--method", "attention", "--query-patch", "196"], "--query-patch 196 is outside"),
        (["--method", "rollout", "--cmap", "nope"], "unknown colormap"),
        (["--method", "chefer", "--class", "no such class"], "no class has that label"),
        (["--method", "chefer", "--class", "crane"], "names classes 134, 517"),
        (["--method", "rollout", "--layer", "all"], "--layer all is for --method heads"),
    ],
)
def test_bad_settings_stop_early(deit_tiny_path, package_photos, tmp_path, capsys, extra, message):
    rc = main(["explain", str(package_photos["coffee"]), "--weights", str(deit_tiny_path), *extra, "--out", str(tmp_path / "o")])
    assert rc == 2
    *header, error = capsys.readouterr().err.strip().splitlines()  # the model's header line (--precision), then one
    assert message in error and header == ["deit_tiny_patch16_224 on cpu in fp32 (auto: bf16 detection switched off "
                                           "by VIT_DEMO_NO_BF16)"]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
