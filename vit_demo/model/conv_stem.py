"""The convolutional stem, a scratch-model option (trained here only, never in a port: timm's ViT has
no such option and timm parity does not cover it): a few small convolutions reach the patch grid and
a 1x1 convolution projects, instead of one p x p convolution."""

from __future__ import annotations

from torch import nn

from .config import ViTConfig
from .vit import PatchEmbed, make_norm, register


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


@register("embed", "conv_stem")
class ConvStemEmbed(PatchEmbed):
    """The patch embedding with a :class:`ConvStem` before a 1x1 projection (PatchEmbed's forward
    runs the stem)."""

    def __init__(self, cfg: ViTConfig) -> None:
        nn.Module.__init__(self)  # PatchEmbed's parts in its order, without building its p x p convolution
        self.patch_size = cfg.patch_size
        self.stem = ConvStem(cfg)
        self.proj = nn.Conv2d(cfg.stem_width or cfg.embed_dim // 2, cfg.embed_dim, kernel_size=1, bias=cfg.patch_bias)
        self.norm = make_norm(cfg) if cfg.patch_norm else nn.Identity()
