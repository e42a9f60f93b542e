"""Explanation methods: one registry, one module per method family.

Every module in this folder is imported here, so a module dropped into it that registers a
method with :func:`register` appears everywhere methods are listed: ``explain --method``,
``faithfulness / sanity / pointing --methods``, the app's relevance row (slow methods as
on-request buttons), the analysis cache, the deck's scores, side-by-side and the benchmarks.

- :mod:`.registry`: :func:`register`, :func:`names`, :func:`get`, :func:`find` (a name as people
  spell it: any case, or a did-you-mean), :func:`single_pass`,
  :func:`slow` and :func:`reuse` (several methods sharing their passes on one input);
- :mod:`.passes`: target classes, the gradient pass, masked forward passes;
- families: :mod:`.attention` (raw attention, head maps, attention distance, position
  embeddings), :mod:`.rollout`, :mod:`.gradients` (gradient rollout, Chefer relevance),
  :mod:`.lrp` (CP-LRP, AttnLRP, gated LRP), :mod:`.gradcam`, :mod:`.perturb` (RISE, causal
  LRP), and any other module here; :mod:`.stem` (a convolutional stem's stages, for the Patches
  tab) registers none.
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import Method, did_you_mean, find, get, names, register, reuse, shared, sharing, single_pass, slow

INFRASTRUCTURE = ("registry", "passes")  # the modules every family builds on: no methods in them


def _import_families() -> None:
    """Import every module of this folder (alphabetically): each registers its methods."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name not in INFRASTRUCTURE and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()

__all__ = ["Method", "did_you_mean", "find", "get", "names", "register", "reuse", "shared", "sharing", "single_pass", "slow"]
