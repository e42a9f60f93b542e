"""The architecture of a timm model, read off the instance (no table of model names).

:func:`config_from_timm` inspects a timm ViT-family model (``vision_transformer``, ``deit``,
``eva``, ``beit``, ``vision_transformer_relpos``) part by part: the embedding, the blocks'
attention, MLP, norms and LayerScale, the position information (absolute, RoPE, relative bias)
and the head, and returns the :class:`~vit_demo.model.ViTConfig` that builds the same network.
Whatever the scratch model does not implement is collected and refused in one
:class:`~.files.UnsupportedModelError` that names every part (SAM's windowed ViT, NaFlex's
variable patch sets, ...). Parallel blocks and differential attention are read too.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from ..model import ViTConfig
from .files import UnsupportedModelError

FAMILIES = ("VisionTransformer", "VisionTransformerDistilled", "Eva", "Beit", "VisionTransformerRelPos",
            "VisionTransformerSAM", "NaFlexVit")
REFUSED: dict[str, str] = {}  # timm classes of the ViT family this project does not port, and why
BLOCKS = {"Block": False, "EvaBlock": False, "RelPosBlock": False,  # name -> post-norm
          "ResPostBlock": True, "EvaBlockPostNorm": True, "ResPostRelPosBlock": True, "ParallelThingsBlock": False}
SCALING_BLOCKS = ("ParallelScalingBlock", "DiffParallelScalingBlock")  # attention and MLP from one projection
ATTENTIONS = ("Attention", "EvaAttention", "AttentionRope", "RelPosAttention", "DiffAttention")
ACTS = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu"}
NORMS = {"LayerNorm": "layernorm", "RmsNorm": "rmsnorm"}
NORM_CLASS = re.compile(r"(Layer|Rms|RMS|Group|Batch|Instance)Norm\w*")


def is_identity(module: Any) -> bool:
    return module is None or isinstance(module, nn.Identity)


def model_name(tm: nn.Module) -> str:
    return getattr(getattr(tm, "pretrained_cfg", {}), "get", lambda k, d=None: d)("architecture", type(tm).__name__)


def config_from_timm(tm: nn.Module) -> ViTConfig:
    """Read the architecture off a timm ViT-family instance. Raises UnsupportedModelError naming
    every part the scratch model does not implement."""
    name, kind = model_name(tm), type(tm).__name__
    if kind in REFUSED:
        raise UnsupportedModelError(f"{name}: {REFUSED[kind]}")
    if kind not in FAMILIES or not hasattr(tm, "blocks") or not (hasattr(tm, "patch_embed") or hasattr(tm, "embeds")):
        raise UnsupportedModelError(f"{name}: not a timm ViT-family model ({kind}; known: {', '.join(FAMILIES)})")
    problems: list[str] = []
    fields: dict[str, Any] = {}
    scaling = type(tm.blocks[0]).__name__ in SCALING_BLOCKS
    parts = (read_scaling_block,) if scaling else (read_block, read_attention, read_mlp)
    rest = (read_sam,) if kind == "VisionTransformerSAM" else (read_positions, read_head)
    embedding = read_naflex_embedding if kind == "NaFlexVit" else read_embedding
    for read in (*parts, embedding, read_norms, *rest):
        fields.update(read(tm, problems))
        if problems and read in (read_block, read_attention, read_scaling_block):  # another kind: the rest
            break  # of it cannot be read as ours
    if problems:
        raise UnsupportedModelError(f"{name}: not a ViT variant this project implements: " + ", ".join(dict.fromkeys(problems)))
    try:
        return ViTConfig(**fields)
    except ValueError as e:
        raise UnsupportedModelError(f"{name}: {e}") from e


def read_embedding(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """Patch embedding, prefix tokens, the absolute position embedding and the norm before the blocks."""
    pe = tm.patch_embed
    proj = getattr(pe, "proj", None)
    if not isinstance(proj, nn.Conv2d) or proj.kernel_size != proj.stride or proj.kernel_size[0] != proj.kernel_size[1]:
        problems.append(f"patch embedding {type(pe).__name__} (not a square non-overlapping convolution)")
        return {}
    if getattr(pe, "dynamic_img_pad", False):
        problems.append("padding of inputs to the patch size")
    reg = getattr(tm, "reg_token", None)
    pos = getattr(tm, "pos_embed", None)
    return dict(pos_embed_grid=pos is not None and pos.ndim == 4,  # SAM: [1, gh, gw, C]
        img_size=tuple(pe.img_size), patch_size=proj.kernel_size[0], in_chans=proj.in_channels, embed_dim=proj.out_channels,
        depth=len(tm.blocks), patch_bias=proj.bias is not None, patch_norm=not is_identity(getattr(pe, "norm", None)),
        class_token=getattr(tm, "cls_token", None) is not None, dist_token=getattr(tm, "dist_token", None) is not None,
        reg_tokens=0 if reg is None else reg.shape[1], no_embed_class=bool(getattr(tm, "no_embed_class", False)),
        pos_embed=getattr(tm, "pos_embed", None) is not None, pre_norm=not is_identity(getattr(tm, "norm_pre", None)),
    )


def block_parts(block: nn.Module) -> tuple[Any, Any]:
    """A block's attention and MLP (a ParallelThingsBlock: its first branch's; None where it has none)."""
    if hasattr(block, "attns"):
        return block.attns[0].attn, block.ffns[0].mlp
    return getattr(block, "attn", None), getattr(block, "mlp", None)


def width(tm: nn.Module) -> int:
    """The model's embedding width."""
    return tm.embeds.embed_dim if hasattr(tm, "embeds") else tm.patch_embed.proj.out_channels


def read_naflex_embedding(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """NaFlexViT's embedding, as it embeds an image: a Linear over each patch's pixels (row,
    column, channel order), an optional norm, prefix tokens without position, and a position
    table (or one per axis) resampled to the grid its way."""
    e = tm.embeds
    if not e.is_linear or not e.channels_last or e.norm_input is not None or e.dynamic_img_pad:
        problems.append("a NaFlex embedding other than a Linear over (row, column, channel) pixels without input norm "
                        "or padding")
        return {}
    (ph, pw), kind = e.patch_size, e.pos_embed_type
    if ph != pw:
        problems.append(f"non-square patches {ph}x{pw}")
    if getattr(tm, "rope", None) is not None:
        problems.append("RoPE in a NaFlex ViT")
    grid = (e.pos_embed.shape[1:3] if kind == "learned" else (e.pos_embed_y.shape[1], e.pos_embed_x.shape[1])
            if kind == "factorized" else (16, 16))
    reg = e.reg_token
    return dict(
        naflex=True, img_size=(grid[0] * ph, grid[1] * ph), patch_size=ph, in_chans=e.in_chans, embed_dim=e.embed_dim,
        depth=len(tm.blocks), patch_bias=e.proj.bias is not None, patch_norm=not is_identity(e.norm),
        class_token=e.cls_token is not None, reg_tokens=0 if reg is None else reg.shape[1], no_embed_class=True,
        pos_embed=kind != "none", pos_embed_grid=kind == "learned", pos_embed_factorized=kind == "factorized",
        pos_embed_mode=e.pos_embed_interp_mode, pos_embed_antialias=e.pos_embed_antialias,
        pos_embed_align_corners=e.pos_embed_align_corners, pos_embed_square=e.pos_embed_ar_preserving,
        pre_norm=not is_identity(getattr(tm, "norm_pre", None)),
    )


def read_norms(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """Every norm of the model must be of one kind (LayerNorm or RMSNorm, affine) with one eps
    (differential attention's own RMSNorm of the heads, eps 1e-5, aside)."""
    fixed = {id(m.sub_norm) for m in tm.modules() if hasattr(m, "sub_norm") and hasattr(m, "lambda_init")}
    fixed |= {id(m) for m in getattr(tm, "neck", nn.Identity()).modules()}  # SAM's neck: read_sam
    found = [m for m in tm.modules() if NORM_CLASS.fullmatch(type(m).__name__) and id(m) not in fixed]
    kinds = {type(m).__name__ for m in found}
    eps = {float(m.eps) for m in found if hasattr(m, "eps")}
    if not found:
        problems.append("no norm layer")
    elif len(kinds) > 1 or not kinds <= set(NORMS):
        problems.append(f"norm layers {', '.join(sorted(kinds))} (one of LayerNorm, RmsNorm)")
    elif len(eps) > 1:
        problems.append(f"norms with different eps {sorted(eps)}")
    elif any(getattr(m, "weight", None) is None or (NORMS[type(m).__name__] == "layernorm" and m.bias is None)
             for m in found):
        problems.append("a norm without learned weight or bias")
    if problems:
        return {}
    return dict(norm=NORMS[kinds.pop()], norm_eps=eps.pop())


def read_block(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """The block type (pre-norm or res-post) and LayerScale (ls1.gamma or gamma_1, both branches or one)."""
    types = {type(b).__name__ for b in tm.blocks}
    b0 = tm.blocks[0]
    kind = type(b0).__name__
    if len(types) > 1 or kind not in BLOCKS:
        problems.append(f"block type {', '.join(sorted(types))}"
                        + (" (parallel branches)" if "Parallel" in kind else "")
                        + (" (differential attention)" if "Diff" in kind else ""))
        return {}
    if kind == "ParallelThingsBlock":
        return dict(block="things", num_parallel=b0.num_parallel, layer_scale=not is_identity(b0.attns[0].ls))
    ls = not is_identity(getattr(b0, "ls1", None))
    gamma = getattr(b0, "gamma_1", None) is not None
    second = not is_identity(getattr(b0, "ls2", None)) or getattr(b0, "gamma_2", None) is not None
    return dict(post_norm=BLOCKS[kind], layer_scale=ls or gamma, layer_scale_on_block=gamma,
                layer_scale_attn_only=(ls or gamma) and not second)


def read_scaling_block(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """timm's ParallelScalingBlock / DiffParallelScalingBlock: attention and MLP side by side, their
    inputs from one projection (its bias, or the MLP's own), qk-norm, one or two output projections."""
    types = {type(b).__name__ for b in tm.blocks}
    b0 = tm.blocks[0]
    diff = type(b0).__name__ == "DiffParallelScalingBlock"
    if len(types) > 1:
        problems.append(f"block types {', '.join(sorted(types))}")
        return {}
    if diff and getattr(b0, "dual_lambda", False):
        problems.append("differential attention with two scalar lambdas (dual_lambda)")
    act = ACTS.get(type(b0.mlp_act).__name__)
    if act is None:
        problems.append(f"activation {type(b0.mlp_act).__name__}")
    C, hidden = b0.in_norm.weight.shape[0], b0.in_split[0]
    out = b0.out_proj if b0.out_proj is not None else b0.attn_out_proj
    return dict(block="scaling", diff_attn=diff, fused_out_proj=b0.out_proj is not None, num_heads=b0.num_heads,
                qkv_bias=b0.in_proj.bias is not None, qk_norm=not is_identity(b0.q_norm), proj_bias=out.bias is not None,
                act=act or "gelu", mlp_ratio=hidden / C, mlp_hidden_dim=0 if int(C * (hidden / C)) == hidden else hidden,
                layer_scale=not is_identity(b0.ls))


def read_attention(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """Heads, q/k/v projections and their biases, qk-norm, the norm before attn.proj, grouped k/v heads."""
    attn = block_parts(tm.blocks[0])[0]
    diff = hasattr(attn, "lambda_init")  # DiffAttention (or a subclass of it)
    if type(attn).__name__ not in ATTENTIONS and not diff:
        problems.append(f"attention {type(attn).__name__}")
        return {}
    if diff and attn.dual_lambda:
        problems.append("differential attention with two scalar lambdas (dual_lambda)")
    if getattr(attn, "gate", None) is not None:
        problems.append("gated attention")
    H = attn.num_heads
    fused = getattr(attn, "qkv", None) is not None
    q = attn.qkv if fused else attn.q_proj
    D = (q.out_features // 3 if fused else q.out_features) // H
    qv = getattr(attn, "q_bias", None) is not None or (not fused and attn.q_proj.bias is not None and attn.k_proj.bias is None)
    kv = [H if fused else b.attn.k_proj.out_features // D for b in tm.blocks]  # grouped-query attention: fewer
    return dict(
        diff_attn=diff, num_heads=H, head_dim=0 if D * H == width(tm) else D,
        kv_heads=() if set(kv) == {H} else tuple(kv),
        qkv_fused=fused, qkv_bias=(q.bias is not None) and not qv, qv_bias=qv,
        qk_norm=not is_identity(getattr(attn, "q_norm", None)), attn_norm=not is_identity(getattr(attn, "norm", None)),
        proj_bias=attn.proj.bias is not None,
    )


def read_mlp(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """Plain MLP or GLU (packed or not), its width, activation, hidden norm and biases."""
    attn, mlp = block_parts(tm.blocks[0])
    kind = {"Mlp": "mlp", "SwiGLU": "swiglu", "GluMlp": "glu"}.get(type(mlp).__name__)
    if kind is None:
        problems.append(f"MLP {type(mlp).__name__}")
        return {}
    if kind == "glu" and getattr(mlp, "gate_last", False):
        problems.append("a GLU with its gate in the second half")
    act = ACTS.get(type(mlp.act).__name__)
    if act == "gelu" and getattr(mlp.act, "approximate", "none") == "tanh":
        act = "gelu_tanh"
    if act is None:
        problems.append(f"activation {type(mlp.act).__name__}")
    fc1 = mlp.fc1_g if kind == "swiglu" else mlp.fc1
    hidden = fc1.out_features // 2 if kind == "glu" else fc1.out_features
    bias = {fc1.bias is not None, mlp.fc2.bias is not None, attn.proj.bias is not None}
    if len(bias) > 1:
        problems.append("some projections with bias, some without")
    C = mlp.fc2.out_features
    return dict(mlp=kind, act=act or "gelu", mlp_ratio=hidden / C,
                mlp_hidden_dim=0 if int(C * (hidden / C)) == hidden else hidden,
                mlp_norm=not is_identity(getattr(mlp, "norm", None)))


def read_positions(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """RoPE (its kind and every setting of its table) and relative position biases."""
    out: dict[str, Any] = {}
    attn = block_parts(tm.blocks[0])[0]
    table = getattr(attn, "relative_position_bias_table", None) is not None
    mlp = getattr(attn, "rel_pos", None)
    shared_table, shared_mlp = getattr(tm, "rel_pos_bias", None), getattr(tm, "shared_rel_pos", None)
    kinds = [k for k, on in (("table", table), ("mlp", mlp is not None), ("shared_table", shared_table is not None),
                             ("shared_mlp", shared_mlp is not None)) if on]
    if len(kinds) > 1:
        problems.append(f"relative position biases {' and '.join(kinds)} together")
    elif kinds:
        rel_mlp = mlp if mlp is not None else shared_mlp
        if rel_mlp is not None and (type(rel_mlp).__name__ != "RelPosMlp" or rel_mlp.mode != "cr"):
            problems.append(f"relative position bias {type(rel_mlp).__name__} (mode {getattr(rel_mlp, 'mode', '?')})")
        out.update(rel_pos=kinds[0], rel_pos_hidden=rel_mlp.mlp.fc1.out_features if rel_mlp is not None else 0)
    rope = getattr(tm, "rope", None)
    if rope is not None:
        out.update(read_rope(tm, rope, problems))
    return out


def read_rope(tm: nn.Module, rope: nn.Module, problems: list[str]) -> dict[str, Any]:
    """The settings of timm's RotaryEmbeddingCat (axial), RotaryEmbeddingMixed or RotaryEmbeddingDinoV3."""
    kind = {"RotaryEmbeddingCat": "axial", "RotaryEmbeddingMixed": "mixed", "RotaryEmbeddingDinoV3": "dinov3"}.get(
        type(rope).__name__)
    attn = tm.blocks[0].attn
    if kind is None:
        problems.append(f"rotary embedding {type(rope).__name__}")
        return {}
    if kind == "axial" and rope.grid_type != "index":
        problems.append(f"RoPE on a {rope.grid_type!r} grid")
    half = bool(getattr(rope, "rotate_half", False))
    if bool(getattr(attn, "rotate_half", False)) != half:
        problems.append("RoPE tables and attention with different rotation layouts")
    if getattr(attn, "num_prefix_tokens", tm.num_prefix_tokens) != tm.num_prefix_tokens:
        problems.append("RoPE on some prefix tokens")
    periods = (getattr(rope, "min_period", None), getattr(rope, "max_period", None))
    ref = getattr(rope, "ref_feat_shape", None)
    return dict(
        rope=kind, rope_temperature=float(rope.temperature or 0.0), rope_xy=rope.grid_indexing == "xy",
        rope_offset=float(getattr(rope, "grid_offset", 0.0)), rope_ref_grid=tuple(ref) if ref is not None else None,
        rope_half=half, rope_normalize=getattr(rope, "normalize_coords", "separate"),
        rope_periods=periods if None not in periods else None,
    )


def read_head(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """Pooling (token, avg, max, avgmax or an attention pool), the final norms and the classifier."""
    pool = tm.global_pool
    if pool not in ("token", "avg", "max", "avgmax", "map", ""):
        problems.append(f"global_pool={pool!r}")
    norm, fc_norm = not is_identity(getattr(tm, "norm", None)), not is_identity(getattr(tm, "fc_norm", None))
    if norm and fc_norm:
        problems.append("a norm both before and after pooling")
    head = tm.head
    out: dict[str, Any] = dict(
        global_pool=pool, final_norm=norm or fc_norm, fc_norm=fc_norm,
        num_classes=head.out_features if isinstance(head, nn.Linear) else 0,
        head_bias=not isinstance(head, nn.Linear) or head.bias is not None,
    )
    if not isinstance(head, (nn.Linear, nn.Identity)):
        problems.append(f"head {type(head).__name__}")
    include = bool(getattr(tm, "pool_include_prefix", False))  # timm's ViT: the pools skip the prefix unless asked
    if include and pool in ("avg", "max", "avgmax") and tm.num_prefix_tokens:
        problems.append("pooling that includes prefix tokens")
    ap = getattr(tm, "attn_pool", None)
    if ap is not None:  # EVA's attention pool reads every token, timm's ViT's the patches only (unless asked)
        include = (include or type(tm).__name__ == "Eva") and tm.num_prefix_tokens > 0
        out.update(read_attn_pool(tm, ap, problems), pool_include_prefix=include)
    return out


def read_attn_pool(tm: nn.Module, pool: nn.Module, problems: list[str]) -> dict[str, Any]:
    """timm's AttentionPoolLatent, in the one form the scratch model has: one latent query, q and
    kv projections with bias, output projection, norm + MLP with a residual, the query's output."""
    if type(pool).__name__ != "AttentionPoolLatent" or tm.global_pool != "map":
        problems.append(f"attention pool {type(pool).__name__}")
        return {}
    C = width(tm)
    plain = (pool.latent_len == 1 and pool.pool == "token" and isinstance(pool.q, nn.Linear) and pool.pos_embed is None
             and is_identity(getattr(pool, "q_norm", None)) and getattr(pool, "mlp", None) is not None
             and pool.latent.shape[-1] == C and pool.kv.out_features == 2 * C and pool.q.bias is not None)
    if not plain:
        problems.append("an attention pool with several latents, position embedding, qk-norm or no MLP")
        return {}
    act = ACTS.get(type(pool.mlp.act).__name__)
    mlp = block_parts(tm.blocks[0])[1]
    mlp_act = ACTS.get(type(mlp.act if mlp is not None else tm.blocks[0].mlp_act).__name__)
    if act != mlp_act:
        problems.append(f"an attention pool with activation {type(pool.mlp.act).__name__} unlike the blocks'")
    hidden = pool.mlp.fc1.out_features
    return dict(map_heads=pool.num_heads, map_mlp_hidden=hidden)


def read_sam(tm: nn.Module, problems: list[str]) -> dict[str, Any]:
    """SAM's image encoder: windowed and global blocks, decomposed relative positions, the
    convolutional neck and a head that only pools (the pretrained encoders have no classifier)."""
    if getattr(tm, "rope_global", None) is not None:
        problems.append("RoPE in SAM's encoder")
    windows = [b.window_size for b in tm.blocks]
    if len(set(windows) - {0}) > 1:
        problems.append(f"windows of several sizes {sorted(set(windows) - {0})}")
    neck = tm.neck
    convs = [m for m in neck.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in neck.modules() if type(m).__name__ == "LayerNorm2d"]
    plain = isinstance(neck, nn.Sequential) and len(neck) == 4 and len(convs) == 2 and {n.eps for n in norms} == {1e-6}
    if not plain or any(c.bias is not None for c in convs):
        problems.append("SAM's encoder without its convolutional neck (1x1 conv, norm, 3x3 conv, norm)")
    fc = getattr(tm.head, "fc", None)
    if type(tm.head).__name__ != "ClassifierHead" or isinstance(fc, nn.Linear) or tm.global_pool != "avg":
        problems.append("a classifier on SAM's encoder (its pretrained weights have none)")
    w = max(windows)
    return dict(window_size=w, global_blocks=tuple(i for i, s in enumerate(windows) if s == 0) if w else (),
                rel_pos="decomposed" if tm.blocks[0].attn.use_rel_pos else "", neck_chans=convs[0].out_channels if convs else 0,
                global_pool="avg", num_classes=0, final_norm=False)
