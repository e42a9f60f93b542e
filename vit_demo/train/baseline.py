"""What a run is measured against, and what its curves say.

- :func:`pixel_baseline`: logistic regression on the raw pixels (scikit-learn), trained on the same
  training pictures and scored on the same validation split as the ViT: seconds of work that tell
  whether the ViT learned more than the pixels alone give away.
- :func:`fit_verdict`: under-fit, over-fit or neither, in words, from the loss curves.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

BASELINE_SIDE = 32  # pictures larger than this are area-averaged down to it for the baseline
BASELINE_PICTURES = 10_000  # at most this many training pictures (a seeded sample): seconds, not minutes
STILL_FALLING = 0.03  # the training loss fell by more than this share over the last fifth of the epochs
OVERFIT_RISE = 0.05  # over-fit: the validation loss ended more than this share above its lowest point ...
END_EPOCHS = 3  # ... "ended": the mean of the last (up to) 3 epochs, after the lowest one


def pixel_features(x: torch.Tensor, side: int) -> np.ndarray:
    """uint8 pictures [N, 3, h, w] -> [N, 3 * side * side] floats in [0, 1] (area-averaged)."""
    x = x.float() / 255
    if x.shape[-1] != side or x.shape[-2] != side:
        x = F.interpolate(x, size=(side, side), mode="area")
    return x.flatten(1).numpy()


def pixel_baseline(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                   seed: int = 0) -> tuple[float | None, float]:
    """(validation accuracy, seconds) of a standardised logistic regression on the raw pixels (of at
    most :data:`BASELINE_PICTURES` training pictures); (None, 0) without validation pictures."""
    if len(val_x) == 0:
        return None, 0.0
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    if len(train_x) > BASELINE_PICTURES:
        keep = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(seed))[:BASELINE_PICTURES]
        train_x, train_y = train_x[keep], train_y[keep]
    side = min(BASELINE_SIDE, val_x.shape[-1], val_x.shape[-2])
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=300, random_state=seed))
    # one BLAS thread: on 2 cores that other jobs share, two OpenBLAS threads took 132 s for the 3,200
    # pictures of a 32-px set where one took 5.6 s (load 7; docs/training.md)
    with warnings.catch_warnings(), threadpool_limits(1):  # lbfgs may stop at max_iter: a baseline, not a fit to polish
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(pixel_features(train_x, side), train_y.numpy())
        acc = float((clf.predict(pixel_features(val_x, side)) == val_y.numpy()).mean())
    return acc, time.perf_counter() - t0


def fit_verdict(history: Sequence[dict[str, float]]) -> tuple[str, str]:
    """("over-fit" | "under-fit" | "fit" | "", one sentence) from the per-epoch curves, as docs/training.md
    defines them. Over-fit: the validation loss rose from its lowest point, i.e. its mean over the
    last :data:`END_EPOCHS` epochs (all after the lowest one) is more than :data:`OVERFIT_RISE` (5 %)
    above the lowest. The mean and the 5 % keep noise out: late in a run, under the cosine decay, the
    validation loss moves by about 1 % from one epoch to the next, and a single epoch's spike is
    averaged down (0.813 at the lowest, then 0.86-0.88 over the last three: 7 % up, over-fit; 0.40
    then 0.40-0.41: fit). Checked first: where the validation loss rises, more training does not
    help, whatever the training loss does. Under-fit: the training loss is above the validation
    loss and still falling (by more than :data:`STILL_FALLING`, 3 %, over the last fifth of the
    epochs). "": fewer than 3 epochs with validation."""
    hist = [h for h in history if h.get("val_loss") == h.get("val_loss")]  # NaN: no validation
    if len(hist) < 3:
        return "", ""
    tail = hist[-max(2, len(hist) // 5):]
    tr_first, tr_last, va_last = tail[0]["train_loss"], hist[-1]["train_loss"], hist[-1]["val_loss"]
    low = min(range(len(hist)), key=lambda i: hist[i]["val_loss"])
    va_min = hist[low]["val_loss"]
    end = hist[max(low + 1, len(hist) - END_EPOCHS):]
    va_end = sum(h["val_loss"] for h in end) / len(end) if end else va_min
    rise = (va_end - va_min) / va_min if va_min > 0 and math.isfinite(va_end) else 0.0
    if rise > OVERFIT_RISE:
        acc = (f"; validation accuracy {hist[low]['val_accuracy']:.2f} there, {hist[-1]['val_accuracy']:.2f} at the end"
               if all(math.isfinite(hist[i].get("val_accuracy", math.nan)) for i in (low, -1)) else "")
        return "over-fit", (f"over-fit: the validation loss rose from its lowest, {va_min:.3f} (epoch "
                            f"{hist[low].get('epoch', low + 1)}), to {va_last:.3f} (the last {len(end)} epochs average "
                            f"{rise:.0%} above it){acc}; the kept checkpoint is the best epoch's, and more pictures, "
                            f"stronger augmentation or fewer epochs would help")
    falling = tr_first > 0 and (tr_first - tr_last) / tr_first > STILL_FALLING
    if tr_last > va_last and falling:
        return "under-fit", (f"under-fit: the training loss ({tr_last:.3f}) is above the validation loss ({va_last:.3f}) "
                             f"and still falling; more time (--minutes) or a bigger model would learn more")
    return "fit", (f"no sign of under- or over-fitting: training loss {tr_last:.3f}, validation loss {va_last:.3f} "
                   f"(lowest {va_min:.3f}; over-fit would be more than {OVERFIT_RISE:.0%} above it at the end)")
