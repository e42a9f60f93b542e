"""What the recipe suite (``bench_train.py suite``) measures the ViT against, on the very split
``train`` uses (the same seed and validation share, read by the project's own loader):

- an RBF support-vector machine on the raw pixels (scikit-learn; logistic regression is the
  ``baseline_accuracy`` that ``train`` reports at its end, on the same split);
- a small CNN of about the ViT's parameter count: four conv-BN-ReLU stages and a linear head,
  trained on the same pictures with the project's own batch augmentation, AdamW and a one-cycle
  schedule. A comparison for the benchmark only: the product stays a ViT.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vit_demo.train.augment import eval_batch, train_batch
from vit_demo.train.baseline import pixel_features
from vit_demo.train.data import TrainData, common_size, index_folder, load_folder
from vit_demo.train.recipe import scratch_data_config, scratch_recipe, scratch_size


def split_of(data: Path, val_split: float = 0.2, seed: int = 0) -> tuple[TrainData, object]:
    """The training and validation pictures exactly as ``train --data DATA`` splits and sizes them."""
    index = index_folder(data)
    size = scratch_size(min(common_size(index.files)))
    dc = scratch_data_config(size)
    return load_folder(index, dc, val_split, seed, size, progress=False, warn=lambda m: None), dc


def svm_baseline(d: TrainData) -> dict[str, float]:
    """An RBF-SVM (C=10, scale gamma) on standardised raw pixels (logistic regression is the
    ``baseline_accuracy`` the train command itself reports on the same split)."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    side = min(32, d.val_x.shape[-1])
    t0 = time.perf_counter()
    model = make_pipeline(StandardScaler(), SVC(C=10.0, gamma="scale")).fit(pixel_features(d.train_x, side), d.train_y.numpy())
    acc = float((model.predict(pixel_features(d.val_x, side)) == d.val_y.numpy()).mean())
    return {"svm": round(acc, 4), "svm_s": round(time.perf_counter() - t0, 1)}


def small_cnn(num_classes: int, width: int) -> nn.Sequential:
    """Four 3x3 conv-BN-ReLU stages (width, 2x, 4x, 4x; the middle two halve the grid), global
    average pooling, a linear head."""
    w = [width, 2 * width, 4 * width, 4 * width]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip([3, *w], w)):
        layers += [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]
        layers += [nn.MaxPool2d(2)] if i in (1, 2) else []
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w[-1], num_classes))


def cnn_width_for(params: int, num_classes: int) -> int:
    """The width whose :func:`small_cnn` has the parameter count closest to ``params``."""
    return min(range(8, 129), key=lambda k: abs(sum(p.numel() for p in small_cnn(num_classes, k).parameters()) - params))


def train_cnn(d: TrainData, dc, params: int, epochs: int = 40, seed: int = 0) -> dict[str, float]:
    """The same-size CNN on the same split and augmentation: best and last validation accuracy, seconds."""
    torch.manual_seed(seed)
    n_cls = len(d.classes)
    model = small_cnn(n_cls, cnn_width_for(params, n_cls))
    r = scratch_recipe()
    bs = 64
    steps = max(1, len(d.train_x) // bs)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * steps)
    g = torch.Generator().manual_seed(seed)
    t0, best, acc = time.perf_counter(), 0.0, 0.0
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(d.train_x), generator=g)
        for i in range(steps):
            idx = order[i * bs:(i + 1) * bs]
            loss = F.cross_entropy(model(train_batch(d.train_x[idx], dc, r.augment, g)), d.train_y[idx], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model(eval_batch(d.val_x[i:i + 256], dc)).argmax(-1) for i in range(0, len(d.val_x), 256)])
        acc = float((pred == d.val_y).float().mean())
        best = max(best, acc)
    return {"cnn_best": round(best, 4), "cnn_last": round(acc, 4), "cnn_s": round(time.perf_counter() - t0, 1),
            "cnn_params": sum(p.numel() for p in model.parameters()), "cnn_epochs": epochs}


def loss_gap(history: list[dict]) -> float:
    """Training minus validation loss at the last epoch (positive: the training loss is higher)."""
    last = history[-1]
    return round(last["train_loss"] - last["val_loss"], 4) if not math.isnan(last["val_loss"]) else float("nan")
