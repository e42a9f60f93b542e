"""How much of timm's ViT family the scratch model ports, and does it compute the same thing?

    python benchmarks/timm_coverage.py [--out docs/timm_coverage.md] [--no-parity]

1. Coverage: every architecture of timm's ViT-family modules (vision_transformer, eva, beit,
   deit, vision_transformer_relpos, vision_transformer_sam, naflexvit) is built on the meta
   device (no weights, no memory, nothing downloaded); it is *accepted* when
   ``config_from_timm`` reads a config off it and the scratch model built from that config has
   exactly timm's state-dict keys and shapes, else *refused* with the reason. Each architecture
   counts with its pretrained tags (``timm.list_pretrained``: metadata, no download).
2. Parity: a sample of small models of each family, timm's random init with every parameter
   moved by noise (so LayerScale, tables and biases matter), ported and run side by side with
   timm on random inputs at the model's size and, where timm resizes (``dynamic_img_size``), at
   a non-square one: max |logit difference|, top-1 agreement, max attention difference.
   Architectures without a small variant are sampled with fewer blocks (marked). A sample whose
   attention maps would pass ``PARITY_MEMORY`` is refused before it runs, and a sample that fails
   is a row of the report that says why: one sample never ends the run.

Writes the full report as Markdown (``--out``) and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

MODULES = ("vision_transformer", "eva", "beit", "deit", "vision_transformer_relpos", "vision_transformer_sam",
           "naflexvit")
TOL = 1e-4
PARITY_MEMORY = 4 << 30  # bytes: a sample whose attention maps need more is refused before it runs

# (timm name, constructor keywords, family): a small model of each family, or a reduced one
SAMPLE = [
    ("deit_tiny_patch16_224", {}, "ViT / DeiT"),
    ("deit_tiny_distilled_patch16_224", {}, "DeiT distilled"),
    ("deit3_small_patch16_224", {}, "DeiT-III"),
    ("vit_small_patch14_reg4_dinov2", {"img_size": 224}, "DINOv2 (registers)"),
    ("vit_giant_patch14_dinov2", {"depth": 2, "img_size": 224}, "DINOv2-giant (SwiGLU)"),
    ("vit_base_patch32_clip_224", {}, "CLIP"),
    ("vit_base_patch32_siglip_256", {}, "SigLIP (MAP head)"),
    ("vit_so400m_patch14_siglip_224", {"depth": 2}, "SigLIP so400m (GELU-tanh)"),
    ("aimv2_large_patch14_224", {"depth": 2}, "AIMv2"),
    ("beit3_base_patch16_224", {"depth": 4}, "BEiT-3"),
    ("vit_base_patch16_rpn_224", {"depth": 4}, "ViT res-post"),
    ("test_vit4", {}, "ViT RMSNorm"),
    ("eva02_tiny_patch14_224", {}, "EVA-02"),
    ("eva02_base_patch16_clip_224", {"depth": 4}, "EVA-02 CLIP"),
    ("eva02_enormous_patch14_clip_224", {"depth": 2}, "EVA-02-E (res-post)"),
    ("eva_giant_patch14_224", {"depth": 2}, "EVA"),
    ("vit_small_patch16_dinov3", {}, "DINOv3"),
    ("vit_small_plus_patch16_dinov3_qkvb", {}, "DINOv3 (SwiGLU, q/v bias)"),
    ("vit_pe_core_tiny_patch16_384", {}, "Perception Encoder"),
    ("vit_small_patch16_rope_224", {}, "RoPE-ViT axial"),
    ("vit_small_patch16_rope_mixed_ape_224", {}, "RoPE-ViT mixed"),
    ("vit_medium_patch16_rope_reg1_gap_256", {}, "timm RoPE ViT"),
    ("vit_base_patch16_sapiens2", {"depth": 4, "num_kv_heads": (12, 6, 6, 12), "img_size": (256, 192)},
     "Sapiens2 (GQA)"),
    ("beit_base_patch16_224", {"depth": 4}, "BEiT"),
    ("beitv2_base_patch16_224", {"depth": 4}, "BEiT v2"),
    ("vit_relpos_small_patch16_224", {}, "relpos ViT"),
    ("vit_srelpos_small_patch16_224", {}, "relpos ViT (shared)"),
    ("vit_relpos_small_patch16_rpn_224", {}, "relpos ViT (res-post)"),
    ("vit_dwee_patch16_reg1_gap_256", {}, "differential attention"),
    ("vit_pwee_patch16_reg1_gap_256", {}, "parallel scaling blocks"),
    ("vit_base_patch16_xp_224", {"depth": 4}, "parallel scaling blocks (RMSNorm, qk-norm)"),
    ("vit_dpwee_patch16_reg1_gap_256", {}, "differential parallel scaling blocks"),
    ("vit_small_patch16_18x2_224", {"depth": 4}, "parallel-branch blocks (18x2)"),
    ("samvit_base_patch16", {"depth": 4, "img_size": 256, "global_attn_indexes": (1, 3)}, "SAM's image encoder"),
    ("naflexvit_base_patch16_gap", {"depth": 4}, "NaFlex ViT"),
    ("naflexvit_base_patch16_parfac_gap", {"depth": 4}, "NaFlex ViT (factorized positions)"),
    ("naflexvit_base_patch16_siglip", {"depth": 4}, "SigLIP 2 NaFlex"),
    # C-RADIO's position table is 128x128 patches (2048 px): at that size one block's captured attention
    # alone takes 25 GB (the full run died there); sampled at its data config's 512 px with a 32x32 table
    ("naflexvit_base_patch16_radio_v3", {"depth": 4, "pos_embed_grid_size": (32, 32)}, "C-RADIOv3 (NaFlex)"),
]


def pretrained_tags() -> dict[str, list[str]]:
    import timm

    tags: dict[str, list[str]] = collections.defaultdict(list)
    for t in timm.list_pretrained():
        tags[t.split(".")[0]].append(t)
    return tags


def judge(name: str) -> str | None:
    """None when the scratch model ports ``name`` (built on the meta device), else the reason."""
    import timm

    from vit_demo.checkpoints.timm import config_from_timm, scratch_keys
    from vit_demo.model import VisionTransformer

    try:
        with torch.device("meta"):
            tm = timm.create_model(name, pretrained=False)
            ours = VisionTransformer(config_from_timm(tm))
    except Exception as e:  # UnsupportedModelError, or whatever a model's constructor raises
        return str(e).split(": ", 1)[-1].removeprefix("not a ViT variant this project implements: ")
    a = {k: tuple(v.shape) for k, v in scratch_keys(tm.state_dict(), ours.cfg).items()}
    b = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    if a != b:
        return f"state dict differs: {sorted(set(a) ^ set(b))[:3]} {[k for k in a if k in b and a[k] != b[k]][:3]}"
    return None


def coverage() -> list[dict]:
    import timm

    tags = pretrained_tags()
    rows = []
    for module in MODULES:
        for name in timm.list_models(module=module):
            rows.append({"module": module, "name": name, "tags": tags.get(name, []), "refused": judge(name)})
        print(f"  {module}: {sum(r['module'] == module for r in rows)} architectures", file=sys.stderr, flush=True)
    return rows


@torch.no_grad()
def parity_one(name: str, kwargs: dict, dynamic: bool) -> dict:
    """One comparison; ``dynamic``: at a non-square size (timm built with ``dynamic_img_size``
    where it needs it)."""
    import timm

    from vit_demo.checkpoints.timm import from_timm
    from vit_demo.checkpoints.verify import takes_any_size, timm_attentions

    extra = {"dynamic_img_size": True} if dynamic and not takes_any_size(from_timm_cfg(name, kwargs)) else {}
    torch.manual_seed(0)
    tm = timm.create_model(name, pretrained=False, **kwargs, **extra).eval()
    for p in tm.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    model, _ = from_timm(tm)
    H, W = model.cfg.img_size
    p = model.cfg.patch_size
    size = (H - p, W + 2 * p) if dynamic else (H, W)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    ref, out = tm(x), model(x, capture=True)
    _, ref_attn = timm_attentions(tm, x)
    return {
        "size": f"{size[0]}x{size[1]}",
        "logit": max((model(x).logits - ref).abs().max().item(), (out.logits - ref).abs().max().item()),
        "attn": max((a - b).abs().max().item() for a, b in zip(out.attentions, ref_attn)),
        "top1": bool(torch.equal(out.logits.argmax(-1), ref.argmax(-1))),
        "scale": ref.abs().max().item(),
    }


def from_timm_cfg(name: str, kwargs: dict) -> Any:
    """The scratch config of timm's ``name`` (built on the meta device)."""
    import timm

    from vit_demo.checkpoints.timm import config_from_timm

    with torch.device("meta"):
        return config_from_timm(timm.create_model(name, pretrained=False, **kwargs))


def resizes(name: str, kwargs: dict) -> bool:
    """Whether timm runs ``name`` at other input sizes (as built: SAM, NaFlex; or with ``dynamic_img_size``)."""
    import timm

    from vit_demo.checkpoints.verify import takes_any_size

    if takes_any_size(from_timm_cfg(name, kwargs)):
        return True
    try:
        with torch.device("meta"):
            timm.create_model(name, pretrained=False, dynamic_img_size=True, **kwargs)
    except TypeError:
        return False
    return True


def attention_bytes(name: str, kwargs: dict, batch: int = 2) -> int:
    """Bytes of the attention maps one parity run holds (every block's, ours and timm's, float32)
    at the model's own size: the sample's memory, known before anything is allocated."""
    cfg = from_timm_cfg(name, kwargs)
    gh, gw = cfg.grid_size
    n = gh * gw + cfg.num_prefix_tokens
    return 2 * cfg.depth * batch * cfg.num_heads * n * n * 4


def parity_sample(name: str, kwargs: dict) -> list[dict]:
    """The sample's runs (its size, and a non-square one where timm resizes); ValueError, in
    words, for a sample whose attention maps would not fit in ``PARITY_MEMORY``."""
    need = attention_bytes(name, kwargs)
    if need > PARITY_MEMORY:
        raise ValueError(f"its attention maps alone would take {need / 2**30:.0f} GiB (the cap is "
                         f"{PARITY_MEMORY / 2**30:.0f} GiB): sample it at a smaller size")
    return [parity_one(name, kwargs, False)] + ([parity_one(name, kwargs, True)] if resizes(name, kwargs) else [])


def parity() -> list[dict]:
    """Every sample; one that fails is a row that says why (the run goes on to the report)."""
    rows = []
    for name, kwargs, family in SAMPLE:
        t0 = time.perf_counter()
        try:
            runs, error = parity_sample(name, kwargs), None
        except Exception as e:  # a failing sample is reported, not the end of a 20-minute run
            runs, error = [], f"{type(e).__name__}: {e}".splitlines()[0][:200]
        rows.append({"name": name, "family": family, "reduced": ", ".join(f"{k}={v}" for k, v in kwargs.items()),
                     "runs": runs, "error": error, "seconds": time.perf_counter() - t0})
        diffs = " / ".join(f"{r['logit']:.1e}" for r in runs) or error
        print(f"  {name}: {diffs}", file=sys.stderr, flush=True)
    return rows


def report(cov: list[dict], par: list[dict] | None, seconds: float) -> str:
    """Long because it is the report: a summary, one table per part, the refused tags by reason."""
    total = sum(len(r["tags"]) for r in cov)
    ok = sum(len(r["tags"]) for r in cov if r["refused"] is None)
    archs_ok = sum(r["refused"] is None for r in cov)
    lines = [
        "# timm coverage",
        "",
        f"`python benchmarks/timm_coverage.py` (timm {__import__('timm').__version__}, torch {torch.__version__}, "
        f"{platform.machine()}, {seconds:.0f} s). Regenerate this page with `--out docs/timm_coverage.md`.",
        "",
        f"**{ok} of {total} pretrained tags accepted ({100 * ok / total:.1f} %)**; {archs_ok} of {len(cov)} "
        f"architectures. Accepted: `config_from_timm` reads the architecture off timm's instance (built on the meta "
        f"device: nothing is downloaded) and the scratch model has exactly timm's state-dict keys and shapes.",
        "",
        "| timm module | architectures | accepted | pretrained tags | accepted |",
        "|---|---|---|---|---|",
    ]
    for module in MODULES:
        rs = [r for r in cov if r["module"] == module]
        t = sum(len(r["tags"]) for r in rs)
        a = sum(len(r["tags"]) for r in rs if r["refused"] is None)
        lines.append(f"| `{module}` | {len(rs)} | {sum(r['refused'] is None for r in rs)} | {t} | {a} "
                     f"({100 * a / max(t, 1):.0f} %) |")
    lines += ["", "## Refused", "", "| reason | architectures | pretrained tags |", "|---|---|---|"]
    by_reason: dict[str, list[dict]] = collections.defaultdict(list)
    for r in cov:
        if r["refused"] is not None:
            by_reason[r["refused"]].append(r)
    for reason, rs in sorted(by_reason.items(), key=lambda kv: -sum(len(r["tags"]) for r in kv[1])):
        tags = [t for r in rs for t in r["tags"]]
        names = ", ".join(f"`{r['name']}`" for r in rs)
        lines.append(f"| {reason} | {names} | {len(tags)}: {', '.join(f'`{t}`' for t in tags) or '-'} |")
    if par is not None:
        lines += ["", "## Random-init parity, a sample of each family", "",
                  "timm's random init with every parameter moved by N(0, 0.05) noise, ported, 2 random inputs; the "
                  "fast and the capture path both compared (the larger difference shown); attention: every layer's "
                  f"post-softmax probabilities against timm's own (fused attention off). Pass: logits within {TOL:g} "
                  "and the same top-1. A second size (non-square) where timm resizes the model (`dynamic_img_size`).",
                  "", "| family | timm model | reduced to | input | max \\|logit diff\\| | max \\|attention diff\\| "
                  "| same top-1 | logit scale |", "|---|---|---|---|---|---|---|---|"]
        for row in par:
            if row.get("error"):
                lines.append(f"| {row['family']} | `{row['name']}` | {row['reduced'] or 'full size'} | - | **not run**: "
                             f"{row['error']} | - | - | - |")
            for run in row["runs"]:
                ok_run = run["logit"] <= TOL and run["top1"]
                lines.append(f"| {row['family']} | `{row['name']}` | {row['reduced'] or 'full size'} | {run['size']} | "
                             f"{run['logit']:.1e}{'' if ok_run else ' **FAIL**'} | {run['attn']:.1e} | "
                             f"{'yes' if run['top1'] else '**no**'} | {run['scale']:.2f} |")
        passed = sum(run["logit"] <= TOL and run["top1"] for row in par for run in row["runs"])
        failed = sum(bool(row.get("error")) for row in par)
        lines += ["", f"{passed} of {sum(len(row['runs']) for row in par)} comparisons pass"
                  + (f"; {failed} sample{'s' if failed > 1 else ''} could not run (above)." if failed else ".")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the Markdown report here (e.g. docs/timm_coverage.md)")
    ap.add_argument("--no-parity", action="store_true", help="coverage only (about a minute)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    t0 = time.perf_counter()
    print("coverage (meta device) ...", file=sys.stderr, flush=True)
    cov = coverage()
    par = None
    if not args.no_parity:
        print("parity (random init) ...", file=sys.stderr, flush=True)
        par = parity()
    text = report(cov, par, time.perf_counter() - t0)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
