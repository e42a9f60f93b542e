"""vit_demo: a Vision Transformer from scratch, its explanations, and a check against timm."""

from .model import TokenLayout, VisionTransformer, ViTConfig, ViTOutput
from .preprocess import DataConfig

__all__ = ["DataConfig", "TokenLayout", "ViTConfig", "ViTOutput", "VisionTransformer"]
__version__ = "0.1.0"
