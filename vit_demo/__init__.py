"""vit_demo: a Vision Transformer from scratch, its explanations, and a check against timm.

From Python (docs/python.md)::

    import vit_demo
    model = vit_demo.load()
    model.explain("cat.jpg", method="chefer")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import (
        AtlasResult,
        Attention,
        Comparison,
        Explanation,
        LoadError,
        Model,
        Prediction,
        Results,
        Steps,
        SurveyResult,
        Verification,
        atlas,
        load,
        survey,
    )
    from .model import TokenLayout, VisionTransformer, ViTConfig, ViTOutput
    from .preprocess import DataConfig

__all__ = [
    "DataConfig", "TokenLayout", "ViTConfig", "ViTOutput", "VisionTransformer",  # the model
    "load", "survey", "atlas", "Model", "LoadError", "Prediction", "Attention", "Explanation", "Comparison",  # the API
    "Results", "Verification", "SurveyResult", "AtlasResult", "Steps",
]
API = frozenset(__all__[5:])  # vit_demo.api's names
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """The model's classes and the Python API (:mod:`vit_demo.api`), loaded on first use: a module
    that needs no torch (the survey's clustering, in a child process of its own) imports the
    package without it."""
    if name == "DataConfig":
        from .preprocess import DataConfig

        return DataConfig
    if name in ("TokenLayout", "VisionTransformer", "ViTConfig", "ViTOutput"):
        from . import model

        return getattr(model, name)
    if name in API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'vit_demo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
