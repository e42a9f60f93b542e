"""The Python API, for notebooks and scripts: three lines from a photo to a map.

    import vit_demo
    model = vit_demo.load()                       # the shipped DeiT-Tiny; or a timm name, a file, a folder
    model.explain("cat.jpg", method="chefer")     # draws itself in Jupyter

- :func:`load` -> :class:`Model`: :meth:`~Model.predict`, :meth:`~Model.attention`,
  :meth:`~Model.explain`, :meth:`~Model.steps` (one picture through the model, step by step),
  :meth:`~Model.verify`;
- :func:`survey` and :func:`atlas`: a whole folder, with the HTML reports of the commands;
- the results (:mod:`.results`, :mod:`.checks`, :mod:`.folders`): frozen dataclasses of numpy
  arrays and plain values, each with ``_repr_png_`` / ``_repr_html_``, ``.figure()`` and ``.save()``.

Everything runs the code of the command line and the app; nothing here imports Gradio.
See docs/python.md.
"""

from .checks import Verification
from .folders import AtlasResult, SurveyResult, atlas, survey
from .inputs import ImageLike, Images
from .model import DEFAULT_METHOD, LoadError, Model, load
from .results import Attention, Comparison, Explanation, Prediction, Results
from .steps import Steps, StepView

__all__ = [
    "DEFAULT_METHOD", "Attention", "AtlasResult", "Results", "Comparison", "Explanation", "ImageLike", "Images",
    "LoadError", "Model", "Prediction", "StepView", "Steps", "SurveyResult", "Verification", "atlas", "load", "survey",
]
