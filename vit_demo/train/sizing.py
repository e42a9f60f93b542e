"""The input size of a model trained from scratch on a folder (no ``--img-size``).

Small pictures (up to 32 px a side: the shapes, the digits) train at their own size, as they
always did. Larger ones, photos most of all, are shrunk: a 375-px model would hold a handful of
epochs in ten minutes on a CPU. The run times a few training steps at candidate sizes
(:data:`~.recipe.SIZE_CANDIDATES` up to the pictures' side, and that side when it is among them)
on pictures of random pixels (a step's time does not depend on what the pixels show), and takes
the largest at which the budget holds enough training: :data:`ENOUGH_EPOCHS` epochs, or fewer when
they add up to :data:`ENOUGH_STEPS` steps (a large folder's epochs are long), or the ``--epochs``
asked for. The smallest is timed first (a tight budget costs one probe, not five), then the
largest (an ample one costs two), then halfway between (:func:`largest_fit`). None fitting, the
smallest. The probes' models come from a forked random state, so the run itself
is the one that ``--img-size`` with the chosen size gives.

Small pictures keep their size, but under a short budget (two minutes) not always their grid: when
the budget holds fewer than :data:`FINE_GRID_EPOCHS` epochs of the default grid (about 8 patches a
side), the conv stem cuts them into patches twice as large (:func:`~.recipe.coarse_patch`: 32-px
shapes in a 4x4 grid of 8-px patches), a step about 3 times cheaper. On five unlike 32-px sets, in
the time of 34 epochs of the 8x8 grid, 85 of the 4x4 one were as good or better on every set
(shapes 0.983 against 0.971; docs/training.md). ``--epochs`` and ``--patch-size`` keep the grid
fixed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..model import VisionTransformer
from ..progress import report
from .budget import epochs_for, eval_estimate, seconds_per_step, step_runner
from .recipe import (
    SIZE_CANDIDATES,
    SMALL_SIDE,
    Recipe,
    coarse_patch,
    fits_grid,
    make_optimizer,
    nearest_sizes,
    patch_for,
    scratch_config,
    scratch_data_config,
    scratch_recipe,
    scratch_size,
)

ENOUGH_EPOCHS = 100  # a small folder: the budget must hold this many epochs at the chosen size ...
ENOUGH_STEPS = 2000  # ... or, for a large one, epochs that add up to this many steps (blobs: 0.985 after 2,170)
SIZE_PROBE_STEPS = (1, 4)  # untimed and timed steps per candidate (the first epoch re-plans anyway)
FINE_GRID_EPOCHS = 100  # small pictures keep the default grid when the budget holds this many epochs of it ...
FINE_GRID_STEPS = 5000  # ... or, on a large folder, epochs that make this many steps; else a coarser grid


@dataclass(frozen=True)
class SizeChoice:
    """The training size, and why, in one line for the log."""

    size: int
    note: str
    step_s: float | None = None  # seconds a training step at ``size`` took in the probe (None: not timed)
    patch: int | None = None  # a patch other than the default one (a coarser grid for a short budget)
    flags: str = ""  # the flags that repeat the choice without the clock (``--img-size 128``)


def wanted_epochs(steps_per_epoch: int, epochs: int | None = None) -> int:
    """The epochs a size must fit: ``epochs`` when asked for, else :data:`ENOUGH_EPOCHS`, or fewer
    when they make :data:`ENOUGH_STEPS` steps."""
    return epochs or max(1, min(ENOUGH_EPOCHS, math.ceil(ENOUGH_STEPS / max(1, steps_per_epoch))))


def fine_grid_epochs(steps_per_epoch: int) -> int:
    """The epochs of the default grid a budget must hold for small pictures to keep it:
    :data:`FINE_GRID_EPOCHS`, or fewer when they make :data:`FINE_GRID_STEPS` steps."""
    return max(1, min(FINE_GRID_EPOCHS, math.ceil(FINE_GRID_STEPS / max(1, steps_per_epoch))))


def size_candidates(side: int, stem: str, patch_size: int | None = None) -> list[int]:
    """The sizes to try for pictures of ``side`` px, the largest first: the candidates not above
    ``side``, and ``side`` itself when it is no larger than the largest, that ``stem`` can use with
    about 8 patches a side (with ``patch_size``: that divide by it)."""
    sizes = {c for c in SIZE_CANDIDATES if c <= side} | ({side} if side <= SIZE_CANDIDATES[-1] else set())
    return sorted((c for c in sizes if fits_grid(c, stem, patch_size)), reverse=True)


def small_size(side: int, stem: str, patch_size: int | None = None) -> int:
    """Small pictures' size: their own (at least 8 px), or the nearest the stem can use (a 27-px
    folder trains at 28 px with the conv stem); unchanged when there is none (the error says why)."""
    size = scratch_size(side)
    if patch_for(size, stem, patch_size) is not None:
        return size
    near = nearest_sizes(size, stem, patch_size)
    return min(near, key=lambda n: (abs(n - size), -n)) if near else size


def probe_step(size: int, num_classes: int, stem: str, patch_size: int | None, recipe: Recipe, batch: int,
               device: torch.device, bf16: bool = False) -> float:
    """Seconds of one training step of the from-scratch model at ``size`` on ``batch`` pictures of
    random pixels (its own random state: the run's draws are untouched)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(size)
        model = VisionTransformer(scratch_config(size, num_classes, patch_size, stem)).init_weights()
        x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
        y = torch.randint(0, num_classes, (batch,))
        return seconds_per_step(model, lambda m: make_optimizer(m, recipe, False), x, y, batch,
                                scratch_data_config(size), recipe.augment, device, bf16, steps=SIZE_PROBE_STEPS)


def default_step(device: torch.device, bf16: bool) -> Callable[[], None]:
    """One training step a call of the default from-scratch model at 32 px (4 classes, batch 64) on random
    pixels, built in a random state of its own: what :func:`~.budget.fastest_threads` times."""
    recipe, size, batch = scratch_recipe(), 32, 64
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(size)
        model = VisionTransformer(scratch_config(size, 4, stem="conv")).init_weights()
        x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
        y = torch.randint(0, 4, (batch,))
    return step_runner(model, lambda m: make_optimizer(m, recipe, False), x, y, batch, scratch_data_config(size),
                       recipe.augment, device, bf16)


def describe(picture: tuple[int, int], share: float) -> str:
    """``pictures are 32x32`` (w x h), ``pictures are mostly 500x375`` (half or more of them), or
    ``pictures are of mixed sizes, most often 500x375``."""
    h, w = picture
    return f"pictures are {'' if share >= 1 else 'mostly ' if share >= 0.5 else 'of mixed sizes, most often '}{w}x{h}"


def choose_size(picture: tuple[int, int], share: float, stem: str, patch_size: int | None, probe: Callable[[int], float],
                steps_per_epoch: int, val_steps: float, seconds: float, epochs: int | None = None,
                budget_words: str = "") -> SizeChoice:
    """The training size for pictures mostly ``picture`` (h, w; ``share`` of them). Small ones: their
    own (:func:`small_size`). Larger: the largest of :func:`size_candidates` at which ``seconds`` hold
    :func:`wanted_epochs` of ``steps_per_epoch`` training steps and a validation pass over
    ``val_steps`` training batches' worth of pictures, each step timed by ``probe(size)``; the
    smallest when none does. ``budget_words`` names the budget in the note (default: ``the
    N-minute budget``)."""
    side = min(picture)
    what = describe(picture, share)
    budget_words = budget_words or f"the {seconds / 60:g}-minute budget"
    if side <= SMALL_SIDE:
        size = small_size(side, stem, patch_size)
        why = "their own size" if size == side else f"the nearest to their {side} px that the model can use"
        coarse = coarse_patch(size, stem) if patch_size is None and epochs is None else None
        if coarse is None:
            return SizeChoice(size, f"{what}: training at {size} px, {why} (--img-size to choose)")
        report(0.0, f"choosing the grid: timing a step at {size} px")
        return choose_grid(size, f"{what}: training at {size} px, {why}", stem, coarse, probe(size), steps_per_epoch,
                           val_steps, seconds, budget_words)
    cands = size_candidates(side, stem, patch_size)[::-1]  # the smallest first
    if not cands:  # a --patch-size that suits none: the smallest, whose error gives flags that work
        return SizeChoice(SIZE_CANDIDATES[0], f"{what}: training at {SIZE_CANDIDATES[0]} px")
    want, t0 = wanted_epochs(steps_per_epoch, epochs), time.perf_counter()
    listed = ", ".join(map(str, cands))

    def epochs_in(step_s: float) -> int:
        return epochs_for(seconds - (time.perf_counter() - t0), step_s, steps_per_epoch, eval_estimate(step_s, val_steps))

    fit, (size, n, step_s) = largest_fit(cands, probe, epochs_in, want)
    if fit is None:
        more = "--minutes to give it more" if epochs is None else "fewer --epochs"
        return SizeChoice(size, f"{what}: training at {size} px (the smallest of {listed} px; even there only {n} of the "
                                f"{want} epochs wanted fit {budget_words}: {more}; --img-size to choose)", step_s,
                          flags=f"--img-size {size}")
    which = f"the largest of {listed} px at which" if len(cands) > 1 else "the size at which"
    fits = f"{want} epochs fit" if want != 1 else "1 epoch fits"
    return SizeChoice(fit[0], f"{what}: training at {fit[0]} px ({which} {fits} {budget_words}; "
                              f"--img-size to choose)", fit[1], flags=f"--img-size {fit[0]}")


def largest_fit(cands: list[int], probe: Callable[[int], float], epochs_in: Callable[[float], int],
                want: int) -> tuple[tuple[int, float] | None, tuple[int, int, float]]:
    """The largest of the sizes ``cands`` (the smallest first) at which the budget holds ``want``
    epochs (``epochs_in(step seconds)``), each size's step timed by ``probe``: ((that size, its step)
    or None, (the last size timed, its epochs, its step)). A larger size's step costs more, so the
    sizes that fit are the ones below the first that does not: the smallest is timed first (a tight
    budget: one probe), then the largest (an ample one: two), then halfway between the largest that
    fits and the smallest that does not, until they are neighbours."""
    fit: tuple[int, float] | None = None
    lo, hi, last = -1, len(cands), (cands[0], 0, 0.0)  # cands[lo] fits (-1: none yet); cands[hi] does not
    while hi - lo > 1:
        i = 0 if lo < 0 else hi - 1 if hi == len(cands) else (lo + hi) // 2
        size = cands[i]
        report(max(lo, 0) / len(cands), f"choosing the input size: timing a step at {size} px")
        step_s = probe(size)
        last = (size, epochs_in(step_s), step_s)
        if last[1] < want:
            if lo < 0:
                break  # not even the smallest
            hi = i
        else:
            lo, fit = i, (size, step_s)
    return fit, last


def choose_grid(size: int, said: str, stem: str, coarse: int, step_s: float, steps_per_epoch: int, val_steps: float,
                seconds: float, budget_words: str) -> SizeChoice:
    """Small pictures at ``size``: the default grid (its step timed at ``step_s``) when ``seconds``
    hold :func:`fine_grid_epochs` of it, else ``coarse`` patches (module docstring). ``said``: the
    note so far (``pictures are 32x32: training at 32 px, their own size``)."""
    want = fine_grid_epochs(steps_per_epoch)
    n = epochs_for(seconds, step_s, steps_per_epoch, eval_estimate(step_s, val_steps))
    fine = patch_for(size, stem)
    if n >= want:
        return SizeChoice(size, f"{said}, {fine}-px patches ({want} epochs of them fit {budget_words}; "
                                f"--img-size to choose)", step_s)
    g = size // coarse
    return SizeChoice(size, f"{said}, in {coarse}-px patches, a {g}x{g} grid: at {fine}-px patches only {n} of the {want} "
                            f"epochs wanted fit {budget_words}, and the coarser grid trains about 3 times as many "
                            f"(--patch-size to choose)", None, patch=coarse, flags=f"--patch-size {coarse}")
