"""``--model NAME`` with no local file, online: timm downloads the pretrained weights through
huggingface_hub (here from a stand-in hub on 127.0.0.1, via $HF_ENDPOINT), with a progress bar;
they are ported once to weights/NAME.safetensors and the next start makes no request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_server import fake_hub

ROOT = Path(__file__).resolve().parent.parent
NAME = "vit_tiny_patch16_224"  # timm fetches timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k/model.safetensors


def hub_checkpoint() -> tuple[str, bytes, torch.nn.Module]:
    """A timm checkpoint for NAME made here (seeded random weights), as the hub would serve it."""
    import timm
    from safetensors.torch import save

    torch.manual_seed(0)
    tm = timm.create_model(NAME, pretrained=False).eval()
    repo = timm.models.get_pretrained_cfg(NAME).hf_hub_id
    return repo, save({k: v.contiguous() for k, v in tm.state_dict().items()}), tm


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The CLI with stderr on a pseudo-terminal, as in a user's terminal: huggingface_hub draws its
    progress bar only on a TTY."""
    import fcntl
    import pty
    import struct
    import termios
    import threading

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns (tqdm sizes its bar)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not b:
                return
            chunks.append(b)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        r = subprocess.run([sys.executable, "-m", "vit_demo", *args], stdout=subprocess.PIPE, stderr=slave, text=True,
                           cwd=ROOT, env=env, timeout=600)
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    r.stderr = b"".join(chunks).decode(errors="replace")
    return r


@pytest.mark.slow  # commands in subprocesses
def test_download_port_and_offline_second_start(tmp_path: Path, package_photos: dict[str, Path]) -> None:
    repo, data, tm = hub_checkpoint()
    weights = tmp_path / "weights"
    photo = str(package_photos["coffee"])
    with fake_hub({repo: {"model.safetensors": data}}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "VIT_DEMO_WEIGHTS_DIR": str(weights), "HF_HUB_DISABLE_TELEMETRY": "1"}
        env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        r = run(env, "predict", photo, "--model", NAME, "--json", "--device", "cpu")
        assert r.returncode == 0, r.stderr
        # the download: one GET of the weights from our hub, and the blob in the HF cache under HF_HOME
        # (huggingface_hub may also ask for /api/agent-harnesses, its user-agent registry: answered 404)
        gets = [p for m, p in hub.requests if m == "GET" and "/resolve/" in p]
        assert gets == [f"/{repo}/resolve/main/model.safetensors"], hub.requests
        blobs = list((tmp_path / "hf").rglob("blobs/*"))
        assert [b.stat().st_size for b in blobs] == [len(data)]
        # the progress output: huggingface_hub's tqdm bar for the file, and our two lines
        assert "model.safetensors" in r.stderr and "100%" in r.stderr, r.stderr
        assert "downloading timm's pretrained weights" in r.stderr and "ported to" in r.stderr
        # the port: weights/NAME.safetensors, a self-describing file holding exactly timm's weights
        out = weights / f"{NAME}.safetensors"
        from vit_demo.checkpoints.files import read_checkpoint

        sd, meta = read_checkpoint(out)
        assert meta["model_name"] == NAME and meta["source"] == f"hub:{NAME}"
        assert all(torch.equal(sd[k], v) for k, v in tm.state_dict().items())
        first = json.loads(r.stdout)[0]["topk"]

        # the second start: no request at all, same answer
        before = len(hub.requests)
        r = run(env, "predict", photo, "--model", NAME, "--json", "--device", "cpu")
        assert r.returncode == 0, r.stderr
        assert len(hub.requests) == before, hub.requests[before:]
        assert json.loads(r.stdout)[0]["topk"] == first
        assert "downloading" not in r.stderr


@pytest.mark.slow  # the command in a subprocess
def test_unknown_file_on_the_hub_is_a_clear_error(tmp_path: Path, package_photos: dict[str, Path]) -> None:
    """The hub answers but has no such weights: one line, no traceback, nothing in weights/."""
    with fake_hub({}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
               "VIT_DEMO_WEIGHTS_DIR": str(tmp_path / "weights")}
        r = run(env, "predict", str(package_photos["coffee"]), "--model", NAME)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error:") and NAME in r.stderr
    assert not (tmp_path / "weights" / f"{NAME}.safetensors").exists()


@pytest.mark.parametrize("endpoint,address", [
    ("http://127.0.0.1:8123", ("127.0.0.1", 8123)),
    ("https://hub.example.org/", ("hub.example.org", 443)),
    ("", ("huggingface.co", 443)),
])
def test_probe_honours_hf_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str, address: tuple) -> None:
    from vit_demo.checkpoints.timm import hub_address

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert hub_address() == address
