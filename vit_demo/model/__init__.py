"""The scratch Vision Transformer: the plain ViT on one page, timm's other ViT families each in a
module of its own.

- ``vit.py``: the plain ViT (Dosovitskiy et al., ICLR 2021), with DeiT's distillation token,
  register tokens (DINOv2), LayerScale (DeiT-III, DINOv2), average / max pooling with ``fc_norm``,
  the pre-norm before the blocks (CLIP); after them, its outputs, the hook points (``hook_q``,
  ``hook_k``, ``hook_v``, ``hook_scores`` on every attention, ``hook_hidden`` on every MLP), and the
  registry the families put their parts in. With ``config.py`` (ViTConfig) beside it, it stands alone.
- ``capture.py``: every layer's attention probabilities at little more than a plain pass's cost
  (one buffer for all layers, scores written into it, the softmax in place); one ``attend`` for
  every attention of every family.

The families, each a config option of a few lines (docs/families.md):

- ``variants.py``: RMSNorm (AIMv2), activations (GELU-tanh for SigLIP, QuickGELU for CLIP, SiLU
  for GLUs), GLU MLPs (SwiGLU, packed and unpacked) and a norm inside the MLP, attention with q/v
  biases, separate q/k/v projections, grouped-query attention, qk-norm and a norm inside the
  attention (EVA-02, BEiT-3), res-post norms (EVA-02-E) and LayerScale as EVA and BEiT store it;
- ``rope.py``: 2-D rotary embeddings of q and k (EVA-02, RoPE-ViT incl. learned mixed frequencies,
  DINOv3, PE);
- ``relpos.py``: relative position biases (BEiT's tables, the relpos ViT's MLP);
- ``parallel.py``: differential attention (two softmax maps subtracted) and parallel blocks
  (ViT-22B's attention and MLP from one projection; parallel branches);
- ``sam.py``: SAM's image encoder (windowed attention, decomposed relative positions, a
  convolutional neck);
- ``naflex.py``: NaFlexViT's embedding (a Linear patch projection, its own resampling of the positions);
- ``attn_pool.py``: an attention-pool head (MAP: a learned query reads the sequence; SigLIP, PE);
- ``conv_stem.py``: a convolutional stem before the patch projection (trained here only).

Parameter names follow timm's state_dict layout of each family (``blocks.0.ls1.gamma`` in timm's
ViT, ``blocks.0.gamma_1`` in EVA and BEiT), so porting is a checked copy (see checkpoints/timm.py).
Nothing here imports timm: timm is the reference we compare against, not a building block.

Importing any module of this package, ``vit_demo.model.vit`` too, runs this file first, which
registers every family (and capture.py's ``attend`` over vit.py's). Only vit.py copied out with
config.py builds the plain ViT alone, and names the family module a config would need.
"""

from __future__ import annotations

from . import attn_pool, capture, conv_stem, naflex, parallel, relpos, rope, sam, variants  # noqa: F401 - they register
from .attn_pool import AttentionPool
from .capture import scores_into
from .config import ACTIVATIONS, POOLS, ViTConfig
from .conv_stem import ConvStem, ConvStemEmbed
from .parallel import DiffAttention, ParallelScalingBlock, ParallelThingsBlock, diff_lambda
from .relpos import RelPosMlp, RelPosTable
from .rope import RotaryEmbedding
from .sam import WindowAttention, window_map
from .variants import GatedMlp, QuickGELU, RMSNorm, VariantAttention
from .vit import (
    PARTS,
    Block,
    HookPoint,
    LayerScale,
    Mlp,
    PatchEmbed,
    Positions,
    SelfAttention,
    TokenLayout,
    VisionTransformer,
    ViTOutput,
    make_act,
    make_norm,
    resample_pos_embed,
)

__all__ = [
    "ACTIVATIONS", "PARTS", "POOLS", "AttentionPool", "Block", "ConvStem", "ConvStemEmbed", "DiffAttention",
    "GatedMlp", "HookPoint",
    "LayerScale", "Mlp", "ParallelScalingBlock", "ParallelThingsBlock", "PatchEmbed", "Positions", "QuickGELU", "RMSNorm",
    "RelPosMlp", "RelPosTable", "RotaryEmbedding", "SelfAttention", "TokenLayout", "VariantAttention", "ViTConfig", "ViTOutput",
    "VisionTransformer", "WindowAttention", "diff_lambda", "make_act", "make_norm", "resample_pos_embed",
    "scores_into", "window_map",
]
