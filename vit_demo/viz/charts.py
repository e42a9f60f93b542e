"""Charts of numbers for slides and reports (matplotlib): faithfulness curves, the check
against timm, the model's facts, the sanity check and training curves. Pictures of maps are
:mod:`~vit_demo.viz.figures`; both are saved with :func:`~vit_demo.viz.export.save_figure`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .style import ACCENT, LABEL_SIZE, MUTED_COLOR, TEXT_COLOR, TICK_SIZE, TITLE_SIZE


def shorten(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, an ellipsis marking the cut."""
    return text if len(text) <= n else text[: n - 1] + "…"


def _plain_figure(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), layout="constrained", facecolor="white")


def faithfulness_figure(scores: dict[str, dict[str, Any]]) -> Figure:
    """Deletion and insertion curves of every method (and random), AUCs in the legend."""
    fig = _plain_figure(9.0, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    colours = {"attention": "#9467bd", "rollout": "#ff7f0e", "grad-rollout": "#2ca02c", "chefer": "#d62728",
               "random": "#888888"}
    for ax, kind, better in zip(axes, ("deletion", "insertion"), ("lower", "higher")):
        for name, s in scores.items():
            c = s[f"{kind}_curve"]
            ax.plot(np.linspace(0, 100, len(c)), np.asarray(c) * 100, color=colours.get(name, None),
                    linestyle="--" if name == "random" else "-", linewidth=2.2 if name == "chefer" else 1.6,
                    label=f"{name}  {s[f'{kind}_auc']:.3f}")
        ax.set_title(f"{kind.capitalize()}: AUC {better} is better", fontsize=LABEL_SIZE + 1, color=TEXT_COLOR)
        ax.set_xlabel(f"patches {'removed' if kind == 'deletion' else 'shown'}, most relevant first (%)",
                      fontsize=LABEL_SIZE - 1, color=TEXT_COLOR)
        ax.legend(fontsize=TICK_SIZE, frameon=False, title="method  AUC", title_fontsize=TICK_SIZE)
        ax.grid(True, color="#e6e6e6", linewidth=0.8)
        ax.set_xlim(0, 100)
        ax.tick_params(labelsize=TICK_SIZE, colors=TEXT_COLOR)
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
    axes[0].set_ylabel("probability of the class (%)", fontsize=LABEL_SIZE - 1, color=TEXT_COLOR)
    axes[0].set_ylim(0, None)
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
    left.set_xticks(np.arange(len(layers)), [str(i) for i in range(len(layers))])
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


def sanity_figure(r: dict[str, Any], title: str | None = None) -> Figure:
    """Rank correlation against the randomisation stage, one line per method (Adebayo Fig. 2)."""
    fig = Figure(figsize=(9, 4.8))
    ax = fig.add_subplot()
    xs = range(len(r["stages"]))
    for m, v in r["methods"].items():
        mean, se = np.asarray(v["rank"]), np.asarray(v["rank_se"])
        ax.plot(xs, mean, marker="o", label=m)
        ax.fill_between(xs, mean - se, mean + se, alpha=0.2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), [s.replace("block ", "b") for s in r["stages"]], rotation=45)
    ax.set_ylim(-0.5, 1.05)
    ax.set_xlabel("re-initialised from the top down to (cumulative)")
    ax.set_ylabel("Spearman rank correlation\nwith the trained model's map")
    ax.set_title(title or f"Model-randomisation sanity check ({r['images']} images)")
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
    """Per layer, the largest |attention difference| between two models (log scale, the
    tolerance dashed)."""
    diffs = np.maximum(np.asarray(diffs, dtype=float), 1e-12)
    fig = Figure(figsize=(10, 4.8), layout="constrained", facecolor="white")
    ax = fig.add_subplot()
    ax.bar(np.arange(len(diffs)), diffs, color=ACCENT)
    ax.axhline(tol, color="#c0392b", linestyle="--", linewidth=1.2, label=f"tolerance {tol:g}")
    ax.set_yscale("log")
    ax.set_ylim(1e-12, max(1e-3, diffs.max() * 10))
    ax.set_xticks(np.arange(len(diffs)), [f"L{i}" for i in range(len(diffs))])
    ax.set_xlabel("Layer", fontsize=LABEL_SIZE)
    ax.set_ylabel("max |attention difference|", fontsize=LABEL_SIZE)
    ax.legend(frameon=False)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.suptitle(title, fontsize=TITLE_SIZE, fontweight="bold")
    ax.set_title(subtitle, fontsize=TICK_SIZE + 1, color=MUTED_COLOR)
    return fig
