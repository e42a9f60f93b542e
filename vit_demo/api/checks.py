"""The check against timm from Python: :class:`Verification`, made by ``python -m vit_demo verify``'s
code (:func:`vit_demo.checkpoints.verify.verify`, on random noise) or by the app's "Compare with
timm" (:func:`~vit_demo.checkpoints.verify.compare_one` and its verdict, on a picture)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from .. import viz
from ..analysis import Analysis
from ..checkpoints.hf import is_hf_folder
from ..checkpoints.load import LoadedModel
from ..checkpoints.verify import compare_one, compared_words, verdict, verify
from ..viz.charts import layer_diff_figure, model_card_figure
from .drawable import Drawable, table


@dataclass(frozen=True, eq=False)
class Verification(Drawable):
    """The scratch model against the reference (timm's model, same weights) on the same inputs."""

    model: str
    reference: str  # "timm", or "transformers <class>" for a transformers folder
    inputs: str  # "8 random-noise inputs", or the picture's name
    passed: bool  # logits within ``tolerance`` and the same top-1 (on a picture: top-5 and attention too)
    tolerance: float
    max_abs_logit_diff: float
    max_abs_prob_diff: float
    top1_agreement: float  # share of the inputs with the same top-1
    verdict: str  # one sentence a presenter can read out
    layer_attn_max_diff: tuple[float, ...] = ()  # per layer (on a picture)
    scratch_topk: tuple[int, ...] = ()
    timm_topk: tuple[int, ...] = ()
    picture: np.ndarray | None = field(default=None, repr=False)
    report: dict[str, Any] = field(default_factory=dict, repr=False)  # every number, as --json / the app has them
    precision: str = "fp32"  # what the scratch model ran in (the reference: fp32 always); fp32 = like with like

    @property
    def compared(self) -> str:
        """Which precisions were compared, in words: "both in fp32", or bf16 against the reference's fp32."""
        return compared_words(self.precision, self.reference)

    def render(self) -> Image.Image:
        return viz.figure_to_image(self.figure(), 1000)

    def figure(self) -> Figure:
        """On a picture: the app's export (per layer, the largest attention difference); on noise:
        the report as a table."""
        if self.layer_attn_max_diff:
            return layer_diff_figure(self.layer_attn_max_diff, f"Scratch ViT vs {self.reference} · {self.model}",
                                     self.verdict, self.tolerance)
        return model_card_figure(self.rows())

    @property
    def badge(self) -> str:
        """PASS / FAIL for a parity check (both in fp32); a bf16 check shows rounding, which is no failure."""
        return ("PASS" if self.passed else "FAIL") if self.precision == "fp32" else f"{self.precision} ROUNDING"

    def rows(self) -> list[tuple[str, str]]:
        return [("verdict", self.badge), ("model", self.model), ("reference", self.reference),
                ("inputs", self.inputs), ("precision", self.compared),
                ("max |logit difference|", f"{self.max_abs_logit_diff:.2e}"),
                ("max |probability difference|", f"{self.max_abs_prob_diff:.2e}"),
                ("same top-1", f"{self.top1_agreement:.0%}"), ("tolerance", f"{self.tolerance:g}")]

    def _repr_html_(self) -> str:
        colour = "#7f8c8d" if self.precision != "fp32" else "#27ae60" if self.passed else "#c0392b"
        badge = (f'<p><span style="background:{colour};color:white;padding:0.1em 0.6em;border-radius:6px;'
                 f'font-weight:700">{self.badge}</span> {html.escape(self.verdict)}</p>')
        return badge + table(["measure", "value"], self.rows()[1:])


def verify_noise(lm: LoadedModel, weights: Path | None, random_init: bool, tol: float,
                 precision: str = "fp32") -> Verification:
    """``python -m vit_demo verify [--precision P]`` for this model: 8 random-noise inputs through both."""
    hf = weights is not None and is_hf_folder(weights)
    r = verify(None if hf else lm.timm_name, None if hf else weights, random_init and weights is None, (), str(lm.device),
               tol, progress=False, reference=weights if hf else None, precision=precision)
    numbers = f"max logit difference {r['max_abs_logit_diff']:.1e}, same top-1 on {r['top1_agreement']:.0%}."
    if precision == "fp32":
        text = f"{'Identical' if r['passed'] else 'Mismatch'} to {tol:g} on {r['inputs']}, {r['compared']}: {numbers}"
    else:
        text = (f"{precision}'s rounding, as expected, on {r['inputs']} ({r['compared']}; both in fp32 is the parity "
                f"check): {numbers}")
    return Verification(model=r["model"], reference=r["reference"], inputs=r["inputs"], passed=bool(r["passed"]),
                        tolerance=tol, max_abs_logit_diff=r["max_abs_logit_diff"],
                        max_abs_prob_diff=r["max_abs_prob_diff"], top1_agreement=r["top1_agreement"], verdict=text,
                        report=r, precision=precision)


def verify_image(lm: LoadedModel, twin: Any, name: str, a: Analysis, tol: float, precision: str = "fp32") -> Verification:
    """The app's "Compare with timm" on one analysed picture, the scratch model in ``precision``
    (fp32: like with like, whatever the model runs in elsewhere; bf16: bfloat16's rounding, said so)."""
    c = compare_one(lm.model, twin, a.x, k=5, repeats=1, precision=precision)
    c["verdict"] = verdict(c, tol)
    passed = c["verdict"].startswith("Identical")
    return Verification(model=lm.name, reference="timm", inputs=name, passed=passed, tolerance=tol,
                        max_abs_logit_diff=c["max_abs_logit_diff"], max_abs_prob_diff=c["max_abs_prob_diff"],
                        top1_agreement=float(c["top1_agree"]), verdict=c["verdict"],
                        layer_attn_max_diff=tuple(c["layer_attn_max_diff"]), scratch_topk=tuple(c["scratch_topk"]),
                        timm_topk=tuple(c["timm_topk"]), picture=np.asarray(a.picture), report=c, precision=precision)
