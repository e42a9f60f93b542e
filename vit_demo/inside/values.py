"""Each step's numbers, read off one :class:`~.record.Recording` for one patch, layer and head.

Every value is a number the forward pass formed (a tap of :mod:`.record`) or a model function
called on the same tensors (the position table for this grid, a relative bias, lambda, the final
norm and head for the logit lens); the few values that are not the model's are said to be so: the
attention and the head's output at a temperature other than 1 (the slider's what-if), the
position similarity (the ViT paper's figure of the model's own table) and the readout's share of a
pooled head. Shapes: C embed dim, K = 3 p p (the projection's input), N tokens, M the keys one
query meets (N, or SAM's window), D a head's width, L layers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..methods.attention import cls_attention
from ..model import VisionTransformer, diff_lambda
from ..model.sam import decomposed_bias
from .record import Recording, StepError, Where


class Choice(NamedTuple):
    """The patch (row, col), its token in the sequence, the block, the head, the softmax temperature."""

    row: int
    col: int
    token: int
    layer: int
    head: int
    temperature: float


def numpy(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def needed(rec: Recording, name: str, step: str, why: str) -> Tensor:
    """The tap ``name`` of the recording, or StepError naming the step that cannot be shown and why."""
    t = rec.get(name)
    if t is None:
        raise StepError(f"this model cannot be stepped through: the step '{step}' is missing ({why})")
    return t


def default_patch(rec: Recording) -> tuple[int, int]:
    """The patch the model's readout attends to most in the last layer (heads averaged): the
    [class] query's row, the attention pool's query carried through the last block, or the mean of
    the patch queries (:func:`vit_demo.methods.attention.cls_attention`)."""
    out = rec.out
    grid = out.layout.grid
    m = cls_attention([a.float() for a in out.attentions], out.layout, len(out.attentions) - 1)[0]
    return divmod(int(m.flatten().argmax()), grid[1])


def embedding_values(model: VisionTransformer, rec: Recording, c: Choice) -> dict[str, np.ndarray]:
    """image, pixels, patch_vector, embedding (and the projection's weight and bias as parameters)."""
    p, cfg = model.cfg.patch_size, model.cfg
    x = rec.x[0].float()
    pixels = x[:, c.row * p:(c.row + 1) * p, c.col * p:(c.col + 1) * p]
    proj_in = needed(rec, "proj_in", "pixels", "the patch projection passed nothing")
    if cfg.naflex:  # a Linear over each patch's pixels in (row, column, channel) order
        vector = proj_in[0, c.row * rec.out.layout.grid[1] + c.col]
    elif cfg.conv_stem:  # what the 1x1 projection reads: the stem's channels at this cell
        vector = proj_in[0, :, c.row, c.col]
    else:  # a p x p convolution of stride p: one dot product per output channel, channel-first
        vector = pixels.reshape(-1)
    tokens = needed(rec, "patch_tokens", "projection", "the patch embedding gave no tokens")
    patch = c.row * rec.out.layout.grid[1] + c.col
    return {"image": numpy(x), "pixels": numpy(pixels), "patch_vector": numpy(vector), "embedding": numpy(tokens[0, patch])}


def projection_parameters(model: VisionTransformer) -> dict[str, np.ndarray]:
    """The patch projection's weight [C, K] (in the order of ``patch_vector``) and bias [C] (zeros without)."""
    proj = model.patch_embed.proj
    w = proj.weight.detach().float()
    bias = proj.bias.detach().float() if proj.bias is not None else torch.zeros(w.shape[0])
    return {"projection_weight": numpy(w.reshape(w.shape[0], -1)), "projection_bias": numpy(bias)}


def position_values(model: VisionTransformer, rec: Recording, c: Choice) -> dict[str, np.ndarray]:
    """token (the patch token with its position), and where the model has one: position [C] (the
    learned table's row for this grid) and position_similarity [gh, gw] (cosine similarity of this
    patch's position code with every patch's: the learned vectors, or, with RoPE alone, the rotary
    code cos | sin of the angles of this layer's head)."""
    cfg, grid = model.cfg, rec.out.layout.grid
    P, patch = cfg.num_prefix_tokens, c.row * grid[1] + c.col
    tokens = needed(rec, "tokens", "position", "nothing entered the blocks")
    out = {"token": numpy(tokens[0, c.token])}
    with torch.inference_mode():
        table = model.position_embedding(grid)
        codes = None
        if table is not None:
            rows = table[0].float()
            rows = rows if cfg.no_embed_class else rows[P:]
            out["position"] = numpy(rows[patch])
            codes = rows
        elif model.rope is not None:
            angles = model.rope.angles(grid).float()
            angles = angles[c.layer, c.head % cfg.num_heads] if angles.ndim == 4 else angles
            codes = torch.cat([angles.cos(), angles.sin()], dim=-1)
    if codes is not None:
        unit = F.normalize(codes, dim=-1)
        out["position_similarity"] = numpy((unit @ unit[patch]).reshape(grid))
    return out


def key_tokens(w: Where, grid: tuple[int, int], c: Choice, n: int) -> tuple[np.ndarray, int, int]:
    """The sequence index of every key the query meets (-1: padding past the grid's edge), the
    query's batch row in q, k, v (its window) and its index there."""
    if w.kind != "window":
        return np.arange(n), 0, c.token
    gh, gw = grid
    s = w.window
    r0, c0 = c.row // s * s, c.col // s * s
    rows, cols = np.divmod(np.arange(s * s), s)
    rows, cols = rows + r0, cols + c0
    keys = np.where((rows < gh) & (cols < gw), rows * gw + cols, -1)
    return keys, (c.row // s) * -(-gw // s) + c.col // s, (c.row - r0) * s + (c.col - c0)


def attention_values(model: VisionTransformer, rec: Recording, w: Where, c: Choice) -> dict[str, Any]:
    """block_input, normed, query, keys, values, key_tokens, scores (and bias), attention and its
    parts, head_output; q and k before RoPE turns them."""
    grid = rec.out.layout.grid
    q = needed(rec, "q", "qkv", f"block {c.layer + 1}'s queries passed no hook_q")
    k, v = needed(rec, "k", "qkv", "no hook_k"), needed(rec, "v", "qkv", "no hook_v")
    scores = needed(rec, "scores", "scores", f"block {c.layer + 1}'s attention passed no scores through hook_scores")
    keys_at, row, j = key_tokens(w, grid, c, rec.out.attentions[c.layer].shape[-1])
    h, sh = w.head, w.score_head
    out: dict[str, Any] = {"block_input": numpy(stream(rec, c.layer)[c.token]), "key_tokens": keys_at}
    normed = rec.get("normed")
    out["normed"] = numpy(normed[0, c.token] if normed is not None else stream(rec, c.layer)[c.token])
    if w.kind == "diff":  # q, k [B, H, 2, N, d]; the scores of both maps [B, H, 2, N, N]
        out.update(query=numpy(q[0, h, :, j]), keys=numpy(k[0, h]), scores=numpy(scores[0, sh, :, j]))
        out["lambda"] = np.float32(float(diff_lambda(w.points).detach()))
    else:
        out.update(query=numpy(q[row, h, j]), keys=numpy(k[row, h]), scores=numpy(scores[row, sh, j]))
    out["values"] = numpy(v[row, h])
    bias = relative_bias(model, rec, w, c, q, row, j)
    if bias is not None:
        out["bias"] = bias
    for name in ("q_unturned", "k_unturned"):
        t = rec.get(name)
        if t is not None:  # grouped k/v heads: the key head this query head reads
            kv = h * t.shape[1] // q.shape[1]
            out[name.replace("q_", "query_").replace("k_", "keys_")] = numpy(t[0, kv, j] if name[0] == "q" else t[0, kv])
    out["attention"] = model_attention(rec, c, keys_at, out)
    mixed = needed(rec, "mixed", "weighted_sum", "the heads' weighted sums passed nothing")
    D = out["values"].shape[-1]
    out["head_output"] = numpy(mixed[0, h, c.token] if w.kind == "diff" else mixed[0, c.token, h * D:(h + 1) * D])
    return out


def stream(rec: Recording, layer: int) -> Tensor:
    """The residual stream [N, C] entering block ``layer``."""
    return (rec.get("stream0") if layer == 0 else rec.get(f"block{layer - 1}"))[0]


def relative_bias(model: VisionTransformer, rec: Recording, w: Where, c: Choice, q: Tensor, row: int, j: int
                  ) -> np.ndarray | None:
    """The relative position bias the block adds to this query's scores [M] (the model's own
    tables or MLP; SAM's decomposed bias from the query itself), or None without one."""
    attn = w.points
    with torch.inference_mode():
        if getattr(attn, "rel_pos_h", None) is not None:
            side = int(round(q.shape[2] ** 0.5)) if w.window else None
            size = (side, side) if side else rec.out.layout.grid
            bias = decomposed_bias(q[row:row + 1].to(attn.rel_pos_h.dtype), attn.rel_pos_h, attn.rel_pos_w, size)
            return numpy(bias[0, w.head, j])
        if hasattr(attn, "position_bias") and model.cfg.rel_pos:
            positions = model.positions(rec.out.layout.grid, rec.x.device)
            bias = attn.position_bias(positions.grid, positions.bias)
            return None if bias is None else numpy(bias[0, w.score_head, c.token])
    return None


def model_attention(rec: Recording, c: Choice, keys_at: np.ndarray, out: dict[str, Any]) -> np.ndarray:
    """The model's own attention row at temperature 1 over the keys the query meets: the captured
    map's row (SAM: its window's keys; the padding's share, which the captured map leaves out, from
    the softmax of the scores)."""
    row = numpy(rec.out.attentions[c.layer][0, c.head, c.token])
    if (keys_at >= 0).all():
        return row[keys_at].astype(np.float32)
    soft = torch.softmax(torch.from_numpy(out["scores"]), -1).numpy()
    return np.where(keys_at >= 0, row[np.maximum(keys_at, 0)], soft).astype(np.float32)


def at_temperature(values: dict[str, Any], t: float) -> dict[str, np.ndarray]:
    """attention, attention_parts (differential) and head_output at temperature ``t``: the softmax of
    scores / t and the weighted sum of the values (t = 1: the softmax the model computes)."""
    s = torch.from_numpy(np.asarray(values["scores"], dtype=np.float32))
    parts = torch.softmax(s / t, dim=-1)
    out = {}
    if s.ndim == 2:  # differential: softmax1 - lambda softmax2
        out["attention_parts"] = parts.numpy()
        a = parts[0] - float(values["lambda"]) * parts[1]
    else:
        a = parts
    out["attention"] = a.numpy()
    out["head_output"] = (a @ torch.from_numpy(values["values"])).numpy()
    return out


def block_values(rec: Recording, c: Choice) -> dict[str, np.ndarray]:
    """stream [L + 1, C] and residual_norms [L + 1] (the token after the embedding, then after each
    block), mid (after the attention branch, where the MLP's input is apart from it), mlp_hidden."""
    L = len(rec.out.attentions)
    rows = [stream(rec, 0)[c.token]] + [needed(rec, f"block{i}", "residual", f"block {i + 1} gave nothing")[0, c.token]
                                        for i in range(L)]
    s = torch.stack(rows)
    out = {"stream": numpy(s), "residual_norms": numpy(s.norm(dim=-1))}
    mid = rec.get("mid")
    if mid is not None:
        out["mid"] = numpy(mid[0, c.token])
    hidden = [rec.seen[n][0, c.token] for n in sorted(rec.seen) if n.startswith("hidden")]
    if not hidden:
        raise StepError(f"this model cannot be stepped through: the step 'mlp' is missing (block {c.layer + 1}'s MLP "
                        "passed no hook_hidden)")
    out["mlp_hidden"] = numpy(torch.cat(hidden))
    return out


def readout_values(model: VisionTransformer, rec: Recording) -> dict[str, np.ndarray]:
    """readout [N]: how much each token weighs in what the classifier reads: the [class] query's
    attention in the last layer (heads averaged), the attention pool's (heads averaged), 1 / n on
    each patch for a mean, each patch's share of the channels whose maximum it holds for a max
    pool (half of each for avgmax). Absent for a model that reads no pooled vector (no pool)."""
    cfg, lay = model.cfg, rec.out.layout
    N, P = rec.out.attentions[-1].shape[-1], lay.num_prefix
    if lay.probe is not None:
        return {"readout": numpy(lay.probe[0])}
    if cfg.global_pool == "token":
        return {"readout": numpy(rec.out.attentions[-1][0, :, lay.cls_index].float().mean(0))}
    if cfg.global_pool not in ("avg", "max", "avgmax"):
        return {}
    mean = torch.zeros(N)
    mean[P:] = 1.0 / (N - P)
    if cfg.global_pool == "avg":
        return {"readout": numpy(mean)}
    with torch.inference_mode():
        final = model.norm(rec.get(f"block{len(model.blocks) - 1}")[0, P:]).cpu()  # [n, C]
    share = torch.zeros(N)
    share[P:] = torch.bincount(final.argmax(0), minlength=N - P).float() / final.shape[-1]
    return {"readout": numpy(share if cfg.global_pool == "max" else 0.5 * (mean + share))}


def lens_values(model: VisionTransformer, rec: Recording) -> dict[str, np.ndarray]:
    """lens [L, classes]: every block's output through the model's final norm (its neck, where it has
    one) and head, as the forward reads the last; logits and probabilities: the forward's own.
    Empty for a headless model (no classes)."""
    if model.cfg.num_classes == 0:
        return {}
    h = torch.cat([rec.get(f"block{i}") for i in range(len(model.blocks))])  # [L, N, C]
    with torch.inference_mode():
        h = model.norm(h)
        if model.neck is not None:
            h = model.neck(h, rec.out.layout.grid)
        lens = model.forward_head(h)[0]
    logits = rec.out.logits[0].float()
    return {"lens": numpy(lens), "logits": numpy(logits), "probabilities": numpy(logits.softmax(-1))}
