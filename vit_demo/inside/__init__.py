"""Step inside: one picture through the ViT, step by step, every number the model's own (no Gradio).

:func:`step_through` runs ONE forward pass with hooks on the model's own modules (the hook points of
docs/architecture.md, "Reading the forward pass") and returns a :class:`Walk`: the 13 steps of
:data:`STEPS` in the order of the forward, each with a title and a text, the numbers of every step
by name (numpy), and a picture of each (:meth:`Walk.render`, drawn by :mod:`vit_demo.viz.steps`).
Every family the model package builds walks through; where a step differs the text says what the
family does, and where a step does not exist it says so instead of inventing numbers.

- :mod:`.record`: where each number passes in each family, and the one forward with hooks;
- :mod:`.values`: each step's numbers read off that recording;
- :mod:`.words`: what each step says; :mod:`.draw`: each step's picture;
- :mod:`.walk`: :func:`step_through`, :class:`Walk`, :class:`Step`, the checks of a request,
  :data:`TEMPERATURE_RANGE` and :func:`clamp_temperature`.

The Python API's ``Model.steps`` (vit_demo/api/steps.py), the ``steps`` command, the slide deck's
"Step inside" section and the app's tab all call :func:`step_through`. docs/step-inside.md.
"""

from .record import StepError
from .walk import STEPS, TEMPERATURE_RANGE, Step, Walk, check_temperature, clamp_temperature, step_through
from .words import Facts

__all__ = ["STEPS", "TEMPERATURE_RANGE", "Facts", "Step", "StepError", "Walk", "check_temperature", "clamp_temperature",
           "step_through"]
