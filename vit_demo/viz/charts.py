"""Charts of numbers for slides and reports (matplotlib): faithfulness curves, the check
against timm, the model's facts, the sanity check and training curves. Pictures of maps are
:mod:`~vit_demo.viz.figures`; both are saved with :func:`~vit_demo.viz.export.save_figure`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .style import ACCENT, LABEL_SIZE, MUTED_COLOR, TEXT_COLOR, TICK_SIZE, TITLE_SIZE


def shorten(text: str, length: int) -> str:
    """``text`` cut to ``length`` characters, an ellipsis marking the cut."""
    return text if len(text) <= length else text[: length - 1] + "…"


def _plain_figure(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), layout="constrained", facecolor="white")


# Distinct colours (colour-blind-safe where possible), one per method, never repeated in a chart.
METHOD_COLORS = {
    "attention": "#9467bd", "rollout": "#e69f00", "grad-rollout": "#009e73", "chefer": "#d62728",
    "lrp": "#0072b2", "attnlrp": "#56b4e9", "lrp-gated": "#000000", "gradcam": "#cc79a7",
    "integrated-gradients": "#8c564b", "rise": "#bcbd22", "lrp-causal": "#17becf",
}
SPARE_COLORS = ("#7f7f7f", "#aec7e8", "#ff9896", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d")
RANDOM_COLOR = "#9a9a9a"


def method_colors(names: Sequence[str]) -> dict[str, str]:
    """A colour per name, none used twice: the method's own colour, else a spare one."""
    out: dict[str, str] = {}
    spare = [c for c in (*SPARE_COLORS, *METHOD_COLORS.values()) if c not in {METHOD_COLORS.get(n) for n in names}]
    for n in names:
        c = METHOD_COLORS.get(n)
        out[n] = c if c is not None and c not in out.values() else spare.pop(0)
    return out


def faithfulness_figure(scores: dict[str, dict[str, Any]], titles: dict[str, str] | None = None,
                        highlight: Sequence[str] = ()) -> Figure:
    """Deletion and insertion curves of every method and of random order, each method in its own
    colour, ONE legend beside the two panels (never over a curve) with both AUCs.

    ``titles``: what to call each method (default its name); ``highlight``: methods drawn bolder
    (the ones a slide shows)."""
    titles = titles or {}
    names = [n for n in scores if n != "random"]
    colours = method_colors(names)
    fig = _plain_figure(12.0, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, kind in zip(axes, ("deletion", "insertion")):
        for name in [*names, "random"] if "random" in scores else names:
            s = scores[name]
            c = np.asarray(s[f"{kind}_curve"]) * 100
            label = (f"{shorten(titles.get(name, name), 24)}  {s['deletion_auc']:.2f} / {s['insertion_auc']:.2f}"
                     if name != "random" else f"random order  {s['deletion_auc']:.2f} / {s['insertion_auc']:.2f}")
            ax.plot(np.linspace(0, 100, len(c)), c, color=RANDOM_COLOR if name == "random" else colours[name],
                    linestyle="--" if name == "random" else "-", linewidth=3.0 if name in highlight else 1.8,
                    label=label if kind == "deletion" else None, zorder=3 if name in highlight else 2)
        ax.set_title("Hide the most relevant patches first\n(falls fast = faithful; lower area is better)"
                     if kind == "deletion" else
                     "Show the most relevant patches first\n(rises fast = faithful; higher area is better)",
                     fontsize=LABEL_SIZE + 1, color=TEXT_COLOR)
        ax.set_xlabel(f"patches {'hidden' if kind == 'deletion' else 'shown'} (%)", fontsize=LABEL_SIZE, color=TEXT_COLOR)
        ax.grid(True, color="#e6e6e6", linewidth=0.8)
        ax.set_xlim(0, 100)
        ax.tick_params(labelsize=TICK_SIZE + 1, colors=TEXT_COLOR)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_ylabel("probability of the class (%)", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    axes[0].set_ylim(0, None)
    fig.legend(loc="outside right center", fontsize=TICK_SIZE + 1, frameon=False,
               title="method   area: deletion / insertion", title_fontsize=TICK_SIZE + 1)
    return fig


def timm_check_figure(checks: Sequence[dict[str, Any]], names: Sequence[str], tol: float) -> Figure:
    """Per layer, the largest |attention difference| between our model and timm's over the
    images (log scale, tolerance dashed), and per image the largest |logit difference|."""
    fig = _plain_figure(11.0, 4.6)
    left, right = fig.subplots(1, 2, width_ratios=[1.5, 1])
    layers = np.max(np.asarray([c["layer_attn_max_diff"] for c in checks]), axis=0)
    floor = 1e-10  # a log axis cannot show 0: exact zeros sit on the floor, labelled "0"
    left.bar(np.arange(len(layers)), np.maximum(layers, floor), color=ACCENT)
    left.set_yscale("log")
    left.set_ylim(floor / 3, max(tol, float(layers.max())) * 30)
    for i, v in enumerate(layers):
        if v == 0:
            left.text(i, floor * 1.5, "0", ha="center", va="bottom", fontsize=TICK_SIZE, color=TEXT_COLOR)
    left.axhline(tol, color="#c0392b", linestyle="--", linewidth=1.4, label=f"tolerance {tol:g}")
    left.set_xticks(np.arange(len(layers)), [str(i + 1) for i in range(len(layers))])
    left.set_xlabel("layer", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    left.set_ylabel("max |attention difference|", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    left.set_title("Attention probabilities, every layer", fontsize=LABEL_SIZE + 1, color=TEXT_COLOR)
    left.legend(frameon=False, fontsize=TICK_SIZE, loc="upper left")
    logit = [max(c["max_abs_logit_diff"], floor) for c in checks]
    y = np.arange(len(checks))[::-1]
    right.barh(y, logit, color=["#2ca02c" if c["topk_agree"] else "#c0392b" for c in checks], height=0.6)
    right.set_xscale("log")
    right.set_xlim(floor / 3, max(tol, max(logit)) * 30)
    for yi, c in zip(y, checks):
        if c["max_abs_logit_diff"] == 0:
            right.text(floor * 1.5, yi, " 0 (bit-identical)", va="center", fontsize=TICK_SIZE, color=TEXT_COLOR)
    right.axvline(tol, color="#c0392b", linestyle="--", linewidth=1.4)
    right.set_yticks(y, [shorten(n, 18) for n in names])
    right.set_xlabel("max |logit difference|", fontsize=LABEL_SIZE, color=TEXT_COLOR)
    right.set_title("Logits per image (green: same top-5)", fontsize=LABEL_SIZE + 1, color=TEXT_COLOR)
    for ax in (left, right):
        ax.tick_params(labelsize=TICK_SIZE, colors=TEXT_COLOR)
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
    return fig


def model_card_figure(rows: Sequence[tuple[str, str]]) -> Figure:
    """The model's facts as a two-column table."""
    fig = Figure(figsize=(9.0, 0.42 * len(rows) + 0.3), facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.axis("off")
    n = len(rows)
    for k, (key, value) in enumerate(rows):
        y = 1 - (k + 0.5) / n
        if k % 2 == 0:
            ax.axhspan(1 - (k + 1) / n, 1 - k / n, color="#f2f5f9", zorder=0)
        ax.text(0.02, y, key, fontsize=14, color=MUTED_COLOR, va="center")
        ax.text(0.36, y, value, fontsize=14, color=TEXT_COLOR, va="center", fontweight="bold")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return fig


def sanity_figure(result: dict[str, Any]) -> Figure:
    """Rank correlation against the randomisation stage, one line per method (Adebayo Fig. 2)."""
    fig = Figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    xs = range(len(result["stages"]))
    for m, v in result["methods"].items():
        mean, se = np.asarray(v["rank"]), np.asarray(v["rank_se"])
        ax.plot(xs, mean, marker="o", label=m)
        ax.fill_between(xs, mean - se, mean + se, alpha=0.2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), [s.replace("block ", "b") for s in result["stages"]], rotation=45)
    ax.set_ylim(-0.5, 1.05)
    ax.set_xlabel("re-initialised from the top down to (cumulative)")
    ax.set_ylabel("Spearman rank correlation\nwith the trained model's map")
    ax.set_title(f"Model-randomisation sanity check ({result['images']} images)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def training_figure(history: Sequence[dict[str, float]], title: str = "") -> Figure:
    """Loss (train, validation) and validation accuracy per epoch."""
    fig = Figure(figsize=(9, 3.4), dpi=100)
    a, b = fig.subplots(1, 2)
    ep = [h["epoch"] for h in history]
    a.plot(ep, [h["train_loss"] for h in history], "o-", label="train")
    a.plot(ep, [h["val_loss"] for h in history], "o-", label="validation")
    a.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    a.legend()
    b.plot(ep, [h["val_accuracy"] for h in history], "o-", color="C2")
    b.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.02), title="validation accuracy")
    b.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def layer_diff_figure(diffs: Sequence[float], title: str, subtitle: str, tol: float = 1e-4) -> Figure:
    """Per layer (numbered from 1), the largest |attention difference| between two models (log
    scale, the parity tolerance ``tol`` dashed: verify's default 1e-4). Exact zeros cannot sit on a
    log axis: they are drawn as short bars on the floor labelled "0", and a chart of nothing but zeros
    says so in words."""
    diffs = np.asarray(diffs, dtype=float)
    floor = 1e-12
    fig = Figure(figsize=(10, 4.8), layout="constrained", facecolor="white")
    ax = fig.add_subplot()
    ax.bar(np.arange(len(diffs)), np.maximum(diffs, floor * 3), bottom=floor, color=ACCENT)
    for i, v in enumerate(diffs):
        if v == 0:
            ax.text(i, floor * 4, "0", ha="center", va="bottom", fontsize=TICK_SIZE + 1, color=TEXT_COLOR)
    ax.axhline(tol, color="#c0392b", linestyle="--", linewidth=1.2, label=f"tolerance {tol:g}")
    ax.set_yscale("log")
    ax.set_ylim(floor, max(1e-3, float(diffs.max()) * 10))
    ax.set_xticks(np.arange(len(diffs)), [str(i + 1) for i in range(len(diffs))])
    ax.set_xlabel("layer", fontsize=LABEL_SIZE)
    ax.set_ylabel("max |attention difference|", fontsize=LABEL_SIZE)
    if len(diffs) and not diffs.any():
        ax.text(0.5, 0.55, "every difference is exactly 0: bit-identical attention in every layer",
                transform=ax.transAxes, ha="center", va="center", fontsize=LABEL_SIZE + 1, color="#27ae60",
                fontweight="bold")
    ax.legend(frameon=False)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.suptitle(title, fontsize=TITLE_SIZE, fontweight="bold")
    ax.set_title(subtitle, fontsize=TICK_SIZE + 1, color=MUTED_COLOR)
    return fig
