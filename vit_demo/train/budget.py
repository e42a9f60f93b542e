"""A time budget instead of an epoch count: ``train --minutes N``.

Before the first step, a few training steps run on a copy of the model (the run itself is
untouched, so a seed still fixes everything that follows) and one validation pass is timed; the
epochs that fit the budget follow from those figures. The run then prints the epoch count it
chose, and ``--epochs`` with that count repeats it exactly on any machine.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..progress import report
from .augment import train_batch
from .fast import fast_input, fast_layout, step_context

DEFAULT_MINUTES = {"cpu": 10.0, "cuda": 3.0, "mps": 5.0}  # from scratch with no --epochs / --minutes
EPOCH_LIMITS = (1, 2000)  # the fewest and most epochs a budget may give
PROBE_STEPS = (2, 8)  # untimed warm-up steps, then timed ones
EVAL_SHARE = 1 / 3  # a validation picture costs about a third of a training one (a forward pass, no backward)


def default_minutes(device: torch.device) -> float:
    """About 10 minutes on a CPU, 3 on a GPU."""
    return DEFAULT_MINUTES.get(device.type, 10.0)


def step_runner(model: nn.Module, make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], x_all: torch.Tensor,
                y_all: torch.Tensor, batch_size: int, dc, augment, device: torch.device,
                bf16: bool = False) -> Callable[[], None]:
    """One training step (augmentation, forward, backward, AdamW) as the run makes it (``bf16``,
    :mod:`.fast`) per call, on a copy of ``model`` with batches drawn by a generator of its own."""
    m = fast_layout(copy.deepcopy(model).to(device).train(), device)
    opt = make_optimizer(m)
    g = torch.Generator().manual_seed(12345)

    def step() -> None:
        idx = torch.randint(0, len(x_all), (min(batch_size, len(x_all)),), generator=g)
        x = fast_input(train_batch(x_all[idx].to(device), dc, augment, g), device)
        with step_context(device, bf16):
            loss = F.cross_entropy(m(x).logits.float(), y_all[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return step


def timed(step: Callable[[], None]) -> float:
    """Wall seconds of one call of ``step``."""
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def seconds_per_step(model: nn.Module, make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], x_all: torch.Tensor,
                     y_all: torch.Tensor, batch_size: int, dc, augment, device: torch.device, bf16: bool = False,
                     steps: tuple[int, int] = PROBE_STEPS) -> float:
    """Wall seconds of one training step (:func:`step_runner`): ``steps`` = (untimed, timed)."""
    step = step_runner(model, make_optimizer, x_all, y_all, batch_size, dc, augment, device, bf16)
    for _ in range(steps[0]):
        step()
    return sum(timed(step) for _ in range(steps[1])) / steps[1]


THREAD_STEPS = 3  # timed steps at each thread count (after one untimed)


def fastest_threads(step: Callable[[], None], say: Callable[[str], None]) -> int:
    """With more than one torch thread: ``step`` timed on one thread and on all of them, the faster
    count kept (``torch.set_num_threads``) and returned. On 2 cores that other jobs share, two threads
    can be far slower than one (the default 32-px model's step at load 7: 2.8 s against 0.2 s); on an
    idle machine two are about 1.5 times faster (docs/training.md). The count of all threads stops
    after a step when it is already twice as slow as one."""
    n = torch.get_num_threads()
    if n <= 1:
        return n
    report(0.0, f"choosing the threads: timing a step on 1 and on {n}")
    torch.set_num_threads(1)
    step()
    one = sum(timed(step) for _ in range(THREAD_STEPS)) / THREAD_STEPS
    torch.set_num_threads(n)
    many: list[float] = []
    while len(many) < THREAD_STEPS and (not many or sum(many) / len(many) <= 2 * one):
        many.append(timed(step))
    if sum(many) / len(many) <= one:
        return n
    torch.set_num_threads(1)
    say(f"training on 1 torch thread, not {n}: a step took {one:.2f} s on 1 and {sum(many) / len(many):.2f} s on {n} "
        "(other work shares the cores)")
    return 1


def eval_estimate(step_s: float, val_steps: float) -> float:
    """Seconds of a validation pass over ``val_steps`` training batches' worth of pictures, from the
    seconds of a training step (a forward pass of each, no backward: :data:`EVAL_SHARE`)."""
    return step_s * val_steps * EVAL_SHARE


def epochs_for(seconds: float, step_s: float, steps_per_epoch: int, eval_s: float) -> int:
    """The most epochs of ``steps_per_epoch`` steps plus one validation pass that fit ``seconds``
    (5 % kept back for the end: the baseline, the checkpoint and the curves)."""
    per_epoch = step_s * steps_per_epoch + eval_s
    n = math.floor(0.95 * seconds / max(per_epoch, 1e-9))
    return int(min(EPOCH_LIMITS[1], max(EPOCH_LIMITS[0], n)))


def format_eta(seconds: float) -> str:
    """``12:05`` (minutes:seconds), or ``1:02:05`` past an hour."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
