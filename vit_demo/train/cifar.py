"""CIFAR-10 and CIFAR-100 from the python-version batch files, offline, with the official split.

A folder holding the files of ``cifar-10-python.tar.gz`` (``data_batch_1`` .. ``data_batch_5``,
``test_batch``, ``batches.meta``) or of ``cifar-100-python.tar.gz`` (``train``, ``test``,
``meta``), or the folder those archives unpack into (``cifar-10-batches-py``,
``cifar-100-python``), trains on the training files and validates on the test file, with the
class names from the meta file (CIFAR-100: the 100 fine labels).

The files are pickles, and unpickling can run code: they are read by an unpickler that builds
only dicts, lists, strings, numbers and numpy arrays, and refuses anything else in one line.
``--data cifar10`` / ``cifar100`` download the archives once through torchvision (when online)
and read them the same way.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.annotations import DataError
from ..preprocess import DataConfig, model_input_image
from .data import TrainData

# what a CIFAR pickle may build: numpy's array reconstruction (numpy 1 and 2 module names) and
# the bytes codec protocol 2 uses for raw bytes; nothing that can run code
SAFE_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}
MAX_BATCH_BYTES = 1 << 30  # 1 GiB: the largest CIFAR file is 150 MB


@dataclass(frozen=True)
class CifarLayout:
    """Which files of a CIFAR folder hold what."""

    root: Path
    name: str  # "CIFAR-10" or "CIFAR-100"
    train: tuple[str, ...]
    test: str
    meta: str
    labels_key: str  # "labels" or "fine_labels"
    names_key: str  # "label_names" or "fine_label_names"


def cifar_layout(root: str | os.PathLike) -> CifarLayout | None:
    """The CIFAR files in ``root`` (or in the folder the archive unpacks into), None if there are none."""
    root = Path(root)
    for d in (root, root / "cifar-10-batches-py", root / "cifar-100-python"):
        if (d / "batches.meta").is_file() and (d / "test_batch").is_file():
            return CifarLayout(d, "CIFAR-10", tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch",
                               "batches.meta", "labels", "label_names")
        if (d / "meta").is_file() and (d / "train").is_file() and (d / "test").is_file():
            return CifarLayout(d, "CIFAR-100", ("train",), "test", "meta", "fine_labels", "fine_label_names")
    return None


class SafeUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays only; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name} (a CIFAR file holds only arrays and lists)")


def read_pickle(path: Path) -> dict[str, Any]:
    """A CIFAR batch or meta file as a dict with str keys (the files' keys are bytes or str)."""
    try:
        if path.stat().st_size > MAX_BATCH_BYTES:
            raise DataError(f"{path}: {path.stat().st_size:,} bytes, larger than any CIFAR file")
        obj = SafeUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from e
    except Exception as e:  # a corrupt or hostile pickle: one line, never a traceback
        raise DataError(f"{path}: not a CIFAR python batch file ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a CIFAR python batch file (holds a {type(obj).__name__}, not a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def read_batch(path: Path, labels_key: str, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch file -> pictures [N, 3, 32, 32] uint8 and labels [N], checked."""
    d = read_pickle(path)
    if "data" not in d or labels_key not in d:
        raise DataError(f"{path}: no 'data' / '{labels_key}' entries (keys: {', '.join(sorted(d))})")
    data = d["data"]
    if isinstance(data, (bytes, bytearray)):
        data = np.frombuffer(data, np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.size % 3072:
        raise DataError(f"{path}: 'data' must be uint8 rows of 3072 values (32 x 32 x 3, channel by channel)")
    x = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, 3, 32, 32).copy())
    try:
        y = torch.tensor([int(v) for v in d[labels_key]], dtype=torch.long)
    except (TypeError, ValueError) as e:
        raise DataError(f"{path}: '{labels_key}' must be a list of class indices") from e
    if len(y) != len(x) or (len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes)):
        raise DataError(f"{path}: {len(x)} pictures but {len(y)} labels, or labels outside 0..{num_classes - 1}")
    return x, y


def class_names(layout: CifarLayout) -> list[str]:
    names = read_pickle(layout.root / layout.meta).get(layout.names_key)
    if not isinstance(names, (list, tuple)) or len(names) < 2:
        raise DataError(f"{layout.root / layout.meta}: no '{layout.names_key}' list of class names")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


def resized(x: torch.Tensor, dc: DataConfig) -> torch.Tensor:
    """32 px pictures through ``dc``'s resize + crop (unchanged when it is 32 x 32 already)."""
    if tuple(dc.input_size) == (32, 32):
        return x
    out = [torch.from_numpy(np.array(model_input_image(Image.fromarray(a.permute(1, 2, 0).numpy()), dc))).permute(2, 0, 1)
           for a in x]
    return torch.stack(out).contiguous()


def load_cifar_dir(layout: CifarLayout, dc: DataConfig, store_size: int = 32) -> TrainData:
    """The official split: the training files to ``store_size`` squares, the test file through the
    eval transform ``dc`` as validation. Files that are missing or malformed stop with one line."""
    names = class_names(layout)
    missing = [f for f in (*layout.train, layout.test) if not (layout.root / f).is_file()]
    if missing:
        raise DataError(f"{layout.root}: {layout.name} folder without {', '.join(missing)}")
    parts = [read_batch(layout.root / f, layout.labels_key, len(names)) for f in layout.train]
    tx, ty = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    vx, vy = read_batch(layout.root / layout.test, layout.labels_key, len(names))
    absent = [names[c] for c in range(len(names)) if not (ty == c).any()]
    if absent:
        raise DataError(f"{layout.root}: no training picture of class(es) {', '.join(absent[:8])}")
    store = DataConfig(input_size=(store_size, store_size), crop_pct=1.0, mean=dc.mean, std=dc.std)
    return TrainData(names, resized(tx, store), ty, resized(vx, dc), vy, 0, f"{layout.name} files in {layout.root}")


# ----------------------------------------------------------------------------- downloads

CIFAR_HOST = ("www.cs.toronto.edu", 443)
DOWNLOADS = {"cifar10": ("CIFAR10", "cifar-10-batches-py"), "cifar100": ("CIFAR100", "cifar-100-python")}


def cifar_cache(which: str = "cifar10") -> Path:
    return Path(os.environ.get("VIT_DEMO_DATA", Path.home() / ".cache" / "vit_demo")) / which


def download_cifar(which: str = "cifar10") -> CifarLayout:
    """The archive unpacked in the cache (downloaded once through torchvision, checksum-checked);
    offline with no cache it fails fast (a 3 s connect, no retries), in one line."""
    cls_name, folder = DOWNLOADS[which]
    root = cifar_cache(which)
    layout = cifar_layout(root / folder)
    if layout is not None:
        return layout
    try:
        import torchvision.datasets as tvd
    except ImportError as e:
        raise DataError(f"--data {which} needs torchvision to download (pip install torchvision), "
                        f"or pass the folder of the python-version files you have") from e
    try:
        socket.getaddrinfo(*CIFAR_HOST)
        socket.create_connection(CIFAR_HOST, timeout=3.0).close()
    except OSError as e:
        raise DataError(f"--data {which}: cannot download {cls_name[:5]}-{cls_name[5:]} (no network: {e.strerror or e}); "
                        f"pass the folder of its python-version files instead, or train on a local folder, "
                        f"e.g. `python -m vit_demo data shapes --out DIR`") from e
    getattr(tvd, cls_name)(str(root), train=True, download=True)
    layout = cifar_layout(root / folder)
    if layout is None:
        raise DataError(f"--data {which}: the download did not leave the expected files in {root / folder}")
    return layout
