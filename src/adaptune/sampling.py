"""Which candidates to measure: greedy top-k (AutoTVM) or Chameleon's Adaptive Sampling.

Adaptive Sampling (Chameleon §3.3, Algorithm 1) clusters the exploration's candidates with
k-means for k = 8, 9, ... and stops at the knee of the loss curve: the loop ends at the first k
whose loss times ``threshold`` is no longer below the previous loss (the loss stopped falling by a
factor of ``threshold``).  We measure the centroids of the knee itself, the last k that still cut
the loss (Algorithm 1 as printed keeps the k one past it: one more measurement that the loss curve
says adds little; on well-separated clusters ours gives exactly the number of clusters).  Sample
Synthesis replaces a centroid that was already measured by the per-knob mode of the candidates.
"""
from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans


def _normalise(configs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    return configs / np.maximum(np.asarray(sizes) - 1, 1)


def greedy_top_k(candidates: np.ndarray, scores: np.ndarray, visited, k: int) -> np.ndarray:
    """The ``k`` highest-scoring distinct candidates not in ``visited`` (AutoTVM's sampling)."""
    out, seen = [], set(visited)
    for i in np.argsort(-np.asarray(scores), kind="stable"):
        key = tuple(int(x) for x in candidates[i])
        if key not in seen:
            seen.add(key)
            out.append(candidates[i])
            if len(out) == k:
                break
    return np.array(out, dtype=np.int64).reshape(-1, candidates.shape[1])


def choose_k(points: np.ndarray, *, k_min: int = 8, k_max: int = 64, threshold: float = 2.5,
             seed: int = 0) -> tuple[int, list[float], np.ndarray]:
    """Threshold-based meta-search for k (Algorithm 1, lines 2-7).

    Returns the knee k, the loss (k-means inertia) per k tried, and the knee's centroids."""
    k_max = min(k_max, len(np.unique(points, axis=0)))
    losses, prev, knee = [], np.inf, None
    for k in range(min(k_min, k_max), k_max + 1):
        km = KMeans(n_clusters=k, n_init=1, random_state=seed, max_iter=100).fit(points)
        losses.append(float(km.inertia_))
        if threshold * km.inertia_ >= prev:          # the loss curve has flattened: past the knee
            break
        prev, knee = km.inertia_, (k, km.cluster_centers_)
    return knee[0], losses, knee[1]


def _synthesise(candidates: np.ndarray, taken: set, is_valid) -> np.ndarray | None:
    """Sample Synthesis: the most frequent value of each knob among the candidates; if that config
    is taken, try swapping single knobs to their next most frequent values."""
    modes = []
    for col in candidates.T:
        vals, counts = np.unique(col, return_counts=True)
        modes.append(vals[np.argsort(-counts, kind="stable")])
    base = np.array([m[0] for m in modes], dtype=np.int64)
    tries = [base]
    for rank in range(1, max(len(m) for m in modes)):
        for j, m in enumerate(modes):
            if rank < len(m):
                c = base.copy()
                c[j] = m[rank]
                tries.append(c)
    for c in tries:
        if tuple(int(x) for x in c) not in taken and (is_valid is None or is_valid(c)):
            return c
    return None


def adaptive_sample(candidates: np.ndarray, sizes, visited, *, k_min: int = 8, k_max: int = 64,
                    threshold: float = 2.5, seed: int = 0, is_valid=None, scores=None) -> np.ndarray:
    """Configs to measure: one per k-means cluster (k at the knee), never visited, never twice.

    Without ``scores`` a cluster gives the candidate nearest its centroid (the paper).  With the
    cost model's ``scores`` it gives its best-predicted member instead: the clusters still spread
    the measurements over the distinct promising regions, but each measures the region's most
    promising config rather than its geometric middle, which in knob-index space is often a
    mediocre schedule.  A pick that was visited is replaced by a synthesised config (mode of
    each knob, then next-most-frequent values), else by the nearest unvisited candidate."""
    candidates, first = np.unique(np.asarray(candidates, dtype=np.int64), axis=0, return_index=True)
    scores = None if scores is None else np.asarray(scores, dtype=np.float64)[first]
    taken = set(map(tuple, np.asarray(list(visited), dtype=np.int64).reshape(-1, candidates.shape[1]).tolist()))
    fresh = np.array([c for c in candidates if tuple(int(x) for x in c) not in taken], dtype=np.int64)
    if len(candidates) <= k_min:
        return fresh.reshape(-1, candidates.shape[1])
    points = _normalise(candidates, sizes)
    _, _, centers = choose_k(points, k_min=k_min, k_max=k_max, threshold=threshold, seed=seed)
    dist = ((points[:, None, :] - centers[None]) ** 2).sum(-1)          # (candidates, clusters)
    label = dist.argmin(1)
    out = []
    for c in range(len(centers)):
        if scores is None:
            order = np.argsort(dist[:, c], kind="stable")
        else:
            members = np.flatnonzero(label == c)
            order = members[np.argsort(-scores[members], kind="stable")] if len(members) else dist[:, c].argsort()
        pick = candidates[order[0]]
        if tuple(int(x) for x in pick) in taken:
            pick = _synthesise(candidates, taken, is_valid)
            if pick is None:
                pick = next((candidates[i] for i in np.argsort(dist[:, c], kind="stable")
                             if tuple(int(x) for x in candidates[i]) not in taken), None)
        if pick is not None:
            taken.add(tuple(int(x) for x in pick))
            out.append(pick)
    return np.array(out, dtype=np.int64).reshape(-1, candidates.shape[1])
