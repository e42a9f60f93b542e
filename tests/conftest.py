"""Shared fixtures. Data in ../shared (real weights, ImageNet sample) is used when present
and the tests that need it skip with a clear reason when it is not (a user's machine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("VIT_DEMO_SHARED", ROOT.parent / "shared"))
DEIT_TINY = ROOT / "weights" / "deit_tiny_patch16_224.safetensors"  # embedded in the repo (weights/README.md)
SAMPLE = SHARED / "imagenet-sample"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"needs {path} (the project's shared data; absent on this machine)")
    return path


@pytest.fixture(scope="session")
def deit_tiny_path() -> Path:
    """The real ImageNet-trained DeiT-Tiny checkpoint (timm layout) that ships in weights/."""
    return DEIT_TINY


@pytest.fixture(scope="session")
def sample_images() -> list[Path]:
    """All 1000 shared ImageNet photos, sorted (class index = position)."""
    return sorted(_need(SAMPLE).glob("*.JPEG"))


@pytest.fixture(scope="session")
def quick_images(sample_images: list[Path]) -> list[Path]:
    """The 100-image quick subset: every 10th file (class indices 0, 10, ..., 990)."""
    return sample_images[::10]


@pytest.fixture(scope="session")
def deit_tiny(deit_tiny_path: Path):
    """LoadedModel: the scratch DeiT-Tiny with the real weights, on the CPU, eval mode."""
    from vit_demo.weights import load_model

    return load_model("deit_tiny_patch16_224", deit_tiny_path, device="cpu")


@pytest.fixture(scope="session")
def deit_tiny_timm(deit_tiny_path: Path):
    """timm's own DeiT-Tiny loaded with the same file, eval mode."""
    import safetensors.torch
    import timm

    tm = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    tm.load_state_dict(safetensors.torch.load_file(str(deit_tiny_path)))
    return tm
