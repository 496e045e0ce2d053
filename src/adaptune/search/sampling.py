"""Which candidates to measure: greedy top-k (AutoTVM) or Chameleon's Adaptive Sampling.

Adaptive Sampling (Chameleon §3.3, Algorithm 1) clusters the exploration's candidates with
k-means for k = 8, 9, ... and stops at the knee of the loss curve: the loop ends at the first k
whose loss times ``threshold`` is no longer below the previous loss (the loss stopped falling by a
factor of ``threshold``).  We measure the centroids of the knee itself, the last k that still cut
the loss (Algorithm 1 as printed keeps the k one past it: one more measurement that the loss curve
says adds little; on well-separated clusters ours gives exactly the number of clusters).  Sample
Synthesis replaces a centroid that was already measured by the per-knob mode of the candidates.

Each centroid snaps to a real config TVM accepts: the exploration's candidates are knob vectors
the cost model scored without replaying them, and some are impossible tilings or postprocessor
rejects; dropping those would measure fewer configs for the same search cost.
"""
from __future__ import annotations

from itertools import islice

import numpy as np
from sklearn.cluster import KMeans


def _normalise(configs: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    return configs / np.maximum(np.asarray(sizes) - 1, 1)


def _key(c) -> tuple:
    return tuple(int(x) for x in c)


def greedy_top_k(candidates: np.ndarray, scores: np.ndarray, visited, k: int) -> np.ndarray:
    """The ``k`` highest-scoring distinct candidates not in ``visited`` (AutoTVM's sampling)."""
    out, seen = [], set(visited)
    for i in np.argsort(-np.asarray(scores), kind="stable"):
        key = _key(candidates[i])
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


def _as_is(configs: np.ndarray) -> list[tuple]:
    return [_key(c) for c in configs]


def _synthesise(candidates: np.ndarray, taken: set, resolve) -> tuple[np.ndarray, tuple] | None:
    """Sample Synthesis: the most frequent value of each knob among the candidates; if that config
    is taken or invalid, try swapping single knobs to their next most frequent values."""
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
    return _first_fresh(tries, taken, resolve)


def _first_fresh(configs, taken: set, resolve, limit: int | None = None,
                 chunk: int = 4) -> tuple[np.ndarray, tuple] | None:
    """The first of ``configs`` (at most ``limit`` of those not taken) that TVM accepts under a
    key not taken, with that key.  Resolved ``chunk`` at a time: the decodes of a chunk run
    side by side on the decode threads, and many tries in a row can be aliases of measured
    configs (a location TVM settles elsewhere) or rejects; a decode past the answer is cached,
    and the next visited cluster's synthesis walks the same list."""
    fresh = islice((c for c in configs if _key(c) not in taken), limit)
    while rows := list(islice(fresh, chunk)):
        for c, key in zip(rows, resolve(np.asarray(rows))):
            if key is not None and key not in taken:
                return c, key
    return None


def adaptive_sample(candidates: np.ndarray, sizes, visited, *, k_min: int = 8, k_max: int = 64,
                    threshold: float = 2.5, seed: int = 0, resolve=None, scores=None,
                    snap_tries: int = 8) -> np.ndarray:
    """Configs to measure: one per k-means cluster (k at the knee), valid, never visited, never twice.

    Without ``scores`` a cluster gives the candidate nearest its centroid (the paper).  With the
    cost model's ``scores`` it gives its best-predicted member instead: the clusters still spread
    the measurements over the distinct promising regions, but each measures the region's most
    promising config rather than its geometric middle, which in knob-index space is often a
    mediocre schedule.

    ``resolve(configs)`` gives, per row, the key a config is measured under (its canonical form
    once TVM has replayed it) or None where TVM rejects it; by default every config is valid as
    it is.  A cluster's pick snaps to a valid config: a rejected member gives way to the next one
    (up to ``snap_tries``, all clusters resolved together per round).  A pick that was visited is
    replaced by a synthesised config (mode of each knob, then next-most-frequent values), else by
    the nearest valid unvisited candidate."""
    resolve = resolve or _as_is
    candidates, first = np.unique(np.asarray(candidates, dtype=np.int64), axis=0, return_index=True)
    scores = None if scores is None else np.asarray(scores, dtype=np.float64)[first]
    taken = set(map(tuple, np.asarray(list(visited), dtype=np.int64).reshape(-1, candidates.shape[1]).tolist()))
    if len(candidates) <= k_min:
        fresh = candidates[[_key(c) not in taken for c in candidates]]
        return fresh[[key is not None and key not in taken for key in resolve(fresh)]]
    points = _normalise(candidates, sizes)
    _, _, centers = choose_k(points, k_min=k_min, k_max=k_max, threshold=threshold, seed=seed)
    dist = ((points[:, None, :] - centers[None]) ** 2).sum(-1)          # (candidates, clusters)
    label = dist.argmin(1)
    orders = []
    for c in range(len(centers)):
        members = np.flatnonzero(label == c)
        if scores is None or not len(members):
            orders.append(np.argsort(dist[:, c], kind="stable"))
        else:
            orders.append(members[np.argsort(-scores[members], kind="stable")])
    # snap: each cluster's first valid member in its order (rounds of one resolve call)
    first_valid: dict[int, tuple[int, tuple]] = {}
    pos = [0] * len(centers)
    for _ in range(snap_tries):
        ask = [c for c in range(len(centers)) if c not in first_valid and pos[c] < len(orders[c])]
        if not ask:
            break
        rows = [orders[c][pos[c]] for c in ask]
        for c, i, key in zip(ask, rows, resolve(candidates[rows])):
            pos[c] += 1
            if key is not None:
                first_valid[c] = (i, key)
    out = []
    for c in range(len(centers)):
        if c not in first_valid:
            continue
        i, key = first_valid[c]
        pick = (candidates[i], key) if key not in taken else (   # visited: Sample Synthesis, else the
            _synthesise(candidates, taken, resolve)               # nearest valid fresh candidate
            or _first_fresh(candidates[np.argsort(dist[:, c], kind="stable")], taken, resolve, snap_tries))
        if pick is not None:
            taken.add(pick[1])
            out.append(pick[0])
    return np.array(out, dtype=np.int64).reshape(-1, candidates.shape[1])


def coverage_probe(best: np.ndarray, knob: int, space, measured: np.ndarray, taken: set, resolve,
                   score, tries: int = 8) -> tuple[np.ndarray, tuple] | None:
    """The best measured config with ``knob`` set to the value measured least often so far (ties:
    best predicted by ``score``), valid and not taken; with its key.

    The cost model learns a knob value's worth only from configs measured with it.  When the
    first good configs happen to share one value of a small knob, the model ranks every other
    value low, the agent and the clustering stay in that basin, and the other values are never
    measured in a good context.  A probe asks that question at the best config, where the
    answer counts."""
    values = np.arange(space.sizes[knob])
    values = values[values != best[knob]]
    if not len(values):
        return None
    configs = np.repeat(best[None], len(values), 0)
    configs[:, knob] = values
    configs = space.canonical(configs)
    rows = measured[space.active[measured[:, 0], knob]] if len(measured) else measured
    counts = np.bincount(rows[:, knob], minlength=space.sizes[knob])[values] if len(rows) else np.zeros(len(values))
    order = np.lexsort((-score(configs), counts))
    return _first_fresh(configs[order], taken, resolve, tries)


def refine_on_model(config: np.ndarray, fixed: int, space, score, sweeps: int = 2) -> np.ndarray:
    """``config`` after ``sweeps`` rounds of coordinate ascent on ``score``: each active knob but
    ``fixed`` and the design-space knob (0) set in turn to its best-predicted value.

    A coverage probe changes one knob of the best config; the knobs around it were chosen for the
    old value.  Where a good value needs a partner (L8: the 7-long h tile innermost is fast only
    with a small inner channel factor) the bare probe measures it in the wrong context, the model
    learns it is poor, and the basin is never entered."""
    c = space.canonical(config)[0]
    for _ in range(sweeps):
        for j in np.flatnonzero(space.movable(c)):
            if j in (0, fixed):
                continue
            cand = np.repeat(c[None], space.sizes[j], 0)
            cand[:, j] = np.arange(space.sizes[j])
            cand = space.canonical(cand)
            c = cand[int(np.argmax(score(cand)))]
    return c
