"""CIFAR-10/100 from the python-version files, offline: folders written here in that format
(pickled dicts of bytes keys, as the official archives hold) train with the official split and
report their own class names; a hostile or malformed file stops with one line and runs nothing."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vit_demo.train.cifar import cifar_layout, load_cifar_dir
from vit_demo.train.data import EASY, DataError, render_shape
from vit_demo.train.recipe import scratch_data_config

ROOT = Path(__file__).resolve().parent.parent
NAMES = ["star", "circle", "triangle", "square"]  # not sorted: the order must come from the meta file


def pictures(n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """``n`` easy shapes at 32 px as CIFAR rows (1024 R, 1024 G, 1024 B) and their labels."""
    labels = [i % len(NAMES) for i in range(n)]
    rows = [np.asarray(render_shape(NAMES[c], 32, rng, EASY)[0]).transpose(2, 0, 1).reshape(-1) for c in labels]
    return np.stack(rows).astype(np.uint8), labels


def dump(path: Path, obj: dict) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))  # protocol 2, bytes keys: as the official files


def write_cifar10(root: Path, per_batch: int = 40, test: int = 40, seed: int = 0) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(1, 6):
        x, y = pictures(per_batch, rng)
        dump(root / f"data_batch_{i}", {b"batch_label": f"training batch {i} of 5".encode(), b"labels": y, b"data": x,
                                        b"filenames": [f"{j}.png".encode() for j in range(per_batch)]})
    x, y = pictures(test, rng)
    dump(root / "test_batch", {b"batch_label": b"testing batch 1 of 1", b"labels": y, b"data": x})
    dump(root / "batches.meta", {b"label_names": [n.encode() for n in NAMES], b"num_cases_per_batch": per_batch,
                                 b"num_vis": 3072})
    return root


@pytest.mark.slow  # trains
def test_cifar10_folder_trains_and_reports_its_class_names(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "cifar-10-batches-py")
    out = tmp_path / "cifar.safetensors"
    # the parent folder is found too (the archive unpacks into cifar-10-batches-py/)
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(tmp_path), "--out", str(out), "--epochs", "2",
                        "--batch-size", "32", "--no-progress", "--json"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["classes"] == NAMES and (summary["train_images"], summary["val_images"]) == (200, 40)
    assert f"scratch on CIFAR-10 files in {root}:" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "vit_demo", "predict", str(ROOT / "docs" / "screenshot.png"), "--weights", str(out),
                        "--topk", "4", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(t["label"] for t in json.loads(r.stdout)[0]["topk"]) == sorted(NAMES)


def test_cifar_pictures_arrive_pixel_for_pixel(tmp_path: Path) -> None:
    """CIFAR-100's layout (train / test / meta, fine labels); each row is 32x32 R, then G, then B."""
    root = tmp_path / "cifar-100-python"
    root.mkdir()
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (12, 3072), dtype=np.uint8)
    fine, coarse = [i % 5 for i in range(12)], [0] * 12
    dump(root / "train", {b"data": x, b"fine_labels": fine, b"coarse_labels": coarse, b"filenames": []})
    dump(root / "test", {b"data": x[:5], b"fine_labels": fine[:5], b"coarse_labels": coarse[:5]})
    dump(root / "meta", {b"fine_label_names": [b"apple", b"bee", b"cloud", b"dolphin", b"elephant"],
                         b"coarse_label_names": [b"all"]})
    layout = cifar_layout(tmp_path)
    assert layout is not None and layout.name == "CIFAR-100" and layout.root == root
    data = load_cifar_dir(layout, scratch_data_config(32))
    assert data.classes == ["apple", "bee", "cloud", "dolphin", "elephant"]
    assert torch.equal(data.train_y, torch.tensor(fine)) and data.val_x.shape == (5, 3, 32, 32)
    assert data.train_x[3, 1, 2, 7] == x[3, 1024 + 2 * 32 + 7] and torch.equal(data.train_x.flatten(1), torch.from_numpy(x))
    bigger = load_cifar_dir(layout, scratch_data_config(48), store_size=48)  # another model size: resized
    assert bigger.train_x.shape == (12, 3, 48, 48) and bigger.val_x.shape == (5, 3, 48, 48)


class Exploit:
    """A pickle that runs a shell command when loaded with the plain pickle module."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.slow  # commands in subprocesses
def test_hostile_or_malformed_files_stop_in_one_line(tmp_path: Path) -> None:
    root = write_cifar10(tmp_path / "c", per_batch=4, test=4)
    layout = cifar_layout(root)
    marker = tmp_path / "pwned"
    dump(root / "data_batch_3", {b"data": Exploit(marker), b"labels": [0]})
    with pytest.raises(DataError, match=r"data_batch_3: not a CIFAR python batch file .*refused to load (posix|nt).system"):
        load_cifar_dir(layout, scratch_data_config(32))
    assert not marker.exists()  # nothing ran
    write_cifar10(tmp_path / "d", per_batch=4, test=4)
    root = tmp_path / "d"
    dump(root / "data_batch_2", {b"data": np.zeros((4, 3000), np.uint8), b"labels": [0] * 4})
    with pytest.raises(DataError, match="uint8 rows of 3072 values"):
        load_cifar_dir(cifar_layout(root), scratch_data_config(32))
    dump(root / "data_batch_2", {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 9]})
    with pytest.raises(DataError, match=r"labels outside 0..3"):
        load_cifar_dir(cifar_layout(root), scratch_data_config(32))
    (root / "data_batch_2").write_bytes(b"\x80\x02garbage")
    with pytest.raises(DataError, match="data_batch_2: not a CIFAR python batch file"):
        load_cifar_dir(cifar_layout(root), scratch_data_config(32))
    (root / "data_batch_2").unlink()
    with pytest.raises(DataError, match="CIFAR-10 folder without data_batch_2"):
        load_cifar_dir(cifar_layout(root), scratch_data_config(32))
    # through the command: one line on stderr, exit code 2
    r = subprocess.run([sys.executable, "-m", "vit_demo", "train", "--data", str(root), "--out", str(tmp_path / "m.safetensors")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "without data_batch_2" in r.stderr, r.stderr
