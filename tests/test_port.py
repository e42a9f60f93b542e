"""Porting: saved files reload without timm; hub requests fail fast offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vit_demo.checkpoints.files import read_checkpoint, save
from vit_demo.checkpoints.load import from_checkpoint, load_model
from vit_demo.checkpoints.timm import HubUnavailableError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a fresh interpreter
def test_save_reload_without_timm(deit_tiny, tmp_path: Path) -> None:
    out = save(deit_tiny.model, deit_tiny.data_config, tmp_path / "deit.safetensors", name="deit_tiny_patch16_224")
    _, meta = read_checkpoint(out)
    assert json.loads(meta["config"])["embed_dim"] == 192
    # A fresh interpreter in which importing timm fails: the file must still load and predict.
    code = (
        "import sys, torch; sys.modules['timm'] = None\n"
        "from vit_demo.checkpoints.load import from_checkpoint\n"
        f"m, dc, meta = from_checkpoint({str(out)!r})\n"
        "x = torch.zeros(1, 3, *dc.input_size)\n"
        "print(float(m(x).logits.sum()), dc.crop_pct, meta['model_name'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    with torch.inference_mode():
        expected = float(deit_tiny.model(torch.zeros(1, 3, 224, 224)).logits.sum())
    total, crop_pct, name = r.stdout.split()
    assert abs(float(total) - expected) < 1e-3 and float(crop_pct) == 0.9 and name == "deit_tiny_patch16_224"


@pytest.mark.parametrize("suffix", [".pth", ".npz"])
def test_other_formats_load(deit_tiny, deit_tiny_path: Path, tmp_path: Path, suffix: str) -> None:
    import numpy as np

    sd, _ = read_checkpoint(deit_tiny_path)
    f = tmp_path / f"deit_tiny_patch16_224{suffix}"
    if suffix == ".pth":
        torch.save({"model": sd}, f)  # a wrapped state_dict, as DeiT releases are
    else:
        np.savez(f, **{k: v.numpy() for k, v in sd.items()})
    model, dc, _ = from_checkpoint(f)  # architecture from the file name
    for k, v in deit_tiny.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_hub_fails_fast_when_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No local weights and no hub: a clear error in seconds, never a minute of retries. The
    hub here is $HF_ENDPOINT pointed at a loopback port nobody listens on (the probe honours it)."""
    from vit_demo.checkpoints.timm import hub_reachable

    port = free_port()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("VIT_DEMO_WEIGHTS_DIR", str(tmp_path))
    assert not hub_reachable()
    t0 = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="--weights FILE"):
        load_model("deit_small_patch16_224")
    assert time.perf_counter() - t0 < 10
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(HubUnavailableError):
        load_model("vit_base_patch16_224")
    assert time.perf_counter() - t0 < 10
    assert list(tmp_path.iterdir()) == []  # nothing half-written into weights/


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_weights_dir_is_searched(deit_tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.symlink(deit_tiny_path, tmp_path / deit_tiny_path.name)
    monkeypatch.setenv("VIT_DEMO_WEIGHTS_DIR", str(tmp_path))
    lm = load_model("deit_tiny_patch16_224", device="cpu")
    assert "deit_tiny_patch16_224.safetensors" in lm.source and not lm.random_weights
