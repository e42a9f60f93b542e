"""A Vision Transformer written from scratch, readable top to bottom: the plain ViT.

Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021), with the tokens and pools that
DeiT and DINO add (a distillation token, register tokens, average or max pooling, LayerScale):

    image [B, 3, h, w]
      -> PatchEmbed: cut into p x p patches, each projected to C channels     [B, n, C], n = gh x gw
      -> prepend the prefix tokens ([class], [dist], registers), add positions [B, N, C], N = P + n
      -> L x Block: x + SelfAttention(norm(x)), then x + Mlp(norm(x))          [B, N, C]
      -> norm, pool (the [class] token, or the patches' mean), Linear head    [B, classes]

Shapes in comments: B batch, C embed dim, N tokens, P prefix tokens, n = gh x gw patches, H heads, D head dim.
The layers come first, then the model, then what they share: outputs, hook points, the attention kernel,
the registry ``PARTS`` where timm's other ViT families register their parts (vit_demo/model/__init__.py;
"family hook" marks where they act). With config.py it is the whole plain ViT (copied alone, the two load
a DeiT). Parameter names follow timm's state_dict layout; nothing here imports timm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import FAMILY_NAMES, ViTConfig


# ----------------------------------------------------------------------------- the layers
class PatchEmbed(nn.Module):
    """Cut the image into p x p patches and project each one to C channels: a p x p convolution of stride p."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_size = p = cfg.patch_size
        self.stem = None  # family hook: convolutions before the projection (model/conv_stem.py)
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, kernel_size=p, stride=p, bias=cfg.patch_bias)
        self.norm = make_norm(cfg) if cfg.patch_norm else nn.Identity()  # AIMv2

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        _, _, h, w = x.shape  # [B, 3, h, w]
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(f"input {h}x{w} is not a multiple of the patch size {p}")
        if self.stem is not None:
            x = self.stem(x)  # [B, C/2, gh, gw]
        x = self.proj(x)  # [B, C, gh, gw]
        return self.norm(x.flatten(2).transpose(1, 2)), (x.shape[2], x.shape[3])  # [B, gh*gw, C], row-major


class SelfAttention(nn.Module):
    """Multi-head self-attention: every token's query is compared with every token's key, and the
    softmax of those scores mixes the tokens' values. H heads do it side by side, D channels each."""

    relevance = "attention"  # LRP (methods/lrp.py) gives modules so marked a rule for q, k, v:
    relevance_rule: Callable | None = None  # set only in its explanation mode

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C, H, D = cfg.embed_dim, cfg.num_heads, cfg.attn_head_dim
        self.num_heads, self.head_dim, self.scale = H, D, D**-0.5
        self.qkv = nn.Linear(C, 3 * H * D, bias=cfg.qkv_bias)
        self.proj = nn.Linear(H * D, C, bias=cfg.proj_bias)
        self.hook_q, self.hook_k, self.hook_v, self.hook_scores = HookPoint(), HookPoint(), HookPoint(), HookPoint()
        self.attend = PARTS["kernel"]["attend"]  # attend() below; in the package, model/capture.py's

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, C] -> q, k, v, each [B, H, N, D]."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def forward(self, x: Tensor, capture: bool | Tensor = False) -> tuple[Tensor, Tensor | None]:
        """x [B, N, C] -> [B, N, C], and the probabilities [B, H, N, N] when ``capture`` (True, or a tensor to hold them)."""
        B, N, _ = x.shape
        q, k, v = self.project(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        o, attn = self.attend(q, k, v, self.scale, capture, None, self.relevance_rule, self.hook_scores)  # [B, H, N, D]
        return self.proj(o.transpose(1, 2).reshape(B, N, -1)), attn  # the heads side by side, projected


class Mlp(nn.Module):
    """Two linear layers with an activation between, applied to every token on its own."""

    def __init__(self, dim: int, hidden: int, act: nn.Module, out: int | None = None, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = act
        self.hook_hidden = HookPoint()  # the hidden activation [B, N, hidden]
        self.fc2 = nn.Linear(hidden, out or dim, bias=bias)

    @classmethod
    def of(cls, cfg: ViTConfig) -> Mlp:
        return cls(cfg.embed_dim, cfg.mlp_hidden, make_act(cfg.act), bias=cfg.proj_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.hook_hidden(self.act(self.fc1(x))))  # [B, N, C] -> [B, N, hidden] -> [B, N, C]


class LayerScale(nn.Module):
    """Per-channel learned scale on a residual branch (Touvron et al., CaiT / DeiT-III)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); with LayerScale
    each branch is scaled per channel first. Attention and MLP: this file's, or a family's."""

    def __init__(self, cfg: ViTConfig, index: int = 0) -> None:
        super().__init__()
        C = cfg.embed_dim
        self.norm1 = make_norm(cfg)
        self.attn = PARTS["attention"][cfg.attention_kind](cfg, index)
        self.ls1 = LayerScale(C) if cfg.layer_scale else nn.Identity()
        self.norm2 = make_norm(cfg)
        self.mlp = PARTS["mlp"][cfg.mlp_kind].of(cfg)
        self.ls2 = LayerScale(C) if cfg.layer_scale else nn.Identity()

    def forward(self, x: Tensor, capture: bool | Tensor = False, positions: Positions | None = None
                ) -> tuple[Tensor, Tensor | None]:
        h = self.norm1(x)  # positions: None here; family hook: what a position family's attention reads
        a, attn = self.attn(h, capture) if positions is None else self.attn(h, capture, positions)
        x = x + self.ls1(a)
        return x + self.ls2(self.mlp(self.norm2(x))), attn


def resample_pos_embed(pos: Tensor, old: tuple[int, int], new: tuple[int, int], antialias: bool = True) -> Tensor:
    """Resize a [1, gh*gw, C] grid of position embeddings to a new grid, bicubic, antialiased as timm's
    ``dynamic_img_size`` (transformers' ``interpolate_pos_encoding``: plain bicubic, ``antialias=False``)."""
    if old == new:
        return pos
    C = pos.shape[-1]
    grid = pos.float().reshape(1, old[0], old[1], C).permute(0, 3, 1, 2)  # [1, C, gh, gw]
    grid = F.interpolate(grid, size=new, mode="bicubic", antialias=antialias)
    return grid.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], C).to(pos.dtype)


class VisionTransformer(nn.Module):
    """The ViT: patch embedding + prefix tokens + position embedding, L blocks, norm, pool, head."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        check_families(cfg)
        self.cfg = cfg
        C = cfg.embed_dim
        self.patch_embed = PARTS["embed"][cfg.embed_kind](cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, C)) if cfg.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, C)) if cfg.reg_tokens else None
        gh, gw = cfg.grid_size
        shape = (1, gh, gw, C) if cfg.pos_embed_grid else (1, gh * gw + (0 if cfg.no_embed_class else cfg.num_prefix_tokens), C)
        self.pos_embed = nn.Parameter(torch.randn(shape) * 0.02) if cfg.pos_embed else None
        self.rope = part("rope", cfg)  # family hooks, None in a plain ViT: rotary positions (model/rope.py),
        self.rel_pos_bias = part("rel_pos_bias", cfg)  # a relative position bias for all blocks: BEiT's table,
        self.shared_rel_pos = part("shared_rel_pos", cfg)  # the relpos ViT's MLP (model/relpos.py)
        self.norm_pre = make_norm(cfg) if cfg.pre_norm else nn.Identity()  # CLIP
        self.blocks = nn.ModuleList([PARTS["block"][cfg.block_kind](cfg, i) for i in range(cfg.depth)])
        self.norm = make_norm(cfg) if cfg.final_norm and not cfg.fc_norm else nn.Identity()
        self.attn_pool = part("attn_pool", cfg)  # family hook: a head that pools by attention (model/attn_pool.py)
        self.fc_norm = make_norm(cfg) if cfg.final_norm and cfg.fc_norm else nn.Identity()
        self.neck = part("neck", cfg)  # family hook: SAM's convolutional neck (model/sam.py)
        C = C if self.neck is None else self.neck.out_chans
        self.head = nn.Linear(C, cfg.num_classes, bias=cfg.head_bias) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist = nn.Linear(C, cfg.num_classes) if cfg.dist_token and cfg.num_classes > 0 else None
        self.capture_slots = PARTS["kernel"]["slots"]  # capture_slots() below, or model/capture.py's
        for module in cfg.families():  # family hook: a family's last step (model/naflex.py's tables)
            PARTS["init"].get(module, lambda model: None)(self)

    @torch.no_grad()
    def init_weights(self) -> VisionTransformer:
        """Initialise for training from scratch, as ViT / DeiT do: truncated normal (std 0.02) for linear layers
        and position embeddings, zero biases, unit norms, tiny prefix tokens, a zero head (all classes alike)."""
        norms = tuple(PARTS["norm"].values())  # LayerNorm, and RMSNorm when variants.py registered it
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, norms):
                nn.init.ones_(m.weight)
            if isinstance(m, (nn.Linear, *norms)) and getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for t in (self.cls_token, self.dist_token, self.reg_token):
            if t is not None:
                nn.init.normal_(t, std=1e-6)
        for head in (self.head, self.head_dist):
            for p in head.parameters() if isinstance(head, nn.Linear) else ():
                nn.init.zeros_(p)
        return self

    def layout(self, grid: tuple[int, int]) -> TokenLayout:
        cfg = self.cfg
        first_reg = int(cfg.class_token) + int(cfg.dist_token)  # [class] [dist] [reg...] patches
        return TokenLayout(cfg.num_prefix_tokens, 0 if cfg.class_token else None, first_reg - 1 if cfg.dist_token else None,
                           tuple(range(first_reg, first_reg + cfg.reg_tokens)), grid)

    def embed(self, x: Tensor) -> tuple[Tensor, TokenLayout]:
        """Image [B, 3, h, w] -> token sequence [B, P + gh*gw, C] with position information."""
        x, grid = self.patch_embed(x)  # [B, gh*gw, C]
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pos = self.position_embedding(grid)
        if pos is None:  # positions come from a family, inside the attention (RoPE, a relative bias)
            x = torch.cat(prefix + [x], dim=1)
        elif self.cfg.no_embed_class:  # DeiT-III / DINOv2: only patches get a position
            x = torch.cat(prefix + [x + pos], dim=1)
        else:
            x = torch.cat(prefix + [x], dim=1) + pos
        return x, self.layout(grid)

    def position_embedding(self, grid: tuple[int, int]) -> Tensor | None:
        """The learned positions [1, (P +) gh*gw, C] for a gh x gw grid: the patches' part resampled
        for another input size. (NaFlex's embedding puts its own way here: model/naflex.py.)"""
        cfg = self.cfg
        if self.pos_embed is None:
            return None
        pos = self.pos_embed.flatten(1, -2)  # a [1, gh, gw, C] table as [1, N, C]
        if grid != cfg.grid_size:  # another input size: resample the patches' positions
            P = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
            pos = torch.cat([pos[:, :P], resample_pos_embed(pos[:, P:], cfg.grid_size, grid, cfg.pos_embed_antialias)], 1)
        return pos

    def positions(self, grid: tuple[int, int], device: torch.device) -> Positions | None:
        """Family hook: what a position family's attention reads besides the tokens; None in a plain
        ViT, whose positions were added to the tokens (``embed``)."""
        if not (self.cfg.rope or self.cfg.rel_pos or self.cfg.window_size):
            return None
        rope = self.rope.table(grid, device) if self.rope is not None else None
        shared = self.rel_pos_bias if self.rel_pos_bias is not None else self.shared_rel_pos
        return Positions(grid, rope, shared(grid) if shared is not None else None)

    def forward_features(self, x: Tensor, capture: bool = False) -> tuple[Tensor, list[Tensor], TokenLayout]:
        """All tokens after the last block and final norm [B, N, C], plus captured attention."""
        x, layout = self.embed(x)
        x = self.norm_pre(x)
        positions = self.positions(layout.grid, x.device)
        attentions = []
        for block, slot in zip(self.blocks, self.capture_slots(x, capture, len(self.blocks), self.cfg.num_heads)):
            x, attn = block(x, slot, positions)
            if capture:
                attentions.append(attn)
        x = self.norm(x)
        if self.neck is not None:  # family hook, SAM: the tokens as a map through convolutions, and back
            x = self.neck(x, layout.grid)
        return x, attentions, layout

    def forward_head(self, x: Tensor, capture: bool = False) -> tuple[Tensor, Tensor | None]:
        """Token sequence [B, N, C] -> logits [B, classes] (or pooled features if headless), and
        the attention-pool head's attention when captured (None without one)."""
        cfg = self.cfg
        if self.head_dist is not None:  # DeiT distilled: average the [class] and [dist] heads
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2, None
        P, pool_attn = cfg.num_prefix_tokens, None
        if self.attn_pool is not None:  # family hook: a learned query reads the sequence
            x, pool_attn = self.attn_pool(x, capture)
        elif cfg.global_pool == "token":
            x = x[:, 0]
        elif cfg.global_pool == "avg":
            x = x[:, P:].mean(dim=1)
        elif cfg.global_pool in ("max", "avgmax"):
            patches = x[:, P:]
            x = patches.amax(dim=1) if cfg.global_pool == "max" else 0.5 * (patches.amax(dim=1) + patches.mean(dim=1))
        return self.head(self.fc_norm(x)), pool_attn

    def forward(self, x: Tensor, capture: bool = False) -> ViTOutput:
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


# ----------------------------------------------------------------------------- what the layers share
class TokenLayout(NamedTuple):
    """Where each token sits in the sequence: [class] [dist] [reg...] patches (row-major)."""

    num_prefix: int
    cls_index: int | None  # index of [class], None if the model has none
    dist_index: int | None
    reg_indices: tuple[int, ...]
    grid: tuple[int, int]  # (gh, gw) patch grid of this input
    probe: Tensor | None = None  # a captured attention-pool query over the N tokens, heads averaged [B, N]

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


class ViTOutput(NamedTuple):
    """What a forward pass returns. ``attentions`` is filled only when captured."""

    logits: Tensor  # [B, num_classes], or pooled features [B, C] when headless
    attentions: list[Tensor] | None  # per layer, post-softmax [B, H, N, N]
    layout: TokenLayout
    pool_attention: Tensor | None = None  # attention-pool head, captured: [B, H, 1, tokens it reads]


class Positions(NamedTuple):
    """What a position family's attention reads besides the tokens (VisionTransformer.positions)."""
    grid: tuple[int, int]  # (gh, gw) patch grid of this input: SAM's windows, the relative biases
    rope: Tensor | None  # the rotary table (model/rope.py)
    bias: Tensor | None  # a relative position bias shared by all blocks [1, H, N, N] (model/relpos.py)


class HookPoint(nn.Identity):
    """A named point of the forward pass: returns its input, for a hook on it to read (or replace); unhooked, no call."""

    def __call__(self, x: Tensor) -> Tensor:
        hooked = self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks
        return super().__call__(x) if hooked else x


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float, capture: bool | Tensor = False, bias: Tensor | None = None,
           rule: Callable | None = None, hook_scores: HookPoint | None = None) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T * scale + bias) v, each head on its own: q [B, H, N, D], k, v [B, H, M, D] -> [B, H, N, D], and when
    ``capture`` is not False the probabilities [B, H, N, M] (the scores pass ``hook_scores``); ``rule``: LRP's. Inside
    the package every attention calls model/capture.py's attend, registered over this one (the same numbers, faster)."""
    if rule is not None:  # LRP's explanation mode: the same values, gradients shaped by its rule
        q, k, v = rule(q, k, v)
    if capture is False:  # one fused kernel: the same numbers, without the N x M matrix in memory
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias), None
    attn = torch.matmul(q, k.transpose(-2, -1)) * scale  # [B, H, N, M]: how well each query matches each key
    attn = attn if bias is None else attn + bias
    attn = (attn if hook_scores is None else hook_scores(attn)).softmax(dim=-1)  # each row: a distribution
    return attn @ v, attn


def capture_slots(x: Tensor, capture: bool, depth: int, heads: int) -> Sequence[bool | Tensor]:
    """What each block gets for ``capture``: the flag itself (model/capture.py hands out slots of one buffer)."""
    return [capture] * depth


# ----------------------------------------------------------------------------- the registry of parts
# kind -> key -> a part: "embed", "attention", "mlp", "block" by the config's *_kind ("": this file's), "norm", "act"
# by cfg.norm, cfg.act; "part": cfg -> a model-level part or None; "init": a family's last step; "kernel": attend() ...
PARTS: dict[str, dict[str, Any]] = {"embed": {"": PatchEmbed}, "attention": {"": SelfAttention}, "mlp": {"": Mlp},
                                    "block": {"": Block}, "part": {}, "init": {}, "norm": {"layernorm": nn.LayerNorm},
                                    "act": {"gelu": nn.GELU}, "kernel": {"attend": attend, "slots": capture_slots}}
REGISTERED: set[str] = set()  # the family modules that registered something


def register(kind: str, key: str) -> Callable[[Any], Any]:
    """Decorator: the class or function is the part ``key`` of ``kind``."""
    def add(obj: Any) -> Any:
        PARTS[kind][key] = obj
        REGISTERED.add(obj.__module__.rsplit(".", 1)[-1])
        return obj
    return add


def check_families(cfg: ViTConfig) -> None:
    """One clear line when ``cfg`` needs a family whose module registered nothing."""
    for module, field in cfg.families().items():
        if module not in REGISTERED:
            raise ValueError(f"ViTConfig({field}) needs the {FAMILY_NAMES[module]} family: import vit_demo.model "
                             f"(or vit_demo.model.{module}) to register it")


def part(name: str, cfg: ViTConfig) -> nn.Module | None:
    """The model-level part ``name`` (rope, attn_pool, neck, ...) a family builds for ``cfg``, or None."""
    return PARTS["part"].get(name, lambda cfg: None)(cfg)


def make_norm(cfg: ViTConfig, dim: int | None = None) -> nn.Module:
    """The model's norm (LayerNorm; RMSNorm from variants.py) over ``dim`` channels (default: embed_dim)."""
    return PARTS["norm"][cfg.norm](dim or cfg.embed_dim, cfg.norm_eps)


def make_act(name: str) -> nn.Module:
    return PARTS["act"][name]()
