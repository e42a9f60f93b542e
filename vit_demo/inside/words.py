"""What each step says: a title and one or two sentences a student understands, the equation in plain
text and this picture's numbers in it, and what this model's family does where it differs from the
plain ViT (RoPE, a relative bias, differential attention, windows, parallel blocks, a pooled or
attention-pool readout, a convolutional stem, NaFlex's projection, no position, no classifier).
Layers and heads are counted from 1 here, as people do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..labels import labels_for
from ..model import VisionTransformer
from .record import Recording, Where

ACTS = {"gelu": "GELU", "gelu_tanh": "GELU (tanh)", "quick_gelu": "QuickGELU", "silu": "SiLU"}


@dataclass(frozen=True)
class Step:
    """One step: its name (:data:`~.walk.STEPS`), title, one or two sentences with the equation in plain
    text, and whether the model has it (``exists=False``: the text says what the model does instead)."""

    name: str
    title: str
    text: str
    exists: bool = True


@dataclass(frozen=True)
class Facts:
    """What the texts and pictures need to know of the model and of the choice (indices from 0)."""

    model: str
    row: int
    col: int
    token: int
    layer: int
    head: int
    temperature: float
    chosen_by_model: bool  # the patch was the readout's choice (no patch asked for)
    grid: tuple[int, int]
    patch_size: int
    prefix: tuple[str, ...]  # the prefix tokens' names ("[class]", ...)
    depth: int
    heads: int  # per layer (parallel branches side by side)
    embed: str  # "conv", "linear" (NaFlex), "stem"
    patch_norm: bool
    position: str  # "absolute", "rotary", "absolute+rotary", "relative", "none"
    pre_norm: bool
    attention: str  # "plain", "diff", "window", "things", "scaling"
    window: int  # SAM: this block's window (0: global)
    norm: str  # "LayerNorm", "RMSNorm"
    qk_norm: bool
    post_norm: bool
    mlp: str  # "mlp", "glu", "swiglu"
    act: str
    branches: int  # parallel MLP branches ("things"), else 1
    readout: str  # "token", "map", "avg", "max", "avgmax", "none"
    dist_token: bool
    labels: tuple[str, ...]

    @property
    def patch_name(self) -> str:
        return f"patch ({self.row}, {self.col})"

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def token_name(self, i: int) -> str:
        """Token ``i`` of the sequence in words: a prefix token's name, or "patch (r, c)"."""
        if i < 0:
            return "padding"
        if i < len(self.prefix):
            return self.prefix[i]
        r, c = divmod(i - len(self.prefix), self.grid[1])
        return f"patch ({r}, {c})"

    @property
    def where(self) -> str:
        return f"layer {self.layer + 1}, head {self.head + 1}"


def facts_of(model: VisionTransformer, rec: Recording, w: Where, c: Any, labels: tuple[str, ...] | None, name: str,
             chosen_by_model: bool) -> Facts:
    cfg, lay = model.cfg, rec.out.layout
    rope = "rotary" if cfg.rope else ""
    absolute = "absolute" if model.pos_embed is not None or getattr(model, "pos_embed_y", None) is not None else ""
    relative = "relative" if cfg.rel_pos else ""
    position = "+".join(p for p in (absolute, rope) if p) or relative or "none"
    attention = "things" if cfg.block == "things" else "scaling" if cfg.block == "scaling" else w.kind
    readout = "map" if lay.probe is not None else cfg.global_pool if cfg.num_classes or cfg.global_pool else "none"
    return Facts(name or "the model", c.row, c.col, c.token, c.layer, c.head, c.temperature, chosen_by_model, lay.grid,
                 cfg.patch_size, tuple(lay.names()), cfg.depth, rec.out.attentions[c.layer].shape[1],
                 "linear" if cfg.naflex else "stem" if cfg.conv_stem else "conv", cfg.patch_norm, position, cfg.pre_norm,
                 attention, w.window, "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm", cfg.qk_norm, cfg.post_norm,
                 cfg.mlp, ACTS.get(cfg.act, cfg.act), cfg.num_parallel if cfg.block == "things" else 1,
                 readout or "none", cfg.dist_token, tuple(labels) if labels else labels_for(cfg.num_classes))


def f2(v: Any) -> str:
    return f"{float(v):.2f}"


def step_texts(f: Facts, v: dict[str, np.ndarray]) -> tuple[Step, ...]:
    """Every step of :data:`~.walk.STEPS` with its title and text for these facts and values."""
    return tuple(Step(name, *fn(f, v)) for name, fn in TEXTS.items())


def patches_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    h, w = v["image"].shape[1:]
    gh, gw = f.grid
    why = " (the one the model's readout attends to most in the last layer)" if f.chosen_by_model else ""
    before = f" after {' '.join(f.prefix)}" if f.prefix else ""
    return ("The picture cut into patches",
            f"The {w}x{h} picture the model sees is cut into a {gh}x{gw} grid of {f.patch_size}x{f.patch_size}-pixel "
            f"patches, read row by row. We follow {f.patch_name}{why}: it is token {f.token} of {f.n_patches + len(f.prefix)}"
            f"{before}.", True)


def pixels_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    p, n = f.patch_size, v["pixels"].size
    order = ("row by row, each pixel's 3 channels together (NaFlex's order)" if f.embed == "linear"
             else "channel by channel, row by row")
    return (f"Its {p}x{p} pixels become {n} numbers",
            f"Each pixel's red, green and blue, normalised as (value - mean) / std, read {order}: "
            f"patch_vector = flatten(pixels), {n} numbers from {f2(v['pixels'].min())} to {f2(v['pixels'].max())}.", True)


def projection_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    C, K = v["projection_weight"].shape
    normed = f" then normed ({f.norm}, as AIMv2 does)" if f.patch_norm else ""
    if f.embed == "stem":
        return ("A convolutional stem makes the token",
                f"This model has no p x p projection: a stem of small convolutions reads the picture around the patch "
                f"(more than its own {f.patch_size}x{f.patch_size} pixels) and gives {K} channels at this cell; a 1x1 "
                f"convolution projects them: embedding = W . stem_token + b, W of {C} x {K}{normed}.", True)
    p = f.patch_size
    how = "a Linear layer (NaFlex)" if f.embed == "linear" else f"a {p}x{p} convolution of stride {p}"
    return (f"A learned projection: {K} numbers -> {C}",
            f"One matrix, the same for every patch ({how}), turns the patch into a token of {C} numbers: "
            f"embedding = W . patch_vector + b, W of {C} x {K}{normed}.", True)


def position_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    if "position" in v:
        sim = ("the cosine similarity of this patch's position vector with every patch's: near ones and the same row "
               "and column look alike (Dosovitskiy et al. 2021, fig. 7)")
        also = " Rotary positions turn q and k later as well." if "rotary" in f.position else ""
        return ("Where it is: a position vector is added",
                f"A learned vector for row {f.row}, column {f.col} is added, or the model could not tell patches apart "
                f"by place: token = embedding + position. The map: {sim}.{also}", True)
    if f.position == "rotary":
        return ("Where it is: nothing added, q and k turned (RoPE)",
                "This model adds no position vector: inside every attention its query and key are turned by angles set "
                "by the patch's row and column (RoPE), so q . k depends on how far apart two patches are. The map: how "
                f"alike this patch's turn is to every other's in {f.where}.", True)
    if f.position == "relative":
        return ("Where it is: a relative bias, not a vector",
                "This model adds no position vector to the token (token = embedding): a learned bias for every offset "
                "between two patches is added to the attention scores instead (step 6).", False)
    return ("Where it is: the model is not told",
            "This model has no position embedding, no rotary turn and no relative bias: it sees the patches as a set.",
            False)


def qkv_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    D, M = v["query"].shape[-1], v["keys"].shape[-2]
    norm = "as it is (res-post block: the norm comes after)" if f.post_norm else f"normed ({f.norm})"
    turned = (" RoPE then turns q and k by their patches' positions (each pair of numbers keeps its length)."
              if "query_unturned" in v else "")
    qk = f" qk-norm normalises each head's q and k ({f.norm})." if f.qk_norm else ""
    par = {"scaling": " One projection gives the MLP's hidden layer and q, k, v side by side (ViT-22B).",
           "things": f" The block has {f.branches} attention branches side by side; head {f.head + 1} counts "
                     "across them.",
           "diff": f" Differential attention: the head's q and k are cut in two halves of {D} numbers, one for each of "
                   "two softmax maps."}.get(f.attention, "")
    keys = f"the {M} keys of its {f.window}x{f.window} window" if f.attention == "window" else f"all {M} keys"
    return (f"Query, keys, values ({f.where})",
            f"In layer {f.layer + 1} the token is {norm} and projected to a query, a key and a value per head: "
            f"q = W_q . x + b_q ({D} numbers in head {f.head + 1}); the query will meet {keys}.{turned}{qk}{par}", True)


def scores_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    s, keys = np.asarray(v["scores"]), v["key_tokens"]
    D = v["query"].shape[-1]
    first = s[0] if s.ndim == 2 else s
    best = int(np.argmax(first))
    eq = f"score = q . k / sqrt({D})" + (f" = q . k / {int(D ** 0.5)}" if int(D ** 0.5) ** 2 == D else "")
    extra = " + bias, a learned relative position bias for the offset between the two patches" if "bias" in v else ""
    if f.attention == "diff":
        extra += "; twice, once for each half of q and k"
    return ("The query meets every key",
            f"Every key is compared with the query: {eq}{extra}. The highest score, {f2(first[best])}, is "
            f"{f.token_name(int(keys[best]))}'s; the lowest {f2(first.min())}.", True)


def softmax_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    a, T = np.asarray(v["attention"]), f.temperature
    best = int(np.argmax(a))
    whose = "the model's own attention (the Attention tab's row)" if T == 1.0 else (
        "NOT the model's attention any more: a temperature above 1 spreads it, below 1 sharpens it; the rest of the "
        "walk stays the model's, at T = 1")
    if f.attention == "diff":
        eq = "attention = softmax(scores_1 / T) - lambda softmax(scores_2 / T)"
        sums = f", lambda = {f2(v['lambda'])}: the rows sum to 1 - lambda and may be negative"
    else:
        eq, sums = "attention_i = exp(s_i / T) / sum_j exp(s_j / T)", ": weights that sum to 1"
    return (f"Softmax: scores -> weights (T = {T:g})",
            f"{eq}{sums}. At T = {T:g} this is {whose}; {f.token_name(int(v['key_tokens'][best]))} gets the most, "
            f"{a[best] * 100:.1f}%.", True)


def weighted_sum_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    a, keys = np.asarray(v["attention"]), v["key_tokens"]
    D = v["head_output"].shape[-1]
    top = np.argsort(-a)[:3]
    parts = ", ".join(f"{f.token_name(int(keys[i]))} {a[i] * 100:.0f}%" for i in top)
    after = (" Then it is RMS-normed and scaled by 1 - lambda_init (differential attention)." if f.attention == "diff"
             else "")
    return ("The weighted sum of the values",
            f"The head's output mixes the values by the attention: o = sum_i a_i v_i ({D} numbers), most from {parts}. "
            f"The {f.heads} heads' outputs side by side are projected back to the token's width and added to it.{after}",
            True)


def mlp_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    h = np.asarray(v["mlp_hidden"])
    on = float((h > 0).mean() * 100)
    x = "x" if f.post_norm else "norm(x)"
    if f.mlp in ("glu", "swiglu"):
        eq = f"hidden = {f.act}(W_gate . {x}) * (W_value . {x})"
    else:
        eq = f"hidden = {f.act}(W1 . {x} + b1)"
    where = (" It reads the same normed token as the attention, side by side (a parallel block)." if f.attention == "scaling"
             else f" {f.branches} MLP branches side by side, their hidden layers one after the other." if f.branches > 1
             else "")
    return ("The MLP: every token on its own",
            f"After the attention, the MLP reads the token: {eq}, {h.size} numbers, {on:.0f}% of them above 0; "
            f"W2 . hidden + b2 is added back to the token.{where}", True)


def residual_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    n = np.asarray(v["residual_norms"])
    eq = {"scaling": "x = x + attention(norm(x)) + MLP(norm(x)), side by side",
          "things": "x = x + the attention branches' sum, then x = x + the MLP branches' sum"}.get(
        f.attention, "x = x + norm(attention(x)), then x = x + norm(MLP(x))" if f.post_norm
        else "x = x + attention(norm(x)), then x = x + MLP(norm(x))")
    return ("The residual stream, layer by layer",
            f"Every block adds its attention's and its MLP's outputs to the token: {eq}. Its length |x| goes from "
            f"{f2(n[0])} after the embedding to {f2(n[-1])} after layer {f.depth}.", True)


def readout_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    if "readout" not in v:
        return ("What the classifier reads", "This model has no classifier and no pooling: it gives every token's final "
                "state as features, so no single readout exists.", False)
    r, n = np.asarray(v["readout"]), len(f.prefix)
    best = n + int(np.argmax(r[n:])) if r.size > n else 0
    said = {
        "token": "the [class] token's final state is all the classifier reads; in the last layer it gathered most "
                 f"from {f.token_name(best)} ({r[best] * 100:.1f}%, heads averaged)"
                 + (" (the [dist] token's head is averaged in)" if f.dist_token else ""),
        "map": "no [class] token: a learned query, the attention pool, reads the final tokens, most "
               f"{f.token_name(best)} ({r[best] * 100:.1f}%, heads averaged)",
        "avg": f"no [class] token: the classifier reads the mean of the {f.n_patches} patch tokens, each 1/{f.n_patches}",
        "max": "no [class] token: the classifier reads each channel's maximum over the patches; the map is each "
               f"patch's share of those channels (most: {f.token_name(best)})",
        "avgmax": "no [class] token: the classifier reads half the patches' mean and half their maximum per channel",
    }[f.readout]
    return ("What the classifier reads", said[0].upper() + said[1:] + ".", True)


def lens_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    if "lens" not in v:
        return ("The logit lens", "This model has no classifier (headless): there are no class scores to read after "
                "each layer.", False)
    lens = np.asarray(v["lens"])
    final = int(np.argmax(v["logits"]))
    tops = lens.argmax(-1)
    first = next((i for i in range(len(tops)) if (tops[i:] == final).all()), len(tops) - 1)
    who = {"token": "the [class] token", "map": "the attention pool's reading"}.get(f.readout, "the pooled patches")
    return ("The answer forms layer by layer (logit lens)",
            f"Reading {who} after every layer through the final norm and the head, logits_l = head(norm(x_l)), shows "
            f"the answer forming: '{f.labels[final]}' is the top class from layer {first + 1} of {f.depth} on.", True)


def logits_text(f: Facts, v: dict) -> tuple[str, str, bool]:
    if "logits" not in v:
        return ("The logits", "This model is headless: it ends with features, not class scores.", False)
    p = np.asarray(v["probabilities"])
    top = int(np.argmax(p))
    return ("The logits: the answer",
            f"The head gives one score per class ({p.size}); softmax turns them into probabilities: '{f.labels[top]}' "
            f"{p[top] * 100:.1f}%. The last row of the logit lens is exactly these logits.", True)


TEXTS = {"patches": patches_text, "pixels": pixels_text, "projection": projection_text, "position": position_text,
         "qkv": qkv_text, "scores": scores_text, "softmax": softmax_text, "weighted_sum": weighted_sum_text,
         "mlp": mlp_text, "residual": residual_text, "readout": readout_text, "lens": lens_text, "logits": logits_text}
