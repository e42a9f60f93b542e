"""Scratch model vs a reference implementation (timm's, or transformers' for a ported
transformers folder), same weights, same inputs -> a parity report."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..images import find_images
from ..model import VisionTransformer, ViTConfig, diff_lambda, window_map
from ..precision import full_precision, model_precision, set_precision
from ..preprocess import DataConfig, load_inputs
from ..progress import batches
from .files import check_state_dict, is_timm_layout, read_checkpoint
from .load import LoadedModel, default_checkpoint, load_model, resolve_device
from .stem_twin import STEM_SCOPE, StemEmbed, is_stem_twin, stage_diffs, traced
from .timm import timm_keys, timm_model

TIMM_LOCK = threading.Lock()  # timm_attentions hooks the model it runs: no other forward of timm while they are on

DEFAULT_TOL = 1e-4
CHECK_PRECISIONS = ("fp32", "bf16")  # what a check runs the scratch model in; the reference always runs in fp32


def compared_words(precision: str, reference: str = "timm") -> str:
    """Which precisions a check compared, in words, for every place that reports one: "both in fp32"
    (like with like: a parity check), or "the scratch model in bf16, timm's in fp32" (bfloat16's
    rounding, shown as such when asked for)."""
    lib = reference.split()[0]
    return "both in fp32" if precision == "fp32" else f"the scratch model in {precision}, {lib}'s in fp32"


def in_bf16(model: nn.Module) -> nn.Module:
    """``model`` running in bfloat16 as ``--precision bf16`` runs it (vit_demo.precision.set_precision):
    itself when it already does, else a shallow copy (the same parameters, a forward of its own), so
    that the model others use is untouched."""
    return model if model_precision(model) == "bf16" else set_precision(copy.copy(model), "bf16")


def timm_twin(lm: LoadedModel, weights: str | os.PathLike | None = None, **kwargs: Any) -> nn.Module:
    """timm's own model for ``lm``'s architecture, loaded with the same weights.

    With a file, timm reads the file itself (not our port of it), so a porting bug shows up.
    """
    cfg = lm.model.cfg
    if lm.timm_name:
        tm = timm_model(lm.timm_name, num_classes=cfg.num_classes, **kwargs)
    elif lm.class_names is not None:  # trained here (vit_demo train): no timm name, a plain config
        tm = timm_from_config(cfg, **kwargs)
    else:
        raise ValueError(f"{lm.name}: no timm architecture is known for it (a timm-layout file: pass --model NAME; "
                         f"a transformers port: use `verify --weights FILE --reference DIR` instead)")
    if weights is not None:
        sd, _ = read_checkpoint(weights)
        if not lm.timm_name:  # built from the config: every key and shape checked first, an error naming them
            check_state_dict(tm, sd, f"{Path(weights).name} (for timm's VisionTransformer built from its config)")
        if is_timm_layout(sd):
            tm.load_state_dict(sd, strict=True)
        else:  # big_vision .npz: timm's own loader
            from timm.models.vision_transformer import _load_weights

            _load_weights(tm, str(weights))
    else:  # random init / hub: the scratch model holds the same weights as timm's would
        sd = timm_keys(lm.model.state_dict(), cfg)
        if not lm.timm_name:
            check_state_dict(tm, sd, f"{lm.name} (for timm's VisionTransformer built from its config)")
        tm.load_state_dict(sd, strict=True)
    return tm.to(lm.device).eval()


def takes_any_size(cfg: ViTConfig) -> bool:
    """Whether timm's model of this architecture runs at any input size as built (SAM's encoder, NaFlex),
    rather than when built with ``dynamic_img_size``."""
    return bool(cfg.window_size or cfg.rel_pos == "decomposed" or cfg.neck_chans or cfg.naflex)


def timm_from_config(cfg: ViTConfig, **kwargs: Any) -> nn.Module:
    """timm's ``VisionTransformer`` built from one of our configs (a checkpoint trained here has
    no timm model name). Only for the plain variants timm's class builds the same way. A
    convolutional stem has no timm counterpart: timm's class is then built with ours as its patch
    embedding (:class:`~.stem_twin.StemEmbed`), so that it compares from the tokens on."""
    from functools import partial

    from timm.models.vision_transformer import VisionTransformer as TimmViT

    if cfg.dist_token or cfg.act != "gelu" or cfg.layer_scale:
        raise ValueError("timm's VisionTransformer has no distillation token / QuickGELU / LayerScale by config")
    if cfg.conv_stem:
        kwargs = {"embed_layer": partial(StemEmbed, cfg), **kwargs}
    return TimmViT(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
                   global_pool=cfg.global_pool, embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                   mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, class_token=cfg.class_token,
                   no_embed_class=cfg.no_embed_class, reg_tokens=cfg.reg_tokens, pre_norm=cfg.pre_norm,
                   final_norm=cfg.final_norm, fc_norm=cfg.fc_norm, norm_layer=partial(nn.LayerNorm, eps=cfg.norm_eps),
                   **kwargs).eval()


TIMING_RUNS = 3  # each model's time: the median of this many runs on the first batch, the two interleaved


def timed(fn: Any, x: torch.Tensor) -> tuple[Any, float]:
    """``fn(x)`` and its wall seconds (a GPU waited for)."""
    cuda = x.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(x.device)
    t0 = time.perf_counter()
    out = fn(x)
    if cuda:
        torch.cuda.synchronize(x.device)
    return out, time.perf_counter() - t0


def time_both(f: Any, g: Any, x: torch.Tensor) -> tuple[Any, Any, float, float]:
    """``f(x)``, ``g(x)`` (their first outputs) and the median seconds of each over :data:`TIMING_RUNS` runs,
    interleaved, the order alternating (f g, g f, f g): a machine that slows down or speeds up
    meanwhile weighs on both alike, and neither always runs second on warm caches."""
    outs: list[Any] = [None, None]
    times: list[list[float]] = [[], []]
    for i in range(TIMING_RUNS):
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            out, t = timed((f, g)[j], x)
            times[j].append(t)
            outs[j] = out if outs[j] is None else outs[j]
    return outs[0], outs[1], float(np.median(times[0])), float(np.median(times[1]))


@torch.inference_mode()
def compare(
    scratch: VisionTransformer, tm: nn.Module, inputs: Sequence[torch.Tensor], batch_size: int = 16, progress: bool = True
) -> dict[str, Any]:
    """Run both models on ``inputs`` ([3, H, W] each) and measure how far apart they are, and how
    fast each runs: :func:`time_both` on the first batch (wall clock on this machine).
    ``tm``: the reference, any module mapping pixels [B, 3, H, W] to logits."""
    dev = next(scratch.parameters()).device
    warm = inputs[0][None].to(dev)
    scratch(warm), tm(warm)  # first-call overheads out of the timing
    diffs, pdiffs, top1, top5 = [], [], 0, 0
    t_scratch = t_timm = 0.0
    stages: dict[str, Any] | None = None
    timed_images = 0
    for chunk in batches(list(inputs), batch_size, "verify", progress):
        x = torch.stack(list(chunk)).to(dev)
        if not timed_images:
            a, b, t_scratch, t_timm = time_both(lambda t: scratch(t).logits, tm, x)
            timed_images = len(x)
        else:
            a, b = scratch(x).logits, tm(x)
        if is_stem_twin(tm):  # from the tokens on: every stage too, outside the timing
            stages = worst_stages(stages, both_traced(scratch, tm, x, trace=True)[3])
        a, b = a.float().cpu(), b.float().cpu()
        diffs.append((a - b).abs().max().item())
        pdiffs.append((a.softmax(-1) - b.softmax(-1)).abs().max().item())
        top1 += (a.argmax(-1) == b.argmax(-1)).sum().item()
        k = min(5, a.shape[-1])
        top5 += sum(set(r.tolist()) == set(s.tolist()) for r, s in zip(a.topk(k).indices, b.topk(k).indices))
    n = len(inputs)
    return {
        **({"stage_max_abs_diff": stages} if stages is not None else {}),
        "images": n,
        "max_abs_logit_diff": max(diffs),
        "max_abs_prob_diff": max(pdiffs),
        "top1_agreement": top1 / n,
        "top5_agreement": top5 / n,
        "scratch_ms_per_image": 1000 * t_scratch / timed_images,
        "reference_ms_per_image": 1000 * t_timm / timed_images,
        "timing": f"median of {TIMING_RUNS} interleaved runs on {timed_images} images, wall clock",
    }


def verify_inputs(images: Sequence[str | os.PathLike], dc: DataConfig) -> tuple[list[Tensor], str]:
    """The inputs ``verify`` compares on, preprocessed by ``dc``, and how its report names them: the
    pictures of ``images`` (ValueError naming one that cannot be read), else 8 random-noise inputs."""
    paths = find_images(list(images))
    if not paths:
        g = torch.Generator().manual_seed(0)
        return list(torch.randn(8, 3, *dc.input_size, generator=g)), "8 random-noise inputs"
    tensors, errors = load_inputs(paths, dc)
    bad = [e for e in errors if e]
    if bad:
        raise ValueError(f"{len(bad)} image(s) could not be read, e.g. {bad[0]}")
    return tensors, f"{len(paths)} images"


def verify(
    model: str | None,
    weights: str | os.PathLike | None = None,
    random_init: bool = False,
    images: Sequence[str | os.PathLike] = (),
    device: str = "auto",
    tol: float = DEFAULT_TOL,
    input_size: tuple[int, int] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    reference: str | os.PathLike | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Build both models with the same weights and compare them on ``images`` (a folder or
    files; random inputs when none). ``passed``: logits within ``tol`` and identical top-1.
    The reference is timm's model, or with ``reference`` (a transformers model folder)
    transformers' own; ``weights`` then defaults to that folder, ported on the fly.
    With no model, weights, random init or reference: the embedded default checkpoint. ``precision``:
    what the scratch model runs in (vit_demo.precision); the reference runs in float32 always, so that
    "identical to float precision" keeps its meaning: in bf16 the report shows bfloat16's differences."""
    if model is None and weights is None and not random_init and reference is None:
        weights = default_checkpoint()
    if reference is not None and weights is None:
        weights = reference
    lm = load_model(model, weights, random_init=random_init, device=device, precision=precision)
    dc = lm.data_config if input_size is None else lm.data_config.with_size(input_size)
    resized = tuple(dc.input_size) != tuple(lm.model.cfg.img_size)
    if resized and lm.model.cfg.rel_pos not in ("", "decomposed"):  # SAM's decomposed tables are resampled
        (gh, gw), (h, w) = lm.model.cfg.grid_size, lm.model.cfg.img_size
        raise ValueError(f"{lm.name}: its relative position bias is defined for the {gh}x{gw} patch grid it was "
                         f"trained at (in timm too): verify it at its own size, {h}x{w}")
    if reference is not None:
        tm = transformers_reference(reference, interpolate=resized).to(lm.device)
        ref_name = f"transformers {tm.architecture}"
    else:
        tm = timm_twin(lm, weights, **({"dynamic_img_size": True} if resized and not takes_any_size(lm.model.cfg) else {}))
        ref_name = "timm"
    inputs, what = verify_inputs(images, dc)
    report = compare(lm.model, tm, inputs, batch_size, progress)
    if reference is None:
        report["timm_ms_per_image"] = report["reference_ms_per_image"]  # the name scripts already use
    stages = report.get("stage_max_abs_diff")  # a convolutional stem: compared from the tokens on
    report.update(
        model=lm.name, timm_model=lm.timm_name, reference=ref_name, weights=str(weights) if weights else lm.source,
        inputs=what, input_size=list(dc.input_size), device=str(resolve_device(device)), tolerance=tol,
        precision=lm.precision, compared=compared_words(lm.precision, ref_name),
        starts_at="tokens" if stages else "pixels", scope=STEM_SCOPE if stages else "",
        passed=(report["max_abs_logit_diff"] <= tol and report["top1_agreement"] == 1.0
                and (stages is None or stages_within(stages, tol))),
    )
    return report


class TransformersReference(nn.Module):
    """transformers' own model loaded from a folder, called like timm's: pixels -> logits, or
    what a headless model outputs, as ours: CLIP's projected ``image_embeds``, the
    ``pooler_output`` (DINOv2's and CLIP's normed [class] token, SigLIP's attention pool), or
    ``ViTModel``'s normed [class] token."""

    def __init__(self, model: nn.Module, architecture: str, interpolate: bool) -> None:
        super().__init__()
        self.model, self.architecture, self.interpolate = model, architecture, interpolate
        import inspect

        # DINOv2 always resizes its position embedding; the others on request
        self.kwargs = {"interpolate_pos_encoding": interpolate} if "interpolate_pos_encoding" in inspect.signature(
            model.forward).parameters else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(pixel_values=x, **self.kwargs)
        for name in ("logits", "image_embeds", "pooler_output"):
            if getattr(out, name, None) is not None:
                return getattr(out, name)
        return out.last_hidden_state[:, 0]


def transformers_reference(folder: str | os.PathLike, interpolate: bool = False) -> TransformersReference:
    """The folder's model built by transformers itself (local files only, eager attention)."""
    from .hf import architecture_of, read_json

    try:
        import transformers
    except ImportError as e:
        raise ValueError("verify --reference needs the transformers package: pip install transformers") from e
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"--reference {folder}: not a transformers model folder (no config.json)")
    arch = architecture_of(read_json(folder / "config.json"), folder)
    kwargs: dict[str, Any] = {"add_pooling_layer": False} if arch == "ViTModel" else {}
    model = getattr(transformers, arch).from_pretrained(str(folder), local_files_only=True,
                                                          attn_implementation="eager", **kwargs)
    return TransformersReference(model.float().eval(), arch, interpolate)


def stage_lines(stages: dict[str, Any]) -> list[str]:
    """The report's lines for a comparison from the tokens on (:func:`both_traced`'s stages)."""
    worst = int(np.argmax(stages["blocks"]))
    n = len(stages["blocks"])
    return [
        "  compared:            from the tokens on (each block's output and attention, final norm, pooling, logits)",
        f"  max |token diff|:    {stages['tokens']:.3e} (after the position embedding)",
        f"  max |block diff|:    output {max(stages['blocks']):.3e} (worst: block {worst + 1} of {n}), "
        f"attention {max(stages['attention']):.3e}",
        f"  max |norm diff|:     {stages['norm']:.3e} (the tokens after the last block and the final norm, if any)",
        f"  max |pooled diff|:   {stages['pooled']:.3e} (the head's input: pooled, then normed by fc_norm, if any)",
    ]


def format_report(report: dict[str, Any]) -> str:
    stages = report.get("stage_max_abs_diff")
    ref = report.get("reference", "timm")
    lib = ref.split()[0]
    low = report.get("precision", "fp32") != "fp32"
    start = " from the tokens on" if stages else ""
    verdict = f"PASSED: identical to {report['tolerance']:g}{start}" if report["passed"] else f"FAILED{start}"
    verdict += ", both in fp32"
    if low:  # asked for (--precision): what bf16's rounding does, never a failed parity check
        verdict = (f"{report['precision']}'s rounding, as expected: {'within' if report['passed'] else 'not within'} "
                   f"{report['tolerance']:g} of {lib}'s fp32{start} (--precision fp32 runs the parity check)")
    if stages:
        import textwrap

        verdict += "\n" + textwrap.fill(report["scope"], 100, initial_indent="  ", subsequent_indent="  ")
    ours, theirs = report["scratch_ms_per_image"], report["reference_ms_per_image"]
    return "\n".join([
        f"scratch ViT vs {ref}: {report['model']} ({report['weights']}), "
        + compared_words(report.get("precision", "fp32"), ref),
        f"  inputs:              {report['inputs']} at {report['input_size'][0]}x{report['input_size'][1]} on {report['device']}",
        *(stage_lines(stages) if stages else []),
        f"  max |logit diff|:    {report['max_abs_logit_diff']:.3e}",
        f"  max |prob diff|:     {report['max_abs_prob_diff']:.3e}",
        f"  top-1 agreement:     {report['top1_agreement'] * 100:.1f}%",
        f"  top-5 agreement:     {report['top5_agreement'] * 100:.1f}%",
        f"  time per image:      scratch {ours:.1f} ms, {lib} {theirs:.1f} ms ({ours / max(theirs, 1e-9):.2f}x {lib}'s; "
        f"{report['timing']} on this machine, which other work moves)",
        f"  {verdict}",
    ])


def attention_modules(block: nn.Module) -> list[nn.Module]:
    """The modules of a timm block that compute attention (``fused_attn``, ``attn_drop``): its
    ``attn``, every branch's (ParallelThingsBlock), or the block itself (parallel scaling blocks)."""
    if hasattr(block, "attns"):
        return [b.attn for b in block.attns]
    return [getattr(block, "attn", block)]


@torch.inference_mode()
def timm_attentions(tm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's logits and its own post-softmax attention per layer (fused attention switched off
    for this call, probabilities read where timm applies attention dropout), in the scratch
    model's form: parallel branches' heads side by side, differential attention's two maps as
    their difference softmax1 - lambda softmax2, SAM's windows on the diagonal of one map."""
    captured: list[list[torch.Tensor]] = [[] for _ in tm.blocks]
    hooks, fused = [], []
    with TIMM_LOCK:  # (two threads' hooks on one model each caught both forwards: twice the heads)
        for i, blk in enumerate(tm.blocks):
            for m in attention_modules(blk):
                fused.append((m, m.fused_attn))
                m.fused_attn = False
                hooks.append(m.attn_drop.register_forward_hook(lambda mod, a, o, i=i: captured[i].append(o.detach())))
        try:
            logits = tm(x)
        finally:
            for h in hooks:
                h.remove()
            for m, f in fused:
                m.fused_attn = f
    out = []
    p = tm.patch_embed.proj.stride if hasattr(tm, "patch_embed") else tm.embeds.patch_size
    grid = (x.shape[-2] // p[0], x.shape[-1] // p[1])
    for blk, maps in zip(tm.blocks, captured):
        m = attention_modules(blk)[0]
        if maps[0].ndim == 3:  # SAM: [B' * H, n, n]
            maps = [maps[0].unflatten(0, (-1, m.num_heads))]
        if getattr(blk, "window_size", 0):  # SAM: [B * windows, H, w*w, w*w] -> [B, H, N, N]
            maps = [window_map(maps[0], grid, blk.window_size)]
        if hasattr(m, "lambda_init"):  # differential: [B, 2H, N, N] -> [B, H, N, N]
            s = maps[0].unflatten(1, (-1, 2))
            maps = [s[:, :, 0] - diff_lambda(m).type_as(s) * s[:, :, 1]]
        out.append(torch.cat(maps, dim=1))
    return logits, out


@torch.inference_mode()
def both_traced(scratch: VisionTransformer, tm: nn.Module, x: torch.Tensor, trace: bool
                ) -> tuple[Any, torch.Tensor, list[torch.Tensor], dict[str, Any] | None]:
    """Both models on ``x`` with every layer's attention: our output, timm's logits and attention,
    and with ``trace`` the max |difference| of each stage (:func:`~.stem_twin.traced`: the tokens,
    every block's output and attention, the final norm, the pooled features), else None."""
    from contextlib import nullcontext

    with traced(scratch) if trace else nullcontext() as ours_stages:
        ours = scratch(x, capture=True)
    with traced(tm) if trace else nullcontext() as ref_stages:
        ref_logits, ref_attn = timm_attentions(tm, x)
    if not trace:
        return ours, ref_logits, ref_attn, None
    stages = stage_diffs(ours_stages, ref_stages)
    stages["attention"] = [(p.float() - q.float()).abs().max().item() for p, q in zip(ours.attentions, ref_attn)]
    return ours, ref_logits, ref_attn, stages


def worst_stages(worst: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The larger difference of two :func:`both_traced` stage records, stage by stage."""
    if worst is None:
        return new
    return {k: [max(p, q) for p, q in zip(worst[k], new[k])] if isinstance(new[k], list) else max(worst[k], new[k]) for k in new}


def stages_within(stages: dict[str, Any], tol: float) -> bool:
    """Whether every stage of a :func:`both_traced` record is within ``tol``."""
    return all(d <= tol for v in stages.values() for d in (v if isinstance(v, list) else [v]))


def compare_one(scratch: VisionTransformer, tm: nn.Module, x: torch.Tensor, k: int = 5, repeats: int = 3,
                precision: str = "fp32") -> dict[str, Any]:
    """Both models on one input [1, 3, H, W]: logits, top-k, per-layer attention, and timings, like
    with like: ``precision`` "fp32" (the default) runs the scratch model in float32 whatever it runs
    in elsewhere (a model the app runs in bf16 too), against timm's float32; "bf16" runs it in
    bfloat16 to show bfloat16's rounding (:func:`verdict` says so, never "Mismatch"). The result
    records it under ``"precision"``."""
    if precision not in CHECK_PRECISIONS:
        raise ValueError(f"a check runs the scratch model in {' or '.join(CHECK_PRECISIONS)}, not {precision!r}")
    if precision == "bf16":
        c = both_once(in_bf16(scratch), tm, x, k, repeats)
    else:
        with full_precision():
            c = both_once(scratch, tm, x, k, repeats)
    return {**c, "precision": precision}


@torch.inference_mode()
def both_once(scratch: VisionTransformer, tm: nn.Module, x: torch.Tensor, k: int = 5, repeats: int = 3) -> dict[str, Any]:
    """Both models on one input [1, 3, H, W], each as it runs: logits, top-k, per-layer attention, and timings."""

    def best_time(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
        return min(times)

    def timm_forward(t: torch.Tensor) -> torch.Tensor:
        with TIMM_LOCK:  # never while another thread's timm_attentions has its hooks on tm
            return tm(t)

    stem = is_stem_twin(tm)
    ours, ref_logits, ref_attn, stages = both_traced(scratch, tm, x, trace=stem)
    a, b = ours.logits.float().cpu()[0], ref_logits.float().cpu()[0]
    k = min(k, a.numel())
    ta, tb = a.topk(k).indices.tolist(), b.topk(k).indices.tolist()
    layer_diffs = [(p.cpu() - q.cpu()).abs().max().item() for p, q in zip(ours.attentions, ref_attn)]
    return {
        **({"stages": stages, "scope": STEM_SCOPE} if stem else {}),
        "max_abs_logit_diff": (a - b).abs().max().item(),
        "max_abs_prob_diff": (a.softmax(-1) - b.softmax(-1)).abs().max().item(),
        "top1_agree": ta[0] == tb[0],
        "topk_agree": ta == tb,
        "scratch_topk": ta,
        "timm_topk": tb,
        "scratch_probs": a.softmax(-1)[ta].tolist(),
        "timm_probs": b.softmax(-1)[tb].tolist(),
        "layer_attn_max_diff": layer_diffs,
        "scratch_ms": 1000 * best_time(lambda t: scratch(t)),
        "timm_ms": 1000 * best_time(timm_forward),
    }


def verdict(check: dict[str, Any], tol: float = DEFAULT_TOL) -> str:
    """One sentence a presenter can read out (two for a model compared from the tokens on: what
    was compared, then why not from the pixels), naming the precisions compared when the check
    records them (:func:`compare_one`); a check of bf16 against fp32 is bf16's rounding, said so."""
    worst_attn = max(check["layer_attn_max_diff"]) if check["layer_attn_max_diff"] else 0.0
    stages = check.get("stages")
    start, scope = (" from the tokens on", f" {check['scope']}") if stages else ("", "")
    low = check.get("precision", "fp32")
    if low != "fp32":
        order = "the same top-k" if check["topk_agree"] else "a top-k order that differs (near-ties that rounding reorders)"
        return (f"{low}'s rounding, as expected{start} ({compared_words(low)}; both in fp32 is the parity check): "
                f"max logit difference {check['max_abs_logit_diff']:.1e}, max attention difference {worst_attn:.1e}, "
                f"{order}.{scope}")
    start += ", both in fp32" if "precision" in check else ""
    if (check["max_abs_logit_diff"] <= tol and check["topk_agree"] and worst_attn <= tol
            and (stages is None or stages_within(stages, tol))):
        blocks = f"max block-output difference {max(stages['blocks'], default=0.0):.1e}, " if stages else ""
        return (f"Identical to {tol:g}{start}: max logit difference {check['max_abs_logit_diff']:.1e}, "
                f"max attention difference {worst_attn:.1e}, {blocks}same top-{len(check['scratch_topk'])}.{scope}")
    parts = []
    if check["max_abs_logit_diff"] > tol:
        parts.append(f"logits differ by up to {check['max_abs_logit_diff']:.2e}")
    if not check["topk_agree"]:
        parts.append("the top-k lists differ")
    if worst_attn > tol:
        layer = int(np.argmax(check["layer_attn_max_diff"]))
        parts.append(f"attention differs by {worst_attn:.2e} (first worst at layer {layer + 1})")
    for name, what in (("tokens", "the tokens differ"), ("norm", "the final norm's output differs"),
                       ("pooled", "the pooled features differ")):
        if stages and stages[name] > tol:
            parts.append(f"{what} by {stages[name]:.2e}")
    if stages and max(stages["blocks"], default=0.0) > tol:
        block = int(np.argmax(stages["blocks"])) + 1
        parts.append(f"block outputs differ by {max(stages['blocks']):.2e} (first worst at block {block})")
    return f"Mismatch{start}: " + "; ".join(parts) + "." + scope
