"""The atlas: what each head and each learned concept of a ViT looks for, over a folder.

**Heads** (every layer x head; the numbers are means over the folder's pictures and over the
patch queries of each picture):

- **mean distance**: the attention-weighted distance in pixels between a patch query and the
  patch keys (:func:`~vit_demo.methods.attention.mean_attention_distance`);
- **entropy**: of each patch query's attention over all N keys, divided by log N (0: one key,
  1: spread evenly);
- **share on [class]** and **on the other prefix tokens** ([dist], registers), 0 where the model
  has none;
- **positional**: |mean pattern|^2 / mean |pattern|^2 of the patch queries' attention rows, in
  [0, 1]: 1 when the head attends the same way on every picture (a positional head), lower when
  its pattern follows the content;
- **importance** by mean-ablation (Michel et al. 2019): the head's output (its slice of the
  input to the block's output projection) replaced by its mean over the folder at every token
  position; the drop in the true-class logit (the predicted class where a picture has no label)
  and in accuracy over the labelled pictures;
- **top patches**: the patches the [class] row of the head weights most, one per picture, best
  first; for a model without [class] (a global-average-pool read-out, as the default model
  trained here has) the mean of the patch queries' rows instead, where the head's queries look
  on average (as :mod:`vit_demo.methods.attention` does).

**Concepts** (after CRAFT, Fel et al. 2023): the patch tokens after block ``layer`` factorised by
scikit-learn's NMF. CRAFT factorises a CNN's post-ReLU activations; a ViT's residual stream is
signed and its negative part matters, so each token is split into [relu(x), relu(-x)] (2C
non-negative numbers) and A ~ W H codes the whole token (W: each patch's code over the K
concepts; H+ - H-: the concepts in token space). A concept's **presence** at a patch is its code
over the 99th percentile of its codes in the folder, clipped at 1. Its **importance for a class**
is the larger of two measures (:class:`Importance`): **removal**, the mean fall of that class's
logit, over the class's pictures, when the patches where it is present are **occluded** in the
embeddings (the input of the first block: each patch embedding moved towards the folder's median
embedding at that place, by the concept's presence) and the whole model runs again; and
**addition**, the mean rise of the class's logit over the other classes' pictures when the
concept's own patches are **stamped** on them (:func:`concept_gains`): a shortcut that is enough
for a class without being needed by it (a mark on most circles, of a model that also knows a
circle without it) shows only there. Why not remove the concept from the tokens at ``layer``, as CRAFT does:
by a late layer the blocks have copied what a patch holds into every other token, so removing
it where it sits changes little; on the watermark lesson that credited the mark's concept to the
classes that are *not* marked (docs/atlas.md). The median, not the mean: a mark on a minority
of the pictures is not in it. The **faithfulness check** occludes each class's three most
important concepts together and compares the fall with three random concepts'. Each concept's
**top patches** (highest code, one per picture) and where they sit: the share on the picture's
border ring (outer eighth), off the object (where the folder has ``boxes.json``), within one
patch of their most common patch (its place), and the share of the pictures where it is present
at that place. A concept among a class's top three whose top patches sit at one place near the
edge (the outer quarter of the grid) that only some pictures have there, or mostly off the
object, is flagged as a possible Clever-Hans feature. ``layer`` 0: the patch embeddings.

Under ``torchrun`` (:mod:`vit_demo.distributed.torchrun`, shared with the survey and the training)
every process takes every ``world``-th picture for the model passes (pass 1: attention and tokens;
pass 2: the heads removed one by one, after the heads' mean outputs over the whole folder are
shared); process 0 gathers them and alone fits the concepts and measures their importance (22
passes of the whole model: two a concept, then the faithfulness check), then writes the result.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..distributed.torchrun import Dist, gather_objects, share_objects
from ..methods.attention import head_maps, in_float32, mean_attention_distance
from ..model import TokenLayout, VisionTransformer
from ..precision import autocast, runs_bf16
from ..progress import TimeUp, batches, check, report, time_left
from .child import Child
from .concepts import FIT_ROWS, PRESENCE_PCT, Concepts, fit_concepts
from .geometry import box_to_input, near_edge, patch_coverage
from .survey import Folder, Loader, Picture, folder_job, label_index, none_readable, read_batch, require_classifier

if TYPE_CHECKING:
    from ..checkpoints.load import LoadedModel

DEFAULT_CONCEPTS = 8
TOP = 8  # top patches kept per head and per concept
CLASS_TOP = 3  # a class's top concepts, for the faithfulness check and the flags
RANDOM_DRAWS = 5  # random concept sets per picture in the faithfulness check
FLAG_SHARE = 0.5  # flagged: this share of a concept's top patches at one place, near the edge or off the object
FLAG_PRESENCE = 0.6  # ... and, near the edge, present at that place in at most this share of the pictures
# The whole atlas's time in units of its first pass's (:func:`atlas_cost`), by part. Measured on DeiT-Tiny
# (12 blocks x 3 heads), 32 photos, one thread on a busy machine (load 7): pass 1 5.8 s; the heads' ablation
# 45.7 s, 19.5 passes from a block on per picture, 0.40 of pass 1 each; the occlusions 31.0 s, 14 whole passes
# per picture, 0.38 each; NMF 13.5 s, 2.3 times pass 1; 96 s in all (16.6 times; its reading: 0.3 s). Rounded up, so that
# an estimate errs on the long side. The additions (a stamping pass a concept) are whole passes like the occlusions:
# 8 more took the atlas of 100 photos from 50.2 to 60.9 CPU-seconds (bf16, one thread, docs/atlas.md).
ABLATION_COST, OCCLUSION_COST, NMF_COST = 0.45, 0.42, 2.5
FIRST = 4  # pictures of pass 1 timed on their own under a time limit, to say early whether the atlas fits
READS = 3  # times the atlas reads each picture: pass 1, pass 2, the report's crops
FIT_SHARE = 0.9  # of the time a job has: what the pictures an atlas is told it may take should need at most
NMF_IMPORTS = ("sklearn.decomposition",)  # what NMF's child process imports while the model's passes run
__all__ = ["FIT_ROWS", "PRESENCE_PCT", "Concepts", "atlas", "fit_concepts"]


# ----------------------------------------------------------------------------- the model, piece by piece


def block_inputs(model: VisionTransformer, x: Tensor) -> tuple[list[Tensor], TokenLayout, Tensor]:
    """One plain forward pass: (the input of every block and the last block's output [L + 1] x
    [B, N, C], the token layout, the logits)."""
    seen: list[Tensor] = []
    hooks = [b.register_forward_pre_hook(lambda _m, a: seen.append(a[0])) for b in model.blocks]
    hooks.append(model.blocks[-1].register_forward_hook(lambda _m, _a, out: seen.append(out[0])))
    try:
        out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen, out.layout, out.logits


def run_from(model: VisionTransformer, tokens: Tensor, start: int, grid: tuple[int, int]) -> Tensor:
    """The logits of ``tokens`` fed to block ``start`` (0-based; ``len(blocks)``: only the final
    norm and the head), the rest of the model as its forward pass runs it (in its precision:
    vit_demo.precision, so that the falls it measures compare like with like)."""
    positions = model.positions(grid, tokens.device)
    x = tokens
    with autocast(tokens.device, runs_bf16(model)):
        for i in range(start, len(model.blocks)):
            x, _ = model.blocks[i](x, False, positions)
        return model.forward_head(model.norm(x))[0]


@contextmanager
def head_replaced(model: VisionTransformer, layer: int, head: int, value: Tensor) -> Iterator[None]:
    """Within: head ``head`` of block ``layer`` (0-based) outputs ``value`` [N, D] at every token
    (its slice of the input to the block's output projection)."""
    attn = model.blocks[layer].attn
    D = attn.head_dim

    def swap(_m: Any, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        y = args[0].clone()
        y[..., head * D : (head + 1) * D] = value.to(y.dtype)
        return (y, *args[1:])

    hook = attn.proj.register_forward_pre_hook(swap)
    try:
        yield
    finally:
        hook.remove()


# ----------------------------------------------------------------------------- what a head does


def attention_entropy(attention: Tensor, num_prefix: int) -> Tensor:
    """[B, H, N, N] attention -> [B, H]: each patch query's entropy over the N keys / log N, averaged."""
    rows = attention[:, :, num_prefix:].double()
    h = -(rows * rows.clamp(min=1e-300).log()).sum(dim=-1)
    return (h / math.log(attention.shape[-1])).mean(dim=-1)


def prefix_shares(attention: Tensor, layout: TokenLayout) -> tuple[Tensor, Tensor]:
    """[B, H, N, N] -> ([B, H] share of the patch queries' attention on [class], on the other prefix tokens)."""
    P = layout.num_prefix
    rows = attention[:, :, P:].double()
    prefix = rows[..., :P].sum(dim=-1).mean(dim=-1)
    cls = rows[..., layout.cls_index].mean(dim=-1) if layout.cls_index is not None else torch.zeros_like(prefix)
    return cls, prefix - cls


@dataclass
class HeadSums:
    """Per picture numbers and running sums of pass 1 (this process's pictures)."""

    numbers: list[np.ndarray] = field(default_factory=list)  # per batch [b, 4, L, H]: distance, entropy, cls, prefix
    peaks: list[np.ndarray] = field(default_factory=list)  # per batch [b, 2, L, H]: top value and its patch
    pattern: Tensor | None = None  # sum of the patch queries' rows [L, H, n, N]
    square: Tensor | None = None  # sum of their squared norms [L, H]
    outputs: Tensor | None = None  # sum of the heads' outputs [L, N, H*D]
    count: int = 0

    def add(self, attentions: Sequence[Tensor], layout: TokenLayout, patch: int, outputs: Tensor) -> None:
        a = torch.stack([t.double() for t in attentions], dim=1)  # [B, L, H, N, N]
        B, L, H = a.shape[:3]
        flat = a.flatten(0, 1)
        dist = mean_attention_distance(attentions, layout, patch).double()
        ent = attention_entropy(flat, layout.num_prefix).reshape(B, L, H)
        cls, prefix = (s.reshape(B, L, H) for s in prefix_shares(flat, layout))
        self.numbers.append(torch.stack([dist, ent, cls, prefix], dim=1).float().cpu().numpy())
        maps = head_maps(attentions, layout).flatten(-2)  # [B, L, H, n]
        top = maps.max(dim=-1)
        self.peaks.append(torch.stack([top.values.double(), top.indices.double()], dim=1).cpu().numpy())
        rows = a[:, :, :, layout.num_prefix :]
        pattern, square = rows.sum(dim=0).cpu(), rows.pow(2).sum(dim=(0, 3, 4)).cpu()
        self.pattern = pattern if self.pattern is None else self.pattern + pattern
        self.square = square if self.square is None else self.square + square
        out = outputs.double().cpu()
        self.outputs = out if self.outputs is None else self.outputs + out
        self.count += B


# ----------------------------------------------------------------------------- pass 1: attention and tokens


@dataclass
class Seen:
    """What pass 1 keeps of this process's pictures."""

    pictures: list[Picture] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)  # the label, else the predicted class
    labelled: list[bool] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)  # per batch [b, N, C]: the output of block ``layer``
    embeds: list[np.ndarray] = field(default_factory=list)  # per batch [b, N, C]: the input of the first block
    sums: HeadSums = field(default_factory=HeadSums)
    errors: list[str] = field(default_factory=list)


def merge_seen(parts: Sequence[Seen]) -> Seen:
    """Every process's :class:`Seen` as one, in the folder's order: ``tokens`` and ``logits`` one
    array each, the per-picture numbers reordered, the running sums added."""
    full = [s for s in parts if s.pictures]
    errors = [e for s in parts for e in s.errors]
    if not full:
        return Seen(errors=errors)
    pics = [p for s in full for p in s.pictures]
    order = np.argsort([p.index for p in pics], kind="stable")

    def cat(get: Any) -> np.ndarray:
        return np.concatenate([a for s in full for a in get(s)])[order]

    sums = HeadSums(numbers=[cat(lambda s: s.sums.numbers)], peaks=[cat(lambda s: s.sums.peaks)],
                    count=sum(s.sums.count for s in full))
    sums.pattern = sum(s.sums.pattern for s in full)  # type: ignore[assignment]
    sums.square = sum(s.sums.square for s in full)  # type: ignore[assignment]
    sums.outputs = sum(s.sums.outputs for s in full)  # type: ignore[assignment]
    flat = [v for s in full for v in zip(s.targets, s.labelled)]
    return Seen([pics[i] for i in order], [flat[i][0] for i in order], [flat[i][1] for i in order],
                [cat(lambda s: s.logits)], [cat(lambda s: s.tokens)], [cat(lambda s: s.embeds)], sums, errors)


def captured_pass(model: VisionTransformer, x: Tensor, layer: int) -> tuple[Any, Tensor, Tensor, Tensor]:
    """A forward pass that captures the attention: (its output, the heads' outputs summed over the
    batch [L, N, H*D], the tokens after block ``layer`` (1-based; 0: the embeddings, before any
    block) [B, N, C], the embeddings (the input of the first block) [B, N, C])."""
    outs: list[Tensor] = []
    tok: list[Tensor] = []
    hooks = [blk.attn.proj.register_forward_pre_hook(lambda _m, a: outs.append(a[0].sum(dim=0))) for blk in model.blocks]
    hooks.append(model.blocks[0].register_forward_pre_hook(lambda _m, a: tok.append(a[0])))
    if layer > 0:
        hooks.append(model.blocks[layer - 1].register_forward_hook(lambda _m, _a, o: tok.append(o[0])))
    try:
        with torch.inference_mode():
            out = model(x, capture=True)
    finally:
        for h in hooks:
            h.remove()
    return in_float32(out), torch.stack(outs), tok[-1], tok[0]


def atlas_cost(model: VisionTransformer, concepts: int) -> float:
    """The whole atlas's time over its first pass's, from the passes it makes: pass 1 (1), every
    head ablated from its block on (H x (L + 1) / 2 passes' worth a picture), the concepts'
    occlusions (K + 1 + :data:`RANDOM_DRAWS` whole passes a picture) and NMF; each part's weight
    measured (:data:`ABLATION_COST`, ...)."""
    L, H = len(model.blocks), model.blocks[0].attn.num_heads
    return 1 + ABLATION_COST * H * (L + 1) / 2 + OCCLUSION_COST * (2 * concepts + 1 + RANDOM_DRAWS) + NMF_COST


def fits_in_time(read_s: float, model_s: float, done: int, total: int, cost: float) -> None:
    """Under a time limit (:func:`vit_demo.progress.time_limit`), after the first pictures of pass
    1 (``done`` of ``total``, read in ``read_s`` s and run in ``model_s`` s): :class:`TimeUp` at
    once, saying how many pictures would fit, when the whole atlas would not end in time. The
    pictures are read three times (both passes, the report's crops), the model's part grows by
    ``cost`` (:func:`atlas_cost`)."""
    limit = time_left()
    if limit is None or not done:
        return
    left, seconds = limit
    spent = read_s + model_s
    per_picture = (READS * read_s + cost * model_s) / done
    if per_picture * total - spent <= left:
        return
    fit = int(FIT_SHARE * (spent + left) / per_picture)
    raise TimeUp(f"An atlas of {total} pictures would take about {per_picture * total:.0f} s on this app now, and a "
                 f"job may take {seconds:.0f} s here: " + (f"send at most {fit} pictures." if fit >= 2 else
                                                          "the app is too busy for an atlas now; try again later."))


def first_pass(lm: LoadedModel, mine: Sequence[Picture], folder: Folder, layer: int, batch_size: int,
               progress: bool, load: Loader | None = None, cost: float | None = None, total: int = 0) -> Seen:
    """Attention numbers, the heads' outputs and the tokens after block ``layer`` (1-based) of every
    picture; ``cost``: the whole atlas's model time over this pass's (:func:`atlas_cost`), to say
    after its first :data:`FIRST` pictures whether the atlas of ``total`` pictures fits its time
    limit (:func:`fits_in_time`)."""
    model, seen = lm.model, Seen()
    mine = list(mine)
    head = FIRST if cost is not None and time_left() is not None and len(mine) > FIRST else 0
    for chunk in itertools.chain([mine[:head]] if head else [], batches(mine[head:], batch_size, "atlas: attention",
                                                                       progress)):
        started = time.perf_counter()
        b = read_batch(chunk, lm, seen.errors, load)
        read_s = time.perf_counter() - started
        if b is None:
            continue
        out, outputs, tokens, embeds = captured_pass(model, b.x, layer)
        seen.sums.add(out.attentions, out.layout, model.cfg.patch_size, outputs)
        logits = out.logits.float().cpu()
        for j, pic in enumerate(b.pictures):
            y = label_index(pic, folder.mode, lm.labels)
            seen.pictures.append(pic)
            seen.labelled.append(y is not None)
            seen.targets.append(int(logits[j].argmax()) if y is None else y)
        seen.logits.append(logits.numpy())
        seen.tokens.append(tokens.float().cpu().numpy())
        seen.embeds.append(embeds.float().cpu().numpy())
        if cost is not None and len(seen.pictures) == len(b.pictures):  # the first batch
            fits_in_time(read_s, time.perf_counter() - started - read_s, len(chunk), total or len(mine), cost)
        report(len(seen.pictures) / max(1, len(mine)) / 2, "pictures", done=len(seen.pictures), total=len(mine))
    return seen


# ----------------------------------------------------------------------------- pass 2: heads removed


def head_importance(lm: LoadedModel, seen: Seen, means: Tensor, batch_size: int, progress: bool,
                    load: Loader | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean-ablation of every head over this process's pictures, ``means`` [L, N, H*D] the heads'
    mean outputs over the whole folder: ([L, H] the target logit's falls, [L, H] the losses of a
    right answer over the labelled pictures), both summed over the pictures."""
    model = lm.model
    L, H, D = len(model.blocks), model.blocks[0].attn.num_heads, model.blocks[0].attn.head_dim
    means = means.float().to(lm.device)
    drop, wrong = np.zeros((L, H)), np.zeros((L, H))
    targets, labelled = torch.tensor(seen.targets), torch.tensor(seen.labelled)
    done, errors = 0, []
    for chunk in batches(seen.pictures, batch_size, "atlas: heads", progress):
        b = read_batch(chunk, lm, errors, load)
        n = len(chunk)
        y, lab = targets[done : done + n].to(lm.device), labelled[done : done + n].to(lm.device)
        with torch.inference_mode():
            inputs, layout, base = block_inputs(model, b.x)
            base_y, base_right = base.gather(1, y[:, None])[:, 0], (base.argmax(1) == y) & lab
            for layer in range(L):
                for head in range(H):
                    check()  # (36 passes a batch for DeiT-Tiny: the time limit is checked before each)
                    with head_replaced(model, layer, head, means[layer, :, head * D : (head + 1) * D]):
                        z = run_from(model, inputs[layer], layer, layout.grid)
                    drop[layer, head] += float((base_y - z.gather(1, y[:, None])[:, 0]).sum())
                    wrong[layer, head] += float((base_right.float() - ((z.argmax(1) == y) & lab).float()).sum())
        done += n
        report(0.5 + done / max(1, len(seen.pictures)) / 4, "pictures", done=done, total=len(seen.pictures))
    return drop, wrong


def head_summary(distance: float, entropy: float, cls: float, prefix: float, positional: float, patch: int) -> str:
    """One plain sentence for a head's numbers."""
    if cls >= 0.5:
        what = "mostly attends to [class]"
    elif prefix >= 0.5:
        what = "mostly attends to the other prefix tokens (registers)"
    elif distance <= 1.5 * patch:
        what = "looks at neighbouring patches"
    elif entropy >= 0.9:
        what = "spreads its attention over the whole picture"
    elif positional >= 0.8:
        what = "attends by position: the same pattern on every picture"
    else:
        what = "attends to content: its pattern follows what is in the picture"
    return f"{what} (mean distance {distance / patch:.1f} patches)"


def head_records(lm: LoadedModel, seen: Seen, drop: np.ndarray, acc: np.ndarray) -> list[dict[str, Any]]:
    """Every head's record (layers and heads from 1), in the model's order."""
    sums, patch = seen.sums, lm.model.cfg.patch_size
    numbers = np.concatenate(seen.sums.numbers).mean(axis=0)  # [4, L, H]
    mean_pattern = sums.pattern / sums.count
    positional = (mean_pattern.pow(2).sum(dim=(2, 3)) / (sums.square / sums.count).clamp(min=1e-300)).numpy()
    peaks = np.concatenate(sums.peaks)  # [n, 2, L, H]
    gw = lm.data_config.input_size[1] // patch
    L, H = drop.shape
    out = []
    for layer in range(L):
        for head in range(H):
            d, e, c, p = (float(numbers[i, layer, head]) for i in range(4))
            order = np.argsort(-peaks[:, 0, layer, head], kind="stable")[:TOP]
            top = [{"path": seen.pictures[i].path, "row": int(peaks[i, 1, layer, head]) // gw,
                    "col": int(peaks[i, 1, layer, head]) % gw, "value": round(float(peaks[i, 0, layer, head]), 6)}
                   for i in order]
            out.append({"layer": layer + 1, "head": head + 1, "mean_distance": round(d, 4), "entropy": round(e, 6),
                        "class_share": round(c, 6), "prefix_share": round(p, 6),
                        "positional": round(float(positional[layer, head]), 6),
                        "importance": round(float(drop[layer, head]), 6),
                        "accuracy_drop": None if np.isnan(acc[layer, head]) else round(float(acc[layer, head]), 6),
                        "summary": head_summary(d, e, c, p, float(positional[layer, head]), patch), "top": top})
    return out


# ----------------------------------------------------------------------------- concepts


def occlude(embeds: Tensor, presence: Tensor, baseline: Tensor, num_prefix: int) -> Tensor:
    """``embeds`` [B, N, C] with each patch token moved towards ``baseline`` [patches, C] (what
    that place usually holds) by ``presence`` [B, patches] in [0, 1]: e_p - m_p (e_p - b_p)."""
    out = embeds.clone()
    patches = out[:, num_prefix:]
    out[:, num_prefix:] = patches - presence[..., None].to(out.dtype) * (patches - baseline.to(out.dtype))
    return out


def concept_falls(lm: LoadedModel, seen: Seen, presence: np.ndarray, baseline: np.ndarray, masks: Tensor,
                  batch_size: int = 16) -> np.ndarray:
    """Logits' falls [n, classes] when the patches where the concepts each picture's row of
    ``masks`` [n, K] marks are present (``presence`` [n, patches, K], the largest of them) are
    occluded in the embeddings (moved towards ``baseline``) and the whole model runs on
    (``seen`` merged: one array each), ``batch_size`` pictures at a time."""
    model, P = lm.model, lm.model.cfg.num_prefix_tokens
    grid = tuple(s // model.cfg.patch_size for s in lm.data_config.input_size)
    base = torch.from_numpy(baseline).to(lm.device)
    embeds, logits = np.concatenate(seen.embeds), np.concatenate(seen.logits)
    out = []
    for start in range(0, len(embeds), batch_size):
        check()
        end = start + batch_size
        m = (torch.from_numpy(presence[start:end]) * masks[start:end, None, :]).amax(dim=-1)
        with torch.inference_mode():
            z = run_from(model, occlude(torch.from_numpy(embeds[start:end]).to(lm.device), m.to(lm.device), base, P), 0, grid)
        out.append(logits[start:end] - z.float().cpu().numpy())
    return np.concatenate(out)


def place_baseline(seen: Seen, num_prefix: int) -> np.ndarray:
    """[patches, C]: the median embedding at each place over the folder (a mark on a minority of
    the pictures is not in it, where a mean would keep a share of it)."""
    return np.median(np.concatenate(seen.embeds)[:, num_prefix:], axis=0).astype(np.float32)


def class_importance(lm: LoadedModel, seen: Seen, presence: np.ndarray, baseline: np.ndarray, batch_size: int = 16
                     ) -> np.ndarray:
    """[K, classes]: the mean fall of each class's logit over the class's pictures (target: the
    label, else the predicted class) when concept k is occluded (:func:`concept_falls`); NaN for
    classes not in the folder. The importance by **removal**."""
    n, K = presence.shape[0], presence.shape[-1]
    targets = np.array(seen.targets)
    out = np.full((K, len(lm.labels)), np.nan)
    for k in range(K):
        mask = torch.zeros(n, K)
        mask[:, k] = 1
        falls = concept_falls(lm, seen, presence, baseline, mask, batch_size)
        for c in np.unique(targets):
            out[k, c] = falls[targets == c, c].mean()
        report(0.75 + (k + 1) / K / 12, "concepts removed")
    return out


def stamp_sources(codes: np.ndarray, n: int) -> np.ndarray:
    """A concept's codes [n, patches] -> the picture each picture gets the concept from: its
    :data:`TOP` pictures with the highest code, in turn (never the picture itself)."""
    top = np.argsort(-codes.max(axis=1), kind="stable")[: min(TOP, n)]
    src = top[np.arange(n) % len(top)]
    clash = src == np.arange(n)
    if len(top) > 1:
        src[clash] = top[(np.arange(n)[clash] + 1) % len(top)]
    return src


def around_top(codes: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """A concept's codes [n, patches] -> [n, patches] 1 within one patch of each picture's top
    patch (its highest code), else 0: what a stamp of the concept carries. Not the concept's
    presence: the lesson's white mark fills 2x2 patches at 4-px patches, and the concept's presence
    was 0 on one of them in some models (a stamp by presence turned 8 % of the other shapes into
    circles, the whole mark 28 %); nor the whole picture, which would carry its object along."""
    gh, gw = grid
    rows, cols = np.divmod(codes.argmax(axis=1), gw)
    r, c = np.divmod(np.arange(gh * gw), gw)
    return ((np.abs(r[None] - rows[:, None]) <= 1) & (np.abs(c[None] - cols[:, None]) <= 1)).astype(np.float32)


def concept_gains(lm: LoadedModel, seen: Seen, codes: np.ndarray, k: int, batch_size: int = 16
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Concept ``k`` **added** to every picture: the patch embeddings within one patch of the
    concept's top patch in a picture where it is strongest (:func:`stamp_sources`, :func:`around_top`)
    copied into the same places of the picture (the concept's own patches stamped on, with the one
    patch around them that a feature larger than a patch also fills), and the whole model run
    again. Returns (the logits' rises [n, classes], the new predictions [n])."""
    model, P = lm.model, lm.model.cfg.num_prefix_tokens
    grid = tuple(s // model.cfg.patch_size for s in lm.data_config.input_size)
    embeds, logits = np.concatenate(seen.embeds), np.concatenate(seen.logits)
    src = stamp_sources(codes[:, :, k], len(embeds))
    stamps = around_top(codes[:, :, k], grid)
    rises, preds = [], []
    for start in range(0, len(embeds), batch_size):
        check()
        s = src[start : start + batch_size]
        m = torch.from_numpy(stamps[s]).to(lm.device)
        with torch.inference_mode():
            x = occlude(torch.from_numpy(embeds[start : start + batch_size]).to(lm.device), m,
                        torch.from_numpy(embeds[s, P:]).to(lm.device), P)
            z = run_from(model, x, 0, grid).float().cpu().numpy()
        rises.append(z - logits[start : start + batch_size])
        preds.append(z.argmax(axis=1))
    return np.concatenate(rises), np.concatenate(preds)


def stamp_importance(lm: LoadedModel, seen: Seen, codes: np.ndarray, batch_size: int = 16
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The importance by **addition**: ([K, classes] the mean rise of each class's logit over the
    *other* classes' pictures when concept k is stamped on them (:func:`concept_gains`), [K, classes]
    the share of those pictures it turns into the class); NaN for classes not in the folder or
    without other pictures. A feature that is enough for a class but not needed by it (a mark on
    most of its pictures, whose other pictures the model also gets right) shows here, not in
    :func:`class_importance`: a marked circle is still a circle without its mark."""
    K = codes.shape[-1]
    targets = np.array(seen.targets)
    before = np.concatenate(seen.logits).argmax(axis=1)
    gain = np.full((K, len(lm.labels)), np.nan)
    turned = np.full((K, len(lm.labels)), np.nan)
    for k in range(K):
        rises, preds = concept_gains(lm, seen, codes, k, batch_size)
        for c in np.unique(targets):
            others = targets != c
            if others.any():
                gain[k, c] = rises[others, c].mean()
                turned[k, c] = ((preds[others] == c) & (before[others] != c)).mean()
        report(0.75 + 1 / 12 + (k + 1) / K / 12, "concepts added")
    return gain, turned


def faithfulness(lm: LoadedModel, seen: Seen, presence: np.ndarray, baseline: np.ndarray, importance: np.ndarray,
                 seed: int = 0, batch_size: int = 16) -> dict[str, Any]:
    """Occluding each picture's class's top :data:`CLASS_TOP` concepts vs as many random ones
    (:data:`RANDOM_DRAWS` draws a picture): the mean fall of the class's logit, and the share
    of pictures where the top concepts' fall is the larger."""
    n, K = presence.shape[0], presence.shape[-1]
    m = min(CLASS_TOP, K)
    targets = np.array(seen.targets)
    top = torch.zeros(n, K)
    for i, c in enumerate(targets):
        top[i, np.argsort(-importance[:, c], kind="stable")[:m]] = 1
    fall_top = concept_falls(lm, seen, presence, baseline, top, batch_size)[np.arange(n), targets]
    g = torch.Generator().manual_seed(seed)
    fall_random = np.zeros(n)
    for d in range(RANDOM_DRAWS):
        rnd = torch.zeros(n, K)
        rnd.scatter_(1, torch.rand(n, K, generator=g).argsort(dim=1)[:, :m], 1)
        fall_random += concept_falls(lm, seen, presence, baseline, rnd, batch_size)[np.arange(n), targets] / RANDOM_DRAWS
        report(0.75 + 2 / 12 + (d + 1) / RANDOM_DRAWS / 12, "random concepts")
    return {"concepts_removed": m, "random_draws": RANDOM_DRAWS,
            "top_fall": round(float(fall_top.mean()), 6), "random_fall": round(float(fall_random.mean()), 6),
            "share_top_larger": round(float((fall_top > fall_random).mean()), 6),
            "passed": bool(fall_top.mean() > fall_random.mean())}


def where_it_lives(codes: np.ndarray, presence: np.ndarray, seen: Seen, lm: LoadedModel, folder: Folder
                   ) -> tuple[list[dict[str, Any]], dict]:
    """A concept's codes and presence [n, patches] -> its top patches (one per picture, best first)
    and where the top tenth of them sit: the share on the border ring, off the object (with boxes),
    within one patch of their most common patch (its "place"); and the share of all the pictures
    in which it is present (presence >= 0.5) at that place."""
    patch = lm.model.cfg.patch_size
    gh, gw = (s // patch for s in lm.data_config.input_size)
    best = codes.argmax(axis=1)
    value = codes[np.arange(len(best)), best]
    order = np.argsort(-value, kind="stable")
    top = [{"path": seen.pictures[i].path, "row": int(best[i]) // gw, "col": int(best[i]) % gw,
            "value": round(float(value[i]), 6)} for i in order[:TOP]]
    ring = max(1, round(gh / 8))
    many = order[: max(TOP, len(order) // 10)]
    rows, cols = best[many] // gw, best[many] % gw
    border = float(np.mean((rows < ring) | (rows >= gh - ring) | (cols < ring) | (cols >= gw - ring)))
    cells, counts = np.unique(best[many], return_counts=True)
    mode = int(cells[counts.argmax()])
    near = (np.abs(rows - mode // gw) <= 1) & (np.abs(cols - mode % gw) <= 1)
    r0, c0 = mode // gw, mode % gw
    around = presence.reshape(-1, gh, gw)[:, max(0, r0 - 1) : r0 + 2, max(0, c0 - 1) : c0 + 2]
    place = {"border_share": round(border, 6), "one_place_share": round(float(near.mean()), 6),
             "place": {"row": r0, "col": c0},
             "place_presence": round(float((around.reshape(len(around), -1).max(axis=1) >= 0.5).mean()), 6)}
    boxed = [i for i in many if seen.pictures[i].rel in folder.boxes]
    if boxed:
        off = []
        for i in boxed:
            from PIL import Image

            with Image.open(seen.pictures[i].path) as im:
                size = im.size
            cov = patch_coverage(box_to_input(folder.boxes[seen.pictures[i].rel], size, lm.data_config), (gh, gw), patch)
            off.append(float(cov.flatten()[best[i]]) < 0.5)
        place["off_object_share"] = round(float(np.mean(off)), 6)
    return top, place


def suspicious(place: dict[str, Any], grid: tuple[int, int]) -> bool:
    """A possible Clever-Hans feature: a concept whose top patches sit at one place (at least
    :data:`FLAG_SHARE` of them within one patch of it) and either that place near the picture's
    edge (in the outer quarter of the grid) while the concept is there in at most
    :data:`FLAG_PRESENCE` of the pictures (a mark on some of them, not what every picture has at
    that place, such as the padding of a convolutional stem), or most of them off the object."""
    edge = near_edge(place["place"]["row"], place["place"]["col"], grid) and place["place_presence"] <= FLAG_PRESENCE
    return place["one_place_share"] >= FLAG_SHARE and (edge or place.get("off_object_share", 0.0) >= FLAG_SHARE)


# ----------------------------------------------------------------------------- the whole atlas


@dataclass
class Importance:
    """A concept's importance for each class [K, classes], measured both ways: ``removal`` (the
    class's logit's fall on its own pictures, :func:`class_importance`), ``addition`` (its rise on
    the other classes' pictures, :func:`stamp_importance`) and ``turned`` (the share of those
    pictures the concept turns into the class)."""

    removal: np.ndarray
    addition: np.ndarray
    turned: np.ndarray

    @property
    def both(self) -> np.ndarray:
        """What ranks the concepts: the larger of the two (removal alone where there is no addition)."""
        return np.fmax(self.removal, self.addition)


def per_class(values: np.ndarray, k: int, classes: Sequence[int], labels: Sequence[str]) -> dict[str, float | None]:
    """Row ``k`` of [K, classes] as {class name: value} over ``classes`` (None for NaN)."""
    return {labels[c]: None if np.isnan(values[k, c]) else round(float(values[k, c]), 6) for c in classes}


def concept_records(lm: LoadedModel, seen: Seen, folder: Folder, concepts: Concepts, ways: Importance,
                    layer: int) -> list[dict[str, Any]]:
    """Every concept's record: its top patches, where they sit, its importance for every class in
    the folder (``importance``: the larger of ``removal`` and ``addition``; ``turned``)."""
    classes = sorted(set(seen.targets))
    grid = (lm.data_config.input_size[0] // lm.model.cfg.patch_size, lm.data_config.input_size[1] // lm.model.cfg.patch_size)
    importance = ways.both
    ranks = {c: list(np.argsort(-importance[:, c], kind="stable")[:CLASS_TOP]) for c in classes}
    out, presence = [], concepts.presence()
    for k in range(concepts.basis.shape[0]):
        top, place = where_it_lives(concepts.codes[:, :, k], presence[:, :, k], seen, lm, folder)
        top_of = [lm.labels[c] for c in classes if k in ranks[c]]
        out.append({"id": k + 1, "layer": layer, "top": top, **place,
                    "importance": {lm.labels[c]: round(float(importance[k, c]), 6) for c in classes},
                    "removal": per_class(ways.removal, k, classes, lm.labels),
                    "addition": per_class(ways.addition, k, classes, lm.labels),
                    "turned": per_class(ways.turned, k, classes, lm.labels),
                    "top_for": top_of, "suspicious": bool(top_of) and suspicious(place, grid)})
    return out


def findings(heads: list[dict[str, Any]], concepts: list[dict[str, Any]], classes: list[str]) -> dict[str, Any]:
    """What stands out: the most important heads, each class's top concepts, the flagged concepts."""
    ranked = sorted(heads, key=lambda h: -h["importance"])[:5]
    flagged = sorted((k for k in concepts if k["suspicious"]),
                     key=lambda k: -max([k["importance"][c] for c in k["top_for"]], default=0.0))
    per_class = {c: [k["id"] for k in sorted(concepts, key=lambda k: -k["importance"][c])[:CLASS_TOP]] for c in classes}
    return {"top_heads": [{"layer": h["layer"], "head": h["head"], "importance": h["importance"],
                           "summary": h["summary"]} for h in ranked],
            "class_concepts": per_class,
            "suspicious_concepts": [{"id": k["id"], "top_for": k["top_for"], "border_share": k["border_share"],
                                     "one_place_share": k["one_place_share"], "place": k["place"],
                                     "place_presence": k["place_presence"], "off_object_share": k.get("off_object_share"),
                                     "turned": {c: k["turned"][c] for c in k["top_for"]}}
                                    for k in flagged]}


def default_layer(depth: int) -> int:
    """A late layer: the last but one block's output (1-based), the last for a one-block model."""
    return max(1, depth - 1)


def atlas(lm: LoadedModel, images: str | os.PathLike, layer: int | None = None, concepts: int = DEFAULT_CONCEPTS,
          labels: str = "auto", limit: int | None = None, batch_size: int = 16, progress: bool = True,
          seed: int = 0, fitted: dict[str, Any] | None = None, load: Loader | None = None,
          isolated: bool = False) -> dict[str, Any] | None:
    """The atlas of the folder ``images`` (see the module docstring): the ``--json`` object; under
    ``torchrun`` only process 0 returns it (the others None). ``fitted``: a dict that receives the
    fitted :class:`Concepts` under ``"concepts"`` (the app codes new pictures with it); ``load``:
    how a picture is read (the app's limits; default :func:`vit_demo.images.load_image`);
    ``isolated``: NMF in a child process (:mod:`.child`: a time limit stops it, a crash there
    fails this atlas only). Under a time limit (:func:`vit_demo.progress.time_limit`) an atlas
    that would not end in time says so after its first batch (:class:`vit_demo.progress.TimeUp`,
    with the number of pictures that would fit). ValueError for a headless model, a layer
    outside 0..depth, too few concepts or no readable picture."""
    t0 = time.perf_counter()
    depth = len(lm.model.blocks)
    require_classifier(lm, "the atlas needs class logits")
    layer = default_layer(depth) if layer is None else layer
    if not 0 <= layer <= depth:
        raise ValueError(f"--layer must be in 0..{depth} for {lm.name}, not {layer}")
    if concepts < 2:
        raise ValueError(f"--concepts must be at least 2, not {concepts}")
    with folder_job(lm, images, labels, limit) as (pictures, folder, dist), ExitStack() as stack:
        # NMF's process, started now: it imports scikit-learn while the model's passes run
        child = stack.enter_context(Child(NMF_IMPORTS, "The atlas's concepts (NMF)")) if isolated and dist.main else None
        seen, drop, wrong = sharded_passes(lm, pictures, folder, layer, batch_size, progress, dist, load,
                                           atlas_cost(lm.model, concepts))
        if seen is None:
            return None
        if not seen.pictures:
            raise none_readable(images, pictures, seen.errors)
        result = concept_atlas(lm, seen, folder, drop, wrong, layer, concepts, batch_size, seed, fitted, child)
    result.update(folder=str(images), labels=folder.mode, processes=dist.world)
    if folder.watermark_box is not None:
        result["shortcut"] = folder.shortcut
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def sharded_passes(lm: LoadedModel, pictures: Sequence[Picture], folder: Folder, layer: int, batch_size: int,
                   progress: bool, dist: Dist, load: Loader | None = None, cost: float | None = None
                   ) -> tuple[Seen | None, np.ndarray, np.ndarray]:
    """The model passes, every ``world``-th picture on each process: pass 1, then the heads' mean
    outputs over the whole folder shared, then mean-ablation; process 0 gathers (seen, the heads'
    mean logit falls [L, H], their accuracy falls [L, H], NaN without labels); None elsewhere."""
    mine = list(pictures)[dist.rank :: dist.world]
    seen = first_pass(lm, mine, folder, layer, batch_size, progress and dist.main, load, cost, len(mine))
    totals = [(o, c) for o, c in share_objects((seen.sums.outputs, seen.sums.count), dist) if c]
    if not totals:
        return merge_seen(gather_objects(seen, dist) or [seen]), np.zeros(0), np.zeros(0)
    means = sum(o for o, _ in totals) / sum(c for _, c in totals)
    drop, wrong = head_importance(lm, seen, means, batch_size, progress and dist.main, load)
    parts = gather_objects((seen, drop, wrong), dist)
    if parts is None:
        return None, drop, wrong
    whole = merge_seen([p[0] for p in parts])
    n, judged = max(1, len(whole.pictures)), int(sum(whole.labelled))
    drop, wrong = sum(p[1] for p in parts) / n, sum(p[2] for p in parts)
    return whole, drop, (wrong / judged if judged else np.full(drop.shape, np.nan))


def concept_atlas(lm: LoadedModel, seen: Seen, folder: Folder, drop: np.ndarray, acc: np.ndarray, layer: int,
                  k: int, batch_size: int, seed: int, fitted: dict[str, Any] | None = None,
                  child: Child | None = None) -> dict[str, Any]:
    """Process 0's part on the merged ``seen``: the head records, the concepts (also put in
    ``fitted["concepts"]`` when given), their importance, the faithfulness check and the findings."""
    model, depth = lm.model, len(lm.model.blocks)
    heads = head_records(lm, seen, drop, acc)
    tokens = np.concatenate(seen.tokens)
    patches = tokens[:, model.cfg.num_prefix_tokens :]
    found = child.run(fit_concepts, patches, k, seed) if child is not None else fit_concepts(patches, k, seed)
    if fitted is not None:
        fitted["concepts"] = found
    presence, baseline = found.presence(), place_baseline(seen, model.cfg.num_prefix_tokens)
    ways = Importance(class_importance(lm, seen, presence, baseline, batch_size),
                      *stamp_importance(lm, seen, found.codes, batch_size))
    check = faithfulness(lm, seen, presence, baseline, ways.both, seed, batch_size)
    concept_list = concept_records(lm, seen, folder, found, ways, layer)
    classes = [lm.labels[c] for c in sorted(set(seen.targets))]
    return {"images": len(seen.pictures), "model": lm.name, "labelled": int(sum(seen.labelled)), "layers": depth,
            "heads_per_layer": model.blocks[0].attn.num_heads,
            "grid": [s // model.cfg.patch_size for s in lm.data_config.input_size],
            "concept_layer": layer, "reconstruction_error": round(found.error, 6),
            "importance_method": "mean-ablation (heads); for the concepts the larger of: the class's logit's fall "
                                 "when the patches where the concept is are occluded in the embeddings (removal), "
                                 "and its rise on the other classes' pictures when the concept's own patches are "
                                 "stamped on them (addition)",
            "heads": heads, "concepts": concept_list, "faithfulness": check,
            "findings": findings(heads, concept_list, classes), "errors": seen.errors}
