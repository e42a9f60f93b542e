"""The CLI as a script would use it: JSON shapes, exit codes, folders, porting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "vit_demo", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


@pytest.mark.slow  # the command in a subprocess
def test_predict_json(deit_tiny_path: Path, labelled_photos: list[tuple[Path, frozenset[str]]], tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    photos = [p for p, _ in labelled_photos]
    for i, p in enumerate(photos[:3]):
        os.symlink(p, folder / f"{i}_{p.name}")  # sorted order = this order
    r = run("predict", str(folder), str(photos[3]), "--weights", str(deit_tiny_path), "--topk", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [Path(o["image"]).name for o in out] == [f"{i}_{p.name}" for i, p in enumerate(photos[:3])] + [photos[3].name]
    for o, (_, accepted) in zip(out, labelled_photos):
        assert len(o["topk"]) == 3 and set(o["topk"][0]) == {"index", "label", "prob"}
        probs = [t["prob"] for t in o["topk"]]
        assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
        assert o["topk"][0]["label"] in accepted, (o["image"], o["topk"])


@pytest.mark.slow  # the command in a subprocess
def test_verify_json_and_exit_code(deit_tiny_path: Path, labelled_photos: list, tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for p, _ in labelled_photos[:4]:
        os.symlink(p, folder / p.name)
    r = run("verify", "--model", "deit_tiny_patch16_224", "--weights", str(deit_tiny_path), "--images", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    for key in ("model", "images", "max_abs_logit_diff", "max_abs_prob_diff", "top1_agreement", "top5_agreement",
                "scratch_ms_per_image", "timm_ms_per_image", "timing", "passed"):
        assert key in rep, key
    assert rep["scratch_ms_per_image"] > 0 and rep["timm_ms_per_image"] > 0
    assert rep["timing"] == "median of 3 interleaved runs on 4 images, wall clock"
    assert rep["images"] == 4 and rep["passed"] is True and rep["top1_agreement"] == 1.0
    assert rep["max_abs_logit_diff"] <= 1e-4
    # An impossible tolerance makes it fail, with a non-zero exit code.
    r = run("verify", "--model", "vit_tiny_patch16_224", "--random-init", "--tol", "-1", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["passed"] is False


def test_verify_times_both_models_interleaved() -> None:
    """Each model's time is the median of three runs, the two interleaved and the order alternating,
    so that a machine busy for a moment weighs on both; the outputs are the first runs'."""
    from vit_demo.checkpoints.verify import time_both

    calls: list[str] = []
    slow = iter([0.2, 0.0, 0.0])  # f's first run is held up: the median leaves it out

    def f(x: torch.Tensor) -> torch.Tensor:
        calls.append("f")
        time.sleep(next(slow))
        return x + len(calls)

    def g(x: torch.Tensor) -> torch.Tensor:
        calls.append("g")
        return x * 0 + len(calls)

    a, b, tf, tg = time_both(f, g, torch.zeros(2))
    assert calls == ["f", "g", "g", "f", "f", "g"]
    assert a.tolist() == [1.0, 1.0] and b.tolist() == [2.0, 2.0]
    assert 0 <= tf < 0.2 and 0 <= tg < 0.2


@pytest.mark.slow  # the command in a subprocess
def test_verify_random_init_non_square() -> None:
    r = run("verify", "--model", "deit3_small_patch16_224", "--random-init", "--input-size", "256x384", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["input_size"] == [256, 384]


@pytest.mark.slow  # commands in subprocesses
def test_port_then_predict(deit_tiny_path: Path, package_photos: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "deit.safetensors"
    r = run("port", "--model", "deit_tiny_patch16_224", "--from", str(deit_tiny_path), "--out", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr
    a = run("predict", str(package_photos["chelsea"]), "--weights", str(out), "--json")
    b = run("predict", str(package_photos["chelsea"]), "--weights", str(deit_tiny_path), "--json")
    assert json.loads(a.stdout)[0]["topk"] == json.loads(b.stdout)[0]["topk"]


@pytest.mark.slow  # commands in subprocesses
def test_errors_are_one_line(tmp_path: Path) -> None:
    r = run("predict", str(tmp_path / "missing.jpg"), "--model", "deit_tiny_patch16_224", "--random-init")
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr  # predict takes no --random-init
    r = run("verify", "--model", "no_such_model_xyz", "--random-init")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no_such_model_xyz" in r.stderr


def test_python_m_vit_demo_is_the_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``python -m vit_demo`` (vit_demo/__main__.py) runs the command line and exits with its status,
    here in this process (the tests above start it in a fresh one): --help lists every command."""
    import runpy

    from vit_demo.cli.main import COMMANDS

    monkeypatch.setattr(sys, "argv", ["vit_demo", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("vit_demo", run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and all(c.__name__.rsplit(".", 1)[1] in out for c in COMMANDS)
