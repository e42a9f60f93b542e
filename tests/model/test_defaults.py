"""The embedded default model: everything uses it with no flags, and a damaged copy gives a
clear error naming the fix, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vit_demo.checkpoints import load as weights
from vit_demo.checkpoints.files import CheckpointError
from vit_demo.checkpoints.load import DEFAULT_SHA256, default_checkpoint, load_model

ROOT = Path(__file__).resolve().parents[2]


def test_default_checkpoint_is_verified() -> None:
    import hashlib

    p = default_checkpoint()
    assert p == ROOT / "weights" / "deit_tiny_patch16_224.safetensors"
    assert hashlib.sha256(p.read_bytes()).hexdigest() == DEFAULT_SHA256


def test_no_flags_loads_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty weights/ folder elsewhere must not matter: no name -> the embedded checkpoint.
    monkeypatch.setenv("VIT_DEMO_WEIGHTS_DIR", str(tmp_path))
    lm = load_model(device="cpu")
    assert lm.timm_name == "deit_tiny_patch16_224" and not lm.random_weights
    assert Path(lm.source.removeprefix("file ")).resolve() == weights.DEFAULT_CHECKPOINT
    assert lm.model.cfg.num_classes == 1000 and lm.labels[0] == "tench"
    # ... and so does naming the default model when weights/ has no file for it
    assert load_model("deit_tiny_patch16_224", device="cpu").source == lm.source


def _damaged(tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "deit_tiny_patch16_224.safetensors"
    data = bytearray(weights.DEFAULT_CHECKPOINT.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "corrupted":
        data[len(data) // 2] ^= 0xFF  # one flipped byte inside a tensor: still parses, wrong numbers
    copy.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("how", ["truncated", "corrupted", "missing"])
def test_damaged_default_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    copy = _damaged(tmp_path, how) if how != "missing" else tmp_path / "deit_tiny_patch16_224.safetensors"
    monkeypatch.setattr(weights, "DEFAULT_CHECKPOINT", copy)
    phrase = "is missing" if how == "missing" else "corrupted or truncated"
    with pytest.raises(CheckpointError, match=phrase) as e:
        load_model(device="cpu")
    assert "git checkout -- weights/" in str(e.value)
    if how != "missing":  # an explicit --weights of the default file is checked too
        with pytest.raises(CheckpointError, match=phrase):
            load_model(weights=copy, device="cpu")


def test_damaged_default_through_the_cli(tmp_path: Path) -> None:
    """The CLI reports it as one line (exit code 2), with no traceback."""
    copy = _damaged(tmp_path, "truncated")
    code = (
        "import sys, pathlib; import vit_demo.checkpoints.load as w\n"
        f"w.DEFAULT_CHECKPOINT = pathlib.Path({str(copy)!r})\n"
        "from vit_demo.cli.main import main\n"
        f"sys.exit(main(['predict', {str(copy)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert "corrupted or truncated" in r.stderr


def test_predict_verify_explain_with_no_flags(package_photos: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    from vit_demo.cli.main import main

    assert main(["predict", str(package_photos["coffee"]), str(package_photos["chelsea"]), "--json"]) == 0
    out = {Path(o["image"]).stem: o["topk"][0]["label"] for o in json.loads(capsys.readouterr().out)}
    assert out["coffee"] == "espresso" and out["chelsea"] in {"Egyptian cat", "tabby", "tiger cat"}
    assert main(["verify", "--images", str(package_photos["coffee"]), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["timm_model"] == "deit_tiny_patch16_224" and rep["passed"] is True
    assert rep["weights"].endswith("weights/deit_tiny_patch16_224.safetensors")
    assert main(["explain", str(package_photos["coffee"]), "--method", "rollout", "--out", str(tmp_path)]) == 0
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())


def test_default_checkpoint_copy_is_not_shadowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another file in weights/ (a user's port) does not replace the default when no model is named."""
    shutil.copy(weights.DEFAULT_CHECKPOINT, tmp_path / "aaa_first.safetensors")
    monkeypatch.setenv("VIT_DEMO_WEIGHTS_DIR", str(tmp_path))
    lm = load_model(device="cpu")
    assert lm.timm_name == "deit_tiny_patch16_224" and "aaa_first" not in lm.source
