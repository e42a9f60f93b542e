"""ViTConfig: everything that defines the architecture, one flat dataclass (every saved checkpoint's
config loads as it was written).

The plain ViT's fields come first (``vit.py`` reads them); then each family's, grouped under the
module of ``vit_demo.model`` that reads them. A config that switches a family on needs that module
imported (``import vit_demo.model`` imports them all): :meth:`ViTConfig.families` says which.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

POOLS = ("token", "avg", "max", "avgmax", "map", "")
ACTIVATIONS = ("gelu", "quick_gelu", "gelu_tanh", "silu")

# Each family module of vit_demo.model, in words (for the line that says one is missing).
FAMILY_NAMES = {
    "variants": "small-variants", "rope": "rotary position", "relpos": "relative position",
    "parallel": "differential attention and parallel block", "sam": "SAM encoder", "naflex": "NaFlex",
    "attn_pool": "attention-pool head", "conv_stem": "convolutional stem",
}


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines the architecture. The defaults are a plain ViT; every field from
    ``kv_heads`` on is one variant of timm's ViT family, off by default."""

    # -- the plain ViT (vit.py): DeiT, DINO, CLIP, registers, pools
    img_size: tuple[int, int] = (224, 224)  # the size it was trained at (H, W)
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0  # MLP hidden width = embed_dim * mlp_ratio
    qkv_bias: bool = True
    norm_eps: float = 1e-6  # 1e-6 for timm ViT/DeiT, 1e-5 for CLIP
    act: Literal["gelu", "quick_gelu", "gelu_tanh", "silu"] = "gelu"  # all but gelu: variants.py
    class_token: bool = True
    dist_token: bool = False  # DeiT distillation token (two heads, averaged at inference)
    reg_tokens: int = 0  # register tokens (Darcet et al. 2024)
    no_embed_class: bool = False  # pos embed covers patches only, added before prefix concat
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP); patch conv has no bias then
    patch_bias: bool = True
    final_norm: bool = True
    layer_scale: bool = False  # LayerScale (DeiT-III, DINOv2); values come from the weights
    global_pool: Literal["token", "avg", "max", "avgmax", "map", ""] = "token"  # map: attention-pool head (attn_pool.py)
    fc_norm: bool = False  # norm after pooling instead of before (avg-pool heads)
    num_classes: int = 1000  # 0: headless (features only, e.g. DINO)
    pos_embed_antialias: bool = True  # resampling positions for another input size: timm antialiases, transformers not
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # every norm of the model (AIMv2, Sapiens2: RMSNorm, variants.py)
    patch_norm: bool = False  # a norm on the patch embeddings (AIMv2)
    head_dim: int = 0  # width of one head; 0: embed_dim // num_heads
    proj_bias: bool = True  # bias of attn.proj and of the MLP's layers (AIMv2: none)
    mlp_hidden_dim: int = 0  # 0: int(embed_dim * mlp_ratio)
    head_bias: bool = True  # False: a projection head without bias (CLIP's visual projection)
    pos_embed: bool = True  # the learned absolute position embedding
    pos_embed_grid: bool = False  # the position embedding stored as [1, gh, gw, C] (SAM, NaFlex) instead of [1, N, C]
    # -- variants.py: attention projections and norms, GLU MLPs, blocks
    kv_heads: tuple[int, ...] = ()  # key / value heads per block, grouped-query attention (Sapiens2); (): num_heads
    qkv_fused: bool = True  # one qkv projection; False: q_proj, k_proj, v_proj (EVA-02 CLIP, Sapiens2)
    qv_bias: bool = False  # learned q and v biases, none for k (BEiT, EVA): attn.q_bias, attn.v_bias
    qk_norm: bool = False  # a norm on every head's queries and keys
    attn_norm: bool = False  # a norm on the heads' concatenated output, before attn.proj (EVA-02 CLIP, BEiT-3)
    mlp: Literal["mlp", "swiglu", "glu"] = "mlp"  # GLU: act(gate) * value; swiglu: fc1_g + fc1_x; glu: fc1's halves
    mlp_norm: bool = False  # a norm on the MLP's hidden layer (NormFormer; EVA-02, BEiT-3)
    post_norm: bool = False  # res-post blocks, x + norm(attn(x)): EVA-02-E, the "rpn" ViTs
    layer_scale_on_block: bool = False  # LayerScale stored as blocks.i.gamma_1 / gamma_2 (EVA, BEiT)
    layer_scale_attn_only: bool = False  # LayerScale on the attention branch only (Sapiens2)
    # -- relpos.py: relative position biases ("decomposed": SAM's, sam.py)
    rel_pos: Literal["", "table", "shared_table", "mlp", "shared_mlp", "decomposed"] = ""  # BEiT; relpos ViT; SAM
    rel_pos_hidden: int = 0  # hidden width of the relative-position MLP
    # -- rope.py: 2-D rotary embedding of q and k
    rope: Literal["", "axial", "mixed", "dinov3"] = ""
    rope_temperature: float = 10000.0  # frequencies temperature^(-i / (D/4))
    rope_xy: bool = False  # angles from (x, y) instead of (row, column): timm's grid_indexing="xy"
    rope_offset: float = 0.0  # added to every coordinate
    rope_ref_grid: tuple[int, int] | None = None  # EVA: coordinates rescaled as if the grid were this one
    rope_half: bool = False  # rotate pairs (i, i + D/2) instead of neighbours (2i, 2i + 1)
    rope_normalize: Literal["separate", "min", "max"] = "separate"  # DINOv3: coordinates in [-1, 1] by which side
    rope_periods: tuple[float, float] | None = None  # DINOv3: min and max period instead of a temperature
    # -- attn_pool.py: the attention-pool head (global_pool="map")
    map_heads: int = 0  # 0: num_heads
    map_mlp_hidden: int = 0  # 0: the blocks' MLP width
    pool_include_prefix: bool = False  # the attention pool reads the prefix tokens too (PE)
    # -- parallel.py: attention and block kinds (timm's vit_d*, vit_*_xp_*, vit_pwee, vit_dpwee, vit_*_18x2_*)
    diff_attn: bool = False  # differential attention: softmax(q1 k1) - lambda softmax(q2 k2)
    block: Literal["", "scaling", "things"] = ""  # parallel blocks: ParallelScalingBlock, ParallelThingsBlock
    fused_out_proj: bool = False  # "scaling": one out_proj over [attention | MLP] instead of attn_out_proj + mlp_out_proj
    num_parallel: int = 2  # "things": attention branches, then as many MLP branches
    # -- sam.py: SAM's image encoder (timm's vision_transformer_sam; with rel_pos="decomposed")
    window_size: int = 0  # attention within windows of this many patches a side (the grid padded at bottom / right)
    global_blocks: tuple[int, ...] = ()  # the blocks that attend over the whole grid when the others are windowed
    neck_chans: int = 0  # a convolutional neck after the blocks (1x1 conv, norm, 3x3 conv, norm) to this many channels
    # -- naflex.py: NaFlexViT (timm's naflexvit; img_size = its position table's grid x patch; timm's names under
    #    embeds., see checkpoints/timm.py): a Linear patch projection, positions resampled its way, none on the prefix
    naflex: bool = False
    pos_embed_factorized: bool = False  # one position table per axis: pos_embed_y [1, gh, C] + pos_embed_x [1, gw, C]
    pos_embed_mode: Literal["bicubic", "bilinear"] = "bicubic"  # how NaFlex resamples its position table
    pos_embed_align_corners: bool = False
    pos_embed_square: bool = False  # "aspect-preserving": resampled to L x L (L the longer side), the top-left gh x gw kept
    # -- conv_stem.py, trained here only, never in a port (timm's ViT has no such option; timm parity does not cover it)
    conv_stem: bool = False  # 3x3 stride-2 convolutions + BatchNorm + ReLU before a 1x1 patch projection (ConvStem)
    stem_width: int = 0  # the conv stem's last width (0: embed_dim // 2); the widths before it halve
    stem_pool: bool = False  # CCT's tokenizer: each stage a stride-1 convolution then a 3x3 max-pool of stride 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", tuple(int(s) for s in self.img_size))
        for name in ("rope_ref_grid", "rope_periods", "kv_heads", "global_blocks"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.head_dim == 0 and self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        kv = self.kv_heads
        if kv and (len(kv) != self.depth or self.qkv_fused or any(self.num_heads % h for h in kv)):
            raise ValueError(f"kv_heads {self.kv_heads}: one per block, dividing num_heads {self.num_heads}, with unfused q/k/v")
        if self.global_pool == "token" and not (self.class_token or self.dist_token):
            raise ValueError("global_pool='token' needs a class token")
        if self.global_pool not in POOLS:
            raise ValueError(f"unknown global_pool {self.global_pool!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.act!r}")
        if self.rope and self.attn_head_dim % 4:
            raise ValueError(f"2-D RoPE needs a head dim divisible by 4, not {self.attn_head_dim}")
        if self.rope and self.rel_pos in ("table", "mlp"):
            raise ValueError("RoPE with a relative position bias in every block is not implemented (timm has neither)")
        self.check_block_kind()
        if self.naflex and (not self.no_embed_class or self.dist_token or self.conv_stem):
            raise ValueError("NaFlex's embedding gives the prefix tokens no position and has no distillation token or stem")
        if self.pos_embed_factorized and not self.naflex:
            raise ValueError("a position table per axis (pos_embed_factorized) is NaFlex's: naflex=True")
        if self.pos_embed_mode not in ("bicubic", "bilinear"):
            raise ValueError(f"unknown position resampling {self.pos_embed_mode!r}")
        sam = self.window_size or self.rel_pos == "decomposed" or self.neck_chans
        if sam and (self.num_prefix_tokens or self.rope or self.attn_norm or not self.qkv_fused or self.kv_heads):
            raise ValueError("SAM's windowed attention, decomposed positions and neck come without prefix tokens, RoPE, "
                             "an inner attention norm, separate q/k/v or grouped k/v heads")
        if self.conv_stem and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"conv_stem needs a patch size that is a power of 2, got {self.patch_size}")

    def check_block_kind(self) -> None:
        """Differential attention and the parallel blocks exist in timm with a plain attention only."""
        elsewhere = [n for n, on in (("RoPE", self.rope), ("relative position bias", self.rel_pos),
                                     ("grouped k/v heads", self.kv_heads), ("res-post blocks", self.post_norm),
                                     ("separate q/k/v", not self.qkv_fused), ("q/v biases", self.qv_bias),
                                     ("windowed attention", self.window_size)) if on]
        if (self.diff_attn or self.block) and elsewhere:
            raise ValueError(f"differential attention and parallel blocks come without {', '.join(elsewhere)}")
        if self.diff_attn and self.attn_head_dim % 2:
            raise ValueError(f"differential attention needs an even head dim, not {self.attn_head_dim}")
        if self.block not in ("", "scaling", "things"):
            raise ValueError(f"unknown block kind {self.block!r}")
        if self.block == "things" and self.diff_attn:
            raise ValueError("parallel-branch blocks with differential attention are not implemented")
        if self.block == "scaling" and (self.mlp != "mlp" or self.attn_norm or self.mlp_norm or self.head_dim):
            raise ValueError("a parallel scaling block has a plain MLP and no inner norms")

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def mlp_hidden(self) -> int:
        return self.mlp_hidden_dim or int(self.embed_dim * self.mlp_ratio)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.embed_dim // self.num_heads

    def families(self) -> dict[str, str]:
        """The family modules of ``vit_demo.model`` this config needs, each with the first field that
        asks for it, as written in a call ({"rope": "rope='axial'"}). A plain ViT: {}."""
        def shown(name: str) -> str:
            return f"{name}={getattr(self, name)!r}"

        asks = {
            "variants": [n for n in ("kv_heads", "qv_bias", "qk_norm", "attn_norm", "mlp_norm", "post_norm",
                                     "layer_scale_on_block", "layer_scale_attn_only") if getattr(self, n)]
                        + [n for n, plain in (("norm", "layernorm"), ("act", "gelu"), ("mlp", "mlp"), ("qkv_fused", True))
                           if getattr(self, n) != plain],
            "rope": ["rope"] if self.rope else [],
            "relpos": ["rel_pos"] if self.rel_pos not in ("", "decomposed") else [],
            "parallel": [n for n in ("diff_attn", "block") if getattr(self, n)],
            "sam": [n for n in ("window_size", "neck_chans") if getattr(self, n)]
                   + (["rel_pos"] if self.rel_pos == "decomposed" else []),
            "naflex": ["naflex"] if self.naflex else [],
            "attn_pool": ["global_pool"] if self.global_pool == "map" else [],
            "conv_stem": ["conv_stem"] if self.conv_stem else [],
        }
        return {module: shown(names[0]) for module, names in asks.items() if names}

    # Which registered class builds each part (vit.py looks them up; "" is its own plain class).
    @property
    def embed_kind(self) -> str:
        return "naflex" if self.naflex else "conv_stem" if self.conv_stem else ""

    @property
    def attention_kind(self) -> str:
        if self.diff_attn:
            return "diff"
        if self.window_size or self.rel_pos == "decomposed":
            return "window"
        if self.rope or self.rel_pos in ("table", "mlp"):
            return "rope" if self.rope else "relpos"
        variant = self.qv_bias or not self.qkv_fused or self.kv_heads or self.qk_norm or self.attn_norm
        return "variant" if variant or self.rel_pos else ""  # a bias shared by the blocks: the variant reads it

    @property
    def mlp_kind(self) -> str:
        return "variant" if self.mlp != "mlp" or self.mlp_norm else ""

    @property
    def block_kind(self) -> str:
        variant = self.post_norm or (self.layer_scale and (self.layer_scale_on_block or self.layer_scale_attn_only))
        return self.block or ("variant" if variant else "")

    def variants(self) -> list[str]:
        """The variants beyond the plain ViT that are on, in a few words each (for summaries)."""
        named = [(self.rope, f"RoPE ({self.rope})"), (self.rel_pos, f"relative position bias ({self.rel_pos})"),
                 (not self.pos_embed, "no absolute position embedding"), (self.global_pool == "map", "attention-pool head"),
                 (self.mlp != "mlp", "SwiGLU" if self.act == "silu" else f"GLU ({self.act})"),
                 (self.norm == "rmsnorm", "RMSNorm"), (self.qk_norm, "qk-norm"), (self.post_norm, "res-post blocks"),
                 (self.kv_heads, "grouped k/v heads"), (self.layer_scale, "LayerScale"),
                 (self.diff_attn, "differential attention (the maps show softmax1 - lambda softmax2)"),
                 (self.block, f"parallel blocks ({self.block})"),
                 (self.window_size, f"attention in {self.window_size}x{self.window_size} windows, global in blocks "
                                    f"{', '.join(map(str, self.global_blocks)) or 'none'}"),
                 (self.neck_chans, "a convolutional neck"),
                 (self.naflex, "NaFlex embedding (Linear patch projection, positions resampled per grid)")]
        return [text for on, text in named if on]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["img_size"] = list(self.img_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ViTConfig fields: {sorted(unknown)}")
        return cls(**d)
