"""The atlas's concepts (:mod:`vit_demo.evaluate.atlas`): the patch tokens after one block
factorised by scikit-learn's NMF, each token split into its positive and negative parts.

No torch here: the app fits the concepts of a user's pictures in a child process of its own
(:mod:`.child`), which the job's time limit can stop (NMF itself cannot be interrupted: 10-40 s
for 100 pictures on a busy machine), and which starts without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRESENCE_PCT = 99  # a concept is fully present where its code reaches this percentile of its codes in the folder
FIT_ROWS = 40_000  # NMF is fitted on at most this many patch rows (the rest transformed)


@dataclass
class Concepts:
    """The NMF of the patch tokens split by sign: codes W [n, patches, K], concepts [K, C], the error."""

    codes: np.ndarray
    basis: np.ndarray  # [K, C] in token space (signed)
    error: float  # ||A - W H||_F / ||A||_F over every patch row
    components: np.ndarray | None = None  # [K, 2C]: the NMF's H, to code other tokens (the app's clicked patch)

    def presence(self) -> np.ndarray:
        """[n, patches, K] in [0, 1]: each code over the concept's :data:`PRESENCE_PCT`-th
        percentile in the folder, clipped at 1 (1: as present as it gets)."""
        scale = np.percentile(self.codes.reshape(-1, self.codes.shape[-1]), PRESENCE_PCT, axis=0)
        return np.clip(self.codes / np.maximum(scale, 1e-12), 0, 1)


def fit_concepts(tokens: np.ndarray, count: int, seed: int = 0) -> Concepts:
    """``tokens`` [n, patches, C] -> K concepts: scikit-learn's NMF of A = [relu(x), relu(-x)] (each
    token split into its positive and negative parts, so that W H codes the whole signed token:
    x ~ W (H+ - H-)), fitted on at most :data:`FIT_ROWS` rows spread through the folder, every row
    then coded. ``basis``: the concepts in token space, H+ - H-; ``error``: ||A - W H|| / ||A||."""
    from sklearn.decomposition import NMF

    n, P, C = tokens.shape
    x = tokens.reshape(-1, C).astype(np.float32)
    A = np.concatenate([np.maximum(x, 0), np.maximum(-x, 0)], axis=1)
    if A.shape[0] < count:
        raise ValueError(f"{A.shape[0]} patch tokens cannot make {count} concepts")
    fit_rows = A[np.linspace(0, A.shape[0] - 1, min(FIT_ROWS, A.shape[0])).astype(int)]
    nmf = NMF(n_components=count, init="nndsvda", max_iter=400, random_state=seed)
    nmf.fit(fit_rows)
    W = nmf.transform(A)
    H = nmf.components_
    error = float(np.linalg.norm(A - W @ H) / max(np.linalg.norm(A), 1e-30))
    return Concepts(W.reshape(n, P, count).astype(np.float32), (H[:, :C] - H[:, C:]).astype(np.float32), error,
                    H.astype(np.float32))
