"""A Vision Transformer written from scratch, readable top to bottom.

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), plus the variants timm
builds on the same skeleton, each a config option of a few lines (README, "Model families"):

- tokens and heads: DeiT's distillation token, register tokens (DINOv2), average / max pooling
  with ``fc_norm``, and an attention-pool head (MAP: a learned query reads the sequence; SigLIP, PE);
- position: the learned absolute embedding (with or without the prefix tokens), 2-D rotary
  embeddings of q and k (EVA-02, RoPE-ViT incl. learned mixed frequencies, DINOv3, PE), relative
  position biases (BEiT's tables, the relpos ViT's MLP), or none;
- blocks: LayerScale (DeiT-III, DINOv2, EVA, BEiT), res-post norms (EVA-02-E), pre-norm before
  the blocks (CLIP), qk-norm, a norm inside the attention and the MLP (EVA-02, BEiT-3), GLU MLPs
  (SwiGLU, packed and unpacked), RMSNorm (AIMv2), projections without bias, grouped-query attention;
- activations: GELU, GELU-tanh (SigLIP), QuickGELU (CLIP), SiLU (GLUs);
- attention and block kinds: differential attention (two softmax maps subtracted), parallel blocks
  (ViT-22B's attention and MLP from one projection; parallel branches), SAM's image encoder
  (windowed attention, decomposed relative positions, a convolutional neck), NaFlexViT's embedding
  (a Linear patch projection, its own resampling of the positions).

Parameter names follow timm's state_dict layout of each family (``blocks.0.ls1.gamma`` in timm's
ViT, ``blocks.0.gamma_1`` in EVA and BEiT), so porting is a checked copy (see checkpoints/timm.py).
Nothing here imports timm: timm is the reference we compare against, not a building block.

Shapes in comments: B batch, C embed dim, N tokens, P prefix tokens, n = gh x gw patches,
H heads, D head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

POOLS = ("token", "avg", "max", "avgmax", "map", "")
ACTIVATIONS = ("gelu", "quick_gelu", "gelu_tanh", "silu")


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines the architecture. The defaults are a plain ViT; every field
    below ``pos_embed_antialias`` is one variant of timm's ViT family, off by default."""

    img_size: tuple[int, int] = (224, 224)  # the size it was trained at (H, W)
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0  # MLP hidden width = embed_dim * mlp_ratio
    qkv_bias: bool = True
    norm_eps: float = 1e-6  # 1e-6 for timm ViT/DeiT, 1e-5 for CLIP
    act: Literal["gelu", "quick_gelu", "gelu_tanh", "silu"] = "gelu"
    class_token: bool = True
    dist_token: bool = False  # DeiT distillation token (two heads, averaged at inference)
    reg_tokens: int = 0  # register tokens (Darcet et al. 2024)
    no_embed_class: bool = False  # pos embed covers patches only, added before prefix concat
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP); patch conv has no bias then
    patch_bias: bool = True
    final_norm: bool = True
    layer_scale: bool = False  # LayerScale (DeiT-III, DINOv2); values come from the weights
    global_pool: Literal["token", "avg", "max", "avgmax", "map", ""] = "token"  # map: attention-pool head
    fc_norm: bool = False  # norm after pooling instead of before (avg-pool heads)
    num_classes: int = 1000  # 0: headless (features only, e.g. DINO)
    pos_embed_antialias: bool = True  # resampling positions for another input size: timm antialiases, transformers not
    # -- norms, projections, MLP
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # every norm of the model (AIMv2, Sapiens2: RMSNorm)
    patch_norm: bool = False  # a norm on the patch embeddings (AIMv2)
    head_dim: int = 0  # width of one head; 0: embed_dim // num_heads
    kv_heads: tuple[int, ...] = ()  # key / value heads per block, grouped-query attention (Sapiens2); (): num_heads
    qkv_fused: bool = True  # one qkv projection; False: q_proj, k_proj, v_proj (EVA-02 CLIP, Sapiens2)
    qv_bias: bool = False  # learned q and v biases, none for k (BEiT, EVA): attn.q_bias, attn.v_bias
    proj_bias: bool = True  # bias of attn.proj and of the MLP's layers (AIMv2: none)
    qk_norm: bool = False  # a norm on every head's queries and keys
    attn_norm: bool = False  # a norm on the heads' concatenated output, before attn.proj (EVA-02 CLIP, BEiT-3)
    mlp: Literal["mlp", "swiglu", "glu"] = "mlp"  # GLU: act(gate) * value; swiglu: fc1_g + fc1_x; glu: fc1's halves
    mlp_hidden_dim: int = 0  # 0: int(embed_dim * mlp_ratio)
    mlp_norm: bool = False  # a norm on the MLP's hidden layer (NormFormer; EVA-02, BEiT-3)
    head_bias: bool = True  # False: a projection head without bias (CLIP's visual projection)
    # -- blocks
    post_norm: bool = False  # res-post blocks, x + norm(attn(x)): EVA-02-E, the "rpn" ViTs
    layer_scale_on_block: bool = False  # LayerScale stored as blocks.i.gamma_1 / gamma_2 (EVA, BEiT)
    layer_scale_attn_only: bool = False  # LayerScale on the attention branch only (Sapiens2)
    # -- position information besides (or instead of) the absolute embedding
    pos_embed: bool = True  # the learned absolute position embedding
    rel_pos: Literal["", "table", "shared_table", "mlp", "shared_mlp", "decomposed"] = ""  # BEiT; relpos ViT; SAM
    rel_pos_hidden: int = 0  # hidden width of the relative-position MLP
    rope: Literal["", "axial", "mixed", "dinov3"] = ""  # 2-D rotary embedding of q and k (RotaryEmbedding below)
    rope_temperature: float = 10000.0  # frequencies temperature^(-i / (D/4))
    rope_xy: bool = False  # angles from (x, y) instead of (row, column): timm's grid_indexing="xy"
    rope_offset: float = 0.0  # added to every coordinate
    rope_ref_grid: tuple[int, int] | None = None  # EVA: coordinates rescaled as if the grid were this one
    rope_half: bool = False  # rotate pairs (i, i + D/2) instead of neighbours (2i, 2i + 1)
    rope_normalize: Literal["separate", "min", "max"] = "separate"  # DINOv3: coordinates in [-1, 1] by which side
    rope_periods: tuple[float, float] | None = None  # DINOv3: min and max period instead of a temperature
    # -- the attention-pool head
    map_heads: int = 0  # 0: num_heads
    map_mlp_hidden: int = 0  # 0: the blocks' MLP width
    pool_include_prefix: bool = False  # the attention pool reads the prefix tokens too (PE)
    # -- attention and block kinds (timm's vit_d*, vit_*_xp_*, vit_pwee, vit_dpwee, vit_*_18x2_*)
    diff_attn: bool = False  # differential attention: softmax(q1 k1) - lambda softmax(q2 k2) (DiffAttention below)
    block: Literal["", "scaling", "things"] = ""  # parallel blocks (ParallelScalingBlock, ParallelThingsBlock below)
    fused_out_proj: bool = False  # "scaling": one out_proj over [attention | MLP] instead of attn_out_proj + mlp_out_proj
    num_parallel: int = 2  # "things": attention branches, then as many MLP branches
    # -- SAM's image encoder (timm's vision_transformer_sam; with rel_pos="decomposed")
    window_size: int = 0  # attention within windows of this many patches a side (the grid padded at bottom / right)
    global_blocks: tuple[int, ...] = ()  # the blocks that attend over the whole grid when the others are windowed
    neck_chans: int = 0  # a convolutional neck after the blocks (1x1 conv, norm, 3x3 conv, norm) to this many channels
    pos_embed_grid: bool = False  # the position embedding stored as [1, gh, gw, C] (SAM, NaFlex) instead of [1, N, C]
    # -- NaFlexViT (timm's naflexvit; img_size = its position table's grid x patch; timm's names under embeds.,
    #    see checkpoints/timm.py): a Linear patch projection, positions resampled its way, none on the prefix
    naflex: bool = False
    pos_embed_factorized: bool = False  # one position table per axis: pos_embed_y [1, gh, C] + pos_embed_x [1, gw, C]
    pos_embed_mode: Literal["bicubic", "bilinear"] = "bicubic"  # how NaFlex resamples its position table
    pos_embed_align_corners: bool = False
    pos_embed_square: bool = False  # "aspect-preserving": resampled to L x L (L the longer side), the top-left gh x gw kept
    # Trained here only, never in a port (timm's ViT has no such option; timm parity does not cover it):
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
        self.check_block_kind()
        if self.naflex and (not self.no_embed_class or self.dist_token or self.conv_stem):
            raise ValueError("NaFlex's embedding gives the prefix tokens no position and has no distillation token or stem")
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


class TokenLayout(NamedTuple):
    """Where each token sits in the sequence: [class] [dist] [reg...] patches (row-major)."""

    num_prefix: int
    cls_index: int | None  # index of [class], None if the model has none
    dist_index: int | None
    reg_indices: tuple[int, ...]
    grid: tuple[int, int]  # (gh, gw) patch grid of this input
    # an attention-pool head's query: its attention over the N tokens, heads averaged [B, N]
    # (0 on the prefix tokens it does not read). Filled by a forward pass that captures.
    probe: torch.Tensor | None = None

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def names(self) -> list[str]:
        """A short name for every prefix token, in order."""
        out = ["[class]"] if self.cls_index is not None else []
        out += ["[dist]"] if self.dist_index is not None else []
        out += [f"[reg{i}]" for i in range(len(self.reg_indices))]
        return out

    def detach(self) -> TokenLayout:
        """The same layout with the probe (if any) out of the autograd graph."""
        return self if self.probe is None else self._replace(probe=self.probe.detach())

    def cpu(self) -> TokenLayout:
        """The same layout with the probe (if any) detached on the CPU, to be kept."""
        return self if self.probe is None else self._replace(probe=self.probe.detach().float().cpu())


# ----------------------------------------------------------------------------- small parts


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ConvStem(nn.Sequential):
    """Xiao et al., "Early convolutions help transformers see better" (NeurIPS 2021): log2(patch)
    3x3 stride-2 convolutions, each with BatchNorm and ReLU, widths doubling up to ``stem_width``
    (default embed_dim / 2). Edges and corners come out of it, either contrast polarity alike; a
    1x1 projection follows. ``stem_pool``: each stage is CCT's instead (Hassani et al. 2021, "Escaping
    the big data paradigm with compact transformers"), a stride-1 convolution whose ReLU output is
    max-pooled 3x3 with stride 2: every pixel is seen by a filter before the grid shrinks."""

    def __init__(self, cfg: ViTConfig) -> None:
        n = cfg.patch_size.bit_length() - 1  # patch 4: two halvings
        last = cfg.stem_width or cfg.embed_dim // 2
        widths = [last // 2 ** (n - 1 - i) for i in range(n)]
        layers: list[nn.Module] = []
        for c_in, c_out in zip([cfg.in_chans, *widths], widths):
            stride = 1 if cfg.stem_pool else 2
            layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
            layers += [nn.MaxPool2d(3, stride=2, padding=1)] if cfg.stem_pool else []
        super().__init__(*layers)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without centring or bias (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: ViTConfig, dim: int | None = None) -> nn.Module:
    """The model's norm (LayerNorm or RMSNorm) over ``dim`` channels (default: embed_dim)."""
    dim = dim or cfg.embed_dim
    return RMSNorm(dim, cfg.norm_eps) if cfg.norm == "rmsnorm" else nn.LayerNorm(dim, eps=cfg.norm_eps)


def make_act(name: str) -> nn.Module:
    return {"quick_gelu": QuickGELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU}.get(name, nn.GELU)()


class PatchEmbed(nn.Module):
    """Cut the image into patches and project each one: a strided convolution does both
    (with ``conv_stem``, convolutions reach the patch grid and a 1x1 convolution projects)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = cfg.patch_size
        p = cfg.patch_size
        self.stem = ConvStem(cfg) if cfg.conv_stem else None
        c_in, p = (cfg.stem_width or cfg.embed_dim // 2, 1) if cfg.conv_stem else (cfg.in_chans, p)
        self.proj = nn.Conv2d(c_in, cfg.embed_dim, kernel_size=p, stride=p, bias=cfg.patch_bias)
        if cfg.naflex:  # NaFlex: a Linear over each patch's pixels, in (row, column, channel) order
            self.proj = nn.Linear(p * p * cfg.in_chans, cfg.embed_dim, bias=cfg.patch_bias)
        self.norm = make_norm(cfg) if cfg.patch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        _, _, h, w = x.shape  # [B, 3, h, w]
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(f"input {h}x{w} is not a multiple of the patch size {p}")
        if isinstance(self.proj, nn.Linear):  # NaFlex: [B, gh*gw, p*p*3], each patch row by row, channels fastest
            x = x.unflatten(2, (h // p, p)).unflatten(4, (w // p, p)).permute(0, 2, 4, 3, 5, 1).flatten(3).flatten(1, 2)
            return self.norm(self.proj(x)), (h // p, w // p)
        if self.stem is not None:
            x = self.stem(x)  # [B, C/2, gh, gw]
        x = self.proj(x)  # [B, C, gh, gw]
        return self.norm(x.flatten(2).transpose(1, 2)), (x.shape[2], x.shape[3])  # [B, gh*gw, C], row-major


class LayerScale(nn.Module):
    """Per-channel learned scale on a residual branch (Touvron et al., CaiT / DeiT-III)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


# ----------------------------------------------------------------------------- position information


class RotaryEmbedding(nn.Module):
    """2-D rotary position embedding (RoPE; Su et al. 2021, for images: Heo et al., ECCV 2024).

    Each patch's query and key are cut into pairs of channels and every pair is turned by an
    angle that grows with the patch's position, so q . k depends on where two patches are
    relative to each other. The angles are a table [n, D/2]: ``axial`` (EVA-02, RoPE-ViT, PE)
    gives the first half of each head's pairs the row (or x) coordinate and the second half the
    column, times frequencies temperature^(-i / (D/4)); ``mixed`` (RoPE-ViT) learns frequencies
    per block and head that mix x and y; ``dinov3`` uses coordinates in [-1, 1] and 2 pi / periods.
    ``table(grid)`` gives [n, 2D] (sin | cos), or [L, H, n, 2D] for ``mixed``.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.attn_head_dim
        if cfg.rope == "mixed":  # learned [x or y, block, head, D/2]; initialised as RoPE-ViT: turned at random
            mag = 1.0 / cfg.rope_temperature ** (torch.arange(0, D, 4).float() / D)
            turn = torch.rand(cfg.depth, cfg.num_heads, 1) * 2 * math.pi
            fx = torch.cat([mag * torch.cos(turn), mag * torch.cos(turn + math.pi / 2)], dim=-1)
            fy = torch.cat([mag * torch.sin(turn), mag * torch.sin(turn + math.pi / 2)], dim=-1)
            self.freqs = nn.Parameter(torch.stack([fx, fy]))
        self.cache: dict[tuple[Any, ...], torch.Tensor] = {}  # fixed tables per grid and device

    def coordinates(self, grid: tuple[int, int]) -> torch.Tensor:
        """[n, 2] coordinates of the patches (row-major), as (row, col) or (x, y) with ``rope_xy``."""
        cfg = self.cfg
        shape, ref = (grid[::-1], (cfg.rope_ref_grid or ())[::-1]) if cfg.rope_xy else (grid, cfg.rope_ref_grid)
        if cfg.rope == "dinov3":  # patch centres in (0, 1) of the image side, then [-1, 1]
            denom = {"separate": shape, "min": (min(shape),) * 2, "max": (max(shape),) * 2}[cfg.rope_normalize]
            axes = [(torch.arange(0.5, s, dtype=torch.float32) + cfg.rope_offset) / d for s, d in zip(shape, denom)]
        else:
            axes = [torch.arange(s).float() + cfg.rope_offset for s in shape]
            if ref:  # EVA: as if the grid had the size it was pretrained at
                axes = [a / s * r for a, s, r in zip(axes, shape, ref)]
        c = torch.stack(torch.meshgrid(axes, indexing="xy" if cfg.rope_xy else "ij"), dim=-1).reshape(-1, 2)
        return 2.0 * c - 1.0 if cfg.rope == "dinov3" else c

    def angles(self, grid: tuple[int, int]) -> torch.Tensor:
        """The angle of every patch and pair: [n, D/2], or [L, H, n, D/2] for ``mixed``."""
        cfg, n4 = self.cfg, self.cfg.attn_head_dim // 4
        c = self.coordinates(grid).to(self.freqs.device if cfg.rope == "mixed" else "cpu")
        if cfg.rope == "mixed":
            return c[:, 0, None] * self.freqs[0][..., None, :] + c[:, 1, None] * self.freqs[1][..., None, :]
        if cfg.rope == "dinov3":
            lo_hi = cfg.rope_periods
            periods = (lo_hi[0] * (lo_hi[1] / lo_hi[0]) ** torch.linspace(0, 1, n4) if lo_hi else
                       cfg.rope_temperature ** (2.0 * torch.arange(n4, dtype=torch.float32) / (2 * n4)))
            return (2 * math.pi * c[:, :, None] / periods).flatten(1)
        bands = 1.0 / cfg.rope_temperature ** (torch.arange(n4, dtype=torch.float32) / n4)
        return (c[:, :, None] * bands).flatten(1)  # [n, (row | x) bands then (col | y) bands]

    def table(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """sin | cos of the angles, each repeated for the two channels of its pair."""
        if self.cfg.rope == "mixed":  # learned: follows the parameters (and their gradients)
            return self.encode(self.angles(grid)).to(device)
        key = (grid, str(device))
        if key not in self.cache:  # fixed: one table per grid and device, kept out of autograd and inference mode
            with torch.inference_mode(False), torch.no_grad():
                self.cache[key] = self.encode(self.angles(grid)).to(device)
        return self.cache[key]

    def encode(self, a: torch.Tensor) -> torch.Tensor:
        a = torch.cat([a, a], dim=-1) if self.cfg.rope_half else a.repeat_interleave(2, dim=-1)
        return torch.cat([a.sin(), a.cos()], dim=-1)


def rotate(x: torch.Tensor, table: torch.Tensor, num_prefix: int, half: bool) -> torch.Tensor:
    """Turn the patch tokens of q or k [B, H, N, D] by ``table`` ([n, 2D] or [H, n, 2D]); the
    prefix tokens have no position and stay as they are."""
    sin, cos = table.chunk(2, dim=-1)
    p = x[:, :, num_prefix:]
    if half:  # pairs (i, i + D/2): (a, b) -> (-b, a)
        a, b = p.chunk(2, dim=-1)
        turned = torch.cat([-b, a], dim=-1)
    else:  # pairs (2i, 2i + 1)
        turned = torch.stack([-p[..., 1::2], p[..., ::2]], dim=-1).reshape(p.shape)
    return torch.cat([x[:, :, :num_prefix], (p * cos + turned * sin).to(x.dtype)], dim=2)


def relative_position_index(grid: tuple[int, int], cls: bool) -> torch.Tensor:
    """[N, N] index into a table of (2gh-1)(2gw-1) relative offsets (Swin, BEiT), plus three
    entries for [class] -> patch, patch -> [class] and [class] -> [class] when ``cls``."""
    gh, gw = grid
    yx = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # [2, n]
    d = (yx[:, :, None] - yx[:, None, :]).permute(1, 2, 0)  # [n, n, 2] offsets
    index = (d[..., 0] + gh - 1) * (2 * gw - 1) + (d[..., 1] + gw - 1)
    if cls:
        m = (2 * gh - 1) * (2 * gw - 1)
        index = F.pad(index, (1, 0, 1, 0))
        index[0, :], index[:, 0], index[0, 0] = m, m + 1, m + 2
    return index


def table_bias(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A learned relative-position table [entries, H] -> the attention bias [1, H, N, N] (BEiT:
    [class] is the only prefix token)."""
    n = grid[0] * grid[1] + 1
    index = relative_position_index(grid, cls=True).to(table.device)
    return table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)


class RelPosTable(nn.Module):
    """BEiT's relative position bias shared by all blocks: one learned table."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        gh, gw = cfg.grid_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * gh - 1) * (2 * gw - 1) + 3, cfg.num_heads))

    def forward(self, grid: tuple[int, int]) -> torch.Tensor:
        return table_bias(self.relative_position_bias_table, grid)


class RelPosMlp(nn.Module):
    """The relpos ViT's bias: a small MLP (ReLU) of the log-spaced relative offset,
    sign(d) log(1 + |d|) per axis (timm's "cr" mode, after Swin-V2), one output per head.
    Prefix tokens get no bias."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.num_prefix = cfg.num_prefix_tokens
        self.mlp = Mlp(2, cfg.rel_pos_hidden, nn.ReLU(), out=cfg.num_heads)

    def forward(self, grid: tuple[int, int]) -> torch.Tensor:
        gh, gw = grid
        d = torch.stack(torch.meshgrid(torch.arange(1 - gh, gh).float(), torch.arange(1 - gw, gw).float(),
                                       indexing="ij"), dim=-1).to(self.mlp.fc1.weight.device)  # [2gh-1, 2gw-1, 2]
        bias = self.mlp(torch.sign(d) * torch.log(1.0 + d.abs())).view(-1, self.mlp.fc2.out_features)
        n = gh * gw
        bias = bias[relative_position_index(grid, cls=False).to(d.device).view(-1)].view(n, n, -1).permute(2, 0, 1)
        return F.pad(bias, [self.num_prefix, 0, self.num_prefix, 0]).unsqueeze(0)  # [1, H, N, N]


# ----------------------------------------------------------------------------- attention and MLP


def scores_into(capture: bool | torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * q k^T [B, H, N, N], the same numbers whichever way it is computed. When ``capture``
    is a tensor of that shape and dtype (a slot of the block that a forward pass without autograd
    keeps, see ``forward_features``), the product is written straight into it, so that the softmax
    can run in place on numbers still in cache; a power-of-2 scale (head size 64: 1/8) is applied
    by the matrix product itself, exactly as a multiply after it would (other scales: multiplied
    after, as always)."""
    B, H, N, D = q.shape
    if not (isinstance(capture, torch.Tensor) and capture.dtype == q.dtype and capture.is_contiguous()
            and capture.shape == (B, H, N, k.shape[-2])):
        return torch.matmul(q, k.transpose(-2, -1)).mul_(scale)
    exact = math.frexp(scale)[0] == 0.5  # a power of 2
    out = capture.view(B * H, N, -1)
    torch.baddbmm(out, q.reshape(B * H, N, D), k.transpose(-2, -1).reshape(B * H, D, -1), beta=0,
                  alpha=scale if exact else 1.0, out=out)
    return capture if exact else capture.mul_(scale)


class Attention(nn.Module):
    """Multi-head self-attention. Two paths, same numbers: a fused kernel for speed, and an
    explicit softmax(q k^T / sqrt(d) + bias) that also returns the attention probabilities.
    Variants: q/k norms, RoPE on q and k, a relative position bias, grouped key/value heads."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C, H, D = cfg.embed_dim, cfg.num_heads, cfg.attn_head_dim
        self.num_heads, self.kv_heads, self.head_dim = H, cfg.kv_heads[index] if cfg.kv_heads else H, D
        self.scale = D**-0.5
        self.num_prefix, self.rope_half, self.grid = cfg.num_prefix_tokens, cfg.rope_half, cfg.grid_size
        if cfg.qkv_fused:
            self.qkv = nn.Linear(C, 3 * H * D, bias=cfg.qkv_bias)
            if cfg.qv_bias:  # EVA, BEiT: biases on q and v only (k's is a fixed 0)
                self.q_bias, self.v_bias = nn.Parameter(torch.zeros(H * D)), nn.Parameter(torch.zeros(H * D))
                self.register_buffer("k_bias", torch.zeros(H * D), persistent=False)
            else:
                self.q_bias = None
        else:
            self.qkv = None
            self.q_proj = nn.Linear(C, H * D, bias=cfg.qkv_bias or cfg.qv_bias)
            self.k_proj = nn.Linear(C, self.kv_heads * D, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(C, self.kv_heads * D, bias=cfg.qkv_bias or cfg.qv_bias)
        self.q_norm = make_norm(cfg, D) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, D) if cfg.qk_norm else nn.Identity()
        self.relative_position_bias_table = None  # BEiT: one learned table per block
        self.rel_pos = RelPosMlp(cfg) if cfg.rel_pos == "mlp" else None  # relpos ViT: one MLP per block
        if cfg.rel_pos == "table":
            gh, gw = cfg.grid_size
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * gh - 1) * (2 * gw - 1) + 3, H))
        self.norm = make_norm(cfg, H * D) if cfg.attn_norm else nn.Identity()
        self.proj = nn.Linear(H * D, C, bias=cfg.proj_bias)
        self.relevance_rule: Callable | None = None  # set only in LRP's explanation mode (lrp.py)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, N, C] -> q [B, H, N, D], k and v [B, H_kv, N, D]."""
        B, N, _ = x.shape
        H, D = self.num_heads, self.head_dim
        if self.qkv is None:  # three projections (EVA-02 CLIP, PE, Sapiens2)
            q = self.q_proj(x).reshape(B, N, H, D).transpose(1, 2)
            k = self.k_proj(x).reshape(B, N, self.kv_heads, D).transpose(1, 2)
            return q, k, self.v_proj(x).reshape(B, N, self.kv_heads, D).transpose(1, 2)
        qkv = self.qkv(x)
        if self.q_bias is not None:  # EVA, BEiT: q and v biases, k's fixed at 0
            qkv = qkv + torch.cat((self.q_bias, self.k_bias, self.v_bias))
        q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
        return q, k, v

    def position_bias(self, grid: tuple[int, int], shared: torch.Tensor | None) -> torch.Tensor | None:
        """This block's relative position bias [1, H, N, N] plus the shared one, if any."""
        own = None
        if self.relative_position_bias_table is not None or self.rel_pos is not None:
            if grid != self.grid:
                raise ValueError(f"a relative position bias is defined for the {self.grid[0]}x{self.grid[1]} patch "
                                 f"grid the model was trained at, not {grid[0]}x{grid[1]}: use its input size")
            own = (self.rel_pos(grid) if self.rel_pos is not None else
                   table_bias(self.relative_position_bias_table, grid))
        return shared if own is None else (own if shared is None else own + shared)

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``capture``: True returns the attention probabilities; a [B, H, N, N] tensor of the
        same dtype (no autograd) receives them, and is returned."""
        B, N, _ = x.shape
        q, k, v = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # patch tokens turned by their 2-D position
            q, k = rotate(q, rope, self.num_prefix, self.rope_half), rotate(k, rope, self.num_prefix, self.rope_half)
        if self.kv_heads != self.num_heads:  # grouped-query attention: each k/v head serves a group of q heads
            k = k.repeat_interleave(self.num_heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.num_heads // self.kv_heads, dim=1)
        if self.relevance_rule is not None:  # same values, gradients shaped by an LRP rule
            q, k, v = self.relevance_rule(q, k, v)
        bias = self.position_bias(grid or self.grid, bias)
        if capture is not False:  # the scale applied to q k^T (the same numbers as scaling q when it is a power of 2)
            attn = scores_into(capture, q, k, self.scale)  # [B, H, N, N]
            attn = attn if bias is None else attn.add_(bias)
            attn = torch.softmax(attn, -1, out=attn) if attn is capture else attn.softmax(dim=-1)
            x = attn @ v
        else:
            attn = None
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)  # concatenate the heads
        return self.proj(self.norm(x)), attn


class Mlp(nn.Module):
    """Two linear layers with an activation between, applied to every token independently; or a
    gated linear unit (GLU, Shazeer 2020): act(gate) * value, then fc2. ``swiglu`` has separate
    gate and value layers (fc1_g, fc1_x), ``glu`` one fc1 whose first half is the gate."""

    def __init__(self, dim: int, hidden: int, act: nn.Module, out: int | None = None, bias: bool = True,
                 kind: str = "mlp", norm: nn.Module | None = None) -> None:
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.fc1_g = nn.Linear(dim, hidden, bias=bias)
            self.fc1_x = nn.Linear(dim, hidden, bias=bias)
        else:
            self.fc1 = nn.Linear(dim, 2 * hidden if kind == "glu" else hidden, bias=bias)
        self.act = act
        self.norm = norm or nn.Identity()  # NormFormer's norm on the hidden layer (EVA-02, BEiT-3)
        self.fc2 = nn.Linear(hidden, out or dim, bias=bias)
        self.relevance_rule: Callable | None = None  # set only in LRP's explanation mode (lrp.py)

    @classmethod
    def of(cls, cfg: ViTConfig) -> Mlp:
        """The blocks' MLP."""
        h = cfg.mlp_hidden
        return cls(cfg.embed_dim, h, make_act(cfg.act), bias=cfg.proj_bias, kind=cfg.mlp,
                   norm=make_norm(cfg, h) if cfg.mlp_norm else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mlp":
            return self.fc2(self.norm(self.act(self.fc1(x))))
        gate, value = (self.fc1_g(x), self.fc1_x(x)) if self.kind == "swiglu" else self.fc1(x).chunk(2, dim=-1)
        gate = self.act(gate)
        if self.relevance_rule is not None:  # same values, gradients shaped by an LRP rule
            gate, value = self.relevance_rule(gate, value)
        return self.fc2(self.norm(gate * value))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)). With ``post_norm``
    the norm moves onto the branch: x + norm(attn(x)), then x + norm(mlp(x))."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C = cfg.embed_dim
        self.post_norm = cfg.post_norm
        self.norm1 = make_norm(cfg)
        sam = cfg.window_size or cfg.rel_pos == "decomposed"
        self.attn = (DiffAttention if cfg.diff_attn else WindowAttention if sam else Attention)(cfg, index)
        scales = cfg.layer_scale and not cfg.layer_scale_on_block
        self.ls1 = LayerScale(C) if scales else nn.Identity()
        self.norm2 = make_norm(cfg)
        self.mlp = Mlp.of(cfg)
        self.ls2 = LayerScale(C) if scales and not cfg.layer_scale_attn_only else nn.Identity()
        on_block = cfg.layer_scale and cfg.layer_scale_on_block  # EVA, BEiT: the same scales, other names
        self.gamma_1 = nn.Parameter(torch.full((C,), 1e-5)) if on_block else None
        self.gamma_2 = nn.Parameter(torch.full((C,), 1e-5)) if on_block and not cfg.layer_scale_attn_only else None

    def forward(self, x: torch.Tensor, capture: bool | torch.Tensor = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.post_norm:
            a, attn = self.attn(x, capture, rope, bias, grid)
            x = x + self.norm1(a)
            return x + self.norm2(self.mlp(x)), attn
        a, attn = self.attn(self.norm1(x), capture, rope, bias, grid)
        x = x + (self.ls1(a) if self.gamma_1 is None else self.gamma_1 * a)
        m = self.mlp(self.norm2(x))
        x = x + (self.ls2(m) if self.gamma_2 is None else self.gamma_2 * m)
        return x, attn


# ----------------------------------------------------------------------------- differential attention, parallel blocks


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d)) v over the last two dims: the fused kernel, or explicit with the
    probabilities returned (captured)."""
    if capture is False:  # True, or a tensor meant to receive the probabilities (ignored here)
        return F.scaled_dot_product_attention(q, k, v), None
    attn = ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
    return attn @ v, attn


def add_diff_params(m: nn.Module, d: int, index: int) -> None:
    """Differential attention's parameters on ``m`` (timm's names, on the attention or the block):
    the vectors whose products give lambda, the heads' RMSNorm (``sub_norm``, eps 1e-5), and
    lambda_init = 0.8 - 0.6 exp(-0.3 * block index) (Ye et al., "Differential Transformer", ICLR 2025)."""
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        setattr(m, name, nn.Parameter(torch.randn(d) * 0.1))
    m.sub_norm = RMSNorm(2 * d, 1e-5)
    m.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * index)


def diff_lambda(m: nn.Module) -> torch.Tensor:
    """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init of ``m`` (ours or timm's: same names)."""
    return (torch.exp((m.lambda_q1 * m.lambda_k1).sum(-1).float())
            - torch.exp((m.lambda_q2 * m.lambda_k2).sum(-1).float()) + m.lambda_init)


def diff_attend(m: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, capture: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Differential attention with ``m``'s parameters: q, k, v [B, H, N, 2d] (each head's query
    and key in two halves of d) -> the heads' output [B, H, N, 2d], RMSNorm-ed and scaled by
    1 - lambda_init, and, captured, the map softmax1 - lambda softmax2 [B, H, N, N]."""
    B, H, N, D = q.shape
    q, k = (norm(t.reshape(B, H, N, 2, D // 2).transpose(2, 3)) for norm, t in ((m.q_norm, q), (m.k_norm, k)))
    if m.relevance_rule is not None:  # q, k [B, H, 2, N, d]
        q, k, v = m.relevance_rule(q, k, v)
    lam = diff_lambda(m).type_as(q)
    if capture is not False:
        s = ((q * (D // 2) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, H, 2, N, N]
        attn = s[:, :, 0] - lam * s[:, :, 1]
        x = attn @ v
    else:
        o1, o2 = (F.scaled_dot_product_attention(q[:, :, i], k[:, :, i], v) for i in (0, 1))  # 4-D: the fast kernels
        attn, x = None, o1 - lam * o2
    return m.sub_norm(x) * (1 - m.lambda_init), attn


class DiffAttention(Attention):
    """Differential attention (timm's DiffAttention): each head's query and key are cut in two
    halves, two softmax maps are taken and the second, weighted by lambda, is subtracted; the
    captured attention is that difference (rows sum to 1 - lambda, entries may be negative)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        d = self.head_dim // 2
        self.q_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        add_diff_params(self, d, index)

    def forward(self, x: torch.Tensor, capture: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, _ = x.shape
        q, k, v = self.project(x)
        x, attn = diff_attend(self, q, k, v, capture)
        return self.proj(self.norm(x.transpose(1, 2).reshape(B, N, -1))), attn


class ParallelScalingBlock(nn.Module):
    """Attention and MLP side by side (Dehghani et al., "Scaling Vision Transformers to 22 Billion
    Parameters", ICML 2023): one norm, one projection giving the MLP's hidden layer and q, k, v,
    then x + ls(attn_out(attention) + mlp_out(act(hidden))) (or one ``out_proj`` over both). With
    ``diff_attn`` the attention is differential (timm's DiffParallelScalingBlock)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C, hidden = cfg.embed_dim, cfg.mlp_hidden
        self.num_heads, self.split = cfg.num_heads, [hidden, C, C, C]
        self.in_norm = make_norm(cfg)
        self.in_proj = nn.Linear(C, hidden + 3 * C, bias=cfg.qkv_bias)
        self.mlp_bias = None if cfg.qkv_bias else nn.Parameter(torch.zeros(hidden))  # in in_proj's bias otherwise
        d = cfg.attn_head_dim // (2 if cfg.diff_attn else 1)
        self.q_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg, d) if cfg.qk_norm else nn.Identity()
        if cfg.diff_attn:
            add_diff_params(self, d, index)
        self.diff = cfg.diff_attn
        self.mlp_act = make_act(cfg.act)
        fused = cfg.fused_out_proj or cfg.diff_attn
        self.out_proj = nn.Linear(C + hidden, C, bias=cfg.proj_bias) if fused else None
        self.attn_out_proj = None if fused else nn.Linear(C, C, bias=cfg.proj_bias)
        self.mlp_out_proj = None if fused else nn.Linear(hidden, C, bias=cfg.proj_bias)
        self.ls = LayerScale(C) if cfg.layer_scale else nn.Identity()
        self.relevance_rule: Callable | None = None  # set only in LRP's explanation mode (lrp.py)

    @property
    def norm1(self) -> nn.Module:
        """The norm of the block's input (what GradCAM reads, as a plain block's norm1)."""
        return self.in_norm

    def forward(self, x: torch.Tensor, capture: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        m, q, k, v = self.in_proj(self.in_norm(x)).split(self.split, dim=-1)
        m = self.mlp_act(m if self.mlp_bias is None else m + self.mlp_bias)
        q, k, v = (t.reshape(B, N, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, N, D]
        if self.diff:
            a, attn = diff_attend(self, q, k, v, capture)
        else:
            q, k = self.q_norm(q), self.k_norm(k)
            if self.relevance_rule is not None:
                q, k, v = self.relevance_rule(q, k, v)
            a, attn = attend(q, k, v, capture)
        a = a.transpose(1, 2).reshape(B, N, C)
        y = self.out_proj(torch.cat([a, m], dim=-1)) if self.out_proj is not None else (
            self.attn_out_proj(a) + self.mlp_out_proj(m))
        return x + self.ls(y), attn


class ParallelThingsBlock(nn.Module):
    """Parallel branches (Touvron et al., "Three things everyone should know about Vision
    Transformers", ECCV 2022): x + sum_i ls_i(attn_i(norm_i(x))), then x + sum_i ls_i(mlp_i(norm_i(x))).
    The captured attention is every branch's heads side by side [B, n*H, N, N] (computed once,
    so gradients reach it); the fast path is each branch's own Attention."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C = cfg.embed_dim

        def ls() -> nn.Module:
            return LayerScale(C) if cfg.layer_scale else nn.Identity()

        n = cfg.num_parallel
        self.attns = nn.ModuleList([nn.ModuleDict(dict(norm=make_norm(cfg), attn=Attention(cfg, index), ls=ls()))
                                    for _ in range(n)])
        self.ffns = nn.ModuleList([nn.ModuleDict(dict(norm=make_norm(cfg), mlp=Mlp.of(cfg), ls=ls())) for _ in range(n)])

    @property
    def norm1(self) -> nn.Module:
        """The first branch's norm of the block's input (what GradCAM reads, as a plain block's norm1)."""
        return self.attns[0]["norm"]

    def forward(self, x: torch.Tensor, capture: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, _ = x.shape
        attn = None
        if capture is not False:  # every branch's heads in one softmax: one captured tensor
            parts = []
            for b in self.attns:
                q, k, v = b["attn"].project(b["norm"](x))
                parts.append((b["attn"].q_norm(q), b["attn"].k_norm(k), v))
            q, k, v = (torch.cat(t, dim=1) for t in zip(*parts))  # [B, n*H, N, D]
            rule = self.attns[0]["attn"].relevance_rule
            o, attn = attend(*(rule(q, k, v) if rule is not None else (q, k, v)), capture=True)
            outs = [b["ls"](b["attn"].proj(b["attn"].norm(o_i.transpose(1, 2).reshape(B, N, -1))))
                    for b, o_i in zip(self.attns, o.chunk(len(self.attns), dim=1))]
        else:
            outs = [b["ls"](b["attn"](b["norm"](x))[0]) for b in self.attns]
        x = x + torch.stack(outs).sum(dim=0)
        return x + torch.stack([b["ls"](b["mlp"](b["norm"](x))) for b in self.ffns]).sum(dim=0), attn


# ----------------------------------------------------------------------------- SAM's image encoder


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """[B, gh, gw, C] -> [B * windows, w, w, C], the grid padded with zeros at the bottom and right."""
    B, gh, gw, C = x.shape
    x = F.pad(x, (0, 0, 0, -gw % w, 0, -gh % w))
    hp, wp = x.shape[1] // w, x.shape[2] // w
    return x.view(B, hp, w, wp, w, C).transpose(2, 3).reshape(-1, w, w, C)


def window_unpartition(x: torch.Tensor, w: int, grid: tuple[int, int]) -> torch.Tensor:
    """[B * windows, w, w, C] -> [B, gh, gw, C], the padding cut off."""
    gh, gw = grid
    hp, wp = -(-gh // w), -(-gw // w)
    x = x.view(-1, hp, wp, w, w, x.shape[-1]).transpose(2, 3).reshape(-1, hp * w, wp * w, x.shape[-1])
    return x[:, :gh, :gw]


def rel_pos_table(size: int, table: torch.Tensor) -> torch.Tensor:
    """[size, size, D]: the embedding of every (query, key) offset along one axis, the learned
    table [2s - 1, D] linearly resampled when it was learned for another size (as timm and SAM)."""
    if table.shape[0] != 2 * size - 1:
        table = F.interpolate(table.T[None], size=2 * size - 1, mode="linear")[0].T
    offsets = torch.arange(size)[:, None] - torch.arange(size)[None, :] + size - 1
    return table[offsets.to(table.device)]


def decomposed_bias(q: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """MViTv2's decomposed relative position bias (Li et al., CVPR 2022; SAM): q [B, H, h*w, D]
    -> [B, H, h*w, h*w], q . R_h[row offset] + q . R_w[column offset]."""
    h, w = size
    r = q.reshape(*q.shape[:2], h, w, q.shape[-1])
    by_row = torch.einsum("bnhwc,hkc->bnhwk", r, rel_pos_table(h, rel_h))
    by_col = torch.einsum("bnhwc,wkc->bnhwk", r, rel_pos_table(w, rel_w))
    return (by_row[..., :, None] + by_col[..., None, :]).reshape(*q.shape[:2], h * w, h * w)


def window_map(a: torch.Tensor, grid: tuple[int, int], w: int) -> torch.Tensor:
    """Every window's attention [B * windows, H, w*w, w*w] as one [B, H, N, N] over the grid: 0
    between windows; what a query gave the padding (keys past the grid's edge) is left out."""
    (gh, gw), N = grid, grid[0] * grid[1]
    hp, wp = -(-gh // w), -(-gw // w)
    rows = torch.arange(hp * w).view(hp, 1, w, 1).expand(hp, wp, w, w)
    cols = torch.arange(wp * w).view(1, wp, 1, w).expand(hp, wp, w, w)
    index = (rows * gw + cols).where((rows < gh) & (cols < gw), N).reshape(hp * wp, w * w).to(a.device)  # N: padding
    a = a.reshape(-1, hp * wp, *a.shape[1:]).transpose(1, 2)  # [B, H, windows, w*w, w*w]
    out = a.new_zeros(a.shape[0], a.shape[1], N + 1, N + 1)
    out[:, :, index[:, :, None], index[:, None, :]] = a
    return out[:, :, :N, :N]


class WindowAttention(Attention):
    """SAM's attention (Li et al., ViTDet, ECCV 2022; Kirillov et al., ICCV 2023): within windows
    of w x w patches, or over the whole grid in the global blocks, with a decomposed relative
    position bias. Captured: one [B, H, N, N] per block, windows on the diagonal (``window_map``)."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__(cfg, index)
        self.window = 0 if index in cfg.global_blocks else cfg.window_size
        gh, gw = (self.window, self.window) if self.window else cfg.grid_size
        decomposed = cfg.rel_pos == "decomposed"
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * gh - 1, self.head_dim)) if decomposed else None
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * gw - 1, self.head_dim)) if decomposed else None

    def forward(self, x: torch.Tensor, capture: bool = False, rope: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, grid: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        grid, w = grid or self.grid, self.window
        t = x.reshape(B, *grid, C)
        t = window_partition(t, w) if w else t  # [B', h, w, C]: windows or the whole grid
        size = (t.shape[1], t.shape[2])
        q, k, v = self.project(t.flatten(1, 2))  # [B', H, h*w, D]
        q, k = self.q_norm(q), self.k_norm(k)
        if self.relevance_rule is not None:
            q, k, v = self.relevance_rule(q, k, v)
        bias = decomposed_bias(q, self.rel_pos_h, self.rel_pos_w, size) if self.rel_pos_h is not None else None
        if capture is not False:
            attn = ((q * self.scale) @ k.transpose(-2, -1) + (0 if bias is None else bias)).softmax(dim=-1)
            o = attn @ v
        else:
            attn, o = None, F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        o = o.transpose(1, 2).flatten(2)  # [B', h*w, C]: the heads side by side
        if w:
            o = window_unpartition(o.reshape(-1, *size, C), w, grid)
        if attn is not None and w:  # one [B, H, N, N]; gradients reach it through a term worth 0
            attn = window_map(attn.detach(), grid, w)
            if torch.is_grad_enabled():
                attn.requires_grad_(True)
                v = window_unpartition(v.transpose(1, 2).flatten(2).reshape(-1, *size, C), w, grid)
                v = v.reshape(B, N, self.num_heads, -1).transpose(1, 2)  # [B, H, N, D]
                o = o.reshape(B, N, C) + ((attn - attn.detach()) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(self.norm(o.reshape(B, N, C))), attn


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of a [B, C, h, w] map (timm's LayerNorm2d)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.weight.shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


def sam_neck(cfg: ViTConfig) -> nn.Sequential:
    """SAM's neck after the blocks: 1x1 convolution, norm, 3x3 convolution, norm (no biases)."""
    C, n = cfg.embed_dim, cfg.neck_chans
    return nn.Sequential(nn.Conv2d(C, n, 1, bias=False), ChannelNorm(n), nn.Conv2d(n, n, 3, padding=1, bias=False),
                         ChannelNorm(n))


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; SigLIP, PE): a learned latent query attends to the
    token sequence, then an MLP with a residual connection. Returns the pooled features [B, C]
    and, when captured, the query's attention over the tokens [B, H, 1, N]."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        C = cfg.embed_dim
        self.num_heads = cfg.map_heads or cfg.num_heads
        self.head_dim = C // self.num_heads
        self.scale = self.head_dim**-0.5
        self.latent = nn.Parameter(torch.zeros(1, 1, C))
        self.q = nn.Linear(C, C)
        self.kv = nn.Linear(C, 2 * C)
        self.proj = nn.Linear(C, C)
        self.norm = make_norm(cfg)
        self.mlp = Mlp(C, cfg.map_mlp_hidden or cfg.mlp_hidden, make_act(cfg.act))
        self.relevance_rule: Callable | None = None  # set only in LRP's explanation mode (lrp.py)

    def forward(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, H, D).transpose(1, 2)  # [B, H, 1, D]
        k, v = self.kv(x).reshape(B, N, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
        if self.relevance_rule is not None:
            q, k, v = self.relevance_rule(q, k, v)
        if capture:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, H, 1, N]
            x = attn @ v
        else:
            attn = None
            x = F.scaled_dot_product_attention(q, k, v)
        x = self.proj(x.transpose(1, 2).reshape(B, 1, C))
        x = x + self.mlp(self.norm(x))
        return x[:, 0], attn


def resample_pos_embed(
    pos: torch.Tensor, old: tuple[int, int], new: tuple[int, int], antialias: bool = True
) -> torch.Tensor:
    """Resize a [1, gh*gw, C] grid of position embeddings to a new grid, bicubic, with
    antialiasing as timm does for ``dynamic_img_size`` (transformers' ``interpolate_pos_encoding``
    uses plain bicubic: ``antialias=False``)."""
    if old == new:
        return pos
    C = pos.shape[-1]
    grid = pos.float().reshape(1, old[0], old[1], C).permute(0, 3, 1, 2)  # [1, C, gh, gw]
    grid = F.interpolate(grid, size=new, mode="bicubic", antialias=antialias)
    return grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], C).to(pos.dtype)


class ViTOutput(NamedTuple):
    """What a forward pass returns. ``attentions`` is filled only when captured."""

    logits: torch.Tensor  # [B, num_classes], or pooled features [B, C] when headless
    attentions: list[torch.Tensor] | None  # per layer, post-softmax [B, H, N, N]
    layout: TokenLayout
    pool_attention: torch.Tensor | None = None  # attention-pool head, captured: [B, H, 1, tokens it reads]


class VisionTransformer(nn.Module):
    """The ViT: patch embedding + prefix tokens + position embedding, L blocks, norm, head."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, C)) if cfg.reg_tokens else None
        gh, gw = cfg.grid_size
        pos_len = gh * gw + (0 if cfg.no_embed_class else cfg.num_prefix_tokens)
        shape = (1, gh, gw, C) if cfg.pos_embed_grid else (1, pos_len, C)
        factorized = cfg.pos_embed and cfg.pos_embed_factorized  # NaFlex: one table per axis
        self.pos_embed = nn.Parameter(torch.randn(shape) * 0.02) if cfg.pos_embed and not factorized else None
        self.pos_embed_y = nn.Parameter(torch.randn(1, gh, C) * 0.02) if factorized else None
        self.pos_embed_x = nn.Parameter(torch.randn(1, gw, C) * 0.02) if factorized else None
        self.rope = RotaryEmbedding(cfg) if cfg.rope else None
        self.rel_pos_bias = RelPosTable(cfg) if cfg.rel_pos == "shared_table" else None  # BEiT's name
        self.shared_rel_pos = RelPosMlp(cfg) if cfg.rel_pos == "shared_mlp" else None  # the relpos ViT's name
        self.norm_pre = make_norm(cfg) if cfg.pre_norm else nn.Identity()
        kind = {"": Block, "scaling": ParallelScalingBlock, "things": ParallelThingsBlock}[cfg.block]
        self.blocks = nn.ModuleList([kind(cfg, i) for i in range(cfg.depth)])
        self.norm = make_norm(cfg) if cfg.final_norm and not cfg.fc_norm else nn.Identity()
        self.attn_pool = AttentionPool(cfg) if cfg.global_pool == "map" else None
        self.fc_norm = make_norm(cfg) if cfg.final_norm and cfg.fc_norm else nn.Identity()
        self.neck = sam_neck(cfg) if cfg.neck_chans else None
        C = cfg.neck_chans or C
        self.head = nn.Linear(C, cfg.num_classes, bias=cfg.head_bias) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = nn.Linear(C, cfg.num_classes) if cfg.dist_token and cfg.num_classes > 0 else None

    @torch.no_grad()
    def init_weights(self) -> VisionTransformer:
        """Initialise for training from scratch, as ViT / DeiT do: truncated normal (std 0.02)
        for linear layers and position embeddings, zero biases, unit norms, a tiny
        [class] token, and a zero head so that every class starts out equally likely."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, RMSNorm)):
                nn.init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for t in (self.cls_token, self.dist_token, self.reg_token):
            if t is not None:
                nn.init.normal_(t, std=1e-6)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                if head.bias is not None:
                    nn.init.zeros_(head.bias)
        return self

    def layout(self, grid: tuple[int, int]) -> TokenLayout:
        cfg = self.cfg
        i = 0
        cls_index = dist_index = None
        if cfg.class_token:
            cls_index, i = i, i + 1
        if cfg.dist_token:
            dist_index, i = i, i + 1
        regs = tuple(range(i, i + cfg.reg_tokens))
        return TokenLayout(cfg.num_prefix_tokens, cls_index, dist_index, regs, grid)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, TokenLayout]:
        """Image [B, 3, h, w] -> token sequence [B, P + gh*gw, C] with position information."""
        cfg = self.cfg
        x, (gh, gw) = self.patch_embed(x)  # [B, gh*gw, C]
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if cfg.naflex:  # NaFlexViT: positions resampled its way, none for the prefix tokens
            return torch.cat(prefix + [x + self.naflex_positions((gh, gw)).to(x.dtype)], dim=1), self.layout((gh, gw))
        if self.pos_embed is None:  # position comes from RoPE or a relative bias, inside the attention
            return torch.cat(prefix + [x], dim=1), self.layout((gh, gw))
        pos = self.pos_embed.flatten(1, -2)  # SAM's [1, gh, gw, C] as [1, N, C]
        if (gh, gw) != cfg.grid_size:  # another input size: resample the patches' positions
            P = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
            pos = torch.cat([pos[:, :P], resample_pos_embed(pos[:, P:], cfg.grid_size, (gh, gw), cfg.pos_embed_antialias)], dim=1)
        if cfg.no_embed_class:  # DeiT-III / DINOv2: only patches get a position
            x = torch.cat(prefix + [x + pos], dim=1)
        else:
            x = torch.cat(prefix + [x], dim=1) + pos
        return x, self.layout((gh, gw))

    def naflex_positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """NaFlexViT's positions for a gh x gw grid, [1, gh*gw, C] (0 without): its table resampled
        (to L x L, the top-left gh x gw kept, when aspect-preserving), as timm's NaFlexEmbeds does
        for an image; a factorized table is two 1-D tables resampled linearly and added."""
        cfg, (gh, gw) = self.cfg, grid
        side = (max(grid),) * 2 if cfg.pos_embed_square else grid
        if self.pos_embed_y is not None:
            def axis(t: torch.Tensor, n: int) -> torch.Tensor:  # [1, L, C] -> [1, n, C]
                return t if t.shape[1] == n else F.interpolate(t.transpose(1, 2).float(), size=n, mode="linear").transpose(1, 2)

            return (axis(self.pos_embed_y, side[0])[:, :gh, None] + axis(self.pos_embed_x, side[1])[:, None, :gw]).flatten(1, 2)
        if self.pos_embed is None:
            return torch.zeros(())
        if grid == tuple(self.pos_embed.shape[1:3]):
            return self.pos_embed.flatten(1, 2)
        pos = F.interpolate(self.pos_embed.permute(0, 3, 1, 2).float(), size=side, mode=cfg.pos_embed_mode,
                            align_corners=cfg.pos_embed_align_corners, antialias=cfg.pos_embed_antialias)
        return pos[:, :, :gh, :gw].flatten(2).transpose(1, 2)

    def positions(self, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """What the blocks need besides the tokens: the RoPE table and the shared relative
        position bias, each None when the model has none."""
        rope = self.rope.table(grid, device) if self.rope is not None else None
        shared = self.rel_pos_bias if self.rel_pos_bias is not None else self.shared_rel_pos
        if shared is not None and grid != self.cfg.grid_size:
            raise ValueError(f"a relative position bias is defined for the {self.cfg.grid_size[0]}x"
                             f"{self.cfg.grid_size[1]} patch grid the model was trained at: use its input size")
        return rope, (shared(grid) if shared is not None else None)

    def forward_features(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], TokenLayout]:
        """All tokens after the last block and final norm [B, N, C], plus captured attention."""
        x, layout = self.embed(x)
        x = self.norm_pre(x)
        rope, bias = self.positions(layout.grid, x.device)
        attentions = []
        # Without autograd every layer's probabilities go into one [L, B, H, N, N] tensor: the
        # allocator keeps one block that size for the next forward, where twelve separate ones
        # went back to the OS and were faulted in again, page by page, every time.
        keep = (torch.empty(len(self.blocks), x.shape[0], self.cfg.num_heads, x.shape[1], x.shape[1], dtype=x.dtype,
                            device=x.device) if capture and not torch.is_grad_enabled() else None)
        for i, block in enumerate(self.blocks):
            r = rope[i] if rope is not None and self.cfg.rope == "mixed" else rope  # mixed: one table per block
            x, attn = block(x, capture if keep is None else keep[i], r, bias, layout.grid)
            if capture:
                attentions.append(attn)
        x = self.norm(x)
        if self.neck is not None:  # SAM: the tokens as a map [B, C, gh, gw] through convolutions, and back
            x = self.neck(x.transpose(1, 2).unflatten(2, layout.grid)).flatten(2).transpose(1, 2)
        return x, attentions, layout

    def forward_head(self, x: torch.Tensor, capture: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token sequence [B, N, C] -> logits [B, classes] (or pooled features if headless), and
        the attention-pool head's attention when captured (None without one)."""
        cfg = self.cfg
        if self.head_dist is not None:  # DeiT distilled: average the [class] and [dist] heads
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2, None
        P, pool_attn = cfg.num_prefix_tokens, None
        if self.attn_pool is not None:  # a learned query reads the sequence (with or without the prefix)
            x, pool_attn = self.attn_pool(x if cfg.pool_include_prefix else x[:, P:], capture)
        elif cfg.global_pool == "token":
            x = x[:, 0]
        elif cfg.global_pool == "avg":
            x = x[:, P:].mean(dim=1)
        elif cfg.global_pool in ("max", "avgmax"):
            patches = x[:, P:]
            x = patches.amax(dim=1) if cfg.global_pool == "max" else 0.5 * (patches.amax(dim=1) + patches.mean(dim=1))
        return self.head(self.fc_norm(x)), pool_attn

    def forward(self, x: torch.Tensor, capture: bool = False) -> ViTOutput:
        """Image [B, 3, h, w] -> logits; with ``capture=True`` also every layer's attention."""
        feats, attentions, layout = self.forward_features(x, capture)
        logits, pool_attn = self.forward_head(feats, capture)
        if pool_attn is not None:  # the pool's query over all N tokens (0 on a prefix it does not read)
            probe = pool_attn.mean(dim=1)[:, 0]
            layout = layout._replace(probe=F.pad(probe, (feats.shape[1] - probe.shape[-1], 0)))
        return ViTOutput(logits, attentions if capture else None, layout, pool_attn)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
