"""A new picture's tokens coded with an atlas's concepts (:mod:`vit_demo.evaluate.atlas`): which
learned concepts each of its patches is made of.

The atlas factorises the tokens after block ``concept_layer`` as A ~ W H over [relu(x), relu(-x)];
a new picture's codes are the non-negative w minimising ||[relu(x), relu(-x)] - w H|| for each of
its tokens, by exact NNLS (the objective of scikit-learn's NMF ``transform``), with the tokens
taken as the atlas took them but without hooks (the model may be shared by other users).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import nnls

from ..checkpoints.load import LoadedModel


def tokens_after(lm: LoadedModel, x: torch.Tensor, layer: int) -> torch.Tensor:
    """The tokens after block ``layer`` (from 1; 0: the embeddings) [B, N, C], as the atlas took
    them, without hooks (the model is shared by every session)."""
    model = lm.model
    with torch.inference_mode():
        t, layout = model.embed(x.to(lm.device))
        t = model.norm_pre(t)
        positions = model.positions(layout.grid, t.device)
        for i in range(layer):
            t, _ = model.blocks[i](t, False, positions)
    return t


def code_tokens(tokens: np.ndarray, components: np.ndarray) -> np.ndarray:
    """[P, C] tokens -> [P, K] codes: for each, the non-negative w minimising
    ||[relu(x), relu(-x)] - w H|| (the NMF's own transform, by exact NNLS); ``components``: H [K, 2C]."""
    A = np.concatenate([np.maximum(tokens, 0), np.maximum(-tokens, 0)], axis=1).astype(np.float64)
    H = components.astype(np.float64).T
    return np.stack([nnls(H, a)[0] for a in A]).astype(np.float32)


def picture_codes(lm: LoadedModel, x: torch.Tensor, layer: int, components: np.ndarray,
                  grid: tuple[int, int]) -> np.ndarray:
    """The patches of the model input ``x`` [1, 3, H, W] coded with the concepts ``components``
    of the tokens after block ``layer``: [gh, gw, K]."""
    P = lm.model.cfg.num_prefix_tokens
    t = tokens_after(lm, x, layer)[0, P:].float().cpu().numpy()
    return code_tokens(t, components).reshape(*grid, -1)
