"""Clusters of explanations (SpRAy: Lapuschkin et al., "Unmasking Clever Hans predictors and
assessing what machines really learn", Nature Communications 2019) and a 2-D map of all maps.

The maps of the pictures predicted as one class are compared by *where their mass lies*: each
map is its positive part normalised to sum 1, and the distance between two maps is their sliced
Wasserstein distance on the patch grid (the earth mover's distance averaged over
:data:`DIRECTIONS` directions, in patches: moving all of a map's mass by one patch costs one
patch). Along one direction it is the L1 distance between the maps' cumulative sums, each step
weighted by its length, so every map becomes a fixed feature vector (:func:`features`) and the
distance is the L1 (Manhattan) distance between features. Per class:

1. a dense affinity with local scaling (Zelnik-Manor & Perona, "Self-tuning spectral
   clustering", NIPS 2004): ``exp(-d_ij^2 / (s_i s_j))``, ``s_i`` the distance from map i to its
   7th nearest neighbour, but never less than :data:`MIN_SCALE` (half a patch);
2. the eigenvalues of its normalised graph Laplacian, smallest first: the number of clusters is
   the position of the largest gap among the first :data:`MAX_K` + 1 (the *eigengap*: a graph of
   k well-separated groups has k eigenvalues near 0 and then a jump), counting only the k whose
   next eigenvalue is at least :data:`GAP_RATIO` times the k-th (Peng, Sun & Zanetti, "Partitioning
   well-clustered graphs: spectral clustering works!", COLT 2015: k clusters are well separated
   when lambda_k+1 / lambda_k is large); without such a k, the class is one cluster;
3. scikit-learn's :class:`~sklearn.cluster.SpectralClustering` on that affinity with that many
   clusters (seeded).

A class of n pictures splits into at most n / :data:`MIN_CLUSTER` clusters (and at most
:data:`MAX_K`); a class with fewer than :data:`MIN_TO_SPLIT` pictures is one cluster; one with more than
:data:`MAX_TO_SPLIT` is clustered on a seeded sample of that many and every other map joins the
cluster with the nearest mean (memory stays bounded: the affinity is n x n). The embedding of
every map is scikit-learn's t-SNE on the same features and distance (PCA for fewer than
:data:`MIN_TSNE` different maps), computed once per distinct map: duplicates share a point, two
different maps sit at the two ends, and maps that are all the same get no view at all (t-SNE's own
PCA start divided by their zero spread, and its Barnes-Hut tree crashed the process on the NaNs).

Why this affinity: with scikit-learn's k-nearest-neighbour graph (10 neighbours) the eigengap
split one homogeneous group of 30 synthetic maps in two and one of 100 in three, and found 8
clusters in two groups of 200; with local scaling it found 1, 1 and 2 (and 2 and 3 for two and
three groups of 12-30, 1 for Dirichlet noise), on two seeds (measured with the Hellinger distance
used before; ``tests/test_survey.py`` checks the same with this one).

Why the ratio: the largest gap alone always finds some k, also where the maps form a continuum.
The default-trained watermark model of the lesson (seed 0) calls 89 of the 90 marked test circles
circles, with 20 % to 97 % of each map's mass on the mark; the largest gap cut that continuum in two
(64 and 32 pictures; eigenvalues 0, 0.17, 0.43: ratio 2.5), and a small model's "triangle" class in
three (ratios 1.5 and 1.7). Where the groups are real the ratio was 7 or more: 7.0 and 15 for the
three synthetic groups, 100 or more for two, 28 for the small model's marked and unmarked circles.

Why this distance and the floor: a small model that learned the watermark of the Clever-Hans
lesson puts nearly all of a marked picture's map on ONE of the mark's four patches, not the
same one on every picture. As distributions (the Hellinger distance used before) those maps
are as far apart as a map on the mark and a map on the shape, and the local scale of a tight
group of eight or more is tiny: the 33 marked pictures predicted "circle" became three clusters
(15, 9, 9), each with more than 99 % of its mass on the mark. In patches, maps on neighbouring
patches of the mark are 0.4 apart (median; 0.64 at the 90th percentile) and 2.0 or more from
the unmarked pictures' maps (10th percentile), while the synthetic groups above are 0.5-0.7
apart within and 1.0-1.3 between (10th percentile): a local scale of at least half a patch
keeps the synthetic groups apart and the marked pictures together (one cluster of 33).

scikit-learn runs with one thread here (``threadpoolctl``): next to torch's OpenMP pool its own
one spun so hard on a busy 2-core machine that a t-SNE of 24 points took 17-37 s instead of 0.2 s.
"""

from __future__ import annotations

import warnings

import numpy as np
from threadpoolctl import threadpool_limits

MAX_K = 8  # at most this many clusters per class
GAP_RATIO = 4.0  # k clusters only where the (k+1)-th eigenvalue is at least this many times the k-th
MIN_TO_SPLIT = 8  # fewer pictures in a class: one cluster
MIN_CLUSTER = 4  # a class of n pictures splits into at most n // 4 clusters (4 pictures a cluster on average)
MAX_TO_SPLIT = 2000  # more: cluster a sample of this many, the rest joins the nearest cluster mean
MIN_TSNE = 12  # fewer maps: PCA for the embedding (t-SNE needs a few neighbours per point)
DIRECTIONS = 8  # the sliced Wasserstein distance's directions (0, 22.5, ..., 157.5 degrees)
MIN_SCALE = 0.5  # patches: the least local scale of the affinity (maps closer than this are alike)
NEIGHBOUR = 7  # the local scale: the distance to this nearest neighbour
SAME = 1e-6  # patches: features that round alike at this step are one map (placed once in 2-D)
MIN_SPREAD = 1e-3  # patches: maps all closer than this to one another are the same map (no 2-D view)


def features(maps: np.ndarray) -> np.ndarray:
    """[N, h, w] maps (each a distribution: non-negative, sum 1) -> [N, DIRECTIONS * (h*w - 1)]
    features whose L1 distance is the sliced Wasserstein distance between the maps, in patches:
    per direction (:data:`DIRECTIONS` of them), the cells ordered by their centre's position along
    it, and the cumulative mass at each step times the step's length."""
    directions = DIRECTIONS
    n, h, w = maps.shape
    flat = np.clip(maps.reshape(n, -1), 0, None).astype(np.float64)
    yy, xx = np.mgrid[:h, :w]
    out = []
    for j in range(directions):
        angle = np.pi * j / directions
        t = (xx * np.cos(angle) + yy * np.sin(angle)).ravel()
        order = np.argsort(t, kind="stable")
        steps = np.diff(t[order])
        out.append(np.cumsum(flat[:, order], axis=1)[:, :-1] * (steps / directions))
    return np.concatenate(out, axis=1) if h * w > 1 else np.zeros((n, 0))


def distances(rows: np.ndarray, others: np.ndarray | None = None) -> np.ndarray:
    """L1 distances between rows of features (the sliced Wasserstein distances of their maps)."""
    from sklearn.metrics import pairwise_distances

    with threadpool_limits(1):
        return pairwise_distances(rows, others, metric="manhattan")


def affinity(rows: np.ndarray) -> np.ndarray:
    """A dense affinity with local scaling (Zelnik-Manor & Perona, "Self-tuning spectral clustering",
    NIPS 2004): exp(-d_ij^2 / (s_i s_j)), s_i the distance to the 7th nearest neighbour, at least
    :data:`MIN_SCALE`."""
    d = distances(rows)
    k = min(len(rows) - 1, NEIGHBOUR)
    s = np.maximum(np.sort(d, axis=1)[:, k], MIN_SCALE)
    a = np.exp(-(d**2) / (s[:, None] * s[None, :]))
    np.fill_diagonal(a, 0.0)
    return a


def laplacian_spectrum(weights: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` smallest eigenvalues of the normalised Laplacian I - D^-1/2 A D^-1/2, ascending."""
    d = weights.sum(axis=1)
    inv = np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-300)), 0.0)
    lap = np.eye(len(weights)) - inv[:, None] * weights * inv[None, :]
    with threadpool_limits(1):
        if len(weights) <= 600:
            return np.linalg.eigvalsh(lap)[:count]
        from scipy.sparse.linalg import eigsh

        return np.sort(eigsh(lap, k=count, which="SA", return_eigenvectors=False))


def eigengap(eigenvalues: np.ndarray, ratio: float = GAP_RATIO) -> int:
    """The number of clusters: 1 + the index of the largest gap between consecutive eigenvalues
    among the first :data:`MAX_K` + 1, among the k whose next eigenvalue is at least ``ratio`` times
    the k-th (k = 1 always counts: the first eigenvalue is 0); ties: the smaller k."""
    ev = np.asarray(eigenvalues, dtype=np.float64)[: MAX_K + 1]
    if len(ev) < 2:
        return 1
    gaps = np.diff(ev)
    separated = ev[1:] >= ratio * np.maximum(ev[:-1], 0.0)
    separated[0] = True
    return int(np.argmax(np.where(separated, gaps, -np.inf))) + 1


def cluster_maps(maps: np.ndarray, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """Cluster one class's maps [n, h, w] into at most :data:`MAX_K`: (cluster of each map, 0..k-1
    with 0 the largest; the Laplacian's smallest eigenvalues, for the record). See the module docstring."""
    n = len(maps)
    if n < MIN_TO_SPLIT:
        return np.zeros(n, dtype=int), []
    x = features(maps)
    sample = np.sort(np.random.default_rng(seed).choice(n, MAX_TO_SPLIT, replace=False)) if n > MAX_TO_SPLIT else None
    xs = x if sample is None else x[sample]  # the maps clustered
    a = affinity(xs)
    ev = laplacian_spectrum(a, min(len(a), MAX_K + 1))
    k = min(eigengap(ev), len(a) // MIN_CLUSTER)
    spectrum = [round(float(v), 6) for v in ev]
    if k <= 1:
        return np.zeros(n, dtype=int), spectrum
    from sklearn.cluster import SpectralClustering

    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", UserWarning)  # "graph is not fully connected": the point of the exercise
        labels = SpectralClustering(n_clusters=k, affinity="precomputed", random_state=seed,
                                    assign_labels="cluster_qr").fit_predict(a)
    if sample is not None:  # the others join the nearest cluster mean
        means = np.stack([xs[labels == c].mean(axis=0) for c in range(k)])  # the features of the mean maps
        full = distances(x, means).argmin(axis=1)
        full[sample] = labels
        labels = full
    order = np.argsort(-np.bincount(labels, minlength=k), kind="stable")  # renumber: largest first
    rank = np.empty(k, dtype=int)
    rank[order] = np.arange(k)
    return rank[labels], spectrum


def distinct(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the first row of each group of rows of ``rows`` that round alike to :data:`SAME`, the group of
    every row): duplicates of one map are placed once, and together."""
    keys = np.round(np.nan_to_num(rows) / SAME).astype(np.int64)
    _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return first, group.reshape(-1)


def tsne(rows: np.ndarray, seed: int) -> np.ndarray:
    """t-SNE of distinct rows (at least :data:`MIN_TSNE`), started from their 2-D PCA scaled as
    scikit-learn's ``init="pca"`` does, but never divided by a zero spread: with identical rows
    that division made NaNs, and scikit-learn's Barnes-Hut tree crashed the process on them."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    start = PCA(n_components=2, random_state=seed).fit_transform(rows)
    spread = float(np.std(start[:, 0]))
    if np.isfinite(start).all() and spread > 1e-12:
        init: np.ndarray | str = (start / spread * 1e-4).astype(np.float32)
    else:
        init = "random"
    perplexity = float(min(30.0, max(2.0, (len(rows) - 1) / 3)))
    with threadpool_limits(1):
        return TSNE(n_components=2, perplexity=perplexity, metric="manhattan", init=init,
                    random_state=seed).fit_transform(rows)


def embed(maps: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """A 2-D point per map [N, h, w] -> ([N, 2] in [0, 1], how), from the same features. Maps
    that are the same (within :data:`SAME`) share one point; ``how``: "tsne" (at least
    :data:`MIN_TSNE` different maps), "pca" (3 or more), "two" (two different maps: one at each
    end), "same" (one map, or maps no more than :data:`MIN_SPREAD` apart: all in the middle),
    "none" (no maps)."""
    n = len(maps)
    if n == 0:
        return np.zeros((0, 2)), "none"
    x = np.nan_to_num(features(maps))
    first, group = distinct(x)
    reps = x[first]
    if len(reps) == 1 or distances(reps, reps[:1]).max() < MIN_SPREAD:
        return np.full((n, 2), 0.5), "same"
    if len(reps) == 2:
        xy, how = np.array([[0.0, 0.5], [1.0, 0.5]]), "two"
    elif len(reps) < MIN_TSNE:
        from sklearn.decomposition import PCA

        xy, how = PCA(n_components=2, random_state=seed).fit_transform(reps), "pca"
    else:
        xy, how = tsne(reps, seed), "tsne"
    xy = np.nan_to_num(np.asarray(xy, dtype=np.float64))
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    xy = np.where(hi > lo, (xy - lo) / np.where(hi > lo, hi - lo, 1.0), 0.5)
    return xy[group], how


def arrange(maps: np.ndarray, groups: list[np.ndarray], seed: int = 0
            ) -> tuple[list[tuple[np.ndarray, list[float]]], np.ndarray, str]:
    """Everything the survey asks of scikit-learn, in one call (to run in a child process of its
    own, :mod:`.child`): each group's clusters (:func:`cluster_maps` of ``maps[group]``) and the
    2-D view of all the maps (:func:`embed`)."""
    xy, how = embed(maps, seed)
    return [cluster_maps(maps[g], seed) for g in groups], xy, how
