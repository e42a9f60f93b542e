"""vit_demo: a Vision Transformer from scratch, its explanations, and a check against timm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import TokenLayout, VisionTransformer, ViTConfig, ViTOutput
    from .preprocess import DataConfig

__all__ = ["DataConfig", "TokenLayout", "ViTConfig", "ViTOutput", "VisionTransformer"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The model's classes, loaded on first use: a module that needs no torch (the survey's
    clustering, in a child process of its own) imports the package without it."""
    if name == "DataConfig":
        from .preprocess import DataConfig

        return DataConfig
    if name in ("TokenLayout", "VisionTransformer", "ViTConfig", "ViTOutput"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'vit_demo' has no attribute {name!r}")
